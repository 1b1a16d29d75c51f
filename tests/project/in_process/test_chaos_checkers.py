"""The checkers of `queue_chaos --workflow`, `--triggers` and `--waits` are able to fail: each test plants, on the
test database, the rows a bug would leave (a step enqueued twice, a workflow ended with a step open, a consumer
queued twice, a wait ended by two events, ...) and calls the checker directly; each fault is reported FAIL by the
check that must catch it, naming it, and the clean end state passes every check.

The clean end states are made by the product itself, in process: the workflows and waits are driven by
engine.lease/complete (the SQL triggers move the steps), the consumers queued by record_materialization's
triggers; only what a worker's handler would have written (ExecutionLog, ProbeEffect) and the clock (one
transaction: one now()) are set by hand. No cluster, no worker process, no chaos run.
"""

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.db.models import F

from jobsite.chaos.checks import Check
from jobsite.chaos.harness_checks import check_faults, check_webhooks, check_workers
from jobsite.chaos.trigger_checks import (
    CHECKED,
    CHURN_CONSUMER,
    CHURN_DATASET,
    CHURN_PRODUCER,
    CHURN_SET,
    CHURN_TASK,
    CONSUMERS,
    MAPPED,
    TriggerRun,
    check_triggers,
    watermark,
)
from jobsite.chaos.wait_checks import EVENT, WaitRun, check_waits
from jobsite.chaos.workflow_checks import AT_LEAST_ONCE, TRANSACTIONAL, WorkflowRun, check_workflows
from jobsite.chaos.workflow_tasks import CHILD
from queue_app import engine
from queue_app.models import ExecutionLog, ProbeEffect, QueueItem, Reservation
from queue_app.workflows import child_steps, services
from queue_app.workflows.definition import CHILD_START_TASK, Graph
from queue_app.workflows.models import Workflow, WorkflowEvent, WorkflowStep

FAIL_TASK = "queue_app.fail"
T_WEBHOOK = datetime(2026, 1, 1, tzinfo=UTC)  # when the receiver got each delivery (its signed timestamp)


def failed(checks: list[Check]) -> dict[str, list[str]]:
    return {c.name: c.problems for c in checks if not c.passed}


def run_probe(held, worker: str = "w1") -> None:
    """What a probe's handler writes: its run (ExecutionLog), and a transactional probe's effect."""
    delivery = "transactional" if held.task == TRANSACTIONAL else "at_least_once"
    ExecutionLog.objects.create(
        item_id=held.item_id, reservation_id=held.reservation_id, attempt=held.attempt, task=held.task,
        delivery=delivery, pid=1, worker_id=worker,
    )  # fmt: skip
    if held.task == TRANSACTIONAL:
        ProbeEffect.objects.create(key=str(held.item_id), applied=1)


def drive(queue: str = "default") -> None:
    """Lease and settle every due item of `queue` until none is left, as a worker would: probes run and
    complete, queue_app.fail dies (its step fails), a sub-workflow step's start starts its child, anything else
    (the built-ins) completes."""
    while leases := engine.lease([queue], 100, worker_id="w1"):
        for held in leases:
            if held.task == FAIL_TASK:
                engine.dead(held, "chaos: the step that fails")
                continue
            if held.task in (TRANSACTIONAL, AT_LEAST_ONCE):
                run_probe(held)
            if held.task == CHILD_START_TASK:  # a sub-workflow step's start: its handler and settle, one transaction
                with transaction.atomic():
                    engine.complete(held, child_steps.start_child(held.payload["step_id"]))
                continue
            engine.complete(held, None)


# -- queue_chaos --workflow -----------------------------------------------------------------------------------


@pytest.fixture
def workflows(db) -> WorkflowRun:
    """The two workflows of the chaos run, small: S root -> child a, child b (sub-workflow steps, each a
    chaos_child) -> fan_in (transactional) -> tail; F a -> b, c (all compensated) -> fan_in (compensated) -> boom
    (fails) -> never. Driven to their end."""
    s = Graph("chaos success")
    root = s.task(AT_LEAST_ONCE, name="root")
    subs = [s.workflow(CHILD, name=f"child {x}", after=[root]) for x in ("a", "b")]
    fan_in = s.task(TRANSACTIONAL, name="fan_in", after=[root, *subs])
    s.task(AT_LEAST_ONCE, name="tail", after=[fan_in])
    f = Graph("chaos compensation")
    a = f.task(AT_LEAST_ONCE, name="a", compensate=AT_LEAST_ONCE)
    b = f.task(TRANSACTIONAL, name="b", after=[a], compensate=AT_LEAST_ONCE)
    c = f.task(AT_LEAST_ONCE, name="c", after=[a], compensate=AT_LEAST_ONCE)
    fan_in = f.task(AT_LEAST_ONCE, name="fan_in", after=[b, c], compensate=AT_LEAST_ONCE)
    boom = f.task(FAIL_TASK, {"message": "chaos: the step that fails"}, name="boom", after=[fan_in])
    f.task(AT_LEAST_ONCE, name="never", after=[boom], compensate=AT_LEAST_ONCE)
    run = WorkflowRun(services.start_graph(s).id, services.start_graph(f).id)
    drive()
    return run


