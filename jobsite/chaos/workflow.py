"""`queue_chaos --workflow`: kill -9 workers while two workflows of probes run, then check what the workflow
engine promises (README, Workflows):

- S (success path): root -> a step that fans out N probes (at-least-once and transactional alternate by group)
  -> one fan-in (transactional) -> tail;
- F (compensation path): a, b, c (compensated) -> a fan-out of small probes (compensated) -> a fan-in
  (compensated) -> a step that always fails (queue_app.fail) -> a step that must never run; the compensations of
  exactly the completed steps then run, in reverse dependency order.

Checks: no workflow stuck (each ends, S succeeded, F failed, within the deadline); every step of S settled done
with its probe's effect per its delivery mode (transactional: applied exactly once; at-least-once: at least
once); every step's item was enqueued exactly once (each fan-in fired once); no step's item was leased before
every dependency had succeeded; F compensated exactly its completed steps, each compensation after those of the
steps downstream of it.

Same private cluster, proxy and worker fleet as the item run (runner.py); the faults here are kill -9 only.
"""

import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Min

from queue_app.models import ExecutionLog, ItemHistory, ProbeEffect, Queue, QueueItem, Reservation, ReservationHistory
from queue_app.workflows import services
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import StepDependency, Workflow, WorkflowStep

from .checks import Check
from .fleet import Fleet
from .runner import ALIAS, MIN_AGE, ChaosRun

QUEUE = "default"  # the probes' queue
QUEUE_LEASE = 20.0
TRANSACTIONAL = "queue_app.probe_transactional"
AT_LEAST_ONCE = "queue_app.probe"


@dataclass(frozen=True)
class WorkflowSizes:
    fan_out: int  # probes per group of S's fan-out (two groups)
    fan_out_failing: int  # probes in F's fan-out
    workers: int
    concurrency: int
    kills: int
    gap: float  # seconds between kills
    deadline: float
    sleep: float  # seconds each fan-out probe sleeps after recording its run (so kills land mid-handler)

    @property
    def steps(self) -> int:
        return 3 + 2 * self.fan_out + 6 + self.fan_out_failing


QUICK = WorkflowSizes(
    fan_out=100, fan_out_failing=20, workers=3, concurrency=4, kills=2, gap=2.0, deadline=300.0, sleep=0.1
)
FULL = WorkflowSizes(
    fan_out=950, fan_out_failing=80, workers=3, concurrency=4, kills=6, gap=3.0, deadline=900.0, sleep=0.05
)


