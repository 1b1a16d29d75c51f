"""The task registry (`@job`, Task, Retry) and the built-in tasks, in process."""

import pytest
from django.core.exceptions import ImproperlyConfigured

from queue_app import registry
from queue_app.models import QueueItem
from queue_app.registry import LEASE_MARGIN, Delivery, Retry, Task, UnknownTask, get_task, job
from tests.tasks import worker_tasks

BUILT_INS = [
    "queue_app.noop",
    "queue_app.echo",
    "queue_app.sleep",
    "queue_app.fail",
    "queue_app.probe",
    "queue_app.probe_at_most_once",
    "queue_app.probe_transactional",
    "queue_app.probe_chunk",
    "queue_app.probe_chunk_at_most_once",
]


@pytest.fixture
def scratch_registry(monkeypatch):
    """Register tasks for one test only."""
    monkeypatch.setattr(registry._tasks, "_entries", dict(registry.registered_tasks()))


def test_built_in_tasks_are_discovered_without_configuration():
    tasks = registry.registered_tasks()
    assert set(BUILT_INS) <= set(tasks)
    assert tasks["queue_app.probe"].delivery is Delivery.AT_LEAST_ONCE
    assert tasks["queue_app.probe_at_most_once"].delivery is Delivery.AT_MOST_ONCE
    assert tasks["queue_app.probe_transactional"].delivery is Delivery.TRANSACTIONAL
    assert tasks["queue_app.probe_chunk"].chunk.size == tasks["queue_app.probe_chunk_at_most_once"].chunk.size == 20


def test_unknown_task_name_raises_unknown_task():
    with pytest.raises(UnknownTask, match="unknown task: no.such.task"):
        get_task("no.such.task")
    assert registry.find_task("no.such.task") is None


def test_job_registers_handler_with_its_options(scratch_registry):
    @job("t.options", queue="mail", hard_timeout=5, lease_timeout=30, retry=Retry(times=4), dedup_window=60)
    def handler(payload, ctx):
        return payload

    task = get_task("t.options")
    assert isinstance(task, Task)
    assert (task.queue, task.hard_timeout, task.lease_timeout, task.dedup_window) == ("mail", 5.0, 30.0, 60)
    assert task.max_attempts == 4
    assert task.min_lease == 5 + LEASE_MARGIN
    assert task({"x": 1}, None) == {"x": 1}


def test_job_name_defaults_to_module_and_qualname(scratch_registry):
    @job()
    def unnamed(payload, ctx):
        return None

    assert get_task(f"{__name__}.test_job_name_defaults_to_module_and_qualname.<locals>.unnamed") is unnamed


def test_one_name_cannot_be_registered_by_two_handlers(scratch_registry):
    job("t.twice")(lambda payload, ctx: 1)
    with pytest.raises(ImproperlyConfigured, match="registered twice"):

        @job("t.twice")
        def other(payload, ctx):
            return 2


def test_at_most_once_task_cannot_ask_for_retries():
    with pytest.raises(ImproperlyConfigured, match="never retried"):
        job("t.amo", delivery="at_most_once", retry=Retry(times=3))


@pytest.mark.parametrize(
    "options",
    [{"hard_timeout": 0}, {"hard_timeout": float("nan")}, {"lease_timeout": -1}, {"delivery": "exactly_once"}],
)
def test_job_rejects_nonsense_options(options):
    with pytest.raises((TypeError, ValueError)):
        job("t.bad", **options)


def test_task_whose_lease_is_not_longer_than_hard_timeout_plus_margin_is_a_problem():
    bad = Task("t.lease", lambda p, c: None, hard_timeout=10, lease_timeout=10 + LEASE_MARGIN)
    good = Task("t.lease", lambda p, c: None, hard_timeout=10, lease_timeout=10 + LEASE_MARGIN + 0.1)
    derived = Task("t.lease", lambda p, c: None, hard_timeout=10)
    assert "not longer than its hard timeout" in bad.problems()[0]
    assert "'t.lease'" in bad.problems()[0]
    assert good.problems() == [] and derived.problems() == []