def step(workflow_id: int, name: str) -> WorkflowStep:
    return WorkflowStep.objects.get(workflow_id=workflow_id, name=name)


def test_workflow_checks_pass_on_the_clean_end_state(workflows):
    checks = check_workflows("default", workflows)
    assert failed(checks) == {}
    assert [c.name for c in checks] == [
        "no workflow stuck",
        "every step settled per its mode",
        "each fan-in fired once",
        "no step before its dependencies",
        "each child ran once, its step ended once",
        "compensations: exactly the completed, in reverse",
        "workers behaved",
    ]
    assert checks[4].figures == {"sub_workflow_steps": 2, "children": 2, "child_steps": 4}
    assert checks[5].figures == {"compensations": 4}  # a, b, c, fan_in: the completed steps with one


def test_a_workflow_finished_with_a_step_open_is_caught(workflows):
    WorkflowStep.objects.filter(id=step(workflows.success, "tail").id).update(state="queued")
    problems = failed(check_workflows("default", workflows))
    assert "1 steps still open: ['tail']" in problems["no workflow stuck"]


def test_a_step_enqueued_twice_is_caught(workflows):
    fan_in = step(workflows.success, "fan_in")
    item = QueueItem.objects.get(id=fan_in.item_id)
    item.pk, item.payload = None, {}  # a second item for the same step: the fan-in fired twice
    item.save()
    problems = failed(check_workflows("default", workflows))
    assert set(problems) == {"each fan-in fired once"}
    assert any(p.startswith("steps enqueued more than once: {'fan_in': 2}") for p in problems["each fan-in fired once"])
    assert f"fan-in of workflow {workflows.success} enqueued 2 times" in problems["each fan-in fired once"]


def test_a_transactional_step_applied_twice_or_a_probe_never_run_is_caught(workflows):
    fan_in, root = step(workflows.success, "fan_in"), step(workflows.success, "root")
    ProbeEffect.objects.filter(key=str(fan_in.item_id)).update(applied=2)
    ExecutionLog.objects.filter(item_id=root.item_id).delete()
    problems = failed(check_workflows("default", workflows))
    assert problems == {
        "every step settled per its mode": [
            "root: at-least-once probe never ran",
            "fan_in: transactional effect applied 2 times",
        ]
    }


def test_a_step_leased_before_its_dependency_ended_is_caught(workflows):
    root, fan_in = step(workflows.success, "root"), step(workflows.success, "fan_in")
    leased = Reservation.objects.get(item_id=fan_in.item_id).reserved_at
    WorkflowStep.objects.filter(id=root.id).update(finished_at=leased + timedelta(seconds=1))
    problems = failed(check_workflows("default", workflows))
    assert list(problems) == ["no step before its dependencies"]
    assert problems["no step before its dependencies"][0].startswith(f"fan_in started at {leased} before root")


def test_a_missing_or_doubled_compensation_is_caught(workflows):
    undos = WorkflowStep.objects.filter(workflow_id=workflows.failing, kind="compensation")
    undo_b = undos.get(compensates_id=step(workflows.failing, "b").id)
    WorkflowStep.objects.filter(id=undo_b.id).update(compensates_id=step(workflows.failing, "a").id)
    problems = failed(check_workflows("default", workflows))
    assert list(problems) == ["compensations: exactly the completed, in reverse"]
    assert problems["compensations: exactly the completed, in reverse"][0].startswith("compensated [")


def test_a_step_after_the_failure_that_ran_is_caught(workflows):
    WorkflowStep.objects.filter(id=step(workflows.failing, "never").id).update(state="succeeded")
    WorkflowStep.objects.filter(id=step(workflows.failing, "boom").id).update(state="succeeded")
    problems = failed(check_workflows("default", workflows))
    assert problems["compensations: exactly the completed, in reverse"][-2:] == [
        "boom is succeeded",
        "never is succeeded",
    ]


