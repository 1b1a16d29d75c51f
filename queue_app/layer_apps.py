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
Installed without its extra (`extra`, whose libraries `extra_modules` names), `check` says which extra to install
(E114): the layer imports its libraries only where it uses them, so the project starts and `check` can say so.
"""

from __future__ import annotations

import importlib.util
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


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a module without a spec
        return False


def missing_extra(layer: AppConfig, extra: str, modules: tuple[str, ...]) -> list[checks.CheckMessage]:
    """jobsite.E114 when a library of the layer's extra is not installed, naming the extra to install."""
    absent = [module for module in modules if not _importable(module)]
    if not absent:
        return []
    return [
        checks.Error(
            f"the {layer.verbose_name.lower()} app ({layer.name}) needs the {extra!r} extra: "
            f"{', '.join(absent)} {'is' if len(absent) == 1 else 'are'} not installed",
            hint=f"pip install 'jobsite[{extra}]' (docs/how-to/adopt.md)",
            id="jobsite.E114",
        )
    ]


class LayerConfig(AppConfig):
    """A layer app: `requires` the apps it builds on; `wire()` is its ready() once they are all installed;
    `extra` is the pip extra carrying the libraries `extra_modules` names (checked, never imported here)."""

    requires: tuple[str, ...] = ("queue_app",)
    extra: str = ""
    extra_modules: tuple[str, ...] = ()
    default_auto_field = "django.db.models.BigAutoField"

    def missing(self) -> list[checks.CheckMessage]:
        return missing_apps(self, self.requires)

    def problems(self) -> list[checks.CheckMessage]:
        """What `check` says of the layer: apps it needs (E100), then its extra's libraries (E114)."""
        return self.missing() + missing_extra(self, self.extra, self.extra_modules)

    def ready(self) -> None:
        if self.name not in _CHECKS:

            def requires_check(app_configs: Any = None, layer: LayerConfig = self, **kwargs: Any) -> list:
                return layer.problems()

            _CHECKS[self.name] = requires_check
        checks.register(_CHECKS[self.name], "jobsite")
        if not self.missing():
            self.wire()

    def wire(self) -> None:
        """Register the layer on the core's hooks (the subclass's)."""
