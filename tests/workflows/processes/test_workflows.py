"""Workflows with real workers on one database: steps become ready exactly once, in the transaction that
settles their last dependency; results flow downstream; failures cancel, compensate, and repair."""

import psycopg
import pytest
from django.db import connection, transaction

from queue_app import engine
from queue_app.models import ItemState, ProbeEffect, QueueItem, Reservation
from queue_app.registry import Context, Delivery
from queue_app.workflows import services
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import StepDependency, Workflow, WorkflowStep
from tests.support.waiting import wait_for
from tests.support.workflow_helpers import finished, items_of, steps
from tests.tasks import workflow_tasks  # noqa: F401  (registers the wf.* tasks and workflows)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def workers(spawn):
    def start(n: int = 2, concurrency: int = 4, queues: str = "default") -> list:
        return [
            spawn(
                "run_worker",
                "--queues",
                queues,
                "--concurrency",
                str(concurrency),
                "--pool",
                "thread",
                "--import",
                "tests.tasks.workflow_tasks",
                "--poll-interval",
                "0.2",
            )
            for _ in range(n)
        ]

    return start


def assert_started_after_dependencies(w: Workflow) -> None:
    """No step's item was created (it became ready) before every dependency had finished."""
    current = steps(w)
    by_id = {s.id: s for s in current.values()}
    for e in StepDependency.objects.filter(downstream_id__in=list(by_id)):
        up, down = by_id.get(e.upstream_id), by_id[e.downstream_id]
        if down.ready_at is not None and up is not None and not up.kept:
            assert up.finished_at is not None and up.finished_at <= down.ready_at, (up.name, down.name)


@pytest.mark.slow
def test_diamond_runs_each_step_once_after_its_dependencies_with_their_results(workers):
    workers()
    w = services.start("wf_diamond", started_by="test")
    w = finished(w.id)
    assert w.state == "succeeded"
    s = steps(w)
    assert {n: st.state for n, st in s.items()} == dict.fromkeys("abcd", "succeeded")
    # results flow: b = 10 + a, c = 100 + a, d = 1000 + b + c
    assert (s["a"].result, s["b"].result, s["c"].result, s["d"].result) == (1, 11, 101, 1112)
    assert {n: len(i) for n, i in items_of(w).items()} == dict.fromkeys("abcd", 1)
    assert_started_after_dependencies(w)
    assert w.steps_open == 0 and w.steps_total == 4


@pytest.mark.slow
def test_fan_out_of_1000_has_one_fan_in_that_fires_once(workers):
    workers(n=3, concurrency=8)
    w = services.start("wf_fan", {"n": 1000})
    w = finished(w.id, timeout=120)
    assert w.state == "succeeded", w.error
    s = steps(w)
    assert len(s) == 1002
    parts = [st for st in s.values() if st.group == "part"]
    assert len(parts) == 1000 and all(p.state == "succeeded" for p in parts)
    fan_in = items_of(w)["sum"]
    assert len(fan_in) == 1, "the fan-in's item was enqueued more than once"
    assert Reservation.objects.filter(item_id=fan_in[0].id).count() == 1
    assert s["sum"].result == sum(range(1000))
    assert_started_after_dependencies(w)


@pytest.mark.slow
def test_failure_cancels_downstream_and_what_has_not_started(workers):
    workers()
    w = finished(services.start("wf_fails").id)
    assert w.state == "failed"
    s = steps(w)
    assert s["a"].state == "succeeded" and s["b"].state == "failed"
    assert s["c"].state == "cancelled" and s["d"].state == "cancelled"
    assert s["c"].item_id is None and s["d"].item_id is None  # never enqueued
    # e was enqueued with b. Which of the two it is depends on the race with b's failure; the rows say which it
    # was, and the outcome must match: started (leased) before the failure -> ran to success; not started ->
    # cancelled together with its item, never leased after.
    e_item = QueueItem.objects.get(id=s["e"].item_id)
    if Reservation.objects.filter(item_id=e_item.id).exists():
        assert (s["e"].state, e_item.state, s["e"].result) == ("succeeded", ItemState.DONE, 8)
    else:
        assert (s["e"].state, e_item.state) == ("cancelled", ItemState.CANCELLED)
        assert s["e"].error == "not started: the workflow failed at b"


