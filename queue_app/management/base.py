"""What jobsite's management commands share.

- `JobsiteCommand`: a BaseCommand whose `--json` runs (an option named `json` or `as_json`, on the command or
  a subcommand) log only warnings and errors, so that `manage.py ... --json 2>&1` still parses as JSON: the
  process's INFO and DEBUG lines are disabled for the command's run (logging.disable) and restored after.
- `add_import_argument(parser, what)` and `import_modules(names)`: the repeatable `--import MODULE` of the commands
  that read declarations (`run_worker`, `workflow`, `dataset`), and its import with a clear CommandError.
- `parse_params(pairs)`: the `--param NAME=VALUE` of `spark_run` and `workflow`.
- `acting_user(name, permission)`: the Django user a command acts as (`--user NAME`, else the OS login name);
  a clear CommandError listing up to five active users who hold the permission when there is none.
"""

from __future__ import annotations

import getpass
import importlib
import logging
from collections.abc import Iterable
from typing import Any

from django.core.management.base import BaseCommand, CommandError

SHOWN_USERS = 5


def wants_json(options: dict[str, Any]) -> bool:
    return bool(options.get("json") or options.get("as_json"))


class JobsiteCommand(BaseCommand):
    """A command with `--json`: only WARNING and above are logged while it runs with `--json`."""

    def execute(self, *args: Any, **options: Any) -> Any:
        if not wants_json(options):
            return super().execute(*args, **options)
        before = logging.root.manager.disable
        logging.disable(max(before, logging.INFO))
        try:
            return super().execute(*args, **options)
        finally:
            logging.disable(before)


def add_import_argument(parser: Any, what: str) -> None:
    """The repeatable `--import MODULE` (dest `imports`): a module imported for its `what` before the command runs."""
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help=f"also import this module for its {what}; repeatable",
    )


def import_modules(names: Iterable[str]) -> None:
    """Import each `--import` module; CommandError naming the first that does not import."""
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise CommandError(f"--import {name}: {exc}") from None


def parse_params(pairs: list[str]) -> dict[str, str]:
    """`--param NAME=VALUE` pairs (repeatable) as a dict of strings; CommandError for a pair without a name or `=`."""
    params: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise CommandError(f"--param takes NAME=VALUE, not {pair!r}")
        params[name.strip()] = value
    return params


def users_with(permission: str, limit: int = SHOWN_USERS) -> list[str]:
    """Usernames of up to `limit` active users holding `permission` (app_label.codename), superusers included."""
    from django.contrib.auth import get_user_model
    from django.db.models import Q

    model = get_user_model()
    app_label, _, codename = permission.partition(".")
    held = Q(is_superuser=True)
    if codename:
        for via in ("user_permissions", "groups__permissions"):
            held |= Q(**{f"{via}__codename": codename, f"{via}__content_type__app_label": app_label})
    found = model._default_manager.filter(held, is_active=True).order_by(model.USERNAME_FIELD).distinct()
    return list(found.values_list(model.USERNAME_FIELD, flat=True)[:limit])


def acting_user(name: str | None, permission: str) -> Any:
    """The Django user `name` (None: the one named as the OS login); CommandError naming who could act instead."""
    from django.contrib.auth import get_user_model

    model = get_user_model()
    username = name or getpass.getuser()
    found = model._default_manager.filter(**{model.USERNAME_FIELD: username}).first()
    if found is not None:
        return found
    how = "--user" if name else "the OS login name"
    holders = users_with(permission)
    what = permission or "it (superusers only)"
    who = (
        f"users holding {what}: {', '.join(holders)} (e.g. --user {holders[0]})"
        if holders
        else f"no active user holds {what}: create one or grant it, then pass --user NAME"
    )
    raise CommandError(f"no Django user {username!r} (from {how}); {who}; nothing was written")
