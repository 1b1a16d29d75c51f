"""`manage.py admin_bench` at a toy size: it loads hot items in the open mix and archived ones with their
attempts, measures lease + settle before and after the history, times every change list, and a second
history load adds rows after every id in use."""

import io

import pytest
from django.core.management import call_command

from queue_app.management.commands.admin_bench import Command
from queue_app.models import DeadLetter, ItemHistory, QueueItem, ReservationHistory

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_small_run_loads_both_sides_and_times_every_list():
    out = io.StringIO()
    call_command(
        "admin_bench", "--reset", "--mix", "open", "--items", "2000", "--history", "3000", "--throughput", "500",
        "--requests", "1", "--budget-ms", "60000", stdout=out,
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

    Command(stdout=io.StringIO()).load_history(1000, 2)  # a second load: ids after every one in use
    ids = list(ItemHistory.objects.values_list("id", flat=True))
    assert len(ids) == len(set(ids)) == 4000
    assert min(ids) > max(QueueItem.objects.values_list("id", flat=True))
