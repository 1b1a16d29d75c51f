"""The admin's screens: every one renders with data, detail pages are read-only and show the payload, attempt
timeline and dead-letter reason, lists filter and search on indexed columns only, and never count a whole
table."""

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from queue_app.admin.paginator import EstimatedCountPaginator
from queue_app.models import QueueItem, Reservation
from tests.support.admin_fixtures import (
    cancelled,
    dead,
    done,
    failed,
    fast_password_hashing_fixture,  # noqa: F401 (autouse)
    letter_of,
    live_worker,
    ready,
    reserved,
    url,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def items() -> dict[str, int]:
    """One item in each state in queue "mail", two ready ones in "billing", and a live worker."""
    made = {
        "ready": ready(dedup_key="order-42", ordering_key="account-7"),
        "reserved": reserved(),
        "done": done(),
        "retrying": failed(),
        "dead": dead(),
        "cancelled": cancelled(),
        "billing": ready("billing.charge", {"amount": 5}, queue="billing"),
    }
    ready("billing.refund", queue="billing")
    live_worker()
    return made


def ids_listed(response) -> set[int]:
    return {obj.pk for obj in response.context["cl"].result_list}


def test_every_list_renders_for_a_superuser(admin_client, items):
    for model in ("queueitem", "reservation", "deadletter", "queue", "worker"):
        response = admin_client.get(url(model))
        assert response.status_code == 200, model
        assert response.context["cl"].result_list, model


def test_every_detail_page_renders_for_a_superuser(admin_client, items):
    dead_id = items["dead"]
    pages = [
        url("queueitem", "change", dead_id),
        url("reservation", "change", Reservation.objects.filter(item_id=dead_id).first().pk),
        url("deadletter", "change", letter_of(dead_id).pk),
        url("queue", "change", "mail"),
        url("worker", "change", "worker-1"),
    ]
    for page in pages:
        assert admin_client.get(page).status_code == 200, page


def test_item_detail_shows_payload_pretty_printed(admin_client):
    item_id = dead(payload={"order": 42, "lines": [1, 2]})

    html = admin_client.get(url("queueitem", "change", item_id)).content.decode()

    # jsonb keeps keys in its own order (shorter first, then alphabetical)
    assert (
        '<pre class="queue-json">{\n  &quot;lines&quot;: [\n    1,\n    2\n  ],\n  &quot;order&quot;: 42\n}</pre>'
        in html
    )


def test_item_detail_shows_the_attempt_timeline_with_traceback(admin_client):
    item_id = dead(error="KeyError: 't.dead'", traceback="Traceback (most recent call last):\nKeyError: boom")
    reservation = Reservation.objects.get(item_id=item_id)

    html = admin_client.get(url("queueitem", "change", item_id)).content.decode()

    assert 'class="queue-timeline"' in html
    assert url("reservation", "change", reservation.pk) in html
    assert "worker-1" in html
    assert "<summary>traceback</summary>" in html
    assert "Traceback (most recent call last):\nKeyError: boom" in html


def test_item_pages_show_times_to_the_second(admin_client):
    """A retry's backoff is seconds long: the detail page and its attempt timeline show seconds."""
    item_id = failed()
    item = QueueItem.objects.get(id=item_id)
    reservation = Reservation.objects.get(item_id=item_id)
    stamp = "%Y-%m-%d %H:%M:%S UTC"

    html = admin_client.get(url("queueitem", "change", item_id)).content.decode()

    assert f'<div class="readonly">{item.run_at.strftime(stamp)}</div>' in html
    assert f'<div class="readonly">{item.created_at.strftime(stamp)}</div>' in html
    assert f"<td>{reservation.reserved_at.strftime(stamp)}</td>" in html
    assert f"<td>{reservation.finished_at.strftime(stamp)}</td>" in html


def test_webhook_attempts_are_named_by_their_delivery_not_as_a_fraction(admin_client):
    from queue_app.webhooks import services as webhooks
    from queue_app.webhooks.models import WebhookAttempt

    endpoint = webhooks.create_endpoint("https://example.com/hook", ["test"]).endpoint
    (delivery,) = webhooks.send_test_event([endpoint.pk])
    for attempt, code in ((1, 503), (2, 200)):
        WebhookAttempt.objects.create(delivery=delivery, attempt=attempt, status_code=code)

    html = admin_client.get(url("webhookdelivery", "change", delivery.pk)).content.decode()

    assert f"delivery {delivery.pk}, attempt 2: 200" in html
    assert f"attempt 2 of {delivery.pk}" not in html


def test_item_detail_shows_the_dead_letter_reason(admin_client):
    item_id = dead(reason="poison: payload is not JSON")

    html = admin_client.get(url("queueitem", "change", item_id)).content.decode()

    assert "<strong>poison: payload is not JSON</strong>" in html


@pytest.mark.django_db(transaction=True)  # lease deadlines against the server's clock, not a frozen now()
def test_an_at_most_once_item_whose_worker_stopped_mid_run_shows_why_and_when_it_started(admin_client):
    from queue_app import engine
    from queue_app.engine.sql import DeadReason
    from queue_app.models import DeadLetter

    item_id = engine.enqueue("queue_app.probe_at_most_once", {}).id
    [lease] = engine.lease(None, 1, "w-dies", lease_timeout=0.3)
    assert engine.start_at_most_once([lease]) == []  # its handler starts; then the worker dies
    time.sleep(0.4)
    assert engine.rescue_expired() == (0, 1)

    letter = DeadLetter.objects.get(item_id=item_id)
    for page in (url("deadletter", "changelist"), url("deadletter", "change", letter.pk)):
        assert DeadReason.AT_MOST_ONCE_STOPPED in admin_client.get(page).content.decode()
    html = admin_client.get(url("queueitem", "change", item_id)).content.decode()
    assert "at-most-once run started" in html and "it may have run partly" in html


def test_detail_pages_are_read_only(admin_client, items):
    response = admin_client.get(url("queueitem", "change", items["dead"]))
    html = response.content.decode()

    assert response.context["has_change_permission"] is False
    assert 'name="_save"' not in html
    assert 'name="task"' not in html
    assert admin_client.post(url("queueitem", "change", items["dead"]), {"task": "x"}).status_code == 403
    assert QueueItem.objects.get(id=items["dead"]).task == "t.dead"


@pytest.mark.parametrize("model", ["queueitem", "reservation", "deadletter", "queue", "worker"])
def test_nothing_is_added_or_deleted_through_the_admin(admin_client, items, model):
    assert admin_client.get(url(model, "add")).status_code == 403
    html = admin_client.get(url(model)).content.decode()
    assert 'value="delete_selected"' not in html


def test_queue_options_are_the_only_editable_fields(admin_client, items):
    form = admin_client.get(url("queue", "change", "mail")).context["adminform"].form

    assert set(form.fields) == {
        *("concurrency_limit", "lease_timeout", "max_attempts", "retention"),
        *("rate_limit", "rate_period", "group_concurrency", "fair", "group_weights", "aging_rate"),
    }


# -- search ---------------------------------------------------------------------------------------------------


def test_search_finds_an_item_by_exact_id(admin_client, items):
    for term in (str(items["done"]), f"#{items['done']}"):
        assert ids_listed(admin_client.get(url("queueitem"), {"q": term})) == {items["done"]}


def test_search_finds_an_item_by_dedup_key(admin_client, items):
    assert ids_listed(admin_client.get(url("queueitem"), {"q": "order-42"})) == {items["ready"]}


def test_search_finds_an_item_by_ordering_key(admin_client, items):
    assert ids_listed(admin_client.get(url("queueitem"), {"q": "account-7"})) == {items["ready"]}


def test_search_matches_whole_keys_only(admin_client, items):
    assert ids_listed(admin_client.get(url("queueitem"), {"q": "order-4"})) == set()
    assert ids_listed(admin_client.get(url("queueitem"), {"q": "billing"})) == set()  # no payload/task scan


def test_search_finds_a_dead_letter_by_its_id_its_item_id_or_the_items_key(admin_client):
    item_id = dead(dedup_key="invoice-9")
    letter = letter_of(item_id)
    dead()

    for term in (str(letter.pk), str(item_id), "invoice-9"):
        assert ids_listed(admin_client.get(url("deadletter"), {"q": term})) == {letter.pk}, term


# -- filters --------------------------------------------------------------------------------------------------


def test_items_filter_by_queue(admin_client, items):
    listed = ids_listed(admin_client.get(url("queueitem"), {"queue__name__exact": "billing"}))

    assert items["billing"] in listed
    assert listed == set(QueueItem.objects.filter(queue_id="billing").values_list("id", flat=True))


def test_items_filter_by_state(admin_client, items):
    assert ids_listed(admin_client.get(url("queueitem"), {"state__exact": "dead"})) == {items["dead"]}


def test_items_read_their_state_in_queue_stats_vocabulary(admin_client, items):
    """A ready item whose retry (or delay) is due later is "scheduled", as `queue_stats` counts it; "ready" is due
    now. The list, its filter and the detail page say the same."""
    from queue_app.management.commands.queue_stats import queue_stats

    mail = next(row for row in queue_stats() if row["queue"] == "mail")
    assert (mail["ready"], mail["scheduled"]) == (1, 1)
    assert ids_listed(admin_client.get(url("queueitem"), {"state__exact": "scheduled"})) == {items["retrying"]}
    due = ids_listed(admin_client.get(url("queueitem"), {"state__exact": "ready", "queue__name__exact": "mail"}))
    assert due == {items["ready"]}
    html = admin_client.get(url("queueitem"), {"queue__name__exact": "mail"}).content.decode()
    assert '<td class="field-state_shown">scheduled</td>' in html
    assert '<td class="field-state_shown">ready</td>' in html
    page = admin_client.get(url("queueitem", "change", items["retrying"])).content.decode()
    assert '<div class="readonly">scheduled</div>' in page
    title = f"#{items['retrying']} t.retry (scheduled)"
    assert f"<h2>{title}</h2>" in page and f'<li aria-current="page">{title}</li>' in page  # not "(ready)"


def test_items_filter_by_task_lists_registered_tasks_and_those_of_finished_items(admin_client, items):
    QueueItem.objects.filter(id=items["cancelled"]).update(task="billing.void")  # finished, not registered
    response = admin_client.get(url("queueitem"), {"task": "billing.charge"})

    assert ids_listed(response) == {items["billing"]}
    page = response.content.decode()
    assert "?task=billing.void" in page  # from item_task_not_done
    assert "?task=queue_app.noop" in page  # registered, no item yet
    # Open items of a task nobody registered ("billing.refund") are offered once they finish (as dead letters,
    # when a worker meets them): an index of open items' tasks would cost every enqueue and lease one more entry.


def test_items_filter_by_creation_time(admin_client, items):
    QueueItem.objects.filter(id=items["done"]).update(created_at=timezone.now() - timedelta(days=3))

    last_day = ids_listed(admin_client.get(url("queueitem"), {"created": "24h"}))
    last_week = ids_listed(admin_client.get(url("queueitem"), {"created": "7d"}))

    assert items["done"] not in last_day
    assert items["ready"] in last_day
    assert items["done"] in last_week


def test_dead_letters_filter_by_queue_task_status_and_time(admin_client):
    mail = letter_of(dead("mail.send", queue="mail")).pk
    billing = letter_of(dead("billing.charge", queue="billing")).pk
    old = letter_of(dead("mail.send", queue="mail"))
    old.died_at = timezone.now() - timedelta(days=2)
    old.requeued_at = timezone.now()
    old.save()

    def listed(**params):
        return ids_listed(admin_client.get(url("deadletter"), params))

    assert listed(item__queue__name__exact="billing") == {billing}
    assert listed(task="mail.send") == {mail, old.pk}
    assert listed(status="open") == {mail, billing}
    assert listed(status="requeued") == {old.pk}
    assert listed(died="24h") == {mail, billing}


@pytest.mark.django_db(transaction=True)  # the engine's own clock: each step commits, as a worker's would
def test_open_dead_letters_are_those_of_dead_items_through_a_requeue_and_a_second_death(admin_client):
    """The "open" filter also says the item is dead (so the planner can use the dead items' indexes): true of
    every open letter, as a requeue closes its item's letters and a second death writes a new one."""
    from queue_app import engine, services
    from queue_app.models import DeadLetter, ItemState

    def die(item_id):
        (held,) = engine.lease(["mail"], 1, "w1")
        assert held.item_id == item_id
        engine.fail(held, "boom", retry_in=0)

    engine.ensure_queue("mail")
    (twice,) = engine.enqueue_many("mail.send", [{}], queue="mail", max_attempts=1)
    die(twice)
    first = letter_of(twice).pk
    services.requeue_dead_letters([first], actor="test")
    assert ids_listed(admin_client.get(url("deadletter"), {"status": "open"})) == set()
    die(twice)
    second = DeadLetter.objects.get(item_id=twice, requeued_at__isnull=True).pk

    assert ids_listed(admin_client.get(url("deadletter"), {"status": "open", "task": "mail.send"})) == {second}
    assert ids_listed(admin_client.get(url("deadletter"), {"status": "requeued"})) == {first}
    assert not DeadLetter.objects.filter(requeued_at__isnull=True).exclude(item__state=ItemState.DEAD).exists()


def test_reservations_filter_by_outcome(admin_client, items):
    listed = ids_listed(admin_client.get(url("reservation"), {"outcome__exact": "dead"}))

    assert listed == set(Reservation.objects.filter(item_id=items["dead"]).values_list("id", flat=True))


def test_reservations_are_searched_by_id_item_id_or_worker_id(admin_client, items):
    attempt = Reservation.objects.filter(item_id=items["dead"]).order_by("id").first()
    by_item = set(Reservation.objects.filter(item_id=items["dead"]).values_list("id", flat=True))

    def found(term):
        return ids_listed(admin_client.get(url("reservation"), {"q": term}))

    assert found(str(items["dead"])) >= by_item
    assert attempt.id in found(f"#{attempt.id}")
    assert found(attempt.worker_id) == set(
        Reservation.objects.filter(worker_id=attempt.worker_id).values_list("id", flat=True)
    )
    with CaptureQueriesContext(connection) as queries:  # a number is an id: no read of worker_id
        found("987654321")
    assert not any('"worker_id" = ' in q["sql"] for q in queries)


def test_workers_filter_by_heartbeat(admin_client):
    live_worker("fresh")
    live_worker("silent", age=timedelta(minutes=10))

    assert ids_listed(admin_client.get(url("worker"), {"alive": "yes"})) == {"fresh"}
    assert ids_listed(admin_client.get(url("worker"), {"alive": "no"})) == {"silent"}


# -- scale ----------------------------------------------------------------------------------------------------


def test_lists_shorten_payloads_and_errors_and_details_show_them_whole(admin_client):
    long_text = "x" * 500
    item_id = dead(payload={"blob": long_text}, error="E" * 500)

    listed = admin_client.get(url("queueitem")).content.decode()
    detail = admin_client.get(url("queueitem", "change", item_id)).content.decode()

    assert long_text not in listed
    assert "x" * 60 in listed
    assert "E" * 500 not in listed
    assert long_text in detail
    assert "E" * 500 in detail


def test_item_list_reads_only_the_head_of_each_payload(admin_client, items):
    with CaptureQueriesContext(connection) as queries:
        admin_client.get(url("queueitem"))

    listing = [q["sql"] for q in queries if q["sql"].startswith('SELECT "queue_app_queueitem"."id", ')]
    assert listing
    assert all('"queue_app_queueitem"."payload",' not in sql for sql in listing)
    assert all("LEFT(" in sql for sql in listing)


def test_change_lists_never_count_a_whole_table(admin_client, items):
    with connection.cursor() as cur:  # statistics of these few rows (an earlier test's may say millions)
        cur.execute("ANALYZE queue_app_queueitem, queue_app_deadletter, queue_app_reservation")
    for model in ("queueitem", "deadletter", "reservation"):
        for params in ({}, {"q": "order-42"}):
            with CaptureQueriesContext(connection) as queries:
                admin_client.get(url(model), params)
            counts = [q["sql"] for q in queries if "COUNT(" in q["sql"].upper()]
            assert counts, model
            assert all("LIMIT" in sql for sql in counts), counts
            if params:  # a filtered count reads in the list's order, newest first, as the page does
                own = [sql for sql in counts if f'FROM "queue_app_{model}"' in sql]  # not the Item history note's
                assert own and all("ORDER BY" in sql and "DESC LIMIT" in sql for sql in own), counts


def test_unfiltered_list_count_is_the_table_estimate(admin_client, items, monkeypatch):
    monkeypatch.setattr(EstimatedCountPaginator, "cap", 3)
    with connection.cursor() as cur:
        cur.execute("ANALYZE queue_app_queueitem")
    total = QueueItem.objects.count()

    response = admin_client.get(url("queueitem"))

    assert response.context["cl"].paginator.estimated
    assert f"about {total:,}" in response.content.decode()


def test_filtered_list_count_stops_at_the_cap(admin_client, monkeypatch):
    monkeypatch.setattr(EstimatedCountPaginator, "cap", 3)
    for _ in range(5):
        ready("t.many")

    response = admin_client.get(url("queueitem"), {"task": "t.many"})

    assert response.context["cl"].paginator.capped
    assert "3+" in response.content.decode()
    assert len(ids_listed(response)) == 5


def test_spark_charts_say_what_the_last_analytics_run_covered_when_it_found_nothing(admin_client):
    """A queue_analytics run that read an empty range leaves no statistics: the page says it ran, over which
    range, and that it found no attempts (not "trigger a run")."""
    from queue_app.spark.models import SparkRun

    charts = reverse("admin:jobsite_spark_sparkrun_charts")
    assert "no <code>queue_analytics</code> run has finished" in admin_client.get(charts).content.decode()
    run = SparkRun.objects.create(
        job="queue_analytics",
        state="succeeded",
        params={"since": "2026-11-26"},
        metrics={"since": "2026-11-26T00:00:00+00:00", "until": "2026-11-27T00:00:00+00:00", "attempts": 0},
        started_at=timezone.now(),
        finished_at=timezone.now(),
    )

    html = " ".join(admin_client.get(charts).content.decode().split())

    assert f"queue_analytics run #{run.id}</a> succeeded" in html
    assert "it covered 2026-11-26 00:00 – 2026-11-27 00:00 UTC and found no attempts there" in html
    assert "no <code>queue_analytics</code> run has finished" not in html
