"""The event sender of `queue_chaos --waits` (waits.py): a process of its own, not the harness and not a worker,
started as `manage.py shell -c "from jobsite.chaos.wait_sender import main; main(PLAN)"` on the chaos
cluster. PLAN is a JSON file: {"pre": [event...], "timed": [event...], "go": path, "sent": path}, an event being
{"at": seconds, "name", "key", "payload", "cli": bool}.

It sends the "pre" events at once (before any workflow exists: the lookback's case), waits for the harness to
create the "go" file (the workflows are started), then sends each "timed" event `at` seconds after that, through
`waits.send_event` or, where "cli", the `workflow send-event` command. Each send is its own transaction; after it
commits, the event's line (its id and whether it ended a wait) is appended to the "sent" file, so the harness
knows what was sent even if this process dies.

A send that fails because the database went away (`queue_chaos --waits` restarts it once) is sent again once the
database answers, unless the event is already stored: a send whose commit went through with its reply lost is
found by its own nonce (every payload's unique marker) and not sent twice. Its line then says "recovered".
"""

import json
import time
from pathlib import Path

from django.core.management import call_command
from django.db import connections
from django.db.utils import InterfaceError, OperationalError

from queue_app.workflows import waits
from queue_app.workflows.models import WorkflowEvent

RETRY_FOR = 120.0  # seconds a send is retried while the database is away


def _stored(event: dict) -> bool:
    return WorkflowEvent.objects.filter(
        name=event["name"], key=event["key"], payload__nonce=event["payload"]["nonce"]
    ).exists()


def _send(event: dict, out) -> None:
    """Send `event` once: retried while the database is away, never twice (a lost reply is found by the nonce)."""
    deadline = time.monotonic() + RETRY_FOR
    retries = 0
    while True:
        try:
            if retries and _stored(event):
                line = {"nonce": event["payload"]["nonce"], "recovered": True, "retries": retries}
                out.write(json.dumps(line) + "\n")
                out.flush()
                return
            _send_once(event, out, retries)
            return
        except (OperationalError, InterfaceError) as exc:
            connections["default"].close()
            if time.monotonic() > deadline:
                raise
            retries += 1
            print(f"send of {event['payload']['nonce']} failed ({str(exc).strip()[:80]}); retrying", flush=True)
            time.sleep(0.2)


def _send_once(event: dict, out, retries: int) -> None:
    if event.get("cli"):
        call_command(
            "workflow", "send-event", event["name"], "--key", event["key"], "--payload", json.dumps(event["payload"])
        )
        out.write(json.dumps({"nonce": event["payload"]["nonce"], "cli": True, "retries": retries}) + "\n")
    else:
        sent = waits.send_event(event["name"], event["key"], event["payload"])
        out.write(
            json.dumps({"nonce": event["payload"]["nonce"], "id": sent.id, "matched": sent.matched, "retries": retries})
            + "\n"
        )
    out.flush()


def main(plan_path: str) -> None:
    plan = json.loads(Path(plan_path).read_text())
    with open(plan["sent"], "a") as out:
        for event in plan["pre"]:
            _send(event, out)
        go = Path(plan["go"])
        while not go.exists():
            time.sleep(0.05)
        started = time.monotonic()
        for event in sorted(plan["timed"], key=lambda e: e["at"]):
            delay = started + event["at"] - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            _send(event, out)
