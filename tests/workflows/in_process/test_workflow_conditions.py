"""Conditions (issue 39): run-if rules per step and branch steps, decided in the settle transaction
(queue_app_wf_decide). In-process tests settle the step items through the engine (the test is the worker); the
proofs with real workers are in test_workflow_conditions_workers.py."""

import pytest
from django.core.management import call_command

from queue_app import engine
from queue_app.models import QueueItem
from queue_app.workflows import WorkflowDefinitionError, services
from queue_app.workflows.conditions import BranchError, choose
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import Workflow, WorkflowStep
from tests.tasks import workflow_condition_tasks  # noqa: F401  (registers wf.value, wf.pick, wf_branch, wf_rules)

pytestmark = pytest.mark.django_db


class Driver:
    """Leases whatever is ready and settles the item of the step asked for (the others stay held)."""

    def __init__(self, w: Workflow) -> None:
        self.w = w
        self.held: dict[int, engine.Lease] = {}

    def step(self, name: str) -> WorkflowStep:
        w = Workflow.objects.get(id=self.w.id)
        return WorkflowStep.objects.get(workflow_id=w.id, attempt=w.attempt, name=name)

    def _held(self, name: str) -> engine.Lease:
        for lease in engine.lease(None, 100, "test", lease_timeout=600):
            self.held[lease.item_id] = lease
        return self.held.pop(self.step(name).item_id)

    def done(self, name: str, result=None) -> None:
        engine.complete(self._held(name), result)

    def dead(self, name: str) -> None:
        engine.dead(self._held(name), "boom")

    def states(self) -> dict[str, str]:
        return {s["name"]: s["state"] for s in services.status(self.w.id)["steps"]}

    def workflow(self) -> Workflow:
        return Workflow.objects.get(id=self.w.id)


def rules_graph(policy: str = "continue") -> Graph:
    g = Graph("rules")
    ok = g.task("wf.add", name="ok")
    bad = g.task("wf.add", name="bad", on_failure=policy)
    for rule in ("all_succeeded", "all_done", "any_failed", "none_failed"):
        g.task("wf.add", name=rule, after=[ok, bad], run_if=rule)
    return g


@pytest.mark.parametrize(
    ("bad_outcome", "expected"),
    [
        ("failed", {"all_succeeded": "queued", "all_done": "queued", "any_failed": "queued", "none_failed": "skipped"}),
        (
            "succeeded",
            {"all_succeeded": "queued", "all_done": "queued", "any_failed": "skipped", "none_failed": "queued"},
        ),
    ],
)
def test_each_run_if_rule_is_decided_when_the_last_dependency_ends(bad_outcome, expected):
    d = Driver(services.start_graph(rules_graph()))
    d.done("ok", 1)
    assert set(d.states().values()) >= {"waiting"}  # nothing decided before the last dependency ends
    d.dead("bad") if bad_outcome == "failed" else d.done("bad", 1)
    states = d.states()
    assert {rule: states[rule] for rule in expected} == expected
    for rule, state in expected.items():
        if state == "queued":
            d.done(rule, 1)
    w = d.workflow()
    assert w.state == ("failed" if bad_outcome == "failed" else "succeeded")
    assert w.steps_open == 0
    assert QueueItem.objects.filter(workflow_step_id=d.step("none_failed").id).exists() == (bad_outcome != "failed")


def test_a_workflow_whose_steps_all_succeeded_or_were_skipped_succeeds_and_skipping_propagates():
    d = Driver(services.start("wf_branch", {"amount": 120}))
    d.done("check", {"amount": 120})
    d.done("route", {"chosen": ["big"], "value": 120, "matched": True})
    assert d.states() == {
        "check": "succeeded",
        "route": "succeeded",
        "big": "queued",
        "small": "skipped",
        "below_small": "skipped",  # depends only on a skipped step
        "end": "waiting",
        "after_end": "waiting",
    }
    assert d.step("below_small").error == "skipped: its run_if (all_succeeded) was not met"
    d.done("big", 1)
    d.done("end", 11)
    d.done("after_end", 111)
    w = d.workflow()
    assert (w.state, w.steps_open, w.steps_failed) == ("succeeded", 0, 0)


