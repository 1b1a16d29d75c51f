"""How far past its freshness policy a dataset is: the pure staleness_seconds() at its boundaries; the
jobsite_dataset_staleness_seconds / jobsite_dataset_fresh gauges scraped from a real /metrics response for fresh,
stale (max_age and partition_by), missing and policy-less datasets, read in one statement; and the dataset.stale
webhook event, sent once per staleness episode even by two checks at once (two threads, two connections)."""

import datetime as dt
import json
import queue
import threading
from dataclasses import dataclass

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from queue_app.datasets import Freshness, dataset
from queue_app.datasets.declarations import _code
from queue_app.datasets.freshness import staleness_seconds
from queue_app.datasets.locations import ROOTS_ENV
from queue_app.datasets.models import Materialization, StaleEpisode
from queue_app.datasets.services import record_materialization
from queue_app.datasets.stale import publish_stale
from queue_app.models import QueueItem
from queue_app.registry import get_task
from queue_app.webhooks.models import WebhookDelivery, WebhookEndpoint
from tests.support.waiting import wait_for

UTC = dt.UTC


@dataclass(frozen=True)
class Seen:
    partition: str
    at: dt.datetime


@pytest.fixture
def root(tmp_path, monkeypatch):
    """The one allowed dataset root, and no datasets but the ones a test declares."""
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path))
    declared_before = set(_code.entries())
    yield tmp_path
    for name in set(_code.entries()) - declared_before:
        _code.unregister(name)


def test_staleness_is_zero_while_fresh_and_counts_from_where_the_policy_was_missed(root):
    now = dt.datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
    aged = dataset("st_aged", location="aged", freshness=Freshness(max_age=dt.timedelta(hours=26)))
    assert staleness_seconds(aged, [Seen("", now - dt.timedelta(hours=26))], now) == 0.0  # exactly max_age: fresh
    assert staleness_seconds(aged, [Seen("", now - dt.timedelta(hours=26, seconds=1))], now) == 1.0
    assert staleness_seconds(aged, [Seen("", now - dt.timedelta(hours=30))], now) == 4 * 3600.0
    assert staleness_seconds(aged, [], now) is None  # missing: nothing to measure from

    daily = dataset(
        "st_daily", location="d/{partition}", partitioning="daily", freshness=Freshness(partition_by="06:00")
    )
    # At 09:00 on the 27th the 26th is due (since 06:00): the 26th is fresh, the 25th is 3 h late.
    assert staleness_seconds(daily, [Seen("2026-11-26", now)], now) == 0.0
    assert staleness_seconds(daily, [Seen("2026-11-25", now)], now) == 3 * 3600.0
    # Newest the 23rd: the 24th fell due on the 25th at 06:00, two days and three hours ago.
    assert staleness_seconds(daily, [Seen("2026-11-23", now)], now) == (2 * 24 + 3) * 3600.0
    # At 05:59 the 25th is still the one due: the 25th is fresh; the 24th is late since yesterday 06:00.
    early = dt.datetime(2026, 11, 27, 5, 59, tzinfo=UTC)
    assert staleness_seconds(daily, [Seen("2026-11-25", early)], early) == 0.0
    assert staleness_seconds(daily, [Seen("2026-11-24", early)], early) == (23 * 3600 + 59 * 60.0)
    # The newest partition wins whatever the order given; a key that is not a day gives no figure.
    assert staleness_seconds(daily, [Seen("2026-11-25", now), Seen("2026-11-26", now)], now) == 0.0
    assert staleness_seconds(daily, [Seen("", now)], now) is None

    assert staleness_seconds(dataset("st_none", location="n"), [Seen("", now)], now) is None  # no policy


