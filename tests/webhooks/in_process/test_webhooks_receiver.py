"""The receiving helper (`queue_app.receiver.webhook_receiver`) through real requests (Django's test
client, through URL routing and the middleware): 204 for a signed fresh event, 409 for a replay, 400 for missing
or malformed headers or body, 401 for a bad signature, 401 with its own message for a stale timestamp. A refused
request records nothing, so the genuine delivery under the same webhook-id is still accepted."""

import json
import re
from datetime import timedelta

import pytest
from django.urls import path
from django.utils import timezone

from queue_app.models import ReceivedWebhook
from queue_app.receiver import webhook_receiver
from queue_app.webhooks.sender import headers

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER_SECRET = "whsec_" + "A" * 32
BODY = json.dumps({"type": "test", "timestamp": "now", "data": {"a": 1}})
SEEN: list[dict] = []


@webhook_receiver(secrets=[SECRET], tolerance=60)
def hook(request, event):
    SEEN.append(event)


urlpatterns = [path("hook/", hook)]


@pytest.fixture(autouse=True)
def seen():
    SEEN.clear()
    yield SEEN
    SEEN.clear()


def post(client, hdrs: dict[str, str], body: str = BODY):
    wire = {k: v for k, v in hdrs.items() if k != "content-type"}
    return client.post("/hook/", body, content_type="application/json", headers=wire)


def signed(webhook_id: str = "msg_1", body: str = BODY, **options) -> dict[str, str]:
    return headers([SECRET], webhook_id, body, **options)


def test_a_signed_fresh_event_reaches_the_view_once(client, seen):
    assert post(client, signed()).status_code == 204
    assert seen == [json.loads(BODY)]
    assert ReceivedWebhook.objects.filter(webhook_id="msg_1").exists()


def test_a_replayed_webhook_id_is_refused_with_409(client, seen):
    assert post(client, signed()).status_code == 204
    again = post(client, signed())
    assert (again.status_code, again.json()["error"]) == (409, "webhook-id msg_1 was received before")
    assert len(seen) == 1


@pytest.mark.parametrize("header", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_a_missing_header_is_400_and_records_nothing(client, seen, header):
    hdrs = signed()
    del hdrs[header]
    response = post(client, hdrs)
    assert (response.status_code, response.json()["error"]) == (400, f"missing {header} header")
    assert seen == [] and not ReceivedWebhook.objects.exists()
    assert post(client, signed()).status_code == 204  # the genuine delivery under that id still gets in


@pytest.mark.parametrize(
    ("header", "value", "message"),
    [
        ("webhook-timestamp", "soon", "malformed webhook-timestamp 'soon'"),
        ("webhook-timestamp", "1e9", "malformed webhook-timestamp '1e9'"),
        ("webhook-timestamp", "-5", "malformed webhook-timestamp '-5'"),
        ("webhook-signature", "garbage", "malformed webhook-signature: 'garbage' is not version,signature"),
        ("webhook-signature", "v1,not*base64!", "malformed webhook-signature: 'v1,not*base64!' is not base64"),
    ],
)
def test_a_malformed_header_is_400_with_what_is_wrong(client, seen, header, value, message):
    response = post(client, {**signed(), header: value})
    assert response.status_code == 400
    assert response.json()["error"].startswith(message)
    assert seen == [] and not ReceivedWebhook.objects.exists()


def test_a_signed_body_that_is_not_json_is_400(client, seen):
    response = post(client, signed(body="not json"), body="not json")
    assert (response.status_code, response.json()["error"]) == (400, "the body is not JSON")
    assert seen == []


@pytest.mark.parametrize(
    "sign",
    # Signed when the test runs, not when it is collected: a full run reaches this file minutes after collection,
    # and a timestamp that old is refused as stale before its signature is looked at.
    [lambda: headers([OTHER_SECRET], "msg_1", BODY), lambda: signed(body=BODY.replace("1", "2"))],
    ids=["wrong-secret", "body-changed"],
)
def test_a_bad_signature_is_401(client, seen, sign):
    response = post(client, sign())
    assert response.status_code == 401
    assert response.json()["error"] == "no valid signature (wrong secret, or the body was changed)"
    assert seen == [] and not ReceivedWebhook.objects.exists()


@pytest.mark.parametrize(("shift", "when"), [(-120, "old"), (120, "in the future")])
def test_a_stale_timestamp_is_401_saying_so_not_blaming_the_secret(client, seen, shift, when):
    # Signed with the right secret: only the time is wrong, and the message must say that.
    response = post(client, signed(at=timezone.now() + timedelta(seconds=shift)))
    assert response.status_code == 401
    error = response.json()["error"]
    assert re.fullmatch(rf"stale webhook-timestamp: 1[12][0-9]s {when} \(tolerance 60s\); check the clocks", error)
    assert seen == [] and not ReceivedWebhook.objects.exists()


@pytest.mark.parametrize("tolerance", [0, -1, 301, float("nan"), True])
def test_a_tolerance_the_library_would_not_honour_is_refused_where_it_is_set(tolerance):
    # Over 300 s, standardwebhooks itself refuses the request as "no matching signature": a stale request would
    # be blamed on the secret.
    with pytest.raises(ValueError, match=r"tolerance must be seconds in \(0, 300\]"):
        webhook_receiver(secrets=[SECRET], tolerance=tolerance)
