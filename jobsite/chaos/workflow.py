"""`queue_chaos --workflow`: kill -9 workers while two workflows of probes run, then check what the workflow
engine promises (README, Workflows):

- S (success path): root -> a step that fans out N probes (at-least-once and transactional alternate by group)
  -> one fan-in (transactional) -> tail;
- F (compensation path): a, b, c (compensated) -> a fan-out of small probes (compensated) -> a fan-in
  (compensated) -> a step that always fails (queue_app.fail) -> a step that must never run; the compensations of
  exactly the completed steps then run, in reverse dependency order.

Checks (workflow_checks.py): no workflow stuck (each ends, S succeeded, F failed, within the deadline); every step
of S settled done with its probe's effect per its delivery mode (transactional: applied exactly once;
at-least-once: at least once); every step's item was enqueued exactly once (each fan-in fired once); no step's
item was leased before every dependency had succeeded; F compensated exactly its completed steps, each
compensation after those of the steps downstream of it.

Same private cluster, proxy and worker fleet as the item run (runner.py); the faults here are kill -9 only.
"""

import time
from dataclasses import dataclass

from queue_app.models import Queue
from queue_app.workflows import services
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import Workflow

from .checks import Check
from .fleet import Fleet
from .runner import ALIAS, MIN_AGE, ChaosRun
from .workflow_checks import AT_LEAST_ONCE, TRANSACTIONAL, WorkflowRun, check_workflows
from .workflow_tasks import CHILD

QUEUE = "default"  # the probes' queue
QUEUE_LEASE = 20.0


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
        return 3 + 2 + 2 * self.fan_out + 6 + self.fan_out_failing  # the 2: sub-workflow steps


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
        # two sub-workflow steps (issue 48): each starts a child and ends with it, under the same kills
        subs = [s.workflow(CHILD, name=f"child {x}", after=[root]) for x in ("a", "b")]
        fan_in = s.task(TRANSACTIONAL, name="fan_in", after=[fan, *subs])
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
        self.fleet = Fleet(
            self._worker_env(), self.run_dir, sizes.concurrency, (QUEUE,), imports=("jobsite.chaos.workflow_tasks",)
        )
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
            self.crashes.append(proc.unasked())
        while len(self.fleet.running()) < self.wf_sizes.workers:
            self.fleet.spawn()

    # -- judging ----------------------------------------------------------------------------------------------

    def _judge_workflows(self) -> list[Check]:
        run = WorkflowRun(self.success, self.failing, self.crashes, len(self.kills))
        checks = check_workflows(ALIAS, run)
        steps = checks[0].figures["steps"]  # the no-workflow-stuck check counts the two workflows' steps
        self._write("")
        self._write(
            f"== queue_chaos --workflow: seed {self.opts.seed}, {steps:,} steps, kills: {'; '.join(self.kills)} =="
        )
        for check in checks:
            figures = " ".join(f"{k}={v}" for k, v in check.figures.items())
            self._write(f"{check.name:<48} {'PASS' if check.passed else 'FAIL':<7} {figures}")
            for p in check.problems:
                self._write(f"    - {p}")
        passed = sum(c.passed for c in checks)
        self._write(f"RESULT: {'PASS' if passed == len(checks) else 'FAIL'} ({passed}/{len(checks)} checks passed)")
        return checks