def scrape(client) -> dict[tuple[str, str], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    return {
        (sample.name, sample.labels["dataset"]): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        if family.name.startswith("jobsite_dataset_")
        for sample in family.samples
    }


@pytest.mark.django_db
def test_metrics_export_each_datasets_staleness_and_freshness_from_one_statement(root, client):
    dataset("st_fresh", location="fresh", freshness=Freshness(max_age=dt.timedelta(hours=1)))
    dataset("st_old", location="old", freshness=Freshness(max_age=dt.timedelta(hours=1)))
    dataset("st_late", location="late/{partition}", partitioning="daily", freshness=Freshness(partition_by="06:00"))
    dataset("st_missing", location="missing", freshness=Freshness(max_age=dt.timedelta(hours=1)))
    dataset("st_nopolicy", location="nopolicy")
    record_materialization("st_fresh")
    old = record_materialization("st_old")
    old_at = timezone.now() - dt.timedelta(hours=3)
    Materialization.objects.filter(id=old.id).update(at=old_at)
    record_materialization("st_late", dt.date(2026, 1, 1))  # day 2026-01-02 fell due on 2026-01-03 at 06:00
    record_materialization("st_nopolicy")

    before = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        values = scrape(client)
    after = timezone.now()

    assert values["jobsite_dataset_fresh", "st_fresh"] == 1
    assert values["jobsite_dataset_staleness_seconds", "st_fresh"] == 0
    assert values["jobsite_dataset_fresh", "st_old"] == 0
    # An hour allowed, three old: two hours past the policy, as of the scrape.
    lo, hi = (t - old_at - dt.timedelta(hours=1) for t in (before, after))
    assert lo.total_seconds() <= values["jobsite_dataset_staleness_seconds", "st_old"] <= hi.total_seconds()
    assert values["jobsite_dataset_fresh", "st_late"] == 0
    overdue = dt.datetime(2026, 1, 3, 6, 0, tzinfo=UTC)
    lo, hi = ((t - overdue).total_seconds() for t in (before, after))
    assert lo <= values["jobsite_dataset_staleness_seconds", "st_late"] <= hi
    # Never materialized: not fresh, and no staleness figure (nothing to count from).
    assert values["jobsite_dataset_fresh", "st_missing"] == 0
    assert ("jobsite_dataset_staleness_seconds", "st_missing") not in values
    # No policy: neither gauge.
    assert not {key for key in values if key[1] == "st_nopolicy"}
    # Every dataset's newest materializations in one statement.
    assert sum("queue_app_materialization" in q["sql"] for q in queries.captured_queries) == 1

    # Materialized again: fresh, zero.
    record_materialization("st_old")
    record_materialization("st_missing")
    values = scrape(client)
    assert values["jobsite_dataset_fresh", "st_old"] == values["jobsite_dataset_fresh", "st_missing"] == 1
    assert values["jobsite_dataset_staleness_seconds", "st_old"] == 0
    assert values["jobsite_dataset_staleness_seconds", "st_missing"] == 0


def stale_events() -> list[dict]:
    bodies = WebhookDelivery.objects.filter(event_type="dataset.stale").order_by("id").values_list("body", flat=True)
    return [json.loads(body)["data"] for body in bodies]


def waiting_on_a_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        return cursor.fetchone() == ("Lock",)


@pytest.mark.django_db(transaction=True)
def test_the_stale_event_is_sent_once_per_episode_even_by_two_checks_at_once(root):
    WebhookEndpoint.objects.create(url="https://example.com/hook", secret="whsec_test", event_types=["dataset.stale"])
    dataset("st_episode", location="episode", freshness=Freshness(max_age=dt.timedelta(hours=1)))
    dataset("st_never", location="never", freshness=Freshness(max_age=dt.timedelta(hours=1)))
    first = record_materialization("st_episode")
    first_at = timezone.now() - dt.timedelta(hours=3)
    Materialization.objects.filter(id=first.id).update(at=first_at)

    # Check A records the episode and holds its transaction open; check B, on its own connection, waits on A's
    # row, and once A commits finds the episode recorded and sends nothing.
    published, release, b_pid, results = threading.Event(), threading.Event(), queue.Queue(), {}

    def check_a():
        try:
            with transaction.atomic():
                results["a"] = publish_stale()
                published.set()
                assert release.wait(120)
        finally:
            published.set()
            connection.close()

    def check_b():
        try:
            assert published.wait(120)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                b_pid.put(cursor.fetchone()[0])
            results["b"] = publish_stale()
        finally:
            connection.close()

    threads = [threading.Thread(target=check_a), threading.Thread(target=check_b)]
    for thread in threads:
        thread.start()
    pid = b_pid.get(timeout=120)
    wait_for(lambda: waiting_on_a_lock(pid), 120, what="check B waiting on check A's episode row")
    release.set()
    for thread in threads:
        thread.join(120)
    assert results == {"a": ["st_episode"], "b": []}
    (event,) = stale_events()
    assert event["dataset"] == "st_episode" and event["freshness_policy"] == {"max_age_seconds": 3600.0}
    assert dt.datetime.fromisoformat(event["overdue_since"]) == first_at + dt.timedelta(hours=1)
    assert dt.datetime.fromisoformat(event["last_materialized"]) == first_at
    assert event["staleness_seconds"] >= 7200
    # Still stale: the same episode, nothing sent; never materialized: no episode to send.
    assert publish_stale() == []
    assert StaleEpisode.objects.filter(dataset="st_episode").count() == 1
    assert not StaleEpisode.objects.filter(dataset="st_never").exists()

    # Fresh again: nothing; stale again: a new episode, a second event.
    second = record_materialization("st_episode")
    assert publish_stale() == []
    second_at = timezone.now() - dt.timedelta(hours=2)
    Materialization.objects.filter(id=second.id).update(at=second_at)
    assert publish_stale() == ["st_episode"]
    assert publish_stale() == []
    assert [dt.datetime.fromisoformat(e["overdue_since"]) for e in stale_events()] == [
        first_at + dt.timedelta(hours=1),
        second_at + dt.timedelta(hours=1),
    ]


@pytest.mark.django_db
def test_a_check_that_rolls_back_sends_nothing_and_leaves_the_episode_to_the_next(root):
    WebhookEndpoint.objects.create(url="https://example.com/hook", secret="whsec_test", event_types=["dataset.stale"])
    dataset("st_rollback", location="rollback", freshness=Freshness(max_age=dt.timedelta(hours=1)))
    row = record_materialization("st_rollback")
    Materialization.objects.filter(id=row.id).update(at=timezone.now() - dt.timedelta(hours=3))

    class Boom(Exception):
        pass

    with pytest.raises(Boom), transaction.atomic():
        assert publish_stale() == ["st_rollback"]
        raise Boom
    assert stale_events() == [] and not StaleEpisode.objects.exists()
    assert publish_stale() == ["st_rollback"]
    assert [e["dataset"] for e in stale_events()] == ["st_rollback"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_running_the_shipped_task_sends_the_event(root, worker):
    # The schedule's target run by a real worker (enqueued here rather than waiting for a minute's fire).
    WebhookEndpoint.objects.create(url="http://127.0.0.1:9/hook", secret="whsec_test", event_types=["dataset.stale"])
    # tests.tasks.datasets_declared, which the worker imports, declares "rollup" fresh for 26 h: 30 h old is stale.
    Materialization.objects.create(dataset="rollup", source="code", at=timezone.now() - dt.timedelta(hours=30))
    item = get_task("queue_app.dataset_staleness").enqueue({})
    proc = worker(
        "stale-check",
        "--queues",
        QueueItem.objects.get(id=item.id).queue_id,
        "--import",
        "tests.tasks.datasets_declared",
        env={ROOTS_ENV: str(root)},
    )
    try:
        wait_for(lambda: QueueItem.objects.get(id=item.id).state == "done", 120, what="the check to finish")
    finally:
        proc.terminate()
        proc.wait(60)
    assert [e["dataset"] for e in stale_events()] == ["rollup"]
    assert QueueItem.objects.get(id=item.id).result == {"stale": ["rollup"]}
