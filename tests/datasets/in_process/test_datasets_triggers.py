"""Data-aware triggers in process (datasets/triggers.py, datasets/spark_triggers.py): Spark jobs declared with on_update
are queued (a SparkRun and its item, trigger "dataset") in the transaction that records the last upstream;
all/any, a materialization counted once, a consumer that cannot start, the debounce timer, the system checks.
The guarantees under concurrency are proved with real workers in
tests/datasets/processes/test_datasets_triggers_workers.py."""

import json
import threading

import pytest
from django.contrib.auth.models import Permission, User
from django.core.checks import run_checks
from django.db import connections, transaction

from queue_app.datasets import DatasetError, MultiPartitions, StaticPartitions, dataset
from queue_app.datasets.checks_run import override_failed_checks, record_check_result
from queue_app.datasets.declarations import _code
from queue_app.datasets.materialize import materialize, wait
from queue_app.datasets.models import Materialization, TriggerFire, TriggerState
from queue_app.datasets.quality import _checks, check
from queue_app.datasets.refs import DatasetRef
from queue_app.datasets.services import record_materialization
from queue_app.datasets.spark_runs import output_figures, record_outputs
from queue_app.datasets.triggers import (
    TIMER_TASK,
    Consumer,
    OnUpdate,
    consumers,
    due_timer,
    materialization_usable,
    trigger_problems,
)
from queue_app.models import QueueItem
from queue_app.params import Param
from queue_app.spark.models import SparkRun
from queue_app.spark.registry import SparkParamError, _jobs, get_job, spark_job
from queue_app.spark.runs import trigger_run, triggered
from queue_app.spark.scripts import ROOTS_ENV as SCRIPT_ROOTS_ENV
from queue_app.spark.scripts import ScriptError, register_script
from queue_app.workflows.definition import _workflows, workflow
from queue_app.workflows.models import Workflow
from tests.support.paths import SPARK_SCRIPTS
from tests.support.waiting import seen_waiting
from tests.tasks import trigger_tasks

pytestmark = pytest.mark.django_db(transaction=True)
SCRIPTS = SPARK_SCRIPTS
TRIGGER_IDS = {"jobsite.E107", "jobsite.E108", "jobsite.E109"}


@pytest.fixture
def declared():
    datasets_before, jobs_before = set(_code.entries()), set(_jobs.entries())
    for name in ("dtr_a", "dtr_b", "dtr_out"):
        dataset(name, location=f"table:t.{name}", partitioning="daily")
    day = [Param("day", "date", required=True)]

    @spark_job("dtr_all", params=day, on_update={"dtr_a": "day", "dtr_b": "day"}, produces={"dtr_out": "day"})
    def all_job(spark, params):
        return {}

    @spark_job("dtr_any", params=day, on_update=["dtr_a", "dtr_b"], trigger_mode="any", consumes={"dtr_a": "day"})
    def any_job(spark, params):
        return {}

    yield
    for name in set(_jobs.entries()) - jobs_before:
        _jobs.unregister(name)
    for name in set(_code.entries()) - datasets_before:
        _code.unregister(name)


def runs(job):
    return list(SparkRun.objects.filter(job=job).order_by("id").values_list("params", "trigger"))


