"""The event sender of `queue_chaos --waits` (waits.py): a process of its own, not the harness and not a worker,
started as `manage.py shell -c "from queue_app.chaos.wait_sender import main; main(PLAN)"` on the chaos
cluster. PLAN is a JSON file: {"pre": [event...], "timed": [event...], "go": path, "sent": path}, an event being
{"at": seconds, "name", "key", "payload", "cli": bool}.

It sends the "pre" events at once (before any workflow exists: the lookback's case), waits for the harness to
create the "go" file (the workflows are started), then sends each "timed" event `at` seconds after that, through
`waits.send_event` or, where "cli", the `workflow send-event` command. Each send is its own transaction; after it
commits, the event's line (its id and whether it ended a wait) is appended to the "sent" file, so the harness
knows what was sent even if this process dies.
"""

import json
import time
from pathlib import Path

from django.core.management import call_command

from ..workflows import waits


def _send(event: dict, out) -> None:
    if event.get("cli"):
        call_command(
            "workflow", "send-event", event["name"], "--key", event["key"], "--payload", json.dumps(event["payload"])
        )
        out.write(json.dumps({"nonce": event["payload"]["nonce"], "cli": True}) + "\n")
    else:
        sent = waits.send_event(event["name"], event["key"], event["payload"])
        out.write(json.dumps({"nonce": event["payload"]["nonce"], "id": sent.id, "matched": sent.matched}) + "\n")
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
