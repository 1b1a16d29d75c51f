"""Webhooks against a real HTTP receiver on loopback, delivered by the real worker (its supervisor in process,
thread pool): Standard Webhooks signatures, the providers' retry schedule with the clock driven (the item made
due at once, never slept for), one webhook-id across retries, ordering, rate limits, disabling, SSRF refusals,
events raised in SQL. Kill -9 mid-delivery is in test_webhooks_processes.py, the receiving helper in
test_webhooks_receiver.py."""

import json
import socket
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from queue_app import engine, services
from queue_app.models import DeadLetter, ItemState, QueueItem, Reservation, Worker
from queue_app.registry import get_task
from queue_app.spark.models import SparkRun
from queue_app.webhooks import InvalidEvent, publish_event
from queue_app.webhooks import services as webhooks
from queue_app.webhooks.events import WEBHOOK_QUEUE
from queue_app.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from queue_app.webhooks.sender import RESPONSE_CHARS
from queue_app.webhooks.tasks import ATTEMPTS, RETRY_SCHEDULE
from queue_app.webhooks.triggers import ITEM_TRIGGER
from queue_app.worker import Supervisor, WorkerOptions
from queue_app.worker.execute import Job, run_job
from tests.support.webhook_receiver import start_receiver

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def allow_private(settings):
    settings.JOBSITE = {**settings.JOBSITE, "WEBHOOKS_ALLOW_PRIVATE": True, "WEBHOOKS_READ_TIMEOUT": 1.0}


@pytest.fixture
def receiver(allow_private):
    receiver = start_receiver()
    yield receiver
    receiver.release.set()
    receiver.server.shutdown()
    receiver.server.server_close()


def run_worker(concurrency: int = 2) -> None:
    """Run the worker in process until nothing is ready or in flight (a burst worker)."""
    options = WorkerOptions(pool="thread", concurrency=concurrency, burst=True, poll_interval=0.05, scheduler=False)
    assert Supervisor(options).run() == 0


def drive_clock(delivery: WebhookDelivery) -> float:
    """The seconds the engine set the delivery's item to wait, then make it due now (instead of sleeping)."""
    item = QueueItem.objects.get(id=delivery.item_id)
    last = Reservation.objects.filter(item_id=item.id).order_by("-id").first()
    waited = (item.visible_at - last.finished_at).total_seconds()
    assert services.retry_now([item.id]) == 1
    return waited


def endpoint(url: str, *types: str, **options) -> tuple[WebhookEndpoint, str]:
    created = webhooks.create_endpoint(url, list(types) or ["test"], **options)
    return created.endpoint, created.secret


def test_delivery_carries_standard_webhooks_headers_that_verify_with_the_library(receiver):
    hook, secret = endpoint(receiver.url, "test")
    (delivery,) = publish_event("test", {"order": 42})
    run_worker()
    (request,) = receiver.wait_for(1)
    event = Webhook(secret).verify(request.body, request.headers)
    assert event["type"] == "test" and event["data"] == {"order": 42} and event["timestamp"]
    assert request.headers["webhook-id"] == delivery.webhook_id
    assert request.headers["webhook-signature"].startswith("v1,")
    assert webhooks.delivery_states([delivery]) == {delivery.id: "delivered"}
    attempt = WebhookAttempt.objects.get(delivery=delivery)
    assert attempt.status_code == 200 and attempt.latency_ms > 0 and attempt.response_body == "ok"
    with pytest.raises(Exception, match="signature"):
        Webhook(webhooks.rotate_secret(hook.id) and "whsec_" + "A" * 43).verify(request.body, request.headers)


def test_a_success_is_recorded_and_its_item_settled_in_one_transaction(receiver):
    """Issue 50: no reader sees a delivery delivered (delivered_at, the attempt's 200) while its item is still
    held. The handler runs here as the worker runs it (worker/execute.run_job), and the item is read before the
    worker's own settle would come: it is done already, settled with the attempt's record."""
    endpoint(receiver.url, "test")
    (delivery,) = publish_event("test", {"n": 1})
    (held,) = engine.lease([WEBHOOK_QUEUE], 1, "test")
    assert held.item_id == delivery.item_id
    job = Job(
        reservation_id=held.reservation_id,
        item_id=held.item_id,
        queue=held.queue,
        task=held.task,
        payload=held.payload,
        attempt=held.attempt,
        max_attempts=held.max_attempts,
        worker_id="test",
    )
    outcome = run_job(job)
    assert (outcome.status, outcome.result) == ("settled", {"status_code": 200})  # nothing left for the worker
    delivery.refresh_from_db()
    assert delivery.delivered_at is not None
    assert QueueItem.objects.get(id=delivery.item_id).state == ItemState.DONE
    assert webhooks.delivery_states([delivery]) == {delivery.id: "delivered"}