def test_all_runs_once_every_upstream_is_new_and_any_runs_on_each_update(declared):
    with transaction.atomic():
        record_materialization("dtr_a", "2026-11-26")
    assert runs("dtr_all") == []
    assert runs("dtr_any") == [({"day": "2026-11-26"}, "dataset")]
    with transaction.atomic():
        b = record_materialization("dtr_b", "2026-11-26")
        assert runs("dtr_all") == [({"day": "2026-11-26"}, "dataset")]  # in the recorder's transaction
    record_materialization("dtr_a", "2026-11-26")  # a newer a: dtr_all waits for a newer b too
    assert len(runs("dtr_all")) == 1
    materialization_usable(b)  # reported again (a check override): counted once
    assert len(runs("dtr_all")) == 1 and len(runs("dtr_any")) == 3
    record_materialization("dtr_b", "2026-11-26")
    assert len(runs("dtr_all")) == 2 and len(runs("dtr_any")) == 4
    record_materialization("dtr_b", "2026-11-27")  # another partition has its own state
    assert len(runs("dtr_all")) == 2
    fire = TriggerFire.objects.filter(consumer="spark:dtr_all").order_by("id").first()
    run = SparkRun.objects.filter(job="dtr_all").order_by("id").first()
    assert fire.started == [f"spark_run:{run.id}"] and set(fire.upstream) == {"dtr_a", "dtr_b"}
    assert run.requested_by.startswith("dtr_a #") and run.item_id is not None
    assert triggered(run).startswith("triggered by the update of dtr_a #")


def test_a_rolled_back_record_triggers_nothing_and_a_consumer_that_cannot_start_keeps_its_error(declared):
    with pytest.raises(RuntimeError), transaction.atomic():
        record_materialization("dtr_a", "2026-11-26")
        raise RuntimeError("the producer failed after writing")
    assert runs("dtr_any") == [] and not TriggerState.objects.exists()

    @spark_job(
        "dtr_broken",
        params=[Param("day", "date", required=True), Param("n", "int", required=True)],
        on_update={"dtr_b": "day"},
    )
    def broken(spark, params):
        return {}

    m = record_materialization("dtr_b", "2026-11-26")  # the producer's record commits all the same
    assert Materialization.objects.filter(id=m.id).exists()
    fire = TriggerFire.objects.get(consumer="spark:dtr_broken")
    assert "n" in fire.error and fire.started == [] and runs("dtr_broken") == []


def test_two_upstreams_recorded_in_overlapping_transactions_start_the_consumer_once(declared):
    """The first recorder holds its transaction open; the second waits on the state row's lock, then sees the
    first's pending upstream and fires: exactly one run, whichever commits last."""
    first_recorded, release = threading.Event(), threading.Event()

    def first():
        try:
            with transaction.atomic():
                record_materialization("dtr_a", "2026-11-26")
                first_recorded.set()
                release.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=first)
    thread.start()
    assert first_recorded.wait(10)
    second = threading.Thread(target=lambda: (record_materialization("dtr_b", "2026-11-26"), connections.close_all()))
    second.start()
    seen_waiting(what="the second recorder waiting on the first's row lock", timeout=10)
    release.set()
    thread.join(10)
    second.join(10)
    assert len(runs("dtr_all")) == 1


def test_a_debounced_trigger_keeps_one_timer_that_later_updates_push_back(declared):
    trigger_tasks.declare()
    try:
        for _ in range(3):
            record_materialization("tt_c", "2026-11-26")
        state = TriggerState.objects.get(consumer="task:tests.trig_debounced")
        timers = QueueItem.objects.filter(task=TIMER_TASK)
        assert timers.count() == 1 and state.timer_item_id == timers.get().id and len(state.pending) == 1
        assert due_timer(state.consumer, state.partition, state.timer_item_id + 999) == "stale"
        assert due_timer(state.consumer, state.partition, state.timer_item_id) == "pushed back"  # not due yet
        state.refresh_from_db()
        TriggerState.objects.filter(id=state.id).update(due_at=state.due_at.replace(year=2000))
        fired = due_timer(state.consumer, state.partition, state.timer_item_id)
        assert fired.started and QueueItem.objects.filter(task="tests.trig_debounced").count() == 1
        assert due_timer(state.consumer, state.partition, state.timer_item_id) == "stale"  # a re-delivery
    finally:
        trigger_tasks.undeclare()


