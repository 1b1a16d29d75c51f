"""`manage.py enqueue` and `manage.py queue_stats`."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db.models import F
from django.utils import timezone

from queue_app import engine
from queue_app.models import DeadLetter, QueueItem
from tests.tasks import worker_tasks  # noqa: F401  (registers tests.* tasks)

pytestmark = pytest.mark.django_db
WAITED = timedelta(seconds=90)


def run(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_enqueue_one_item_with_its_task_options():
    out, _ = run("enqueue", "tests.flaky", "--payload", '{"succeed_on": 2}', "--priority", "5")
    item = QueueItem.objects.get()
    assert out.strip() == f"enqueued item {item.id} of tests.flaky on queue default"
    assert (item.payload, item.priority, item.max_attempts) == ({"succeed_on": 2}, 5, 3)


def test_enqueue_count_queues_many_in_bulk():
    out, _ = run("enqueue", "queue_app.noop", "--count", "50", "--queue", "bulk")
    ids = sorted(QueueItem.objects.filter(queue_id="bulk").values_list("id", flat=True))
    assert len(ids) == 50
    assert out.strip() == f"enqueued 50 items of queue_app.noop (ids {ids[0]}..{ids[-1]})"


def test_enqueue_with_dedup_key_reports_the_duplicate():
    first, _ = run("enqueue", "queue_app.echo", "--dedup-key", "k1")
    again, _ = run("enqueue", "queue_app.echo", "--dedup-key", "k1")
    item = QueueItem.objects.get()
    assert again.strip() == f"duplicate: item {item.id} of queue_app.echo already holds dedup key 'k1'"


def test_enqueue_delay_holds_the_item_back_and_ordering_key_lines_items_up():
    run("enqueue", "queue_app.echo", "--delay", "60", "--ordering-key", "customer-7")
    run("enqueue", "queue_app.echo", "--ordering-key", "customer-7")
    run("enqueue", "queue_app.echo", "--ordering-key", "customer-8")
    delayed, behind, other = QueueItem.objects.order_by("id")
    assert 55 < (delayed.run_at - timezone.now()).total_seconds() <= 60
    # Not due yet, and its key's next item waits behind it; another key's item goes.
    assert [held.item_id for held in engine.lease(["default"], 10, "w1")] == [other.id]
    QueueItem.objects.filter(id=delayed.id).update(visible_at=delayed.created_at)  # a minute later, in effect
    (first,) = engine.lease(["default"], 10, "w1")
    assert first.item_id == delayed.id
    engine.complete(first)
    assert [held.item_id for held in engine.lease(["default"], 10, "w1")] == [behind.id]


@pytest.mark.django_db(transaction=True)
def test_enqueue_refuses_a_mistyped_task_name_and_names_the_closest(manage):
    result = manage("enqueue", "queue_app.ecko", "--payload", '{"a": 1}')
    assert result.returncode == 1, result.stderr
    assert "no task is registered as 'queue_app.ecko' here; did you mean queue_app.echo," in result.stderr
    assert "--allow-unknown-task" in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""
    assert not QueueItem.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue_refuses_an_unknown_task_name_with_nothing_close(manage):
    result = manage("enqueue", "zzz", "--count", "5")
    assert result.returncode == 1, result.stderr
    assert "no task is registered as 'zzz' here; no registered task has a similar name" in result.stderr
    assert not QueueItem.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue_allow_unknown_task_queues_a_task_this_process_does_not_know(manage):
    result = manage("enqueue", "billing.charge", "--allow-unknown-task", "--queue", "billing")
    assert result.returncode == 0, result.stderr
    item = QueueItem.objects.get()
    assert (item.task, item.queue_id) == ("billing.charge", "billing")
    assert result.stdout.strip() == f"enqueued item {item.id} of billing.charge on queue billing"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--payload", "{nope"], "--payload is not valid JSON"),
        (["--priority", "500"], "priority must be an integer from -100 to 100"),
        (["--queue", "bad queue!"], "queue name must match"),
        (["--count", "0"], "--count must be at least 1"),
        (["--count", "2", "--dedup-key", "k"], "cannot be combined with --count"),
        (["--payload", '{"deep": ' * 70 + "1" + "}" * 70], "nested deeper than"),
    ],
)
def test_enqueue_bad_input_is_a_command_error_with_the_reason(args, message):
    with pytest.raises(CommandError, match=message):
        run("enqueue", "queue_app.echo", *args)
    assert not QueueItem.objects.exists()


def test_queue_stats_counts_items_by_state_per_queue():
    engine.enqueue_many("queue_app.noop", [{}] * 3)
    engine.enqueue("queue_app.noop", {}, delay=600)
    engine.enqueue("queue_app.noop", {}, queue="other")
    held = engine.lease(["other"], 1, "w")
    engine.dead(held[0], "poison")
    oldest = QueueItem.objects.filter(queue_id="default", task="queue_app.noop").order_by("id").first()
    QueueItem.objects.filter(id=oldest.id).update(run_at=F("run_at") - WAITED, visible_at=F("visible_at") - WAITED)
    out, _ = run("queue_stats", "--json")
    stats = {row["queue"]: row for row in json.loads(out)["queues"]}
    assert (stats["default"]["ready"], stats["default"]["scheduled"], stats["default"]["done"]) == (3, 1, 0)
    assert 90 <= stats["default"]["oldest_ready_age"] < 90 + 60  # the due item waiting longest, 90 s and the test's
    assert (stats["other"]["dead"], stats["other"]["dead_letters"], stats["other"]["ready"]) == (1, 1, 0)
    assert stats["other"]["oldest_ready_age"] is None
    assert DeadLetter.objects.count() == 1


def test_queue_stats_prints_a_table():
    engine.enqueue_many("queue_app.noop", [{}] * 2)
    out, _ = run("queue_stats")
    header, row = out.splitlines()
    assert header.split()[:4] == ["queue", "ready", "scheduled", "reserved"]  # the admin's vocabulary and order
    assert row.split()[:2] == ["default", "2"]


@pytest.mark.django_db(transaction=True)
def test_enqueue_and_queue_stats_from_the_command_line(manage):
    result = manage("enqueue", "queue_app.noop", "--count", "3")
    assert result.returncode == 0 and result.stdout.startswith("enqueued 3 items"), result.stderr
    stats = json.loads(manage("queue_stats", "--json").stdout)
    assert stats["queues"][0]["ready"] == 3
    bad = manage("enqueue", "queue_app.noop", "--payload", "[")
    assert bad.returncode == 1 and "--payload is not valid JSON" in bad.stderr
