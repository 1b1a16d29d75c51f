"""What every layer app (queue_app.datasets, queue_app.webhooks) shares: its dependency on the apps it builds on,
declared and checked by `check` (jobsite.E100), not found as an ImportError.

    class WebhooksConfig(LayerConfig):
        name = "queue_app.webhooks"
        label = "jobsite_webhooks"
        requires = ("queue_app",)

        def wire(self) -> None:  # ready(), run only when every required app is installed
            ...

Installed without an app it requires, `check` says which (E100, with the INSTALLED_APPS line to add) and
nothing of the layer is wired; its admin module asks `LayerConfig.missing()` before registering a page.
"""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig, apps
from django.core import checks

_CHECKS: dict[str, Any] = {}  # one check function per layer app, however often ready() runs


def missing_apps(layer: AppConfig, requires: tuple[str, ...]) -> list[checks.CheckMessage]:
    """jobsite.E100 for each app `requires` names that is not installed, said for the layer app."""
    return [
        checks.Error(
            f"the {layer.verbose_name.lower()} app ({layer.name}) needs {required!r} in INSTALLED_APPS",
            hint=f'INSTALLED_APPS += ["{required}", "{layer.name}"] (docs/how-to/adopt.md)',
            id="jobsite.E100",
        )
        for required in requires
        if not apps.is_installed(required)
    ]


class LayerConfig(AppConfig):
    """A layer app: `requires` the apps it builds on; `wire()` is its ready() once they are all installed."""

    requires: tuple[str, ...] = ("queue_app",)
    default_auto_field = "django.db.models.BigAutoField"

    def missing(self) -> list[checks.CheckMessage]:
        return missing_apps(self, self.requires)

    def ready(self) -> None:
        if self.name not in _CHECKS:

            def requires_check(app_configs: Any = None, layer: LayerConfig = self, **kwargs: Any) -> list:
                return layer.missing()

            _CHECKS[self.name] = requires_check
        checks.register(_CHECKS[self.name], "jobsite")
        if not self.missing():
            self.wire()

    def wire(self) -> None:
        """Register the layer on the core's hooks (the subclass's)."""
