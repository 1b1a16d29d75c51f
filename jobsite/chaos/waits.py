"""`queue_chaos --waits`: kill -9 workers while hundreds of workflows sleep and wait for events (issue 39), then
check what waits promise (docs/how-to/workflow-waits.md).

Each workflow `order-N` is nap (wf.sleep, 1 s to a few seconds) -> paid (wf.wait_event "chaos.paid" with key
`order-N`, timeout an hour: a lost wait stays open and fails the run) -> after (a transactional probe, whose
effect counts its runs). Another process (wait_sender.py) sends the events: some before any workflow exists
(kept for the lookback), some while the workflow naps (before its wait opens), most after the wait opened; every
fifth key twice; a few through the `workflow send-event` command, the rest through `waits.send_event`.

Checks: every workflow succeeded (no wait lost, nothing stuck); every event sent is stored once (none lost, none
doubled); every event wakes exactly one step exactly once (per key exactly one event claimed, the oldest, by that
key's wait, whose result is that event's payload; the unclaimed are exactly the second sends); the step after
each wait was enqueued once and its effect applied once; nothing woke early (no nap's item leased, nor its step
ended, before its due time: created + seconds on the server's clock; no wait opened before its nap ended; no
step after a wait leased before its event was sent, nor started before the wait ended).

Same private cluster and worker fleet as the item run (runner.py); the faults here are kill -9 of workers and
one PostgreSQL restart (`pg_ctl restart -m fast`, as the item run's) while the workflows nap and wait and the sender
sends: the workers reconnect, the sender sends again what failed (unless its nonce is already stored: a send
whose reply the restart swallowed is not sent twice), the harness's own queries wait it out (`_q`).
"""

import json
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import connections
from django.db.models import Min

from queue_app.models import ItemHistory, ProbeEffect, Queue, QueueItem, Reservation, ReservationHistory
from queue_app.workflows import services
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import Workflow, WorkflowEvent, WorkflowStep

from .checks import Check
from .fleet import MANAGE, ROOT, Fleet
from .runner import ALIAS, MIN_AGE, ChaosRun

QUEUE = "default"  # the sleep, timeout and probe items' queue
QUEUE_LEASE = 10.0
EVENT = "chaos.paid"
TRANSACTIONAL = "queue_app.probe_transactional"
CLI_SENDS = 3  # late events sent through `workflow send-event`


@dataclass(frozen=True)
class WaitSizes:
    workflows: int
    workers: int
    concurrency: int
    kills: int
    gap: float  # seconds between kills
    deadline: float
    max_sleep: float  # each nap sleeps 1 s to this
    late: float  # a late event comes up to this long after its workflow's nap ended
    restart_at: float  # seconds into the waits phase of the one PostgreSQL restart


QUICK = WaitSizes(
    workflows=240, workers=3, concurrency=4, kills=2, gap=2.0, deadline=180.0, max_sleep=6.0, late=8.0, restart_at=6.0
)
FULL = WaitSizes(
    workflows=2000,
    workers=3,
    concurrency=4,
    kills=6,
    gap=3.0,
    deadline=600.0,
    max_sleep=20.0,
    late=40.0,
    restart_at=15.0,
)