def test_skipping_a_whole_tail_ends_the_workflow_in_the_same_settle():
    g = Graph("tail")
    check = g.task("wf.value", {"n": 0}, name="check")
    route = g.branch("route", on=check, path="n", op="truthy", then=["a"])
    a = g.task("wf.add", name="a", after=[route])
    g.task("wf.add", name="b", after=[a], run_if="all_done")
    d = Driver(services.start_graph(g))
    d.done("check", {"n": 0})
    d.done("route", {"chosen": [], "value": 0, "matched": False})
    assert d.states() == {"check": "succeeded", "route": "succeeded", "a": "skipped", "b": "skipped"}
    assert d.workflow().state == "succeeded"


def test_a_branch_task_returns_the_names_to_run():
    g = Graph("picked")
    pick = g.task("wf.pick", {"names": ["y"]}, name="pick", branch=["x", "y", "z"])
    for name in "xyz":
        g.task("wf.add", name=name, after=[pick])
    d = Driver(services.start_graph(g))
    d.done("pick", "y")  # a single name, as a list or {"chosen": [...]}, chooses the same
    assert d.states() == {"pick": "succeeded", "x": "skipped", "y": "queued", "z": "skipped"}


def test_repair_keeps_a_branchs_choice_and_the_skipped_steps():
    d = Driver(services.start("wf_branch", {"amount": 5}))
    d.done("check", {"amount": 5})
    d.done("route", {"chosen": ["small"]})
    d.dead("small")
    assert d.workflow().state == "failed"
    repaired = services.repair(d.w.id, actor="test")
    assert repaired.state == "running"
    assert d.states() == {
        "check": "succeeded",
        "route": "succeeded",
        "big": "skipped",  # kept: the branch that did not choose it is kept
        "small": "queued",
        "below_small": "waiting",
        "end": "waiting",
        "after_end": "waiting",
    }
    d.done("small", 2)
    d.done("below_small", 3)
    d.done("end", 13)
    d.done("after_end", 113)
    assert d.workflow().state == "succeeded"


def test_a_cancelled_branch_downstream_is_decided_again_by_repair():
    g = Graph("cancelled")
    check = g.task("wf.value", name="check")
    route = g.branch("route", on=check, path="go", op="==", value=True, then=["yes"], otherwise=["no"])
    g.task("wf.add", name="yes", after=[route])
    g.task("wf.add", name="no", after=[route])
    g.task("wf.boom", name="other")
    d = Driver(services.start_graph(g))
    d.done("check", {"go": True})
    d.dead("other")  # the workflow fails while route runs (its item is held): yes and no are cancelled
    d.done("route", {"chosen": ["yes"]})
    assert d.workflow().state == "failed"
    assert (d.step("route").state, d.step("yes").state, d.step("no").state) == ("succeeded", "cancelled", "cancelled")
    services.repair(d.w.id, actor="test")  # route is kept: its choice decides yes and no again
    states = d.states()
    assert (states["route"], states["yes"], states["no"], states["other"]) == (
        "succeeded",
        "queued",
        "skipped",
        "queued",
    )


def branch_run(*, fail_small: bool) -> Driver:
    """wf_branch with amount 5: route chooses small (big skipped); small fails, or everything succeeds."""
    d = Driver(services.start("wf_branch", {"amount": 5}))
    d.done("check", {"amount": 5})
    d.done("route", {"chosen": ["small"]})
    if fail_small:
        d.dead("small")
        return d
    for name, result in (("small", 2), ("below_small", 3), ("end", 13), ("after_end", 113)):
        d.done(name, result)
    assert d.workflow().state == "succeeded"
    return d


def test_repair_onto_the_current_definition_keeps_a_branchs_choice_and_the_skipped_steps():
    d = branch_run(fail_small=True)
    services.repair(d.w.id, onto_current=True, actor="test")  # workflows/rebuild.py's _onto: the same rules
    assert d.states() == {
        "check": "succeeded",
        "route": "succeeded",
        "big": "skipped",
        "small": "queued",
        "below_small": "waiting",
        "end": "waiting",
        "after_end": "waiting",
    }


@pytest.mark.parametrize("onto_current", [False, True])
def test_fork_keeps_the_skipped_steps_and_decides_its_step_again(onto_current):
    source = branch_run(fail_small=False)
    below = Driver(services.fork(source.w.id, "small", onto_current=onto_current, actor="test"))
    assert below.states() == {
        "check": "succeeded",
        "route": "succeeded",
        "big": "skipped",  # kept: the kept branch did not choose it
        "small": "queued",  # re-run, decided again with route's kept choice
        "below_small": "waiting",
        "end": "waiting",
        "after_end": "waiting",
    }
    again = Driver(services.fork(source.w.id, "route", onto_current=onto_current, actor="test"))
    states = again.states()
    assert (states["route"], states["big"], states["small"]) == ("queued", "waiting", "waiting")
    again.done("route", {"chosen": ["big"]})  # a new choice this time
    assert (again.step("big").state, again.step("small").state, again.step("below_small").state) == (
        "queued",
        "skipped",
        "skipped",
    )