def test_declarations_and_checks_refuse_bad_triggers(declared):
    with pytest.raises(DatasetError, match="'all' or 'any'"):
        spark_job("dtr_bad", on_update=["dtr_a"], trigger_mode="some")
    with pytest.raises(DatasetError, match="debounce"):
        spark_job("dtr_bad", on_update=["dtr_a"], debounce=-1)
    with pytest.raises(DatasetError, match="not a string"):
        spark_job("dtr_bad", on_update="dtr_a")

    def consumer(key, names, produces=(), param="day"):
        refs = tuple(DatasetRef(n) for n in names)
        return Consumer(key, OnUpdate(refs), lambda p, u: [], param=param, params=("day",), produces=produces)

    dataset("dtr_static", location="table:t.static", partitioning=StaticPartitions(["eu"]))
    problems = trigger_problems(
        {
            "spark:x": consumer("spark:x", ["dtr_missing"]),
            "spark:y": consumer("spark:y", ["dtr_a", "dtr_static"]),
            "spark:z": consumer("spark:z", ["dtr_a"], param=None),
            "spark:c1": consumer("spark:c1", ["dtr_out"], produces=("dtr_b",)),
            "spark:c2": consumer("spark:c2", ["dtr_b"], produces=("dtr_out",)),
        }
    )
    by_id = {}
    for check_id, message in problems:
        by_id.setdefault(check_id, []).append(message)
    assert "unknown dataset 'dtr_missing'" in by_id["jobsite.E107"][0]
    assert any("partitioned differently" in m for m in by_id["jobsite.E108"])
    assert any("no parameter to take the partition" in m for m in by_id["jobsite.E108"])
    assert "cycle" in by_id["jobsite.E109"][0] and "dtr_out" in by_id["jobsite.E109"][0]


@pytest.fixture
def materialize_cli(manage):
    trigger_tasks.declare()
    yield lambda *args: manage("dataset", "--import", "tests.tasks.trigger_declared", "materialize", *args)
    trigger_tasks.undeclare()