class WorkflowChaosRun(ChaosRun):
    def __init__(self, options, write, sizes: WorkflowSizes) -> None:
        super().__init__(options, write)
        self.wf_sizes = sizes
        self.kills: list[str] = []

    def run(self) -> int:
        checks: list[Check] = []
        try:
            self._setup()
            Queue.objects.using(ALIAS).filter(name=QUEUE).update(lease_timeout=QUEUE_LEASE)
            self._start_workflows()
            self._kill_phase()
            checks = self._judge_workflows()
        finally:
            self._teardown()
        return 0 if checks and all(c.passed for c in checks) else 1

    def _start_workflows(self) -> None:
        n, m = self.wf_sizes.fan_out, self.wf_sizes.fan_out_failing
        s = Graph("chaos success")
        root = s.task(AT_LEAST_ONCE, name="root")
        fan = s.task(
            "queue_app.workflow_probe_fan_out",
            {"n": n, "groups": {"alo": AT_LEAST_ONCE, "tx": TRANSACTIONAL}, "child": {"sleep": self.wf_sizes.sleep}},
            name="fan_out",
            after=[root],
        )
        fan_in = s.task(TRANSACTIONAL, name="fan_in", after=[fan])
        s.task(AT_LEAST_ONCE, name="tail", after=[fan_in])
        f = Graph("chaos compensation")
        a = f.task(AT_LEAST_ONCE, name="a", compensate=AT_LEAST_ONCE)
        b = f.task(TRANSACTIONAL, name="b", after=[a], compensate=AT_LEAST_ONCE)
        c = f.task(AT_LEAST_ONCE, name="c", after=[a], compensate=AT_LEAST_ONCE)
        fan = f.task(
            "queue_app.workflow_probe_fan_out",
            {
                "n": m,
                "groups": {"part": AT_LEAST_ONCE},
                "compensate": AT_LEAST_ONCE,
                "child": {"sleep": self.wf_sizes.sleep},
            },
            name="fan_out",
            after=[b, c],
        )
        fan_in = f.task(AT_LEAST_ONCE, name="fan_in", after=[fan], compensate=AT_LEAST_ONCE)
        boom = f.task("queue_app.fail", {"message": "chaos: the step that fails"}, name="boom", after=[fan_in])
        f.task(AT_LEAST_ONCE, name="never", after=[boom], compensate=AT_LEAST_ONCE)
        self.success = services.start_graph(s, started_by="queue_chaos", using=ALIAS).id
        self.failing = services.start_graph(f, started_by="queue_chaos", using=ALIAS).id
        self.say(f"started workflows {self.success} (success path) and {self.failing} (compensation path), "
                 f"{self.wf_sizes.steps:,} steps before fan-out compensations")  # fmt: skip

    def _open_workflows(self) -> int | None:
        return self._q(
            lambda: Workflow.objects.using(ALIAS).exclude(state__in=["succeeded", "failed", "cancelled"]).count()
        )

    def _kill_phase(self) -> None:
        sizes = self.wf_sizes
        self.fleet = Fleet(self._worker_env(), self.run_dir, sizes.concurrency, (QUEUE,))
        for _ in range(sizes.workers):
            self.fleet.spawn()
        started = time.monotonic()
        deadline = started + sizes.deadline
        next_kill = started + MIN_AGE + sizes.gap
        while time.monotonic() < deadline:
            self._replace_crashed_workers()
            if not self._open_workflows():
                break
            if len(self.kills) < sizes.kills and time.monotonic() >= next_kill and self._kill_a_worker():
                next_kill = time.monotonic() + sizes.gap
            time.sleep(0.3)
        self.phase_times["workflows"] = time.monotonic() - started
        for proc in self.fleet.running():
            self.fleet.sigterm(proc, fate="stopped")
        self.fleet.wait_all(60)
        self.fleet.kill_all()

    def _replace_crashed_workers(self) -> None:
        for proc in self.fleet.reap():
            self.crashes.append(f"{proc.worker_id} exited {proc.exit_code} unasked (log {proc.log})")
        while len(self.fleet.running()) < self.wf_sizes.workers:
            self.fleet.spawn()

    # -- judging ----------------------------------------------------------------------------------------------

    def _judge_workflows(self) -> list[Check]:
        db = ALIAS
        success = Workflow.objects.using(db).get(id=self.success)
        failing = Workflow.objects.using(db).get(id=self.failing)
        steps = {
            w.id: list(WorkflowStep.objects.using(db).filter(workflow=w, attempt=w.attempt)) for w in (success, failing)
        }
        every = [s for rows in steps.values() for s in rows]
        by_id = {s.id: s for s in every}
        # Hot and archived alike: the workers move finished items into the partitioned history during the run
        # (a step's item in both would be counted twice below, as a step enqueued twice).
        items = {}
        for model in (QueueItem, ItemHistory):
            for item in (
                model.objects.using(db).filter(workflow_step_id__in=list(by_id)).only("id", "state", "workflow_step_id")
            ):
                items.setdefault(item.id, []).append(item)
        doubled = [i for i, found in items.items() if len(found) > 1]
        items = {i: found[0] for i, found in items.items()}
        checks = []

        problems = []
        if success.state != "succeeded":
            problems.append(f"success-path workflow {success.id} is {success.state}")
        if failing.state != "failed":
            problems.append(f"compensation-path workflow {failing.id} is {failing.state}")
        open_steps = [s.name for s in every if s.state in ("waiting", "queued")]
        if open_steps:
            problems.append(f"{len(open_steps)} steps still open: {open_steps[:10]}")
        checks.append(
            Check("no workflow stuck", not problems, {"steps": len(every), "open": len(open_steps)}, problems)
        )

        problems = []
        runs = Counter(ExecutionLog.objects.using(db).filter(item_id__in=list(items)).values_list("item_id", flat=True))
        effects = dict(
            ProbeEffect.objects.using(db).filter(key__in=[str(i) for i in items]).values_list("key", "applied")
        )
        modes = Counter()
        for s in steps[success.id]:
            item = items.get(s.item_id)
            if s.state != "succeeded" or item is None or item.state != "done":
                problems.append(f"{s.name}: step {s.state}, item {item and item.state}")
                continue
            if s.target == TRANSACTIONAL:
                modes["transactional"] += 1
                if effects.get(str(item.id)) != 1:
                    problems.append(f"{s.name}: transactional effect applied {effects.get(str(item.id))} times")
            elif s.target == AT_LEAST_ONCE:
                modes["at_least_once"] += 1
                if runs[item.id] < 1:
                    problems.append(f"{s.name}: at-least-once probe never ran")
        checks.append(Check("every step settled per its mode", not problems, dict(modes), problems[:20]))

        problems = []
        per_step = Counter(i.workflow_step_id for i in items.values())
        twice = {by_id[sid].name: n for sid, n in per_step.items() if n != 1}
        if doubled:
            problems.append(f"step items both hot and archived (a broken move): {doubled[:10]}")
        if twice:
            problems.append(f"steps enqueued more than once: {dict(list(twice.items())[:10])}")
        fan_ins = [s for s in every if s.name == "fan_in"]
        for s in fan_ins:
            if per_step.get(s.id) != 1:
                problems.append(f"fan-in of workflow {s.workflow_id} enqueued {per_step.get(s.id, 0)} times")
        checks.append(
            Check("each fan-in fired once", not problems, {"fan_ins": len(fan_ins), "items": len(items)}, problems)
        )

        problems = []
        first_lease: dict[int, datetime] = {}
        for model in (Reservation, ReservationHistory):
            for item_id, first in (
                model.objects.using(db).filter(item_id__in=list(items)).values("item_id")
                .annotate(first=Min("reserved_at")).values_list("item_id", "first")
            ):  # fmt: skip
                first_lease[item_id] = min(first, first_lease.get(item_id, first))
        edges = list(StepDependency.objects.using(db).filter(downstream_id__in=list(by_id)))
        for e in edges:
            up, down = by_id.get(e.upstream_id), by_id[e.downstream_id]
            started_at = first_lease.get(down.item_id)
            if started_at is None or up is None:
                continue
            if up.state != "succeeded" or up.finished_at is None or up.finished_at > started_at:
                problems.append(f"{down.name} started at {started_at} before {up.name} ({up.state}, {up.finished_at})")
        checks.append(Check("no step before its dependencies", not problems, {"edges": len(edges)}, problems[:20]))

        problems = []
        f_steps = steps[failing.id]
        completed = {s.id for s in f_steps if s.kind != "compensation" and s.state == "succeeded" and s.compensate}
        undos = [s for s in f_steps if s.kind == "compensation"]
        undone = Counter(s.compensates_id for s in undos)
        if set(undone) != completed or any(n != 1 for n in undone.values()):
            problems.append(f"compensated {sorted(undone)} but completed with a compensation {sorted(completed)}")
        problems += [f"{s.name} {s.state}" for s in undos if s.state != "succeeded"]
        for s in f_steps:
            if s.name in ("boom",) and s.state != "failed":
                problems.append(f"boom is {s.state}")
            if s.name == "never" and s.state != "cancelled":
                problems.append(f"never is {s.state}")
        checks.append(
            Check(
                "compensations: exactly the completed, in reverse",
                not problems,
                {"compensations": len(undos)},
                problems,
            )
        )
        checks.append(Check("workers behaved", not self.crashes, {"kills": len(self.kills)}, self.crashes))

        self._write("")
        self._write(
            f"== queue_chaos --workflow: seed {self.opts.seed}, {len(every):,} steps, kills: {'; '.join(self.kills)} =="
        )
        for check in checks:
            figures = " ".join(f"{k}={v}" for k, v in check.figures.items())
            self._write(f"{check.name:<48} {'PASS' if check.passed else 'FAIL':<7} {figures}")
            for p in check.problems:
                self._write(f"    - {p}")
        passed = sum(c.passed for c in checks)
        self._write(f"RESULT: {'PASS' if passed == len(checks) else 'FAIL'} ({passed}/{len(checks)} checks passed)")
        return checks