@pytest.mark.slow
def test_saga_compensates_exactly_the_completed_steps_in_reverse_dependency_order(workers):
    workers()
    w = finished(services.start("wf_saga").id)
    assert w.state == "failed"
    s = steps(w)
    completed = {n for n, st in s.items() if st.kind != "compensation" and st.state == "succeeded"}
    undos = {n: st for n, st in s.items() if st.kind == "compensation"}
    assert {st.result["undid"] for st in undos.values()} == {n for n in completed if s[n].compensate}
    assert {"a", "b", "d"} <= completed and "boom" not in completed and s["never"].state == "cancelled"
    assert all(u.state == "succeeded" for u in undos.values())
    # reverse order: d's undo before b's before a's
    assert undos["undo d"].finished_at <= undos["undo b"].ready_at
    assert undos["undo b"].finished_at <= undos["undo a"].ready_at
    assert {n: len(i) for n, i in items_of(w).items() if n.startswith("undo")} == dict.fromkeys(undos, 1)


@pytest.mark.slow
def test_repair_reruns_only_failed_and_downstream_keeping_results(workers):
    workers()
    w = finished(services.start("wf_fails").id)
    assert w.state == "failed"
    before = steps(w)
    ProbeEffect.objects.create(key="fixed")
    services.repair(w.id, actor="test")
    w = finished(w.id)
    assert w.state == "succeeded" and w.attempt == 2
    after = steps(w)
    assert after["a"].kept and after["a"].item_id == before["a"].item_id and after["a"].result == 1
    for name in "bcd":
        assert not after[name].kept and after[name].state == "succeeded"
    assert len(items_of(w)["a"]) == 1  # a ran once over both attempts
    assert len(steps(w, attempt=1)) == len(before)  # the first attempt's history is kept


def test_start_inside_a_rolled_back_transaction_writes_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        services.start("wf_diamond")
        raise RuntimeError("roll back")
    assert not Workflow.objects.exists() and not QueueItem.objects.exists()


def _step_seen_by_another_connection(step_id: int) -> tuple[str, int, int | None, int]:
    """(state, pending, item_id) of a step, and how many items it has, read by a connection of its own: what
    every other transaction (a worker's lease) sees."""
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as other:
        state, pending, item_id = other.execute(
            "SELECT state, pending, item_id FROM queue_app_workflowstep WHERE id = %s", [step_id]
        ).fetchone()
        (items,) = other.execute(
            "SELECT count(*) FROM queue_app_queueitem WHERE workflow_step_id = %s", [step_id]
        ).fetchone()
    return state, pending, item_id, items


def test_a_step_becomes_ready_in_the_transaction_that_settles_its_last_dependency_and_rolls_back_with_it():
    """The settle of d's last dependency (c) makes d ready inside the settling transaction, visible to nothing
    else before it commits; rolled back, d is waiting again with no item; settled for real, d is ready."""
    w = services.start("wf_diamond")
    (a,) = engine.lease(None, 10, "w1", lease_timeout=60)
    engine.complete(a, 1)
    b, c = sorted(engine.lease(None, 10, "w1", lease_timeout=60), key=lambda lease: lease.item_id)
    engine.complete(b, 11)
    d = WorkflowStep.objects.get(workflow=w, name="d")
    assert (d.state, d.pending, d.item_id) == ("waiting", 1, None)

    with pytest.raises(RuntimeError), transaction.atomic():
        engine.complete(c, 101)
        inside = WorkflowStep.objects.get(id=d.id)
        assert (inside.state, inside.pending) == ("queued", 0)
        assert QueueItem.objects.get(id=inside.item_id).state == ItemState.READY
        assert _step_seen_by_another_connection(d.id) == ("waiting", 1, None, 0)
        raise RuntimeError("roll the settle back")

    assert _step_seen_by_another_connection(d.id) == ("waiting", 1, None, 0)
    assert WorkflowStep.objects.get(workflow=w, name="c").state == "queued"  # c's settle rolled back too
    assert QueueItem.objects.get(id=c.item_id).state == ItemState.RESERVED
    assert Workflow.objects.get(id=w.id).steps_open == 2

    engine.complete(c, 101)
    state, pending, item_id, items = _step_seen_by_another_connection(d.id)
    assert (state, pending, items) == ("queued", 0, 1)
    assert QueueItem.objects.get(id=item_id).state == ItemState.READY
    (leased,) = engine.lease(None, 10, "w1", lease_timeout=60)
    assert leased.item_id == item_id