def test_materialize_queues_one_run_per_partition_missing_only_and_refuses_bad_input(materialize_cli):
    record_materialization("tt_days", "2026-11-02")
    done = materialize_cli("tt_days", "--from", "2026-11-01", "--to", "2026-11-03", "--missing-only", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert set(result) == {"dataset", "partitions", "runs", "items", "state"}
    assert result["partitions"] == ["2026-11-01", "2026-11-03"] and result["state"] == "queued"
    queued = SparkRun.objects.filter(id__in=result["runs"]).order_by("id")
    assert [r.params for r in queued] == [{"day": "2026-11-01"}, {"day": "2026-11-03"}]
    assert all(r.trigger == "cli" and r.item_id for r in queued)
    waited = materialize_cli("tt_days", "--partition", "2026-11-02", "--missing-only", "--wait", "--json")
    assert waited.returncode == 0 and json.loads(waited.stdout)["state"] == "nothing to do"
    # no worker runs them: --wait gives up at its timeout and exits 1
    late = materialize_cli("tt_days", "--partition", "2026-11-05", "--wait", "--timeout", "0.5", "--json")
    assert late.returncode == 1 and json.loads(late.stdout)["state"] == "timed out"
    bad = materialize_cli("tt_a", "--partition", "2026-11-01")
    assert bad.returncode == 1 and "nothing produces it" in bad.stderr
    before = SparkRun.objects.count()
    for kwargs, message in [  # the service the command calls, in process
        ({"partition": "yesterday"}, "tt_days"),
        ({"partition": "2026-11-01", "start": "2026-11-01", "end": "2026-11-02"}, "not both"),
        ({}, "is partitioned"),
        ({"start": "2026-11-03", "end": "2026-11-01"}, "tt_days"),
    ]:
        with pytest.raises(DatasetError, match=message):
            materialize("tt_days", **kwargs)
    with pytest.raises(DatasetError, match="unknown dataset"):
        materialize("nope")
    assert SparkRun.objects.count() == before


def test_manage_py_check_reports_a_trigger_on_an_unknown_dataset_and_a_cycle(declared):
    @spark_job("dtr_loop", params=[Param("day", "date", required=True)], on_update={"dtr_out": "day"},
               produces={"dtr_a": "day"})  # fmt: skip
    def loop(spark, params):  # dtr_a -> dtr_all -> dtr_out -> dtr_loop -> dtr_a
        return {}

    @spark_job("dtr_lost", on_update=["dtr_nowhere"])
    def lost(spark, params):
        return {}

    found = [(m.id, m.msg) for m in run_checks(tags=["jobsite"]) if m.id in TRIGGER_IDS]
    assert any(i == "jobsite.E107" and m.startswith("spark:dtr_lost on_update: unknown dataset") for i, m in found)
    assert any(i == "jobsite.E109" and "dtr_loop" not in m and "dtr_out" in m for i, m in found), found


def test_a_batched_backfill_gives_one_run_several_partitions_and_records_each(declared):
    params = [Param("day", "date", required=True), Param("days", "str")]

    @spark_job("dtr_batch", params=params, produces={"dtr_b": "day"}, backfill_batch=2, partitions_param="days")
    def batch(spark, params):
        return {}

    result = materialize("dtr_b", start="2026-11-01", end="2026-11-03")
    queued = SparkRun.objects.filter(id__in=result["runs"]).order_by("id")
    assert [r.params for r in queued] == [{"day": "2026-11-01", "days": "2026-11-01,2026-11-02"}, {"day": "2026-11-03"}]
    first = queued[0]
    with transaction.atomic():  # what the run's success records (runs._finish), without Spark
        record_outputs(output_figures(get_job("dtr_batch"), first.params, first.id, None), first.id, "dtr_batch")
    recorded = Materialization.objects.filter(dataset="dtr_b", spark_run_id=first.id)
    assert sorted(recorded.values_list("partition", flat=True)) == ["2026-11-01", "2026-11-02"]
    with pytest.raises(SparkParamError, match="days"):
        trigger_run("dtr_batch", {"day": "2026-11-01", "days": "2026-11-01,someday"}, trigger="orm")
    with pytest.raises(ValueError, match="needs partitions_param"):
        spark_job("dtr_bad", params=params, backfill_batch=3)
    with pytest.raises(ValueError, match="declared str parameter"):
        spark_job("dtr_bad", params=params, backfill_batch=3, partitions_param="day")


def test_a_registered_script_with_on_update_runs_for_the_partition(declared, monkeypatch):
    monkeypatch.setenv(SCRIPT_ROOTS_ENV, str(SCRIPTS))
    script = sorted(p.name for p in SCRIPTS.glob("*.py"))[0]
    register_script(
        "dtr_script",
        path=str(SCRIPTS / script),
        args=["{day}"],
        params=[{"name": "day", "type": "date", "required": True}],
        on_update={"dtr_b": "day"},
        trigger_mode="any",
    )
    record_materialization("dtr_b", "2026-11-26")
    assert runs("dtr_script") == [({"day": "2026-11-26"}, "dataset")]
    with pytest.raises(ScriptError, match="'all' or 'any'"):
        register_script("dtr_script2", path=str(SCRIPTS / script), on_update=["dtr_b"], trigger_mode="every")


def test_a_workflow_with_on_update_starts_for_the_partition(declared):
    @workflow("dtr_flow", params=[Param("day", "date", required=True)], on_update={"dtr_a": "day", "dtr_b": "day"})
    def flow(wf, params):
        wf.task("queue_app.noop", name="only")

    try:
        record_materialization("dtr_a", "2026-11-26")
        assert not Workflow.objects.filter(name="dtr_flow").exists()
        record_materialization("dtr_b", "2026-11-26")
        [started] = Workflow.objects.filter(name="dtr_flow")
        assert started.params == {"day": "2026-11-26"} and started.started_by.startswith("update of dtr_a #")
        fire = TriggerFire.objects.get(consumer="workflow:dtr_flow")
        assert fire.started == [f"workflow:{started.id}"]
    finally:
        _workflows.unregister("dtr_flow")


def test_a_workflow_on_update_of_a_two_dimension_dataset_is_started_with_a_param_per_dimension(declared):
    """As a Spark job's consumer does: "day|region" takes 2026-11-30|eu as day and region, the workflow started
    in the transaction that records the last upstream; the checks hold its param against the dimensions."""
    for name in ("dtr_sales", "dtr_stock"):
        dataset(name, location=f"table:t.{name}", partitioning=MultiPartitions(day="daily", region=["eu", "us"]))
    by_region = [Param("day", "date", required=True), Param("region", "str", required=True)]

    @workflow("dtr_regional", params=by_region, on_update={"dtr_sales": "day|region", "dtr_stock": "day|region"})
    def flow(wf, params):
        wf.task("queue_app.noop", name="only")

    @workflow("dtr_halfway", params=by_region, on_update={"dtr_sales": "day|region|day"})
    def bad(wf, params):
        wf.task("queue_app.noop", name="only")

    try:
        record_materialization("dtr_sales", "2026-11-30|eu")
        with transaction.atomic():
            last = record_materialization("dtr_stock", {"day": "2026-11-30", "region": "eu"})
            [started] = Workflow.objects.filter(name="dtr_regional")  # in the recorder's transaction
            assert started.params == {"day": "2026-11-30", "region": "eu"}
            assert started.started_by.endswith(f"dtr_stock #{last.id}")
        problems = [m for i, m in trigger_problems(consumers()) if i == "jobsite.E108"]
        assert problems == [
            "workflow:dtr_halfway on_update: 'day|region|day' names 3 parameters; give one per dimension "
            "(<multi partitioning day|region>) or one taking the whole key"
        ]
    finally:
        _workflows.unregister("dtr_regional")
        _workflows.unregister("dtr_halfway")


def test_materialize_wait_needs_the_blocking_checks_passed_and_missing_only_retakes_failed_ones(declared):
    queued = materialize("dtr_out", partition="2026-11-05")
    (run_id,) = queued["runs"]
    SparkRun.objects.filter(id=run_id).update(state="succeeded")
    made = record_materialization("dtr_out", "2026-11-05", spark_run_id=run_id)
    expected = {"pending": "timed out", "failed": "failed", "passed": "succeeded", "none": "succeeded"}
    for checks, state in expected.items():
        Materialization.objects.filter(id=made.id).update(checks=checks)
        assert wait(queued, timeout=0.2, poll=0.05)["state"] == state, checks

    record_materialization("dtr_out", "2026-11-06")
    Materialization.objects.filter(id=made.id).update(checks="failed")
    again = materialize("dtr_out", start="2026-11-05", end="2026-11-06", missing_only=True)
    assert again["partitions"] == ["2026-11-05"]  # the failed one is taken again, the good one left


def test_a_materialization_triggers_only_once_its_blocking_checks_pass_or_are_overridden(declared):
    checks_before = list(_checks)

    @check("dtr_a", severity="error")
    def dtr_gate(part):
        return True

    try:
        first = record_materialization("dtr_a", "2026-11-07")
        assert first.checks == "pending" and runs("dtr_any") == []  # not usable yet: nothing fires
        assert record_check_result(first.id, "dtr_gate", passed=True) == "passed"
        assert runs("dtr_any") == [({"day": "2026-11-07"}, "dataset")]  # fired in the check's transaction

        second = record_materialization("dtr_a", "2026-11-08")
        assert record_check_result(second.id, "dtr_gate", passed=False, message="bad") == "failed"
        assert len(runs("dtr_any")) == 1
        ana = User.objects.create_user("ana", is_staff=True)
        ana.user_permissions.add(Permission.objects.get(codename="override_dataset_check"))
        override_failed_checks(User.objects.get(pk=ana.pk), second, "known bad rows")
        assert runs("dtr_any")[1:] == [({"day": "2026-11-08"}, "dataset")]
    finally:
        _checks[:] = checks_before
