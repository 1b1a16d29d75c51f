"""Webhooks with real `run_worker` processes and the real `manage.py webhooks` command: a worker killed with
SIGKILL in the middle of a delivery loses nothing, and the next worker delivers again under the same webhook-id;
several workers deliver an ordered endpoint's messages one at a time in publish order."""

import json
import signal

import pytest
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from queue_app import engine, services
from queue_app.models import ItemState, QueueItem, Reservation
from queue_app.webhooks import publish_event
from queue_app.webhooks import services as webhooks
from queue_app.webhooks.models import WebhookDelivery
from tests.support.waiting import wait_for
from tests.support.webhook_receiver import start_receiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ALLOW = {"JOBSITE_WEBHOOKS_ALLOW_PRIVATE": "1"}
# A delivery's lease is WEBHOOKS_HARD_TIMEOUT + 2 s (60 + 2 by default): 22 s here, so a test waits for a real
# expiry. The hard timeout must exceed the 10 s slot wait plus the connect and read timeouts (1 + 8).
SHORT_LEASE = {
    **ALLOW,
    "JOBSITE_WEBHOOKS_CONNECT_TIMEOUT": "1",
    "JOBSITE_WEBHOOKS_READ_TIMEOUT": "8",
    "JOBSITE_WEBHOOKS_HARD_TIMEOUT": "20",
}
LEASE = 22.0


@pytest.fixture
def receiver(settings):
    settings.JOBSITE = {**settings.JOBSITE, "WEBHOOKS_ALLOW_PRIVATE": True}
    receiver = start_receiver()
    yield receiver
    receiver.release.set()
    receiver.server.shutdown()
    receiver.server.server_close()


def worker(spawn, name: str, env: dict[str, str] = ALLOW):
    return spawn(
        "run_worker",
        "--worker-id",
        name,
        "--queues",
        "webhooks",
        "--pool",
        "thread",
        "--concurrency",
        "4",
        "--poll-interval",
        "0.2",
        env=env,
    )


def test_kill_9_mid_delivery_delivers_again_with_the_same_webhook_id_and_loses_nothing(receiver, spawn):
    created = webhooks.create_endpoint(receiver.url, ["test"])
    engine.ensure_queue("webhooks")
    services.set_queue_options("webhooks", lease_timeout=1.0)  # raised to the delivery task's own minimum, LEASE
    receiver.answer(200, delay=-1)  # the first request hangs until released: the worker is killed meanwhile
    deliveries = [publish_event("test", {"n": n})[0] for n in range(5)]
    victim = worker(spawn, "victim", env=SHORT_LEASE)
    receiver.wait_for(5, timeout=60)
    wait_for(lambda: QueueItem.objects.filter(state=ItemState.DONE).count() == 4, 30, what="the other four done")
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    (hung,) = QueueItem.objects.filter(state=ItemState.RESERVED)
    # The killed worker's lease is left to run out by itself: nothing drives the clock.
    deadline = hung.visible_at
    assert (deadline - timezone.now()).total_seconds() <= LEASE
    worker(spawn, "heir", env=SHORT_LEASE)
    requests = receiver.wait_for(6, timeout=LEASE + 120)
    wait_for(lambda: QueueItem.objects.filter(state=ItemState.DONE).count() == 5, 60, what="all five done")
    lost = Reservation.objects.get(id=hung.reservation_id)
    heir = Reservation.objects.get(item_id=hung.id, attempt=2)
    assert lost.outcome == "expired" and lost.finished_at > deadline  # rescued once its lease had run out
    assert heir.worker_id == "heir" and heir.reserved_at > deadline
    resent = [r for r in requests if r.headers["webhook-id"] == requests[0].headers["webhook-id"]]
    hung_delivery = WebhookDelivery.objects.get(item_id=hung.id)
    assert {r.headers["webhook-id"] for r in requests} == {d.webhook_id for d in deliveries}  # none lost
    assert len(resent) == 2 and resent[0].headers["webhook-id"] == hung_delivery.webhook_id
    for request in requests:
        Webhook(created.secret).verify(request.body, request.headers)
    assert webhooks.delivery_states(deliveries) == {d.id: "delivered" for d in deliveries}


