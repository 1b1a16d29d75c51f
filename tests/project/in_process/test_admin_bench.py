"""`manage.py admin_bench` at a toy size: it loads hot items in the open mix and archived ones with their
attempts, and datasets with their materializations, measures lease + settle before and after the history, times
every change list and the dataset pages, and a second history load adds rows after every id in use."""

import io
from datetime import timedelta

import pytest
from django.core.management import call_command

from jobsite.bench.admin_bench import AdminBench
from jobsite.bench.admin_datasets import MATRIX, MATRIX_DAYS, MATRIX_REGIONS
from queue_app.datasets.models import Materialization
from queue_app.models import DeadLetter, ItemHistory, QueueItem, ReservationHistory

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_small_run_loads_both_sides_and_times_every_list():
    out = io.StringIO()
    call_command(
        "admin_bench", "--reset", "--mix", "open", "--items", "2000", "--history", "3000", "--throughput", "500",
        "--datasets", "40", "--materializations", "400", "--requests", "1", "--budget-ms", "60000", stdout=out,
    )  # fmt: skip
    text = out.getvalue()

    states = dict.fromkeys(("ready", "reserved", "dead", "done"), 0)
    for state in QueueItem.objects.values_list("state", flat=True):
        states[state] += 1
    n = 2000  # the open mix (admin_bench.MIXES), row by row: the newest 2% done, then by g % 100

    def state(g: int) -> str:
        if g > n - n // 50:
            return "done"
        return "ready" if g % 100 < 90 else "reserved" if g % 100 < 95 else "dead"

    expected = dict.fromkeys(states, 0)
    for g in range(1, n + 1):
        expected[state(g)] += 1
    assert states == expected
    assert DeadLetter.objects.count() == expected["dead"]
    assert ItemHistory.objects.count() == ReservationHistory.objects.count() == 3000
    assert "ratio" in text and "every change list under 60000 ms at p95" in text
    for label in ("items: created last hour", "dead letters: open, queue + task", "reservations: search item id"):
        assert label in text
    loaded = Materialization.objects.filter(dataset__startswith="bench_ds_")
    assert loaded.exclude(dataset=MATRIX).count() == 400  # 10 days x 40
    assert loaded.filter(dataset=MATRIX).count() == MATRIX_DAYS * MATRIX_REGIONS  # the two-dimension page's rows
    for label in ("datasets: list", "dataset page", "dataset lineage (79 nodes)", "dataset page, 365 x 50 matrix"):
        assert label in text  # lineage at depth 8 of 40: 40 + 39 nodes
    only = io.StringIO()
    call_command(
        "admin_bench", "--reuse", "--items", "0", "--datasets", "40", "--only", "datasets", "--requests", "1",
        "--budget-ms", "60000", stdout=only,
    )  # fmt: skip
    assert "dataset lineage (79 nodes)" in only.getvalue() and "items: no filter" not in only.getvalue()

    AdminBench(io.StringIO(), style=None).load_history(1000, 2)  # a second load: ids after every one in use
    ids = list(ItemHistory.objects.values_list("id", flat=True))
    assert len(ids) == len(set(ids)) == 4000
    assert min(ids) > max(QueueItem.objects.values_list("id", flat=True))


def test_the_loader_writes_the_id_marks_a_worker_would_have_taken_and_they_bound_every_later_row():
    """--idle-minutes: the loaded week ends an hour and a half ago; the marks cover the week and the idle time,
    and no item or reservation stamped after a mark has an id at or below it (engine/marks.py's rule)."""
    from django.db import connection

    from queue_app.models import IdMark

    call_command(
        "admin_bench", "--reset", "--mix", "week", "--items", "3000", "--idle-minutes", "90",
        "--requests", "1", "--budget-ms", "60000", stdout=io.StringIO(),
    )  # fmt: skip
    with connection.cursor() as cur:
        cur.execute("SELECT max(created_at) < now() - interval '89 minutes' FROM queue_app_queueitem")
        assert cur.fetchone()[0]
        # A row stamped at or after a mark breaches it when its id is at or below the mark's: with every mark and
        # row in time order (a mark first on a tie), a row breaches some earlier mark exactly when its id is at or
        # below the largest of their ids so far (a window, not a join of 60,000 marks by 3,000 rows).
        breaches = """
            SELECT count(*) FILTER (WHERE kind = 1 AND id <= top), count(*) FILTER (WHERE kind = 1 AND id > top)
            FROM (SELECT kind, id, max(id) FILTER (WHERE kind = 0) OVER (ORDER BY at, kind) AS top
                  FROM (SELECT taken_at AS at, 0 AS kind, {mark} AS id FROM queue_app_idmark
                        UNION ALL SELECT {at}, 1, id FROM {rows}) stamped) ordered"""
        cur.execute(breaches.format(mark="item_id", at="created_at", rows="queue_app_queueitem"))
        item_breaches, bounded = cur.fetchone()
        cur.execute(breaches.format(mark="reservation_id", at="reserved_at", rows="queue_app_reservation"))
        assert (item_breaches, cur.fetchone()[0]) == (0, 0)
    assert bounded > 0
    # Marks from before the week to now; those of the idle time hold every loaded id (the last hour's filter
    # has nothing to walk), the first none.
    marks = IdMark.objects.order_by("taken_at")
    assert marks.count() > 7 * 8640
    assert marks.first().item_id == 0 and marks.last().item_id == 3000
    assert {m.item_id for m in marks.filter(taken_at__gte=marks.last().taken_at - timedelta(minutes=85))} == {3000}