def test_a_step_whose_item_a_worker_leases_while_its_workflow_fails_runs_and_is_not_marked_cancelled():
    """b dies while a worker's lease of e's item (ready, enqueued with b) is not yet committed: the failure's
    cancel of what has not started waits for that item's row lock, finds it leased, and leaves it and its step
    alone. (Before: the step was marked cancelled on the statement's snapshot while its item went on to run.)"""
    import threading

    w = services.start("wf_fails")
    (a,) = engine.lease(None, 10, "w1", lease_timeout=60)
    engine.complete(a, 1)
    e = WorkflowStep.objects.get(workflow=w, name="e")
    (b,) = engine.lease(None, 1, "w1", lease_timeout=60)
    assert b.item_id == WorkflowStep.objects.get(workflow=w, name="b").item_id
    params = connection.get_connection_params()
    with psycopg.connect(**params) as worker, psycopg.connect(**params, autocommit=True) as look:
        worker.execute("UPDATE queue_app_queueitem SET state = 'reserved' WHERE id = %s", [e.item_id])
        failing = threading.Thread(target=lambda: (engine.dead(b, "poison"), connection.close()))
        failing.start()
        # Until b's settle waits for the item's row lock (or, if it does not, has ended). Read outside the
        # worker's transaction: pg_stat_activity is read once per transaction.
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = %s"
        wait_for(
            lambda: not failing.is_alive() or look.execute(waiting, ["Lock"]).fetchone()[0],
            30,
            what="b's settle to wait for the leased item's row lock",
        )
        worker.commit()
        failing.join(30)
    assert not failing.is_alive()
    s = steps(Workflow.objects.get(id=w.id))
    assert (s["b"].state, s["c"].state, s["d"].state) == ("failed", "cancelled", "cancelled")
    assert (s["e"].state, QueueItem.objects.get(id=e.item_id).state) == ("queued", ItemState.RESERVED)
    assert Workflow.objects.get(id=w.id).state == "failing"  # e still runs: the workflow ends when it does


def test_deleting_a_workflow_takes_its_steps_and_edges_and_nothing_else():
    """Steps and edges have no foreign key constraints (migration 0019): the trigger workflow_deleted removes
    them with their workflow, as the constraints' cascade did, and leaves other workflows' rows alone."""
    gone, kept = services.start("wf_diamond"), services.start("wf_diamond")
    kept_steps = set(WorkflowStep.objects.filter(workflow=kept).values_list("id", flat=True))
    kept_edges = StepDependency.objects.filter(downstream_id__in=kept_steps).count()
    assert kept_edges == 4 and WorkflowStep.objects.filter(workflow=gone).count() == 4
    Workflow.objects.filter(id=gone.id).delete()
    assert set(WorkflowStep.objects.values_list("id", flat=True)) == kept_steps
    assert StepDependency.objects.count() == kept_edges
    assert Workflow.objects.get(id=kept.id).steps_total == 4


@pytest.mark.slow
def test_cancel_stops_a_running_task_and_cancels_the_rest(workers):
    from queue_app.workflows.definition import Graph

    workers(n=1)
    g = Graph("t")
    s = g.task("wf.slow", {"seconds": 30}, name="slow")
    g.task("wf.add", name="after", after=[s])
    w = services.start_graph(g, started_by="test")
    wait_for(
        lambda: QueueItem.objects.filter(workflow_step_id__isnull=False, state=ItemState.RESERVED).exists(),
        30,
        what="the slow step to start",
    )
    assert services.cancel(w.id, actor="test")
    w = finished(w.id)
    assert w.state == "cancelled"
    st = steps(w)
    assert st["slow"].state == "cancelled" and st["after"].state == "cancelled"


