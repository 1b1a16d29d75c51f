"""Graphviz for the admin's drawings (workflow graphs, versions, lineage), when it is there.

The `graphviz` package comes with the workflows and datasets extras and its `dot` program with the OS (Debian's
graphviz); without either, a page that would draw says so in place of the drawing instead of failing.
"""

from collections.abc import Callable
from types import ModuleType
from typing import Any

from django.utils.html import format_html

MISSING = (
    "This drawing needs Graphviz: pip install 'jobsite[workflows]' (or [datasets]) and the OS package graphviz "
    "(its dot program)."
)


def graphviz() -> ModuleType | None:
    try:
        import graphviz as module
    except ImportError:
        return None
    return module


def drawn(draw: Callable[[ModuleType], Any]) -> Any:
    """What `draw(graphviz)` returns (its SVG), or the note (a str) saying what is missing when the package or
    `dot` is not installed."""
    module = graphviz()
    if module is None:
        return format_html('<p class="help">{}</p>', MISSING)
    try:
        return draw(module)
    except module.ExecutableNotFound:
        return format_html('<p class="help">{}</p>', MISSING)
