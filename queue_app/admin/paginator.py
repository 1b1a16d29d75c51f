"""A change-list paginator that never counts a big table in full.

Unfiltered: pg_class.reltuples (exact count only while the table is small). Filtered: count up to a cap with
SELECT count(*) FROM (... in the list's order LIMIT cap + 1), the path the page itself takes (monitoring.capped_count),
and show "1,000+" beyond it. Pages past the cap (20 pages of 50) are
not offered: a filter that matches more is narrowed (or acted on with "all matching"), not paged through.
"""

from functools import cached_property

from django.core.paginator import Paginator

from ..monitoring import capped_count, table_estimate

LIST_COUNT_CAP = 1_000


class EstimatedCountPaginator(Paginator):
    cap = LIST_COUNT_CAP

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.estimated = False  # count is pg_class.reltuples
        self.capped = False  # more rows match than `cap`; count is cap + 1

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not queryset.query.where and not queryset.query.distinct:
            estimate = table_estimate(queryset.model)
            if estimate > self.cap:
                self.estimated = True
                return estimate
        n = capped_count(queryset, self.cap + 1, in_order=True)
        self.capped = n > self.cap
        return n

    @property
    def count_label(self) -> str:
        count = self.count
        if self.estimated:
            return f"about {count:,}"
        if self.capped:
            return f"{self.cap:,}+"
        return f"{count:,}"
