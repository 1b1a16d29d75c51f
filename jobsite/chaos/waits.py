"""`queue_chaos --waits`: kill -9 workers while hundreds of workflows sleep and wait for events (issue 39), then
check what waits promise (docs/how-to/workflow-waits.md).

Each workflow `order-N` is nap (wf.sleep, 1 s to a few seconds) -> paid (wf.wait_event "chaos.paid" with key
`order-N`, timeout an hour: a lost wait stays open and fails the run) -> after (a transactional probe, whose
effect counts its runs). Another process (wait_sender.py) sends the events: some before any workflow exists
(kept for the lookback), some while the workflow naps (before its wait opens), most after the wait opened; every
fifth key twice; a few through the `workflow send-event` command, the rest through `waits.send_event`.

Checks (wait_checks.py): every workflow succeeded (no wait lost, nothing stuck); every event sent is stored once
(none lost, none doubled); every event wakes exactly one step exactly once (per key exactly one event claimed, the
oldest, by that key's wait, whose result is that event's payload; the unclaimed are exactly the second sends); the
step after each wait was enqueued once and its effect applied once; nothing woke early (no nap's item leased, nor
its step ended, before its due time: created + seconds on the server's clock; no wait opened before its nap ended;
no step after a wait leased before its event was sent, nor started before the wait ended).

Same private cluster and worker fleet as the item run (runner.py); the faults here are kill -9 of workers and
one PostgreSQL restart (`pg_ctl restart -m fast`, as the item run's) while the workflows nap and wait and the sender
sends: the workers reconnect, the sender sends again what failed (unless its nonce is already stored: a send
whose reply the restart swallowed is not sent twice), the harness's own queries wait it out (`_q`).
"""

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db import connections

from queue_app.models import Queue
from queue_app.workflows import services
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import Workflow, WorkflowEvent

from .checks import Check
from .fleet import MANAGE, ROOT, Fleet
from .runner import ALIAS, MIN_AGE, ChaosRun
from .wait_checks import EVENT, WaitRun, check_waits

QUEUE = "default"  # the sleep, timeout and probe items' queue
QUEUE_LEASE = 10.0
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
                self.crashes.append(proc.unasked())
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
        lines = self.sent_path.read_text().splitlines() if self.sent_path.exists() else []
        run = WaitRun(
            self.workflows, self.naps, self.planned, self.seconds, [json.loads(line) for line in lines],
            self.sender.poll(), str(self.sender_log), self.crashes, len(self.kills), self.restart,
        )  # fmt: skip
        checks = check_waits(ALIAS, run)
        events = WorkflowEvent.objects.using(ALIAS).filter(name=EVENT).count()
        self._write("")
        self._write(f"== queue_chaos --waits: seed {self.opts.seed}, {len(self.workflows)} workflows, {events} events, "
                    f"kills: {'; '.join(self.kills)}; restart: {self.restart or 'none'} ==")  # fmt: skip
        for check in checks:
            figures = " ".join(f"{k}={v}" for k, v in check.figures.items())
            self._write(f"{check.name:<48} {'PASS' if check.passed else 'FAIL':<7} {figures}")
            for p in check.problems:
                self._write(f"    - {p}")
        passed = sum(c.passed for c in checks)
        self._write(f"RESULT: {'PASS' if passed == len(checks) else 'FAIL'} ({passed}/{len(checks)} checks passed)")
        return checks
