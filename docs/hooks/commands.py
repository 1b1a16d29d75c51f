"""MkDocs hook: the management command reference, rendered from each command's own argparse parser.

`docs/reference/commands.md` holds the line `<!-- commands -->`; at build time it becomes one section per command
of `queue_app/management/commands/`, the layer apps' (`queue_app/<layer>/management/commands/`: spark,
workflows, datasets, webhooks) and
`jobsite/management/commands/` (usage, description, every argument and
flag with its default and choices, sub-commands included). The page can therefore never list a flag that does
not exist or miss one that does.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- commands -->"
PAGE = "reference/commands.md"
# Django's options every command has (`manage.py help CMD` shows them): documented once, not per command.
COMMON = {
    "help",
    "version",
    "verbosity",
    "settings",
    "pythonpath",
    "traceback",
    "no_color",
    "force_color",
    "skip_checks",
}


def _django() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobsite.settings")
    # Importing the settings must not write a secret key into var/ just to build the docs.
    os.environ.setdefault("SECRET_KEY", "docs-build-only")
    import django

    django.setup()


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _names(action: argparse.Action) -> str:
    if action.option_strings:
        names = ", ".join(f"`{name}`" for name in action.option_strings)
        if action.nargs != 0:
            names += f" `{action.metavar or action.dest.upper()}`"
        return names
    return f"`{action.metavar or action.dest}`"


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.default == []:
        return ""
    if "default" in (action.help or ""):  # the help says it, in words (e.g. "default: CPUs", not this machine's 2)
        return ""
    return f"`{action.default}`"


def _arguments(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if action.dest in COMMON or isinstance(action, argparse._SubParsersAction):
            continue
        # As argparse expands it for --help: %(default)s, %(choices)s...
        help_text = action.help % dict(vars(action), prog=parser.prog) if action.help else ""
        if action.choices:
            help_text += f" (one of: {', '.join(str(c) for c in action.choices)})"
        if action.required and action.option_strings:
            help_text += " (required)"
        rows.append(f"| {_names(action)} | {_default(action)} | {_cell(help_text)} |")
    if not rows:
        return []
    return ["| argument | default | meaning |", "|---|---|---|", *rows, ""]


def _usage(parser: argparse.ArgumentParser) -> list[str]:
    usage = parser.format_usage().removeprefix("usage: ").strip()
    # Django's common options are noise in every usage line; they are listed once at the top of the page.
    for flag in (
        "[-h]",
        "[--version]",
        "[-v {0,1,2,3}]",
        "[--settings SETTINGS]",
        "[--pythonpath PYTHONPATH]",
        "[--traceback]",
        "[--no-color]",
        "[--force-color]",
        "[--skip-checks]",
    ):
        usage = usage.replace(flag, "")
    return ["```text", " ".join(usage.split()), "```", ""]


# Whose commands: the core app's (every project that installs queue_app has them), the layer apps' (a project that
# adds the layer) and the jobsite project's own.
APPS = {
    "queue_app": "the app (`queue_app`)",
    "queue_app.spark": "the Spark app (`queue_app.spark`)",
    "queue_app.workflows": "the workflows app (`queue_app.workflows`)",
    "queue_app.datasets": "the datasets app (`queue_app.datasets`)",
    "queue_app.webhooks": "the webhooks app (`queue_app.webhooks`)",
    "jobsite": "the jobsite project only (not in an adopter's project)",
}


def _render(name: str, app: str) -> list[str]:
    from django.core.management import load_command_class

    command = load_command_class(app, name)
    parser = command.create_parser("manage.py", name)
    module_doc = (sys.modules[type(command).__module__].__doc__ or "").strip()
    lines = [f"## `{name}`", "", _cell(command.help or ""), "", f"*Comes with {APPS[app]}.*", "", *_usage(parser)]
    if module_doc:
        lines += ['??? note "More"', "", *[f"    {line}" if line else "" for line in module_doc.splitlines()], ""]
    lines += _arguments(parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for sub_name, sub in action.choices.items():
                lines += [f"### `{name} {sub_name}`", "", _cell(helps.get(sub_name) or sub.description or ""), ""]
                lines += _usage(sub) + _arguments(sub)
    return lines


def commands_markdown() -> str:
    _django()
    commands = sorted(
        (p.stem, app)
        for app in APPS
        for p in (ROOT.joinpath(*app.split(".")) / "management" / "commands").glob("*.py")
        if p.stem != "__init__"
    )
    return "\n".join(line for name, app in commands for line in _render(name, app))


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} lost its {MARKER} line: the command reference has nowhere to go")
    return markdown.replace(MARKER, commands_markdown())