def test_a_child_started_twice_or_a_step_ended_twice_is_caught(workflows):
    a, b = step(workflows.success, "child a"), step(workflows.success, "child b")
    first = Workflow.objects.get(id=a.child_workflow_id)
    Workflow.objects.create(name=first.name, started_by=first.started_by, state="succeeded")  # a second child
    QueueItem.objects.filter(id=b.item_id).update(attempts=1)  # its wait leased: not ended by its child's end
    problems = failed(check_workflows("default", workflows))
    assert list(problems) == ["each child ran once, its step ended once"]
    assert problems["each child ran once, its step ended once"] == [
        "3 child workflows started for 2 sub-workflow steps",
        "child b: its wait item ('done', 1), not settled by its child",
    ]


def test_a_child_step_enqueued_twice_or_a_child_not_linked_is_caught(workflows):
    a, b = step(workflows.success, "child a"), step(workflows.success, "child b")
    second = WorkflowStep.objects.get(workflow_id=a.child_workflow_id, name="second")
    item = QueueItem.objects.get(id=second.item_id)
    item.pk, item.payload = None, {}
    item.save()  # the child's second step enqueued twice
    WorkflowStep.objects.filter(id=b.id).update(child_workflow_id=a.child_workflow_id)  # b's child is a's
    problems = failed(check_workflows("default", workflows))["each child ran once, its step ended once"]
    assert f"child workflow {a.child_workflow_id} linked to 2 steps" in problems
    assert f"child {a.child_workflow_id} step second: succeeded, its item enqueued 2 times" in problems


def test_a_crashed_worker_fails_the_workflow_run(workflows):
    run = WorkflowRun(workflows.success, workflows.failing, ["w3 exited 1 unasked"], kills=2)
    assert failed(check_workflows("default", run)) == {"workers behaved": ["w3 exited 1 unasked"]}


# -- queue_chaos --triggers -----------------------------------------------------------------------------------

ALL_TASK, ANY_TASK = CONSUMERS
GOOD, OVERRIDDEN, REWRITTEN = "2025-01-01", "2025-01-02", "2025-01-03"


class TriggerScene:
    """Three partitions' end state, by hand: GOOD recorded good; OVERRIDDEN's chaos_a recorded bad, failed, then
    overridden; REWRITTEN's chaos_a recorded bad, failed, then recorded again good. Each upstream recorded at
    T0, every consumer item leased at T0 + 100 s and done, with its output row; the consumers of the blocked
    partitions queued in the second phase."""

    def __init__(self) -> None:
        with connection.cursor() as cur:
            cur.execute("SELECT now() - interval '1 hour'")
            self.t0 = cur.fetchone()[0]
        self.rows: dict[tuple[str, str], list] = {}
        for day in (GOOD, OVERRIDDEN, REWRITTEN):
            states = {GOOD: ["passed"], OVERRIDDEN: ["overridden"], REWRITTEN: ["failed", "passed"]}[day]
            self.rows[CHECKED, day] = [self.record(CHECKED, day, s) for s in states]
            self.rows["chaos_b", day] = [self.record("chaos_b", day, "none")]
        self.consume(GOOD)
        self.second_phase_from = QueueItem.objects.order_by("-id").first().id + 1
        self.consume(OVERRIDDEN)
        self.consume(REWRITTEN)

    def record(self, dataset: str, day: str, checks: str = "none", at: float = 0):
        from queue_app.datasets.models import Materialization

        return Materialization.objects.create(
            dataset=dataset, partition=day, source="code", checks=checks, at=self.t0 + timedelta(seconds=at)
        )

    def consume(self, day: str) -> None:
        """The all consumer once (the usable upstreams), the any consumer once per usable upstream; each run."""
        a, b = self.rows[CHECKED, day][-1].id, self.rows["chaos_b", day][-1].id
        self.item(ALL_TASK, day, {"chaos_a": a, "chaos_b": b})
        self.item(ANY_TASK, day, {"chaos_a": a})
        self.item(ANY_TASK, day, {"chaos_b": b})

    def item(self, task: str, day: str, upstream: dict, *, leased: float = 100, ran: bool = True) -> int:
        item_id = engine.enqueue(task, {"partition": day, "upstream": upstream}).id
        at = self.t0 + timedelta(seconds=leased)
        res = Reservation.objects.create(
            item_id=item_id, attempt=1, worker_id="w1", reserved_at=at, lease_expires_at=at, heartbeat_at=at,
            finished_at=at, outcome="done",
        )  # fmt: skip
        QueueItem.objects.filter(id=item_id).update(state="done", reservation_id=res.id, attempts=1)
        if ran:
            self.record({**CONSUMERS, **MAPPED}[task], day, at=leased)
        return item_id

    def run(self, **changes) -> TriggerRun:
        days = [GOOD, OVERRIDDEN, REWRITTEN]
        return TriggerRun(days, [OVERRIDDEN], [REWRITTEN], changes.get("second_phase_from", self.second_phase_from))

    def judge(self, **changes) -> dict[str, list[str]]:
        return failed(check_triggers("default", self.run(**changes)))


