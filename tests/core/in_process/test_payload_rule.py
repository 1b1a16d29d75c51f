"""What a payload is (issue 50): any JSON value, for items and for workflow events alike, and every entry point
says so the same way (engine/payload.py's PAYLOAD_RULE) when it refuses one, writing nothing."""

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from queue_app import engine
from queue_app.engine.payload import PAYLOAD_RULE
from queue_app.models import QueueItem
from queue_app.workflows import WorkflowError, waits
from queue_app.workflows.models import WorkflowEvent

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("text", ["[1, 2]", '"str"', "7", "null"])
def test_any_json_value_is_a_payload_from_the_cli_and_code(text):
    call_command("enqueue", "queue_app.echo", "--payload", text, stdout=io.StringIO())
    call_command("workflow", "send-event", "partner.callback", "--key", "k", "--payload", text, stdout=io.StringIO())
    expected = json.loads(text)
    assert QueueItem.objects.get().payload == ({} if expected is None else expected)  # an item's null is {}
    assert WorkflowEvent.objects.get().payload == expected
    assert waits.send_event("partner.callback", "k2", expected).id and engine.enqueue("queue_app.echo", expected).id


def test_every_entry_point_refuses_a_payload_that_is_not_json_the_same_way_and_writes_nothing():
    for command in (["enqueue", "queue_app.echo"], ["workflow", "send-event", "partner.callback", "--key", "k"]):
        with pytest.raises(CommandError) as refused:
            call_command(*command, "--payload", "{nope", stdout=io.StringIO())
        assert f"--payload is not valid JSON ({PAYLOAD_RULE}): " in str(refused.value)
        assert str(refused.value).endswith("; nothing was written")
    with pytest.raises(engine.InvalidEnqueue, match=PAYLOAD_RULE):
        engine.enqueue("queue_app.echo", {1, 2})
    with pytest.raises(WorkflowError, match=PAYLOAD_RULE):
        waits.send_event("partner.callback", "k", {1, 2})
    assert not QueueItem.objects.exists() and not WorkflowEvent.objects.exists()