class WaitChaosRun(ChaosRun):
    def __init__(self, options, write, sizes: WaitSizes) -> None:
        super().__init__(options, write)
        self.w_sizes = sizes
        self.kills: list[str] = []
        self.restart: str = ""  # "at Ns, took Ms" once the PostgreSQL restart fired
        self.sender: subprocess.Popen | None = None
        self.workflows: dict[str, int] = {}  # key -> workflow id
        self.naps: dict[str, float] = {}  # key -> seconds
        self.planned: dict[str, str] = {}  # nonce -> key
        self.seconds: dict[str, str] = {}  # nonce of each second send -> key

    def run(self) -> int:
        checks: list[Check] = []
        try:
            self._setup()
            Queue.objects.using(ALIAS).filter(name=QUEUE).update(lease_timeout=QUEUE_LEASE)
            pre, timed = self._plan()
            self._start_sender(pre, timed)
            self.fleet = Fleet(self._worker_env(), self.run_dir, self.w_sizes.concurrency, (QUEUE,))
            for _ in range(self.w_sizes.workers):
                self.fleet.spawn()
            self._await_pre(len(pre))
            self._start_workflows()
            (self.run_dir / "go").touch()
            self._kill_phase()
            checks = self._judge()
        finally:
            if self.sender is not None and self.sender.poll() is None:
                self.sender.kill()
                self.sender.wait(30)
            self._teardown()
        return 0 if checks and all(c.passed for c in checks) else 1

    # -- the plan -----------------------------------------------------------------------------------------------

    def _plan(self) -> tuple[list[dict], list[dict]]:
        sizes, rng = self.w_sizes, self.rng
        pre, timed = [], []

        def event(key: str, n: int, at: float) -> dict:
            nonce = f"{key}#{n}"
            self.planned[nonce] = key
            if n == 2:
                self.seconds[nonce] = key
            return {"at": round(at, 3), "name": EVENT, "key": key, "payload": {"nonce": nonce, "order": key}}

        for i in range(sizes.workflows):
            key = f"order-{i}"
            nap = self.naps[key] = round(rng.uniform(1.0, sizes.max_sleep), 2)
            kind = i % 6
            if kind == 0:  # before the workflow exists
                first = event(key, 1, 0.0)
                pre.append(first)
                at = rng.uniform(0.0, nap + sizes.late)
            else:
                # during the nap (the wait is not open yet), or after it
                at = rng.uniform(0.0, max(0.1, nap - 1.0)) if kind <= 2 else nap + rng.uniform(0.5, sizes.late)
                first = event(key, 1, at)
                timed.append(first)
            if i % 5 == 0:
                timed.append(event(key, 2, at + rng.uniform(0.2, 3.0)))
        late = [e for e in timed if e["at"] > self.naps[e["key"]] and e["payload"]["nonce"].endswith("#1")]
        for e in late[:CLI_SENDS]:
            e["cli"] = True
        return pre, timed

    def _start_sender(self, pre: list[dict], timed: list[dict]) -> None:
        plan = self.run_dir / "wait-plan.json"
        self.sent_path = self.run_dir / "wait-sent.jsonl"
        plan.write_text(json.dumps({"pre": pre, "timed": timed, "go": str(self.run_dir / "go"),
                                    "sent": str(self.sent_path)}))  # fmt: skip
        code = f"from jobsite.chaos.wait_sender import main; main({str(plan)!r})"
        self.sender_log = self.run_dir / "wait-sender.log"
        with self.sender_log.open("w") as out:
            self.sender = subprocess.Popen(
                [sys.executable, str(MANAGE), "shell", "-c", code], cwd=ROOT, env=self._worker_env(), stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.say(f"sender started: {len(pre)} events before any workflow, {len(timed)} timed "
                 f"({len(self.seconds)} second sends, {CLI_SENDS} through the CLI)")  # fmt: skip

    def _await_pre(self, n: int) -> None:
        deadline = time.monotonic() + 120
        while self._q(WorkflowEvent.objects.using(ALIAS).filter(name=EVENT).count, 0) < n:
            if time.monotonic() > deadline or self.sender.poll() is not None:
                raise RuntimeError(f"the sender did not send its {n} early events (log {self.sender_log})")
            time.sleep(0.1)

    def _start_workflows(self) -> None:
        for key, nap in self.naps.items():
            g = Graph(f"chaos waits {key}")
            sleep = g.sleep("nap", seconds=nap)
            paid = g.wait_event("paid", event=EVENT, key=key, timeout=3600, on_timeout="fail", after=[sleep])
            g.task(TRANSACTIONAL, name="after", after=[paid])
            self.workflows[key] = services.start_graph(g, started_by="queue_chaos", using=ALIAS).id
        self.say(f"started {len(self.workflows)} workflows (nap -> wait for {EVENT} -> transactional probe)")

    # -- the faults ---------------------------------------------------------------------------------------------

    def _open_workflows(self) -> int | None:
        return self._q(
            lambda: (
                Workflow.objects.using(ALIAS)
                .filter(id__in=list(self.workflows.values()))
                .exclude(state__in=["succeeded", "failed", "cancelled"])
                .count()
            )
        )

    def _kill_phase(self) -> None:
        sizes = self.w_sizes
        started = time.monotonic()
        deadline = started + sizes.deadline
        next_kill = started + MIN_AGE + sizes.gap
        while time.monotonic() < deadline:
            for proc in self.fleet.reap():
                self.crashes.append(f"{proc.worker_id} exited {proc.exit_code} unasked (log {proc.log})")
            while len(self.fleet.running()) < sizes.workers:
                self.fleet.spawn()
            if self.sender.poll() is not None and self._open_workflows() == 0:
                break
            if len(self.kills) < sizes.kills and time.monotonic() >= next_kill and self._kill_a_worker():
                next_kill = time.monotonic() + sizes.gap
            if not self.restart and time.monotonic() >= started + sizes.restart_at:
                self._restart_database(time.monotonic() - started)
            time.sleep(0.3)
        self.phase_times["waits"] = time.monotonic() - started
        self.say(f"waits phase over after {self.phase_times['waits']:.1f}s")
        for proc in self.fleet.running():
            self.fleet.sigterm(proc, fate="stopped")
        self.fleet.wait_all(60)
        self.fleet.kill_all()

    def _restart_database(self, at: float) -> None:
        """The item run's restart fault (runner.py `_fire`): every session is terminated, the workers and the sender
        reconnect on their own; the harness drops its connection (its queries go through `_q` meanwhile)."""
        self.say(f"FAULT PostgreSQL restart (pg_ctl restart -m fast), {self._open_workflows()} workflows open")
        began = datetime.now(UTC)
        took = self.cluster.restart()
        self.outages.append((began, datetime.now(UTC)))
        connections[ALIAS].close()
        self.restart = f"at {at:.1f}s, took {took:.1f}s"
        self.say(f"PostgreSQL back after {took:.1f}s")

    # -- judging ------------------------------------------------------------------------------------------------

    def _judge(self) -> list[Check]:
        db = ALIAS
        ids = list(self.workflows.values())
        key_of = {wf_id: key for key, wf_id in self.workflows.items()}
        workflows = {w.id: w for w in Workflow.objects.using(db).filter(id__in=ids)}
        steps: dict[str, dict[str, WorkflowStep]] = defaultdict(dict)
        for s in WorkflowStep.objects.using(db).filter(workflow_id__in=ids, attempt=1):
            steps[key_of[s.workflow_id]][s.name] = s
        by_step = {s.id: s for named in steps.values() for s in named.values()}
        items: dict[int, list] = defaultdict(list)  # step id -> its items, hot and archived
        for model in (QueueItem, ItemHistory):
            for item in model.objects.using(db).filter(workflow_step_id__in=list(by_step)):
                items[item.workflow_step_id].append(item)
        events = list(WorkflowEvent.objects.using(db).filter(name=EVENT).order_by("id"))
        per_key = defaultdict(list)
        for e in events:
            per_key[e.key].append(e)
        checks = []

        problems = [f"{key} (workflow {w}) is {workflows[w].state}" for key, w in self.workflows.items()
                    if workflows[w].state != "succeeded"]  # fmt: skip
        checks.append(Check("every workflow succeeded", not problems, {"workflows": len(ids)}, problems[:20]))

        problems = []
        stored = defaultdict(int)
        for e in events:
            stored[(e.payload or {}).get("nonce")] += 1
        problems += [f"{nonce} stored {stored[nonce]} times" for nonce in self.planned if stored[nonce] != 1]
        problems += [f"unplanned event {nonce}" for nonce in stored if nonce not in self.planned]
        sent_lines = self.sent_path.read_text().splitlines() if self.sent_path.exists() else []
        lines = [json.loads(line) for line in sent_lines]
        recovered = sum(line.get("recovered", False) for line in lines)
        retried = sum(line.get("retries", 0) > 0 for line in lines)
        code = self.sender.poll()
        if len(sent_lines) != len(self.planned) or code != 0:
            problems.append(f"sender sent {len(sent_lines)} of {len(self.planned)}, exit {code} "
                            f"(log {self.sender_log})")  # fmt: skip
        figures = {"events": len(events), "sends_retried": retried, "reply_lost_found_stored": recovered}
        checks.append(Check("every event sent stored once", not problems, figures, problems[:20]))

        problems = []
        kept_then_claimed = live = 0
        for key, named in steps.items():
            wait = named.get("paid")
            claimed = [e for e in per_key[key] if e.step_id is not None]
            if wait is None or len(claimed) != 1:
                problems.append(f"{key}: {len(claimed)} events claimed")
                continue
            event = claimed[0]
            if event.step_id != wait.id:
                problems.append(f"{key}: its event ended step {event.step_id}, not its wait {wait.id}")
            if event.id != per_key[key][0].id:
                problems.append(f"{key}: event {event.id} claimed, not the oldest {per_key[key][0].id}")
            if wait.result != event.payload:
                problems.append(f"{key}: the wait's result {wait.result} is not its event's payload")
            if wait.ready_at is not None and event.created_at < wait.ready_at:
                kept_then_claimed += 1
            else:
                live += 1
        unclaimed = {(e.payload or {}).get("nonce") for e in events if e.step_id is None}
        if unclaimed != set(self.seconds):
            problems.append(
                f"unclaimed events {sorted(unclaimed ^ set(self.seconds))[:10]} differ from the second sends"
            )
        if not (kept_then_claimed and live):
            problems.append(f"the run did not exercise both paths: {kept_then_claimed} kept, {live} live")
        figures = {"claimed": len(events) - len(unclaimed), "kept_then_claimed": kept_then_claimed, "live": live,
                   "second_sends_kept": len(unclaimed)}  # fmt: skip
        checks.append(Check("every event woke exactly one step once", not problems, figures, problems[:20]))

        problems = []
        afters = [named["after"] for named in steps.values() if "after" in named]
        effects = dict(ProbeEffect.objects.using(db).values_list("key", "applied"))
        for s in afters:
            found = items.get(s.id, [])
            if len(found) != 1:
                problems.append(f"{key_of[s.workflow_id]}: the step after the wait enqueued {len(found)} times")
            elif effects.get(str(found[0].id)) != 1:
                problems.append(f"{key_of[s.workflow_id]}: its effect applied {effects.get(str(found[0].id))} times")
        if len(afters) != len(ids):
            problems.append(f"{len(ids) - len(afters)} workflows lack their step after the wait")
        checks.append(Check("the step after each wait ran once", not problems, {"steps": len(afters)}, problems[:20]))

        checks.append(self._check_early(steps, items, per_key))
        problems = list(self.crashes)
        if not self.restart:
            problems.append("the PostgreSQL restart did not fire before the waits were over")
        figures = {"kills": len(self.kills), "restarts": int(bool(self.restart))}
        checks.append(Check("workers behaved", not problems, figures, problems))

        self._write("")
        self._write(f"== queue_chaos --waits: seed {self.opts.seed}, {len(ids)} workflows, {len(events)} events, "
                    f"kills: {'; '.join(self.kills)}; restart: {self.restart or 'none'} ==")  # fmt: skip
        for check in checks:
            figures = " ".join(f"{k}={v}" for k, v in check.figures.items())
            self._write(f"{check.name:<48} {'PASS' if check.passed else 'FAIL':<7} {figures}")
            for p in check.problems:
                self._write(f"    - {p}")
        passed = sum(c.passed for c in checks)
        self._write(f"RESULT: {'PASS' if passed == len(checks) else 'FAIL'} ({passed}/{len(checks)} checks passed)")
        return checks

    def _first_leases(self, item_ids) -> dict[int, datetime]:
        """{item id: its first reservation's reserved_at}, across the hot and history tables."""
        first_lease: dict[int, datetime] = {}
        for model in (Reservation, ReservationHistory):
            for item_id, first in (
                model.objects.using(ALIAS).filter(item_id__in=[i for i in item_ids if i is not None]).values("item_id")
                .annotate(first=Min("reserved_at")).values_list("item_id", "first")
            ):  # fmt: skip
                first_lease[item_id] = min(first, first_lease.get(item_id, first))
        return first_lease

    def _check_early(self, steps, items, per_key) -> Check:
        """Nothing woke early, every timestamp the server's clock."""
        nap_items = {found[0].id: (key, found[0]) for key, named in steps.items()
                     for found in [items.get(named["nap"].id, [])] if found}  # fmt: skip
        first_lease = self._first_leases(list(nap_items))
        after_leases = self._first_leases([named["after"].item_id for named in steps.values()])
        problems, margins = [], []
        for item_id, (key, item) in nap_items.items():
            due = item.created_at + timedelta(seconds=self.naps[key])
            nap = steps[key]["nap"]
            leased = first_lease.get(item_id)
            if leased is None or leased < due or item.run_at < due:
                problems.append(f"{key}: nap due {due} (run_at {item.run_at}) leased at {leased}")
            if nap.finished_at is None or nap.finished_at < due:
                problems.append(f"{key}: nap due {due} ended at {nap.finished_at}")
            else:
                margins.append((nap.finished_at - due).total_seconds())
        for key, named in steps.items():
            nap, wait, after = named["nap"], named["paid"], named["after"]
            if wait.ready_at is None or nap.finished_at is None or wait.ready_at < nap.finished_at:
                problems.append(f"{key}: wait opened at {wait.ready_at}, nap ended at {nap.finished_at}")
            # Timestamps are transaction starts: the transaction that ends a wait may begin before the event's
            # and still see it (READ COMMITTED: each statement sees what committed before it), so the wait's own
            # end time may read earlier than the event's. What runs after the wait is leased by a transaction that
            # began after both committed: its first lease is never before the event was sent.
            claimed = [e for e in per_key[key] if e.step_id == wait.id]
            leased = after_leases.get(after.item_id)
            if claimed and (wait.finished_at is None or leased is None or leased < claimed[0].created_at):
                problems.append(f"{key}: the step after the wait leased at {leased}, its event sent at "
                                f"{claimed[0].created_at}")  # fmt: skip
            if after.ready_at is None or wait.finished_at is None or after.ready_at < wait.finished_at:
                problems.append(f"{key}: after started at {after.ready_at}, wait ended at {wait.finished_at}")
        if len(nap_items) != len(steps):
            problems.append(f"{len(steps) - len(nap_items)} naps without an item")
        margins.sort()
        figures = {"naps": len(margins), "late_p50_ms": round(margins[len(margins) // 2] * 1000) if margins else None}
        return Check("nothing woke early", not problems, figures, problems[:20])