def _nothing_written() -> None:
    assert not Workflow.objects.exists() and not WorkflowStep.objects.exists() and not QueueItem.objects.exists()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda g: g.task("wf.add", name="a", after=["b"]) and g.task("wf.add", name="b", after=["a"]), "cycle"),
        (lambda g: g.task("no.such.task"), "unknown task 'no.such.task'"),
        (lambda g: g.spark("no_such_job"), "unknown Spark job 'no_such_job'"),
        (lambda g: g.spark("demo_sleep", {"tasks": "many"}), "tasks"),
        (lambda g: g.task("wf.add", name="a", after=["ghost"]), "unknown step 'ghost'"),
        (lambda g: g.task("wf.add", name="a") and g.task("wf.add", name="a"), "defined twice"),
        (lambda g: g.task("wf.add", {"x": float("nan")}), "payload"),
        (lambda g: g.task("wf.add", compensate="no.such.undo"), "unknown task 'no.such.undo'"),
        (lambda g: g.task("wf.add", on_failure="explode"), "on_failure"),
    ],
)
def test_a_bad_definition_is_refused_with_a_clear_error_and_writes_nothing(build, message):
    from queue_app.workflows import workflow
    from queue_app.workflows.definition import WorkflowDefinitionError, _workflows

    workflow("wf_bad")(lambda wf, params: build(wf))
    try:
        with pytest.raises(WorkflowDefinitionError, match=message):
            services.start("wf_bad")
    finally:
        _workflows.unregister("wf_bad")
    _nothing_written()


def test_a_dependency_on_another_workflows_step_is_refused():
    from queue_app.workflows.definition import Graph, WorkflowDefinitionError

    other = Graph("other").task("wf.add", name="x")
    with pytest.raises(WorkflowDefinitionError, match="another workflow"):
        Graph("mine").task("wf.add", name="y", after=[other])


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("wf_fan", {"n": "lots"}, "n: "),
        ("wf_fan", {"n": 0}, "must be >= 1"),
        ("wf_fan", {"m": 3}, "unknown parameter"),
        ("no_such_workflow", {}, "unknown workflow"),
    ],
)
def test_bad_params_or_name_are_refused_and_write_nothing(name, params, message):
    from queue_app.workflows import WorkflowError

    with pytest.raises(WorkflowError, match=message):
        services.start(name, params)
    _nothing_written()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start": "2026-01-05", "end": "2026-01-01"}, "from 2026-01-05 is after to 2026-01-01"),
        ({"start": "2020-01-01", "end": "2026-01-01"}, "pass --force"),
        ({"start": "2026-01-01", "end": "2026-01-02", "concurrency": 0}, "concurrency"),
        ({"start": "yesterday", "end": "2026-01-02"}, "YYYY-MM-DD"),
        ({"start": "2026-01-01", "end": "2026-01-02", "params": {"day": "2026-01-01"}}, "partition"),
    ],
)
def test_a_bad_backfill_is_refused_and_writes_nothing(kwargs, message):
    from queue_app.workflows import WorkflowError

    with pytest.raises(WorkflowError, match=message):
        services.backfill("wf.add", **kwargs)
    _nothing_written()


@pytest.mark.slow
def test_backfill_with_concurrency_2_never_has_more_than_2_partitions_running(workers):
    workers(n=2, concurrency=4)
    w = services.backfill("wf.add", "2026-01-01", "2026-01-08", params={"sleep": 0.3}, concurrency=2)
    w = finished(w.id, timeout=90)
    assert w.state == "succeeded"
    s = sorted(steps(w).values(), key=lambda st: st.name)
    assert [st.name for st in s] == [f"2026-01-0{d}" for d in range(1, 9)]
    spans = []
    for st in s:
        item = QueueItem.objects.get(id=st.item_id)
        started = Reservation.objects.filter(item_id=item.id).order_by("id").first().reserved_at
        spans.append((started, item.finished_at))
    for started, _ in spans:  # at every start, how many partitions were running
        running = sum(1 for a, b in spans if a <= started < b)
        assert running <= 2
    assert max(sum(1 for a, b in spans if a <= s0 < b) for s0, _ in spans) == 2  # and it did use both lanes


@pytest.mark.slow
def test_batch_calls_on_done_once_when_all_are_done(workers):
    workers()
    w = services.batch("wf.add", [{"x": i} for i in range(20)], on_done="wf.undo", callback_payload={"step": "b"})
    w = finished(w.id)
    assert w.state == "succeeded"
    done = wait_for(lambda: list(QueueItem.objects.filter(task="wf.undo", state="done")), 20, what="on_done")
    assert len(done) == 1 and done[0].payload["workflow_id"] == w.id