@pytest.fixture
def triggers(db) -> TriggerScene:
    return TriggerScene()


def test_trigger_checks_pass_on_the_clean_end_state(triggers):
    checks = check_triggers("default", triggers.run())
    assert failed(checks) == {}
    assert [c.name for c in checks] == [
        "no item stuck",
        "every upstream recorded once",
        "bad records failed their blocking check",
        "each consumer queued once per usable set",
        "each consumer item ran exactly once",
        "no consumer before its upstreams",
        "each mapped consumer queued once per set",
        "dynamic keys: no run after removal",
        "workers behaved",
    ]


def test_a_trigger_fired_twice_is_caught(triggers):
    a, b = triggers.rows[CHECKED, GOOD][0].id, triggers.rows["chaos_b", GOOD][0].id
    triggers.item(ALL_TASK, GOOD, {"chaos_a": a, "chaos_b": b})  # queued (and run) a second time
    triggers.item(ANY_TASK, GOOD, {"chaos_b": b})
    assert triggers.judge() == {
        "each consumer queued once per usable set": [
            f"all consumer of {GOOD} queued 2 times",
            f"any consumer of {GOOD} queued 3 times",
        ]
    }


def test_a_consumer_run_twice_or_never_is_caught(triggers):
    triggers.record("chaos_all_out", GOOD)  # a second run of its one item
    triggers.item(ANY_TASK, REWRITTEN, {"chaos_a": triggers.rows[CHECKED, REWRITTEN][0].id}, ran=False)
    problems = triggers.judge()
    assert problems["each consumer item ran exactly once"] == [
        f"chaos_all_out[{GOOD}]: 2 runs for 1 items",
        f"chaos_any_out[{REWRITTEN}]: 2 runs for 3 items",
    ]


def test_a_consumer_of_a_blocked_partition_queued_before_its_override_is_caught(triggers):
    later = triggers.second_phase_from + 100  # as if the second phase began after every consumer item
    problems = triggers.judge(second_phase_from=later)
    assert list(problems) == ["each consumer queued once per usable set"]
    assert [p.split(" queued")[0].split(" of ")[1] for p in problems["each consumer queued once per usable set"]] == [
        f"blocked {OVERRIDDEN}",
        f"blocked {REWRITTEN}",
    ]


def test_a_consumer_given_the_bad_record_is_caught(triggers):
    bad, b = triggers.rows[CHECKED, REWRITTEN][0].id, triggers.rows["chaos_b", REWRITTEN][0].id
    QueueItem.objects.filter(task=ALL_TASK, payload__partition=REWRITTEN).update(
        payload={"partition": REWRITTEN, "upstream": {"chaos_a": bad, "chaos_b": b}}
    )
    problems = triggers.judge()["each consumer queued once per usable set"]
    assert problems[-1] == f"all consumer of {REWRITTEN} got {{'chaos_a': {bad}, 'chaos_b': {b}}}"


def test_a_consumer_leased_before_its_upstreams_were_recorded_is_caught(triggers):
    (item,) = QueueItem.objects.filter(task=ALL_TASK, payload__partition=GOOD)
    Reservation.objects.filter(item_id=item.id).update(reserved_at=triggers.t0 - timedelta(seconds=1))
    problems = triggers.judge()
    assert list(problems) == ["no consumer before its upstreams"]
    assert problems["no consumer before its upstreams"][0].startswith(f"{ALL_TASK}[{GOOD}] leased at ")


def test_a_bad_record_that_passed_its_check_or_an_upstream_recorded_twice_is_caught(triggers):
    from queue_app.datasets.models import Materialization

    Materialization.objects.filter(id=triggers.rows[CHECKED, OVERRIDDEN][0].id).update(checks="passed")
    triggers.record("chaos_b", GOOD)
    problems = triggers.judge()
    assert problems["bad records failed their blocking check"] == [
        f"chaos_a[{OVERRIDDEN}] checks ['passed'], not ['overridden']"
    ]
    assert problems["every upstream recorded once"] == [f"chaos_b[{GOOD}] recorded 2 times"]


def test_an_item_left_open_is_caught(triggers):
    QueueItem.objects.filter(task=ANY_TASK).update(state="ready")
    assert triggers.judge()["no item stuck"] == []
    assert not check_triggers("default", triggers.run())[0].passed


