"""The item run's checks of the run itself (runner.py), apart from the harness so they can be shown able to fail
(tests/project/in_process/test_chaos_checkers.py): the fault schedule fired in full on work in flight, every dead
letter's webhook delivered and signed, the workers behaved.
"""

import json
from collections import Counter
from datetime import UTC, datetime

from django.db import connections
from standardwebhooks.webhooks import Webhook

from queue_app.models import DeadLetter
from queue_app.webhooks.events import WEBHOOK_QUEUE
from queue_app.webhooks.models import WebhookDelivery

from .checks import Check
from .faults import Fired

KINDS = ("kill", "kill_amo", "kill_handoff", "sigterm", "restart", "cut")


def check_faults(fired: list[Fired], wanted: dict[str, int]) -> Check:
    """The schedule fired in full (`wanted`: how many of each kind), and on work in flight (a fault on an empty
    queue proves nothing)."""
    kinds = {k: sum(f.kind == k for f in fired) for k in KINDS}
    problems = [f"{k}: {kinds[k]} of {n} fired" for k, n in wanted.items() if kinds[k] < n]
    problems += [f"{f.kind} at {f.t}s fired on an empty queue" for f in fired if not f.detail.get("open")]
    figures = {**kinds, "kills_holding_work": sum(f.held > 0 for f in fired if f.kind == "kill")}
    return Check("faults fired under load", not problems, figures, problems)


def check_webhooks(
    db: str, first: dict[str, tuple[dict[str, str], bytes]], repeats: dict[str, int], secret: str
) -> Check:
    """Every dead letter raised exactly one item.dead_lettered event (its trigger commits with the dead
    letter), delivered to the receiver (`first`: webhook-id -> the headers and body it first got; `repeats`: how
    many more times each came), correctly signed with `secret`, under its delivery's webhook-id; no webhook item
    is left open or died. A delivery received more than once (a worker killed after the request) is counted."""
    letters = set(DeadLetter.objects.using(db).exclude(item__queue_id=WEBHOOK_QUEUE).values_list("item_id", flat=True))
    deliveries = dict(WebhookDelivery.objects.using(db).values_list("webhook_id", "body"))
    evented = Counter(json.loads(body)["data"]["item_id"] for body in deliveries.values())
    with connections[db].cursor() as cur:  # hot and archived alike: the archiver moves the done ones
        query = "SELECT state, count(*) FROM queue_app_item_all WHERE queue_id = %s GROUP BY 1"
        cur.execute(query, [WEBHOOK_QUEUE])
        states = Counter(dict(cur.fetchall()))
    problems = [f"the dead letter of item {i} raised no event" for i in sorted(letters - set(evented))]
    problems += [f"item {i} raised {n} events" for i, n in sorted(evented.items()) if n != 1]
    problems += [f"item {i} raised an event but has no dead letter" for i in sorted(set(evented) - letters)]
    problems += [f"delivery {w} never reached the receiver" for w in sorted(set(deliveries) - set(first))]
    problems += [f"the receiver got {w}, which no delivery has" for w in sorted(set(first) - set(deliveries))]
    signer = Webhook(secret)
    for webhook_id, (headers, body) in first.items():
        headers = {k.lower(): v for k, v in headers.items()}
        at = datetime.fromtimestamp(int(headers["webhook-timestamp"]), UTC)
        if signer.sign(webhook_id, at, body.decode()) not in headers["webhook-signature"].split(" "):
            problems.append(f"{webhook_id}: the signature does not verify")
    problems += [f"{n} webhook items ended {state}" for state, n in states.items() if state != "done"]
    figures = {
        "dead_letters": len(letters),
        "deliveries": len(deliveries),
        "received": len(first),
        "received_again": sum(repeats.values()),
        "webhook_items": dict(states),
    }
    return Check("webhooks: every dead letter delivered", not problems, figures, problems[:20])


def check_workers(crashes: list[str], procs: list, drained: bool, burst_rounds: int) -> Check:
    """No worker died unasked; every SIGTERMed worker exited 0 (finished or handed back its work); the burst
    workers drained the queue. `procs`: the fleet's WorkerProc records (worker_id, fate, burst, exit_code)."""
    problems = list(crashes)
    termed = [p for p in procs if p.fate in ("sigterm", "stopped")]
    problems += [f"{p.worker_id} exited {p.exit_code} after SIGTERM" for p in termed if p.exit_code != 0]
    bursts = [p for p in procs if p.burst]
    problems += [f"burst worker {p.worker_id} exited {p.exit_code}" for p in bursts if p.exit_code not in (0, -9)]
    if not drained:
        problems.append("the burst workers did not drain the queue before the deadline")
    figures = {
        "started": len(procs),
        "sigtermed": len(termed),
        "sigterm_exit_0": sum(p.exit_code == 0 for p in termed),
        "crashed": len(crashes),
        "burst_rounds": burst_rounds,
    }
    return Check("workers behaved", not problems, figures, problems)