def test_retries_on_500_follow_the_providers_schedule_under_one_webhook_id(receiver):
    endpoint(receiver.url, "test")
    receiver.answer(500, times=3)
    (delivery,) = publish_event("test", {"n": 1})
    waits = []
    for _ in range(3):
        run_worker()
        waits.append(drive_clock(delivery))
    run_worker()
    requests = receiver.wait_for(4)
    assert [round(w) for w in waits] == [round(s) for s in RETRY_SCHEDULE[:3]]  # 5 s, 5 min, 30 min
    assert {r.headers["webhook-id"] for r in requests} == {delivery.webhook_id}
    attempts = list(WebhookAttempt.objects.filter(delivery=delivery).order_by("id"))
    assert [a.status_code for a in attempts] == [500, 500, 500, 200]
    assert [a.attempt for a in attempts] == [1, 2, 3, 4]
    assert len(attempts[0].response_body) <= RESPONSE_CHARS and attempts[0].error == "HTTP 500"
    delivery.refresh_from_db()
    assert (delivery.attempt_count, delivery.last_status_code) == (4, 200)


def test_a_timeout_and_a_refused_connection_are_retried_on_the_schedule(receiver):
    endpoint(receiver.url, "test")
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    refused, _ = endpoint(f"http://127.0.0.1:{closed_port}/hook", "test")
    receiver.answer(200, delay=2.0)  # past the 1 s read timeout
    deliveries = publish_event("test", {})
    run_worker()
    by_endpoint = {d.endpoint_id: d for d in deliveries}
    errors = {d.endpoint_id: WebhookAttempt.objects.get(delivery=d).error for d in deliveries}
    assert errors[refused.id].startswith("connection failed")
    assert [e for k, e in errors.items() if k != refused.id][0].startswith("read timeout")
    for d in deliveries:
        assert round(drive_clock(d)) == RETRY_SCHEDULE[0]
        assert QueueItem.objects.get(id=d.item_id).attempts == 1
    run_worker()
    assert webhooks.delivery_states(deliveries) == {
        by_endpoint[refused.id].id: "pending",
        next(d.id for d in deliveries if d.endpoint_id != refused.id): "delivered",
    }
    assert round(drive_clock(by_endpoint[refused.id])) == RETRY_SCHEDULE[1]


def test_a_delivery_failing_every_attempt_becomes_a_dead_letter_and_can_be_replayed(receiver):
    endpoint(receiver.url, "test")
    receiver.answer(503, times=ATTEMPTS)
    (delivery,) = publish_event("test", {})
    for attempt in range(1, ATTEMPTS + 1):
        run_worker()
        if attempt < ATTEMPTS:
            assert round(drive_clock(delivery)) == RETRY_SCHEDULE[attempt - 1]
    assert QueueItem.objects.get(id=delivery.item_id).state == ItemState.DEAD
    assert DeadLetter.objects.filter(item_id=delivery.item_id).exists()
    assert webhooks.delivery_states([delivery]) == {delivery.id: "failed"}
    assert webhooks.failed_since(timezone.now() - timedelta(hours=1)) == [delivery.id]
    assert webhooks.replay_deliveries([delivery.id], actor="ops") == 1
    run_worker()
    requests = receiver.wait_for(ATTEMPTS + 1)
    assert {r.headers["webhook-id"] for r in requests} == {delivery.webhook_id}
    assert webhooks.delivery_states([delivery]) == {delivery.id: "delivered"}


def test_ordered_endpoint_receives_in_publish_order_even_when_the_first_is_retried(receiver):
    endpoint(receiver.url, "test", ordered=True)
    receiver.answer(500)
    deliveries = [publish_event("test", {"n": n})[0] for n in range(6)]
    run_worker(concurrency=4)
    assert len(receiver.requests) == 1  # the rest wait behind the retried first one
    drive_clock(deliveries[0])
    run_worker(concurrency=4)
    received = [json.loads(r.body)["data"]["n"] for r in receiver.wait_for(7)]
    assert received == [0, 0, 1, 2, 3, 4, 5]