class ChurnScene:
    """A dynamic key's life as the run leaves it, by hand: c1 of chaos_customers added by the harness; a producer
    item of it (its materialization recorded) open while a churn item's removal is refused naming it, done
    before the next churn item removes the key (its watermarks read then); a third adds it again, and a
    producer item of it after that. With `in_gap`: an item and a materialization of c1 made while it was
    removed."""

    def __init__(self, t0, *, in_gap: bool = False) -> None:
        from queue_app.datasets.models import DynamicPartitionKey, Materialization

        self.t0 = t0
        first = DynamicPartitionKey.objects.create(partition_set=CHURN_SET, key="c1", added_by="queue_chaos")
        self.open_item = self.item(CHURN_PRODUCER, {"dataset": CHURN_DATASET, "partition": "c1"}, finished=10)
        Materialization.objects.create(dataset=CHURN_DATASET, partition="c1", source="item", at=self.at(10))
        named = [f"item:{self.open_item}"]
        self.refusal = self.item(CHURN_TASK, {"key": "c1"}, result={"key": "c1", "op": "remove", "removed": False,
                                                                     "named": named})  # fmt: skip
        self.removal = self.item(CHURN_TASK, {"key": "c1"}, finished=20)
        first.removed_at, first.removed_by = self.at(20), f"chaos:{self.removal}"
        first.save()
        self.result(self.removal, {"key": "c1", "op": "remove", "removed": True, "watermark": self.mark()})
        if in_gap:
            self.gap_item = self.item(CHURN_CONSUMER, {"partition": "c1", "upstream": {}}, finished=25)
            self.gap_m = Materialization.objects.create(
                dataset=CHURN_DATASET, partition="c1", source="item", at=self.at(25)
            ).id
        mark = self.mark()
        readd = self.item(CHURN_TASK, {"key": "c1"}, finished=30)
        DynamicPartitionKey.objects.create(partition_set=CHURN_SET, key="c1", added_by=f"chaos:{readd}")
        self.result(readd, {"key": "c1", "op": "add", "added": True, "watermark": mark})
        self.item(CHURN_PRODUCER, {"dataset": CHURN_DATASET, "partition": "c1"}, finished=40)

    def at(self, seconds: float):
        return self.t0 + timedelta(seconds=seconds)

    def mark(self) -> dict:
        with connection.cursor() as cursor:
            return watermark(cursor)

    def item(self, task: str, payload: dict, *, finished: float = 5, result=None) -> int:
        item_id = engine.enqueue(task, payload).id
        QueueItem.objects.filter(id=item_id).update(state="done", finished_at=self.at(finished), result=result)
        return item_id

    def result(self, item_id: int, result: dict) -> None:
        QueueItem.objects.filter(id=item_id).update(result=result)


def test_a_run_of_a_removed_key_or_a_removal_while_one_was_open_is_caught(triggers):
    from queue_app.datasets.models import DynamicPartitionKey

    check = "dynamic keys: no run after removal"
    scene = ChurnScene(triggers.t0)
    assert triggers.judge() == {}
    (churn,) = [c for c in check_triggers("default", triggers.run()) if c.name == check]
    assert churn.figures == {"removed": 1, "refused": 1, "added_again": 1, "runs": 3}

    QueueItem.objects.filter(id=scene.open_item).update(finished_at=scene.at(21))  # settled after the removal
    QueueItem.objects.filter(id=scene.refusal).update(
        result={"key": "c1", "op": "remove", "removed": False, "named": ["item:1"]}  # a consumer of chaos_a's
    )
    stray = DynamicPartitionKey.objects.create(partition_set=CHURN_SET, key="c2", added_by="queue_chaos")
    DynamicPartitionKey.objects.filter(id=stray.id).update(removed_at=scene.at(50), removed_by="cli:someone")
    assert triggers.judge()[check] == [
        "key rows removed by ['cli:someone'] no committed removal says; removals [] not in the rows",
        f"item {scene.open_item} of c1 open at its removal (chaos:{scene.removal})",
        f"chaos:{scene.refusal}: removal of c1 refused naming item:1, no run of it",
    ]


def test_an_item_or_a_materialization_of_a_key_made_while_it_was_removed_is_caught(triggers):
    scene = ChurnScene(triggers.t0, in_gap=True)
    assert triggers.judge() == {
        "dynamic keys: no run after removal": [
            f"item {scene.gap_item} of c1 started while it was removed (chaos:{scene.removal})",
            f"materialization {scene.gap_m} of c1 started while it was removed (chaos:{scene.removal})",
        ]
    }


