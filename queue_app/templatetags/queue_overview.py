"""{% queue_overview %}: the queue overview fragment, for the admin index (templates/admin/index.html)."""

from typing import Any

from django import template

from ..admin.overview import TEMPLATE, may_view, overview_context

register = template.Library()


@register.inclusion_tag(TEMPLATE, takes_context=True)
def queue_overview(context: template.Context) -> dict[str, Any]:
    request = context["request"]
    return overview_context(request) if may_view(request) else {}