def test_rate_limit_spaces_requests_to_one_endpoint(receiver):
    endpoint(receiver.url, "test", rate_limit=5.0)
    for n in range(6):
        publish_event("test", {"n": n})
    run_worker(concurrency=4)
    times = sorted(r.at for r in receiver.wait_for(6))
    # Six send slots at 5/s span a second; arrivals jitter by each request's latency on a busy machine.
    assert times[-1] - times[0] >= 0.6  # unlimited, four threads send all six within a few tens of ms


def test_a_slot_too_far_away_hands_the_item_back_without_spending_its_attempt(receiver):
    endpoint(receiver.url, "test", rate_limit=0.05)  # one request per 20 s
    deliveries = [publish_event("test", {"n": n})[0] for n in range(2)]
    run_worker()  # two threads: whichever claims the slot first sends, the other is handed back
    assert len(receiver.wait_for(1)) == 1
    states = webhooks.delivery_states(deliveries)
    assert sorted(states.values()) == ["delivered", "pending"], states
    (waiting,) = (d for d in deliveries if states[d.id] == "pending")
    item = QueueItem.objects.get(id=waiting.item_id)
    assert (item.state, item.attempts) == (ItemState.READY, 0)  # handed back, its attempt not spent
    assert (item.visible_at - timezone.now()).total_seconds() > 5  # back when its slot is near
    assert not WebhookAttempt.objects.filter(delivery=waiting).exists()


def test_disabled_endpoint_gets_nothing(receiver):
    hook, _ = endpoint(receiver.url, "test")
    (queued,) = publish_event("test", {"before": "disable"})
    assert webhooks.set_enabled([hook.id], False) == 1
    assert publish_event("test", {"after": "disable"}) == []
    assert webhooks.send_test_event([hook.id]) == []
    run_worker()
    # The handler posts, and the receiver records the request before answering it, before the item is settled:
    # settled (skipped) with no request recorded, the endpoint got nothing.
    item = QueueItem.objects.get(id=queued.item_id)
    assert (item.state, item.result) == (ItemState.DONE, {"skipped": "endpoint disabled"})
    assert receiver.requests == []
    assert webhooks.delivery_states([queued]) == {queued.id: "skipped"}


def test_publish_event_rolls_back_with_the_callers_transaction(receiver):
    endpoint(receiver.url, "test")
    with pytest.raises(RuntimeError), transaction.atomic():
        assert len(publish_event("test", {"x": 1})) == 1
        raise RuntimeError("the caller's transaction fails")
    assert not WebhookDelivery.objects.exists()
    assert not QueueItem.objects.filter(queue_id="webhooks").exists()
    run_worker()
    assert receiver.requests == []


@pytest.mark.parametrize("event_type, data", [("no.such.event", {}), ("test", {"x": float("nan")})])
def test_publish_event_refuses_unknown_types_and_data_that_is_not_json(event_type, data):
    with pytest.raises(InvalidEvent):
        publish_event(event_type, data)


def test_rotation_signs_with_the_old_and_the_new_secret_during_the_window(receiver):
    hook, old = endpoint(receiver.url, "test")
    new = webhooks.rotate_secret(hook.id, window=timedelta(hours=1))
    publish_event("test", {})
    run_worker()
    (request,) = receiver.wait_for(1)
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):
        Webhook(secret).verify(request.body, request.headers)
    WebhookEndpoint.objects.filter(id=hook.id).update(previous_secret_until=timezone.now())
    publish_event("test", {})
    run_worker()
    second = receiver.wait_for(2)[1]
    Webhook(new).verify(second.body, second.headers)
    with pytest.raises(Exception, match="signature"):
        Webhook(old).verify(second.body, second.headers)


def test_endpoint_failing_for_days_is_disabled_with_a_message_and_an_event(receiver):
    failing, _ = endpoint(receiver.url, "test")
    watcher, _ = endpoint(receiver.url + "/watch", "webhook_endpoint.disabled")
    receiver.answer(500)
    publish_event("test", {})
    WebhookEndpoint.objects.filter(id=failing.id).update(failing_since=timezone.now() - timedelta(days=6))
    run_worker()
    failing.refresh_from_db()
    assert not failing.enabled and "disabled automatically" in failing.disabled_reason
    requests = receiver.wait_for(2)
    event = json.loads(next(r.body for r in requests if r.path.endswith("/watch")))
    assert event["type"] == "webhook_endpoint.disabled" and event["data"]["endpoint_id"] == failing.id