# -- queue_chaos --waits --------------------------------------------------------------------------------------

KEPT, LIVE = "order-0", "order-1"  # its event sent before its workflow existed; sent after its wait opened
NAP = 2.0


class WaitScene:
    """Two workflows nap -> wait for EVENT -> transactional probe, driven to their end: KEPT's event sent before
    the workflow existed, LIVE's once its wait opened, then LIVE's second send (kept, unclaimed). The naps made due
    at once, their items' created_at moved back by the nap (as if they had slept it). One transaction, one now():
    a wait's ready_at is the clock's (later), so LIVE's event and its after step's lease are moved to when they
    came in a run: the event at its wait's opening, the lease at its step's."""

    def __init__(self) -> None:
        from queue_app.workflows.waits import send_event

        self.send = lambda key, n: send_event(EVENT, key, {"nonce": f"{key}#{n}", "order": key})
        self.send(KEPT, 1)
        self.workflows = {}
        for key in (KEPT, LIVE):
            g = Graph(f"chaos waits {key}")
            sleep = g.sleep("nap", seconds=NAP)
            paid = g.wait_event("paid", event=EVENT, key=key, timeout=3600, on_timeout="fail", after=[sleep])
            g.task(TRANSACTIONAL, name="after", after=[paid])
            self.workflows[key] = services.start_graph(g).id
        naps = QueueItem.objects.filter(workflow_step_id__in=WorkflowStep.objects.filter(name="nap").values("id"))
        naps.update(run_at=F("created_at"), visible_at=F("created_at"))
        naps.update(created_at=F("created_at") - timedelta(seconds=NAP))
        drive()  # the naps end, both waits open, KEPT's takes its kept event, KEPT's after runs
        self.send(LIVE, 1)
        drive()
        self.send(LIVE, 2)
        WorkflowEvent.objects.filter(payload__nonce=f"{LIVE}#1").update(created_at=self.step(LIVE, "paid").ready_at)
        after = self.step(LIVE, "after")
        Reservation.objects.filter(item_id=after.item_id).update(reserved_at=after.ready_at)

    def step(self, key: str, name: str) -> WorkflowStep:
        return WorkflowStep.objects.get(workflow_id=self.workflows[key], name=name)

    def event(self, key: str, n: int) -> WorkflowEvent:
        return WorkflowEvent.objects.get(key=key, payload__nonce=f"{key}#{n}")

    def run(self, **changes) -> WaitRun:
        planted = {f"{KEPT}#1": KEPT, f"{LIVE}#1": LIVE, f"{LIVE}#2": LIVE}
        fields = dict(
            workflows=self.workflows, naps=dict.fromkeys(self.workflows, NAP), planted=planted,
            seconds={f"{LIVE}#2": LIVE}, sent=[{}] * 3, restart="at 6.0s, took 1.0s",
        )  # fmt: skip
        return WaitRun(**(fields | changes))

    def judge(self, **changes) -> dict[str, list[str]]:
        return failed(check_waits("default", self.run(**changes)))


@pytest.fixture
def waits(db) -> WaitScene:
    return WaitScene()


def test_wait_checks_pass_on_the_clean_end_state(waits):
    checks = check_waits("default", waits.run())
    assert failed(checks) == {}
    assert [c.name for c in checks] == [
        "every workflow succeeded",
        "every event sent stored once",
        "every event woke exactly one step once",
        "the step after each wait ran once",
        "nothing woke early",
        "workers behaved",
    ]
    assert checks[2].figures == {"claimed": 2, "kept_then_claimed": 1, "live": 1, "second_sends_kept": 1}


def test_a_wait_completed_by_two_events_is_caught(waits):
    """The unique index lets one event name one step only: a second event of the key claimed (here by the step
    after the wait) is a key whose events ended two steps."""
    WorkflowEvent.objects.filter(id=waits.event(LIVE, 2).id).update(step_id=waits.step(LIVE, "after").id)
    problems = waits.judge()
    assert problems["every event woke exactly one step once"][:1] == [f"{LIVE}: 2 events claimed"]


def test_a_wait_ended_by_a_newer_event_than_the_oldest_is_caught(waits):
    first, second, wait = waits.event(LIVE, 1), waits.event(LIVE, 2), waits.step(LIVE, "paid")
    WorkflowEvent.objects.filter(id=first.id).update(step_id=None)
    WorkflowEvent.objects.filter(id=second.id).update(step_id=wait.id)
    problems = waits.judge()["every event woke exactly one step once"]
    assert problems[:2] == [
        f"{LIVE}: event {second.id} claimed, not the oldest {first.id}",
        f"{LIVE}: the wait's result {wait.result} is not its event's payload",
    ]
    assert problems[2].startswith("unclaimed events ['order-1#1', 'order-1#2'] differ from the second sends")


