"""The shape every registry of named things shares: tasks (registry.py), Spark jobs (spark/registry.py) and
workflows (workflows/definition.py).

A registry holds entries by name. Its entries register themselves when their module is imported: the modules a
setting names (SPARK_JOB_MODULES) and one module of every installed app (`tasks.py`, `spark_jobs.py`), imported
on the first lookup, once per process. Registration flows one way: those modules import the registry, the
registry names none of them. The same origin (the same function, imported again) registering a name again
replaces its entry; another origin under a taken name is refused.
"""

from __future__ import annotations

import difflib
import threading
from collections.abc import Callable
from importlib import import_module

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules

NAMES_SHOWN = 20  # registered names listed in an "unknown name" message


def shown_names(names: list[str]) -> str:
    """The first NAMES_SHOWN of `names` for a message ("a, b and 3 more"; "(none)")."""
    shown = ", ".join(names[:NAMES_SHOWN]) or "(none)"
    return shown + (f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else "")


class DuplicateName(ImproperlyConfigured, ValueError):
    """Two different origins register the same name."""


def origin_of(func: Callable) -> str:
    """Who registered an entry made from `func`: its module and qualified name."""
    return f"{func.__module__}.{func.__qualname__}"


class Registry[T]:
    """Entries of one kind by name. `kind` names them in messages ("task", "Spark job", "workflow");
    `app_module` is the module of every installed app that is imported to find them; `setting` names a
    JOBSITE setting listing modules to import first; `origin(entry)` says who registered an entry."""

    def __init__(self, kind: str, *, app_module: str, origin: Callable[[T], str], setting: str | None = None) -> None:
        self.kind = kind
        self.app_module = app_module
        self.setting = setting
        self.origin = origin
        self._entries: dict[str, T] = {}
        self._lock = threading.RLock()
        self._discovered = False
        self._discovering = False

    def discover(self) -> None:
        """Import the modules that register entries, once per process (every lookup calls this: no lock once
        done). A lookup made while they are being imported (by one of them) sees what is registered so far.
        Before Django has loaded the models, only the setting's modules are imported; the apps' are imported at
        a later lookup."""
        if self._discovered:
            return
        with self._lock:
            if self._discovered or self._discovering:
                return
            self._discovering = True
            try:
                if self.setting is not None:
                    from queue_app.conf import queue_settings

                    for module in getattr(queue_settings, self.setting):
                        import_module(module)
                if apps.models_ready:
                    autodiscover_modules(self.app_module)
                    self._discovered = True
            finally:
                self._discovering = False

    def register(self, name: str, entry: T) -> T:
        """Register `entry` under `name`; DuplicateName when another origin holds the name."""
        with self._lock:
            known = self._entries.get(name)
            if known is not None and self.origin(known) != self.origin(entry):
                raise DuplicateName(
                    f"{self.kind} name {name!r} is registered twice: by {self.origin(known)} and by "
                    f"{self.origin(entry)}"
                )
            self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> T | None:
        return self._entries.pop(name, None)

    def get(self, name: str) -> T | None:
        """The entry registered as `name`, else None (after discovery)."""
        self.discover()
        return self._entries.get(name) if isinstance(name, str) else None

    def entries(self) -> dict[str, T]:
        """Every registered entry, by name in order."""
        self.discover()
        return dict(sorted(self._entries.items()))

    def names(self) -> list[str]:
        return list(self.entries())

    def closest(self, name: str, names: list[str] | None = None) -> list[str]:
        """The registered names (or `names`) that look most like `name`, best first."""
        if not isinstance(name, str):
            return []
        return difflib.get_close_matches(name, self.names() if names is None else names, n=3, cutoff=0.6)

    def did_you_mean(self, name: str, names: list[str] | None = None) -> str:
        """' (did you mean 'a', 'b'?)' for an error about a misspelt name, '' when no name is close."""
        close = self.closest(name, names)
        return f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