def test_a_success_clears_the_endpoints_failing_since(receiver):
    hook, _ = endpoint(receiver.url, "test")
    receiver.answer(500)
    (delivery,) = publish_event("test", {})
    run_worker()
    assert WebhookEndpoint.objects.get(id=hook.id).failing_since is not None
    drive_clock(delivery)
    run_worker()
    assert WebhookEndpoint.objects.get(id=hook.id).failing_since is None


# -- SSRF and bad input ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, message",
    [
        ("http://127.0.0.1:8000/", "loopback"),
        ("http://localhost/", "loopback"),
        ("http://169.254.169.254/latest/meta-data/", "link-local"),
        ("http://10.0.0.5/hook", "private"),
        ("http://[::1]/hook", "loopback"),
        ("http://[::ffff:192.168.1.1]/", "private"),
        ("http://0.0.0.0/", "unspecified"),
    ],
)
def test_private_loopback_and_link_local_targets_are_refused_with_a_clear_error(url, message):
    with pytest.raises(webhooks.EndpointInvalid) as refused:
        webhooks.create_endpoint(url, ["test"])
    assert message in refused.value.errors["url"] and "JOBSITE_WEBHOOKS_ALLOW_PRIVATE" in refused.value.errors["url"]
    assert not WebhookEndpoint.objects.exists()


def test_a_name_resolving_to_loopback_is_refused_at_send_time_and_nothing_is_sent(receiver, settings):
    hook, _ = endpoint(receiver.url.replace("127.0.0.1", "localhost"), "test")  # accepted while allowed
    settings.JOBSITE = {**settings.JOBSITE, "WEBHOOKS_ALLOW_PRIVATE": False}
    (delivery,) = publish_event("test", {})
    run_worker()
    attempt = WebhookAttempt.objects.get(delivery=delivery)
    assert attempt.status_code is None and "refused" in attempt.error and "loopback" in attempt.error
    assert "JOBSITE_WEBHOOKS_ALLOW_PRIVATE=1 allows it" in attempt.error  # what the deliveries list shows: the switch
    assert receiver.requests == []


def test_redirects_are_not_followed(receiver):
    endpoint(receiver.url, "test")
    receiver.answer(302)
    (delivery,) = publish_event("test", {})
    run_worker()
    attempt = WebhookAttempt.objects.get(delivery=delivery)
    assert attempt.status_code == 302 and "not followed" in attempt.error
    assert len(receiver.requests) == 1
    assert QueueItem.objects.get(id=delivery.item_id).state == ItemState.READY  # a failed attempt, retried


@pytest.mark.parametrize(
    "fields, field, message",
    [
        ({"url": "ftp://example.com/x"}, "url", "only http and https"),
        ({"url": "javascript:alert(1)"}, "url", "only http and https"),
        ({"url": "https://"}, "url", "no host"),
        ({"url": "https://user:pw@example.com/"}, "url", "credentials"),
        ({"url": "https://exa mple.com/"}, "url", "whitespace"),
        ({"url": "https://example.com:99999/"}, "url", "not a valid URL"),
        ({"url": "https://example.com/" + "a" * 2000}, "url", "longer than"),
        ({"event_types": ["nope"]}, "event_types", "unknown event types"),
        ({"event_types": []}, "event_types", "at least one"),
        ({"rate_limit": 0}, "rate_limit", "requests per second"),
        ({"rate_limit": float("inf")}, "rate_limit", "requests per second"),
        ({"item_event_queues": ["webhooks"]}, "item_event_queues", "carries the webhooks"),
        ({"item_event_queues": ["bad name!"]}, "item_event_queues", "not queue names"),
        ({"description": "d" * 201}, "description", "at most"),
    ],
)
def test_bad_endpoint_input_is_refused_field_by_field_and_nothing_is_written(fields, field, message):
    good = {"url": "https://example.com/hook", "event_types": ["test"]}
    with pytest.raises(webhooks.EndpointInvalid) as refused:
        webhooks.create_endpoint(**{**good, **fields})
    assert message in refused.value.errors[field]
    assert not WebhookEndpoint.objects.exists()


# -- events raised by jobsite ---------------------------------------------------------------------------------


def events_received(receiver, count: int) -> list[dict]:
    return [json.loads(r.body) for r in receiver.wait_for(count)]


def test_a_dead_letter_raises_item_dead_lettered_through_the_trigger(receiver):
    endpoint(receiver.url, "item.dead_lettered")
    item = get_task("queue_app.fail").enqueue({"message": "boom"}, max_attempts=1).id
    run_worker()  # the fail dies, its trigger queues the fan-out, which queues the delivery: one burst runs all
    (event,) = events_received(receiver, 1)
    assert event["type"] == "item.dead_lettered"
    assert event["data"]["item_id"] == item and event["data"]["error"].endswith("boom")