def test_an_event_lost_or_stored_twice_is_caught(waits):
    waits.event(LIVE, 2).delete()
    kept = waits.event(KEPT, 1)
    kept.pk, kept.step_id = None, None
    kept.save()
    problems = waits.judge()["every event sent stored once"]
    assert problems == [f"{KEPT}#1 stored 2 times", f"{LIVE}#2 stored 0 times"]


def test_a_lost_wait_is_caught(waits):
    from queue_app.workflows.models import Workflow

    Workflow.objects.filter(id=waits.workflows[LIVE]).update(state="running")
    assert waits.judge()["every workflow succeeded"] == [f"{LIVE} (workflow {waits.workflows[LIVE]}) is running"]


def test_the_step_after_a_wait_run_twice_is_caught(waits):
    ProbeEffect.objects.filter(key=str(waits.step(KEPT, "after").item_id)).update(applied=2)
    assert waits.judge() == {"the step after each wait ran once": [f"{KEPT}: its effect applied 2 times"]}


def test_a_nap_or_a_step_after_its_wait_that_woke_early_is_caught(waits):
    nap = waits.step(KEPT, "nap")
    QueueItem.objects.filter(id=nap.item_id).update(created_at=F("created_at") + timedelta(seconds=1))
    WorkflowEvent.objects.filter(id=waits.event(LIVE, 1).id).update(created_at=F("created_at") + timedelta(seconds=5))
    problems = waits.judge()
    assert list(problems) == ["nothing woke early"]
    assert [p.split(":")[0] for p in problems["nothing woke early"]] == [KEPT, KEPT, LIVE]
    assert "the step after the wait leased at" in problems["nothing woke early"][-1]


def test_a_sender_that_did_not_send_everything_or_a_restart_that_never_fired_is_caught(waits):
    problems = waits.judge(sent=[{}] * 2, sender_exit=1, restart="")
    assert problems["every event sent stored once"] == ["sender sent 2 of 3, exit 1 (log )"]
    assert problems["workers behaved"] == ["the PostgreSQL restart did not fire before the waits were over"]


# -- the item run's checks of the run itself: faults, webhooks, workers ---------------------------------------


def test_a_fault_schedule_not_fired_in_full_or_on_an_empty_queue_is_caught():
    from jobsite.chaos.faults import Fired

    fired = [Fired("kill", 3.0, 0.1, held=2, detail={"open": 40}), Fired("restart", 9.0, 0.5, detail={"open": 12})]
    wanted = {"kill": 1, "kill_amo": 0, "sigterm": 0, "restart": 1, "cut": 0}
    clean = check_faults(fired, wanted)
    assert clean.passed and clean.figures["kills_holding_work"] == 1
    fired.append(Fired("cut", 20.0, 0.9, detail={"open": 0}))
    late = check_faults(fired, wanted | {"sigterm": 1})
    assert late.problems == ["sigterm: 0 of 1 fired", "cut at 20.0s fired on an empty queue"]


def test_workers_that_crashed_or_did_not_exit_cleanly_are_caught():
    from types import SimpleNamespace as Proc

    procs = [
        Proc(worker_id="w1", fate="killed", burst=False, exit_code=-9),
        Proc(worker_id="w2", fate="sigterm", burst=False, exit_code=0),
        Proc(worker_id="w3", fate="burst-done", burst=True, exit_code=0),
    ]
    assert check_workers([], procs, True, 1).passed
    procs[1].exit_code, procs[2].exit_code = 1, 2
    check = check_workers(["w4 exited 1 unasked"], procs, False, 3)
    assert check.problems == [
        "w4 exited 1 unasked",
        "w2 exited 1 after SIGTERM",
        "burst worker w3 exited 2",
        "the burst workers did not drain the queue before the deadline",
    ]