def test_three_workers_deliver_an_ordered_endpoints_messages_in_publish_order(receiver, spawn):
    webhooks.create_endpoint(receiver.url, ["test"], ordered=True)
    receiver.answer(500, times=2)
    for n in range(30):
        publish_event("test", {"n": n})
    for name in ("a", "b", "c"):
        worker(spawn, name)
    first = WebhookDelivery.objects.order_by("id").first()
    for failures in (1, 2):  # drive the clock through the first message's two retries
        receiver.wait_for(failures, timeout=60)
        wait_for(lambda: services.retry_now([first.item_id]), 30, what="the retried first message to wait")
    requests = receiver.wait_for(32, timeout=120)
    order = [json.loads(r.body)["data"]["n"] for r in requests]
    assert order == [0, 0, 0, *range(1, 30)]


def test_cli_adds_lists_tests_and_lists_deliveries(receiver, manage):
    added = manage(
        "webhooks", "add", receiver.url, "--event", "test", "--event", "queue.paused", "--ordered", env=ALLOW
    )
    assert added.returncode == 0, added.stderr
    lines = dict(line.split(": ", 1) for line in added.stdout.splitlines() if ": " in line)
    endpoint_id, secret = int(lines["id"]), lines["secret"]
    assert secret.startswith("whsec_")
    listed = json.loads(manage("webhooks", "list", "--json").stdout)
    assert [(e["id"], e["event_types"], e["ordered"]) for e in listed] == [
        (endpoint_id, ["test", "queue.paused"], True)
    ]
    assert secret not in manage("webhooks", "list").stdout
    tested = manage("webhooks", "test", str(endpoint_id))
    assert tested.returncode == 0 and "queued test event msg_" in tested.stdout
    manage("run_worker", "--burst", "--queues", "webhooks", env=ALLOW)
    (request,) = receiver.wait_for(1)
    assert Webhook(secret).verify(request.body, request.headers)["type"] == "test"
    (row,) = json.loads(manage("webhooks", "deliveries", "--endpoint", str(endpoint_id), "--json").stdout)
    assert (row["event_type"], row["webhook_id"], row["state"], row["attempts"], row["last_status_code"]) == (
        "test",
        request.headers["webhook-id"],
        "delivered",
        1,
        200,
    )
    header, line = manage("webhooks", "deliveries").stdout.splitlines()
    assert header.split("\t") == ["id", "endpoint", "event_type", "webhook_id", "state", "attempts", "last_status_code"]
    assert line.split("\t") == [str(row["id"]), str(endpoint_id), "test", row["webhook_id"], "delivered", "1", "200"]
    header, line = manage("webhooks", "list").stdout.splitlines()
    assert (header.split("\t"), line.split("\t")[:2]) == (
        ["id", "state", "url", "event_types"],
        [str(endpoint_id), "enabled ordered"],
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["add", "http://127.0.0.1/hook", "--event", "test"], "loopback"),
        (["add", "gopher://example.com/", "--event", "test"], "only http and https"),
        (["add", "https://example.com/", "--event", "nope"], "unknown event types"),
        (["add", "https://example.com/"], "--event"),
        (["test", "999"], "no webhook endpoint 999"),
        (["deliveries", "--endpoint", "999"], "no webhook endpoint 999"),
    ],
)
def test_cli_refuses_bad_input_with_a_clear_error_and_writes_nothing(manage, args, message):
    result = manage("webhooks", *args)
    assert result.returncode != 0 and message in result.stderr
    assert not WebhookDelivery.objects.exists()


def test_a_webhooks_hard_timeout_with_no_room_for_the_request_is_refused_at_start(manage):
    result = manage("run_worker", "--burst", "--queues", "webhooks", env={"JOBSITE_WEBHOOKS_HARD_TIMEOUT": "20"})

    assert result.returncode != 0
    assert "WEBHOOKS_HARD_TIMEOUT=20s leaves a delivery no room" in result.stderr
    assert "(30s in all)" in result.stderr  # the 10 s slot wait, the 5 s connect, the 15 s read