def test_no_endpoint_no_event_work(allow_private):
    get_task("queue_app.fail").enqueue({}, max_attempts=1)
    run_worker()
    assert not QueueItem.objects.filter(queue_id="webhooks").exists()


def test_item_done_and_failed_fire_only_for_queues_an_endpoint_opts_in(receiver):
    def trigger_exists() -> bool:
        with connection.cursor() as cur:
            cur.execute("SELECT count(*) FROM pg_trigger WHERE tgname = %s", [ITEM_TRIGGER])
            return cur.fetchone()[0] == 1

    assert not trigger_exists()  # no subscriber: the settle of every item runs no trigger at all
    hook, _ = endpoint(receiver.url, "item.done", "item.failed", item_event_queues=["watched"])
    assert trigger_exists()
    done = engine.enqueue("queue_app.echo", {"v": 1}, queue="watched").id
    engine.enqueue("queue_app.echo", {"v": 2}, queue="unwatched")
    failed = engine.enqueue("queue_app.fail", {}, queue="watched", max_attempts=2).id
    run_worker()
    events = {(e["type"], e["data"]["item_id"]) for e in events_received(receiver, 2)}
    assert events == {("item.done", done), ("item.failed", failed)}
    webhooks.set_enabled([hook.id], False)
    assert not trigger_exists()


def test_pausing_and_resuming_a_queue_raise_events(receiver):
    endpoint(receiver.url, "queue.paused", "queue.resumed")
    engine.ensure_queue("mail")
    services.pause_queue("mail", actor="ops")
    services.resume_queue("mail", actor="ops")
    run_worker()
    events = events_received(receiver, 2)
    assert sorted((e["type"], e["data"]["queue"], e["data"]["by"]) for e in events) == [
        ("queue.paused", "mail", "ops"),
        ("queue.resumed", "mail", "ops"),
    ]


def test_a_spark_run_reaching_a_final_state_raises_spark_run_finished(receiver):
    endpoint(receiver.url, "spark_run.finished")
    run = SparkRun.objects.create(job="demo", state="running")
    SparkRun.objects.filter(id=run.id).update(state="timed_out", error="too slow")
    run_worker()
    (event,) = events_received(receiver, 1)
    assert event["type"] == "spark_run.finished"
    assert (event["data"]["run_id"], event["data"]["outcome"]) == (run.id, "timed_out")


def test_a_worker_swept_as_lost_raises_worker_lost_but_a_clean_stop_does_not(receiver):
    endpoint(receiver.url, "worker.lost")
    old = timezone.now() - timedelta(hours=1)
    for name in ("gone", "stopped-cleanly"):
        Worker.objects.create(id=name, host="h", pid=1, started_at=old, last_heartbeat=old)
    Worker.objects.filter(id="stopped-cleanly").update(state="stopped", last_heartbeat=timezone.now())
    assert engine.sweep_workers(60, 10**6) == (1, 0)
    run_worker()
    # Every fan-out and delivery is settled: an event raised for the clean stop would have its delivery by now.
    assert not QueueItem.objects.filter(queue_id="webhooks", state__in=[ItemState.READY, ItemState.RESERVED]).exists()
    (delivery,) = WebhookDelivery.objects.filter(event_type="worker.lost")
    (event,) = events_received(receiver, 1)
    assert event["type"] == "worker.lost" and event["data"]["worker_id"] == "gone"
    assert [r.headers["webhook-id"] for r in receiver.requests] == [delivery.webhook_id]


def test_a_workflows_end_raises_workflow_finished_or_failed_once(receiver):
    from queue_app.workflows import services as workflows
    from tests.tasks import workflow_tasks  # noqa: F401  (registers wf_diamond and wf_fails)

    endpoint(receiver.url, "workflow.finished", "workflow.failed")
    ok = workflows.start("wf_diamond", started_by="test").id
    bad = workflows.start("wf_fails", started_by="test").id
    run_worker()
    events = {e["data"]["workflow_id"]: e for e in events_received(receiver, 2)}
    assert {wid: (e["type"], e["data"]["state"]) for wid, e in events.items()} == {
        ok: ("workflow.finished", "succeeded"),
        bad: ("workflow.failed", "failed"),
    }
    assert events[ok]["data"]["name"] == "wf_diamond" and events[ok]["data"]["started_by"] == "test"
    assert WebhookDelivery.objects.filter(event_type__startswith="workflow.").count() == 2