class Webhooks:
    """Two items dead-lettered on a database with the run's endpoint (item.dead_lettered): the SQL trigger queues
    a delivery for each; each received once, signed with the endpoint's secret, its item settled done."""

    def __init__(self) -> None:
        from standardwebhooks.webhooks import Webhook

        from queue_app.webhooks.events import WEBHOOK_QUEUE
        from queue_app.webhooks.models import WebhookDelivery, WebhookEndpoint
        from queue_app.webhooks.sender import new_secret

        self.secret = new_secret()
        WebhookEndpoint.objects.create(
            url="http://127.0.0.1:9/", event_types=["item.dead_lettered"], secret=self.secret
        )
        for _ in range(2):
            engine.enqueue("chaos.poison", {}, queue="chaos", max_attempts=1)
            (held,) = engine.lease(["chaos"], 1, worker_id="w1")
            engine.dead(held, "unknown task: chaos.poison")
        self.publish(WEBHOOK_QUEUE)
        self.first, self.repeats = {}, {}
        signer = Webhook(self.secret)
        for delivery in WebhookDelivery.objects.order_by("id"):
            at = T_WEBHOOK
            headers = {"Webhook-Id": delivery.webhook_id, "Webhook-Timestamp": str(int(at.timestamp())),
                       "Webhook-Signature": signer.sign(delivery.webhook_id, at, delivery.body)}  # fmt: skip
            self.first[delivery.webhook_id] = (headers, delivery.body.encode())
        drive(WEBHOOK_QUEUE)  # the deliveries' items settle done

    @staticmethod
    def publish(queue: str) -> None:
        """Run the publish items the dead letters' trigger queued, as their handler does: one delivery each."""
        from queue_app.events import PUBLISH_TASK
        from queue_app.webhooks.events import publish_event

        for held in engine.lease([queue], 100, worker_id="w1"):
            assert held.task == PUBLISH_TASK
            publish_event(held.payload["type"], held.payload["data"])
            engine.complete(held, None)

    def check(self) -> Check:
        return check_webhooks("default", self.first, self.repeats, self.secret)


@pytest.fixture
def webhooks(db) -> Webhooks:
    return Webhooks()


def test_webhook_checks_pass_when_every_dead_letter_was_delivered_once_signed(webhooks):
    check = webhooks.check()
    assert check.passed, check.problems
    assert check.figures | {"webhook_items": None} == {
        "dead_letters": 2, "deliveries": 2, "received": 2, "received_again": 0, "webhook_items": None
    }  # fmt: skip


def test_a_delivery_lost_forged_or_left_open_is_caught(webhooks):
    from queue_app.webhooks.events import WEBHOOK_QUEUE

    lost, forged = list(webhooks.first)
    del webhooks.first[lost]
    headers, body = webhooks.first[forged]
    webhooks.first[forged] = (headers, body.replace(b"chaos", b"CHAOS"))  # a body its signature does not cover
    QueueItem.objects.filter(queue_id=WEBHOOK_QUEUE).update(state="ready")
    assert webhooks.check().problems == [
        f"delivery {lost} never reached the receiver",
        f"{forged}: the signature does not verify",
        "4 webhook items ended ready",  # two publish items, two deliveries
    ]


def test_a_dead_letter_with_no_event_is_caught(webhooks):
    from queue_app.webhooks.models import WebhookDelivery

    gone = WebhookDelivery.objects.order_by("id").first()
    item_id = json.loads(gone.body)["data"]["item_id"]
    del webhooks.first[gone.webhook_id]
    gone.delete()
    assert webhooks.check().problems == [f"the dead letter of item {item_id} raised no event"]


def test_a_mapped_consumer_fired_twice_or_for_an_incomplete_set_is_caught(triggers):
    """A week of chaos_b recorded whole (2025-01-06 .. 12) and a day of chaos_region's every source: each mapped
    consumer queued once passes; queued again, or for a week missing a day, is caught."""
    week = [f"2025-01-{d:02d}" for d in range(6, 13)]
    ids = {f"chaos_b[{d}]": triggers.record("chaos_b", d).id for d in week}
    fan_in = {f"chaos_region[{GOOD}|{s}]": triggers.record("chaos_region", f"{GOOD}|{s}").id for s in ("s1", "s2")}
    week_task, fanin_task = MAPPED
    triggers.item(week_task, "2025-W02", ids)
    triggers.item(fanin_task, GOOD, fan_in)

    def judge():
        run = TriggerRun([GOOD, OVERRIDDEN, REWRITTEN, *week], [OVERRIDDEN], [REWRITTEN], triggers.second_phase_from,
                         sources=["s1", "s2"])  # fmt: skip
        return failed(check_triggers("default", run)).get("each mapped consumer queued once per set", [])

    assert judge() == []
    triggers.item(week_task, "2025-W02", ids)  # the week's set fired a second time
    triggers.item(fanin_task, OVERRIDDEN, {})  # a fan-in of a day whose sources were never recorded
    assert judge() == [
        "jobsite.chaos_consume_fanin[2025-01-02] queued 1 times for an incomplete set",
        "jobsite.chaos_consume_week[2025-W02] queued 2 times",
    ]
