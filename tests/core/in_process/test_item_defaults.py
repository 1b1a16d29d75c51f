"""An item's delivery-derived defaults come from its task's declaration in one place (registry.item_defaults),
whichever path creates it: engine.enqueue and enqueue_many, the task's own enqueue, the enqueue command, a
schedule, an admin requeue, django.tasks. An at-most-once task's items get one attempt everywhere."""

import pytest
from django.utils import timezone

from queue_app import engine, scheduling, services
from queue_app.models import DeadLetter, ItemState, QueueItem, Schedule
from queue_app.registry import get_task, item_defaults
from tests.tasks import django_tasks_app as app

AMO = "queue_app.probe_at_most_once"
pytestmark = pytest.mark.django_db


def attempts(*ids: int) -> set[int]:
    return set(QueueItem.objects.filter(id__in=ids).values_list("max_attempts", flat=True))


def test_engine_enqueue_and_enqueue_many_take_the_tasks_attempts():
    one = engine.enqueue(AMO, {}).id
    many = engine.enqueue_many(AMO, [{}, {}])
    assert attempts(one, *many) == {1}
    flaky = engine.enqueue("queue_app.fail", {}).id  # Retry(times=3)
    assert attempts(flaky) == {3}


def test_the_tasks_own_enqueue_takes_the_same():
    task = get_task(AMO)
    assert attempts(task.enqueue({}).id, *task.enqueue_many([{}, {}])) == {1}


def test_a_task_without_a_count_takes_its_queues():
    assert item_defaults("queue_app.echo")["max_attempts"] is None
    assert attempts(engine.enqueue("queue_app.echo", {}).id) == {5}


def test_a_name_no_task_declares_takes_the_queues_defaults():
    assert item_defaults("nobody.declares.this") is None
    assert attempts(engine.enqueue("nobody.declares.this", {}).id) == {5}


def test_an_explicit_count_that_contradicts_at_most_once_is_refused_and_nothing_written():
    with pytest.raises(engine.InvalidEnqueue, match="at-most-once task, never retried: max_attempts=5"):
        engine.enqueue(AMO, {}, max_attempts=5)
    with pytest.raises(engine.InvalidEnqueue, match="at-most-once"):
        engine.enqueue_many(AMO, [{}], max_attempts=2)
    assert not QueueItem.objects.exists()


@pytest.mark.django_db(transaction=True)  # the command commits in its own process
def test_the_enqueue_command_takes_the_tasks_attempts(manage):
    for count in ("1", "3"):
        result = manage("enqueue", AMO, "--count", count)
        assert result.returncode == 0, result.stderr
    stored = QueueItem.objects.filter(task=AMO)
    assert stored.count() == 4
    assert set(stored.values_list("max_attempts", flat=True)) == {1}


def test_a_schedule_fire_takes_the_tasks_attempts():
    sched = Schedule.objects.create(name="amo", cron="* * * * *", target=AMO, enabled=False)
    fired = scheduling.run_now(sched)
    assert attempts(fired.item_id) == {1}


def test_a_django_task_declared_at_most_once_gets_one_attempt():
    result = app.notify_once.enqueue("hello")
    assert attempts(int(result.id)) == {1}


def test_requeue_gives_an_item_its_tasks_declared_attempts():
    # An item stored before its task's count was derived in one place (engine.enqueue stored the queue's 5).
    engine.ensure_queue("default")
    item = QueueItem.objects.create(queue_id="default", task=AMO, payload={}, state=ItemState.DEAD, max_attempts=5)
    DeadLetter.objects.create(item=item, reason="old", last_error="", died_at=timezone.now())
    assert services.requeue_items([item.id], actor="admin") == 1
    assert attempts(item.id) == {1}