def test_retry_policy_retries_listed_exceptions_except_ignored_ones():
    policy = Retry(on=(OSError,), ignore=(FileNotFoundError,))
    assert policy.should_retry(ConnectionError())
    assert not policy.should_retry(FileNotFoundError())
    assert not policy.should_retry(ValueError())


def test_retry_delay_is_fixed_or_exponential_backoff():
    assert Retry(delay=2.5).retry_in(7) == 2.5
    waits = [Retry(backoff_base=1, backoff_max=100).retry_in(attempt) for attempt in (1, 2, 3, 4)]
    assert 0.7 <= waits[0] <= 1.3 and 5.5 <= waits[3] <= 10.5
    assert Retry(backoff_base=1, backoff_max=3).retry_in(10) <= 3 * 1.3


def test_retry_schedule_gives_each_wait_in_turn_and_repeats_its_last():
    policy = Retry(times=5, schedule=(5, 300, 1800))
    assert [policy.retry_in(attempt) for attempt in (1, 2, 3, 4, 9)] == [5, 300, 1800, 1800, 1800]


@pytest.mark.parametrize("schedule", [(), [5, 10], (5, -1), (float("inf"),), ("5",)])
def test_retry_schedule_must_be_a_tuple_of_seconds(schedule):
    with pytest.raises((TypeError, ValueError)):
        Retry(schedule=schedule)


@pytest.mark.parametrize("times", [0, -1, 1.5, True])
def test_retry_times_counts_attempts_and_is_at_least_one(times):
    with pytest.raises((TypeError, ValueError)):
        Retry(times=times)


@pytest.mark.django_db
def test_task_enqueue_applies_task_queue_and_attempts(scratch_registry):
    task = job("t.enqueue", queue="mail", retry=Retry(times=2))(lambda payload, ctx: None)
    item = task.enqueue({"a": 1})
    stored = QueueItem.objects.get(id=item.id)
    assert (stored.queue_id, stored.max_attempts, stored.task, stored.payload) == ("mail", 2, "t.enqueue", {"a": 1})
    ids = task.enqueue_many([{}, {}], queue="other")
    assert set(QueueItem.objects.filter(id__in=ids).values_list("queue_id", flat=True)) == {"other"}


@pytest.mark.django_db
def test_at_most_once_task_enqueues_single_attempt_items():
    item = get_task("queue_app.probe_at_most_once").enqueue({})
    assert QueueItem.objects.get(id=item.id).max_attempts == 1


def test_sleep_payload_decoder_rejects_what_it_cannot_sleep():
    decode = get_task("queue_app.sleep").decode
    assert decode({"seconds": 0.5}) == 0.5
    for bad in ({}, {"seconds": "1"}, {"seconds": -1}, {"seconds": float("inf")}, [], None):
        with pytest.raises(ValueError):
            decode(bad)


def test_test_tasks_module_registers_on_import():
    assert get_task("tests.sleepy") is worker_tasks.sleepy


def resolve_for_test(name: str):
    if name == "resolved.elsewhere":
        return Task(name, lambda payload, ctx: "resolved")
    if name == "resolver.breaks":
        raise RuntimeError("cannot resolve")
    return None


def test_names_no_job_registered_are_looked_up_by_the_resolvers(monkeypatch):
    monkeypatch.setattr(registry, "RESOLVERS", [f"{__name__}.resolve_for_test"])
    monkeypatch.setattr(registry, "_resolved", {})
    assert get_task("resolved.elsewhere")(None, None) == "resolved"
    assert registry.find_task("resolver.breaks") is None
    assert registry.find_task("nobody.at.all") is None


def test_django_tasks_backend_is_a_resolver():
    assert "queue_app.tasks_backend.job_spec_for" in registry.RESOLVERS
    assert registry.find_task("os.path.join") is None  # importable, but not a task
