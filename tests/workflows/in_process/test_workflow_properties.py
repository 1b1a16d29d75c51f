"""Stateful property test of workflows against the real database (hypothesis RuleBasedStateMachine).

Hypothesis starts small workflows (a diamond a -> b, c -> d with a random failure policy per step, a random run-if
rule for b, c and d, and `a` sometimes a branch choosing among b and c), then leases
their step items and settles them in random orders by every path the engine has: complete, fail (retried or
dead on the last attempt), dead letter, a lapsed lease rescued, and a cancel of the workflow. No worker runs:
the test is the worker. After every step the rows alone are checked (no model): each step's item was enqueued
at most once, and only once every dependency had succeeded, failed with `continue` or been skipped; every step
whose dependencies all ended is decided, never left waiting (liveness: enqueued when they all proceed and its
rule holds, skipped when its rule does not hold or its branch did not choose it, cancelled when one does not
proceed); a workflow's open-step count is the number of its open steps; a workflow that ended has no open
step and ended exactly once (one `workflow_finished` item), an open one not yet.

Size: JOBSITE_HYPOTHESIS_EXAMPLES (default 50) and JOBSITE_HYPOTHESIS_STEPS (default 40) run it longer.
"""

import os

import pytest
from django.db import connection
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from queue_app import engine
from queue_app.models import QueueItem
from queue_app.workflows import services
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import StepDependency, Workflow, WorkflowStep
from queue_app.workflows.services import FINISHED_TASK
from tests.support.queue_helpers import advance_database_clock
from tests.tasks import workflow_tasks  # noqa: F401  (registers wf.add)

EXAMPLES = int(os.environ.get("JOBSITE_HYPOTHESIS_EXAMPLES", "50"))
STEPS = int(os.environ.get("JOBSITE_HYPOTHESIS_STEPS", "40"))
TABLES = (
    "queue_app_stepdependency",
    "queue_app_workflowstep",
    "queue_app_workflow",
    "queue_app_reservation",
    "queue_app_deadletter",
    "queue_app_queueitem",
)
LEASE = 60.0
POLICIES = st.sampled_from(["fail", "continue"])
RULES = st.sampled_from(["all_succeeded", "all_done", "any_failed", "none_failed"])
RESULTS = st.sampled_from([1, "b", "c", ["b", "c"], [], {"chosen": ["c"]}])  # a branch's result names the chosen


def _proceeds(step: WorkflowStep) -> bool:
    """Whether a step that ended lets the steps waiting for it be decided (run or skipped, per their rule)."""
    return step.state in ("succeeded", "skipped") or (step.state == "failed" and step.on_failure == "continue")


def _chosen(branch: WorkflowStep, name: str) -> bool:
    result = branch.result
    names = result if isinstance(result, list) else [result] if isinstance(result, str) else None
    if isinstance(result, dict):
        names = result.get("chosen")
    return branch.state == "succeeded" and isinstance(names, list) and name in names


def _skips(step: WorkflowStep, deps: list[WorkflowStep]) -> bool:
    """The run-if decision of a step whose dependencies all proceeded (docs/how-to/workflows.md, Conditions)."""
    rule = step.spec.get("run_if")
    if rule is None:
        return False
    skipped = sum(d.state == "skipped" for d in deps)
    failed = sum(d.state == "failed" for d in deps)
    if any("branch" in d.spec and not _chosen(d, step.name) for d in deps) or (deps and skipped == len(deps)):
        return True
    return {"all_done": False, "any_failed": failed == 0, "none_failed": failed > 0}.get(rule, skipped > 0)


class WorkflowMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        with connection.cursor() as cur:  # each example starts from empty tables
            for table in TABLES:
                cur.execute(f"DELETE FROM {table}")
        self.held: dict[int, engine.Lease] = {}  # step items leased and not settled, by item id
        self.workflows: list[int] = []

    def draw_held(self, data) -> engine.Lease:
        return self.held.pop(data.draw(st.sampled_from(sorted(self.held)), label="held item"))

    @precondition(lambda self: len(self.workflows) < 3)
    @rule(
        policies=st.lists(POLICIES, min_size=4, max_size=4),
        rules=st.lists(RULES, min_size=3, max_size=3),
        branch=st.booleans(),
    )
    def start(self, policies, rules, branch):
        g = Graph("diamond")
        a = g.task("wf.add", {"x": 1}, name="a", on_failure=policies[0], branch=["b", "c"] if branch else None)
        b = g.task("wf.add", {"x": 2}, name="b", after=[a], on_failure=policies[1], run_if=rules[0])
        c = g.task("wf.add", {"x": 3}, name="c", after=[a], on_failure=policies[2], run_if=rules[1])
        g.task("wf.add", {"x": 4}, name="d", after=[b, c], on_failure=policies[3], run_if=rules[2])
        self.workflows.append(services.start_graph(g).id)

    @rule(data=st.data(), n=st.integers(1, 3))
    def lease_and_settle(self, data, n):
        """A worker's round: lease up to n items and settle each one way or another (mostly done), or hold it
        (for the rules below: a later settle, a lapsed lease, a cancel)."""
        for lease in engine.lease(None, n, "w1", lease_timeout=LEASE):
            if not QueueItem.objects.filter(id=lease.item_id, workflow_step_id__isnull=False).exists():
                engine.complete(lease, None)  # a workflow_finished hook: its handler is not under test
                continue
            outcome = data.draw(st.sampled_from(["complete", "complete", "complete", "fail", "dead", "hold"]))
            event(f"settle: {outcome}")
            if outcome == "complete":
                engine.complete(lease, data.draw(RESULTS))
            elif outcome == "fail":
                engine.fail(lease, "boom", retry_in=0)
            elif outcome == "dead":
                engine.dead(lease, "poison")
            else:
                self.held[lease.item_id] = lease

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def complete(self, data):
        engine.complete(self.draw_held(data), data.draw(RESULTS))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def complete_many(self, data):
        ids = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, max_size=4, unique=True))
        assert engine.complete_many([(self.held.pop(i), 1) for i in ids]) == []

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def fail(self, data):
        event(f"fail: {engine.fail(self.draw_held(data), 'boom', retry_in=0)}")

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def dead(self, data):
        engine.dead(self.draw_held(data), "poison")

    @precondition(lambda self: self.held)
    @rule()
    def leases_lapse_and_are_rescued(self):
        advance_database_clock(int(LEASE) + 60)
        engine.rescue_expired()
        self.held.clear()  # every held lease lapsed: ready again, or dead on its last attempt

    @precondition(lambda self: self.workflows)
    @rule(data=st.data())
    def cancel(self, data):
        event(f"cancel: {services.cancel(data.draw(st.sampled_from(self.workflows)), actor='test')}")
        still = set(QueueItem.objects.filter(id__in=list(self.held), state="reserved").values_list("id", flat=True))
        self.held = {i: lease for i, lease in self.held.items() if i in still}

    @invariant()
    def each_step_is_enqueued_at_most_once_and_only_after_its_dependencies(self):
        items = {}
        for step_id, item_id in QueueItem.objects.filter(workflow_step_id__isnull=False).values_list(
            "workflow_step_id", "id"
        ):
            assert step_id not in items, f"step {step_id} has two items"
            items[step_id] = item_id
        steps = {s.id: s for s in WorkflowStep.objects.all()}
        for step_id, item_id in items.items():
            assert steps[step_id].item_id == item_id
        for edge in StepDependency.objects.filter(downstream_id__in=list(items)):
            up = steps[edge.upstream_id]
            assert _proceeds(up), f"{steps[edge.downstream_id].name} enqueued while {up.name} is {up.state}"

    @invariant()
    def a_step_whose_dependencies_all_ended_is_decided(self):
        """Liveness: the settle that ends a step's last open dependency decides the step in the same transaction.
        It is never left waiting: when every dependency proceeds (succeeded, skipped, or failed with `continue`)
        it is skipped exactly when its run-if rule (or a branch) says so, else enqueued (or already run); cancelled
        when one does not proceed; a step with no dependency is enqueued at the start."""
        for w in Workflow.objects.all():
            current = {s.id: s for s in WorkflowStep.objects.filter(workflow=w, attempt=w.attempt)}
            ups: dict[int, list[WorkflowStep]] = {i: [] for i in current}
            for edge in StepDependency.objects.filter(downstream_id__in=list(current)):
                ups[edge.downstream_id].append(current[edge.upstream_id])
            for step_id, deps in ups.items():
                step = current[step_id]
                if any(up.state in ("waiting", "queued") for up in deps):
                    continue
                assert step.state != "waiting", f"{step.name} waits though {[u.name for u in deps]} ended ({w.state})"
                if not all(_proceeds(up) for up in deps):
                    assert step.state == "cancelled", f"{step.name} is {step.state} after a failed dependency"
                elif step.state != "cancelled":
                    skips = _skips(step, deps)
                    event(f"decided: {'skipped' if skips else 'run'}")
                    assert (step.state == "skipped") == skips, f"{step.name} {step.state}, rule {step.spec}"
                    assert skips or step.item_id is not None, f"{step.name} {step.state}"

    @invariant()
    def a_workflow_counts_its_open_steps_and_ends_exactly_once(self):
        finished = {}
        for payload in QueueItem.objects.filter(task=FINISHED_TASK).values_list("payload", flat=True):
            finished[payload["workflow_id"]] = finished.get(payload["workflow_id"], 0) + 1
        for w in Workflow.objects.all():
            open_steps = WorkflowStep.objects.filter(
                workflow=w, attempt=w.attempt, state__in=["waiting", "queued"]
            ).count()
            assert w.steps_open == open_steps, (w.state, w.steps_open, open_steps)
            if w.is_final:
                assert open_steps == 0 and finished.get(w.id) == 1, (w.state, open_steps, finished.get(w.id))
            else:
                assert w.id not in finished, f"workflow {w.id} is {w.state} but its end was announced"


@pytest.mark.django_db(transaction=True)
def test_workflow_state_machine():
    run_state_machine_as_test(
        WorkflowMachine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        ),
    )