@pytest.mark.slow
def test_batch_calls_on_dead_once_when_the_first_item_dies(workers):
    workers()
    w = services.batch(
        "wf.until_fixed", [{}, {}, {}], on_done="wf.add", on_dead="wf.undo", callback_payload={"step": "d"}
    )
    w = finished(w.id)
    assert w.state == "failed"
    assert all(st.state == "failed" for st in steps(w).values())  # every item ran: one dying stops none
    dead_cb = wait_for(lambda: list(QueueItem.objects.filter(task="wf.undo", state="done")), 20, what="on_dead")
    assert len(dead_cb) == 1
    assert not QueueItem.objects.filter(task="wf.add").exists()  # on_done never ran


@pytest.mark.slow
def test_a_workflows_end_enqueues_the_finished_hook_which_sends_the_signal(workers):
    from queue_app.workflows.signals import workflow_finished

    workers()
    w = finished(services.start("wf_diamond").id)
    hook = wait_for(
        lambda: QueueItem.objects.filter(task="queue_app.workflow_finished", state="done").first(),
        20,
        what="the workflow_finished item to run",
    )
    assert hook.payload == {"workflow_id": w.id, "state": "succeeded"}
    assert QueueItem.objects.filter(task="queue_app.workflow_finished").count() == 1  # once per end
    heard = []

    def receiver(sender, workflow, state, **kwargs):
        heard.append((workflow.id, state))

    workflow_finished.connect(receiver)
    try:
        from queue_app.registry import Context, Delivery
        from queue_app.workflows.tasks import finished as hook_task

        ctx = Context(hook.id, 0, 1, 1, hook.task, hook.queue_id, Delivery.AT_LEAST_ONCE, "test")
        hook_task(hook.payload, ctx)
    finally:
        workflow_finished.disconnect(receiver)
    assert heard == [(w.id, "succeeded")]


@pytest.mark.slow
def test_backfill_of_a_workflow_with_a_fan_out_keeps_each_days_fan_out_to_its_day(workers):
    workers()
    w = finished(services.backfill("wf_daily", "2026-03-01", "2026-03-03", concurrency=2).id)
    assert w.state == "succeeded", w.error
    s = steps(w)
    assert len(s) == 3 * (2 + 3)
    for day in ("2026-03-01", "2026-03-02", "2026-03-03"):
        assert s[f"{day} sum"].result == 0 + 1 + 2  # its own day's three parts, no other day's
        assert {n for n in s if n.startswith(f"{day} part[")} == {f"{day} part[{i}]" for i in range(3)}
        assert {st.group for n, st in s.items() if n.startswith(day)} == {day}  # one partition in the grid


@pytest.mark.slow
def test_a_spark_step_reads_its_dependencies_results_through_its_run(workers, monkeypatch):
    from queue_app.spark.protocol import RUN_ID_ENV
    from queue_app.workflows.definition import Graph

    workers(n=1)  # the default queue only: the Spark step's run stays queued
    g = Graph("spark-upstream")
    a = g.task("wf.add", {"x": 5}, name="a")
    g.spark("demo_sleep", {"tasks": 1, "seconds": 0.2}, name="spark", after=[a])
    w = services.start_graph(g)
    step = wait_for(
        lambda: WorkflowStep.objects.filter(workflow=w, name="spark", spark_run_id__isnull=False).first(),
        60,
        what="the Spark step to be enqueued",
    )
    assert services.spark_upstream(step.spark_run_id) == {"a": 5}
    monkeypatch.setenv(RUN_ID_ENV, str(step.spark_run_id))  # what the run's child sets from its --run-id
    assert services.spark_upstream() == {"a": 5}
    assert services.cancel(w.id)


def test_a_fan_outs_steps_are_named_by_their_task_or_their_group_and_key():
    """The names docs/how-to/workflows.md gives them (issue 50's docs drift: the docs said `group[key]` only)."""
    g = Graph("fan-names")
    g.task("wf.add", {"x": 0}, name="parent")
    w = services.start_graph(g)
    parent = WorkflowStep.objects.get(workflow=w, name="parent")
    ctx = Context(parent.item_id, 0, 1, 1, "wf.add", "default", Delivery.AT_LEAST_ONCE, "test")
    services.fan_out(ctx, "wf.add", {"a": {"x": 1}})
    services.fan_out(ctx, "wf.add", {"b": {"x": 2}}, group="part")
    assert set(steps(Workflow.objects.get(id=w.id))) == {"parent", "wf.add[a]", "part[b]"}
