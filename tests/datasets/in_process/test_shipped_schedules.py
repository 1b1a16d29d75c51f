"""The shipped every-minute schedules (issue 49, gap 4): "dataset-staleness" and "dataset-watch", as their
migrations write them (the suite deletes every schedule at set-up: tests/conftest.py), fire once a minute into
items of their tasks, and those items run: the first minute finds the stale dataset and the landed file, the next
finds nothing new (one event per staleness episode, one observation per set of files). In process: the
scheduler's own tick at chosen times, each item leased and run by the worker's run_job and settled."""

import datetime as dt
import importlib
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.db import connection
from django.utils import timezone

from queue_app import engine, scheduling
from queue_app.datasets import Freshness, dataset
from queue_app.datasets.declarations import _code
from queue_app.datasets.locations import ROOTS_ENV
from queue_app.datasets.models import Materialization
from queue_app.datasets.watches import _watches, watch
from queue_app.models import QueueItem, Schedule
from queue_app.worker.execute import Job, run_job

pytestmark = pytest.mark.django_db(transaction=True)  # run_job drops a connection left inside a transaction
EVERY_MINUTE = {"dataset-staleness": "queue_app.dataset_staleness", "dataset-watch": "queue_app.dataset_watch"}


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """The shipped schedules, written by their migrations' own functions; a dataset 30 h old against a 26 h
    policy, and a watched landing folder with one file."""
    editor = SimpleNamespace(connection=connection)
    for name in ("0004_shipped_schedules", "0028_dataset_stale_episodes", "0039_dataset_watch_schedule"):
        importlib.import_module(f"queue_app.migrations.{name}").create(apps, editor)
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path))
    declared, watches = set(_code.entries()), list(_watches)
    dataset("sched_rollup", location="rollup", freshness=Freshness(max_age=dt.timedelta(hours=26)))
    dataset("sched_events", location="landing/{partition}", partitioning="daily")
    watch("sched_events", "landing/{partition}/*.csv")
    Materialization.objects.create(dataset="sched_rollup", source="code", at=timezone.now() - dt.timedelta(hours=30))
    (tmp_path / "landing" / "2026-11-26").mkdir(parents=True)
    (tmp_path / "landing" / "2026-11-26" / "a.csv").write_text("a,b\n1,2\n")
    yield
    for name in set(_code.entries()) - declared:
        _code.unregister(name)
    _watches[:] = watches


def fire_and_run(at: dt.datetime) -> dict[str, object]:
    """Tick the scheduler at `at`; lease and run what the every-minute schedules queued: {schedule: result}."""
    fired = {f.schedule: f for f in scheduling.tick(now=at + dt.timedelta(seconds=1))}
    assert set(EVERY_MINUTE) <= set(fired)  # prune-done fires too, on its own ten-minute marks
    results = {}
    for name, task in EVERY_MINUTE.items():
        item = QueueItem.objects.get(id=fired[name].item_id)
        assert item.task == task
        # On a ten-minute mark the prune's item is queued first, in the same queue: lease past it.
        leased = engine.lease([item.queue_id], len(fired), "w1", lease_timeout=60)
        (held,) = [lease for lease in leased if lease.item_id == item.id]
        for other in leased:
            if other.item_id != item.id:
                engine.release(other)
        outcome = run_job(Job(held.reservation_id, held.item_id, held.queue, held.task, held.payload, 1, 3, "w1"))
        assert outcome.status == "ok", outcome
        engine.complete(held, outcome.result)
        results[name] = outcome.result
    return results


def test_the_every_minute_schedules_fire_each_minute_and_their_tasks_run(shipped):
    schedules = {s.name: (s.cron, s.target, s.enabled) for s in Schedule.objects.filter(name__in=EVERY_MINUTE)}
    assert schedules == {name: ("* * * * *", task, True) for name, task in EVERY_MINUTE.items()}
    start = Schedule.objects.get(name="dataset-staleness").next_fire_at  # the next whole minute

    first = fire_and_run(start)
    assert first["dataset-staleness"] == {"stale": ["sched_rollup"]}
    (observed,) = first["dataset-watch"]["observed"]
    assert Materialization.objects.get(id=observed).dataset == "sched_events"

    later = start + dt.timedelta(minutes=1)
    assert fire_and_run(later) == {"dataset-staleness": {"stale": []}, "dataset-watch": {"observed": []}}
    assert scheduling.tick(now=later + dt.timedelta(seconds=30)) == []  # each fire time once