def test_a_fork_from_a_skipped_step_decides_it_again_and_ends_at_once():
    g = Graph("fork_skipped")
    ok = g.task("wf.add", name="ok")
    g.task("wf.add", name="alert", after=[ok], run_if="any_failed")
    d = Driver(services.start_graph(g))
    d.done("ok", 1)
    assert d.states() == {"ok": "succeeded", "alert": "skipped"} and d.workflow().state == "succeeded"
    fork = services.fork(d.w.id, "alert", actor="test")  # its only step to run is skipped again: nothing open
    assert fork.state == "succeeded"
    assert Driver(fork).states() == {"ok": "succeeded", "alert": "skipped"}
    steps = WorkflowStep.objects.filter(workflow_id=fork.id).values_list("id", flat=True)
    assert not QueueItem.objects.filter(workflow_step_id__in=list(steps)).exists()


def test_choose_reads_a_path_and_compares():
    args = {"on": "paid", "path": "order.amount", "op": ">", "value": 100, "then": ["big"], "otherwise": ["small"]}
    assert choose(args, {"paid": {"order": {"amount": 120}}}) == {"chosen": ["big"], "value": 120, "matched": True}
    assert choose(args, {"paid": {"order": {"amount": 100}}})["chosen"] == ["small"]
    with pytest.raises(BranchError, match="no 'order.amount'"):
        choose(args, {"paid": {"amount": 1}})
    with pytest.raises(BranchError, match="cannot compare"):
        choose(args, {"paid": {"order": {"amount": "lots"}}})
    listed = {**args, "path": "rows.1", "op": "in", "value": ["a", "b"]}
    assert choose(listed, {"paid": {"rows": ["x", "b"]}})["matched"] is True


def counts() -> tuple[int, int, int]:
    return Workflow.objects.count(), WorkflowStep.objects.count(), QueueItem.objects.count()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda g: (
                g.task("wf.value", name="check"),
                g.branch("route", on="check", then=["elsewhere"]),
                g.task("wf.add", name="elsewhere", after=["check"]),
            ),
            "branch names 'elsewhere', which is not a step directly downstream of it",
        ),
        (
            lambda g: (
                g.task("wf.value", name="check"),
                g.branch("route", on="check", then=["a"]),
                g.task("wf.add", name="a", after=["route"]),
                g.task("wf.add", name="b", after=["a"]),
                g.task("wf.add", name="c", after=["route", "a"]),
            ),
            "steps c depend on the branch but it never chooses them",
        ),
        (lambda g: g.task("wf.add", name="a", run_if="some_failed"), "run_if must be one of all_succeeded"),
        (lambda g: g.branch("route", on="x", op="~", then=["a"]), "op must be one of"),
        (lambda g: g.branch("route", on="x", then=["a"], otherwise=["a"]), "then and otherwise name each step once"),
        (lambda g: g.task("wf.pick", name="p", branch=[]), "a branch names its downstream steps"),
    ],
)
def test_bad_conditions_are_clear_errors_and_nothing_is_written(build, message):
    before = counts()
    g = Graph("bad")
    with pytest.raises(WorkflowDefinitionError, match=message):
        build(g)
        services.start_graph(g)
    assert counts() == before


def test_a_registered_workflow_with_a_bad_branch_fails_the_system_check_and_start_writes_nothing():
    from django.core.management.base import SystemCheckError

    from queue_app.workflows.definition import _workflows, workflow

    @workflow("wf_bad_branch")
    def bad(wf, params):
        check = wf.task("wf.value", name="check")
        wf.branch("route", on=check, then=["a"])
        wf.task("wf.add", name="a", after=[check])

    try:
        before = counts()
        with pytest.raises(WorkflowDefinitionError, match="not a step directly downstream"):
            services.start("wf_bad_branch")
        assert counts() == before
        with pytest.raises(SystemCheckError, match=r"jobsite.E\d+.*wf_bad_branch.*not a step directly downstream"):
            call_command("check")
    finally:
        _workflows.unregister("wf_bad_branch")
