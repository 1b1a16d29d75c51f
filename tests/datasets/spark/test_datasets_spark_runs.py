"""A Spark run that produces a dataset partition records its materialization in the transaction that marks it
succeeded: real spark-submit children of an unmodified PySpark script (tests/tasks/spark_scripts/), the run's handler
executed in this process under a real reservation of its queue item (as a worker would), figures from the run's
event log, or reported by the script itself (jobsite/spark_report.py). A failing run records nothing.

The first two runs' partitions are checked on a Spark DataFrame (a blocking `on="spark"` check, run by its
queue item's handler here, as a worker would, reading the partition with a local SparkSession): the good day
passes, the bad day (a region without revenue) fails with its null count stored and blocks its consumer.

A run with one parameter per dimension (issue 48) records its `day|region` partition and, being the day's last
region, starts the consumer that reads every region of the day (AllOf), once.

Four JVM runs in all (two cores shared with other suites): local[2], a start-up tuned JVM, small data; and one
local SparkSession in this process for the checks, stopped after the module.
"""

import threading
from pathlib import Path

import pytest
from django.db import connection, connections

from queue_app import engine, services
from queue_app.datasets import MultiPartitions, StaticPartitions, checks_run, dataset
from queue_app.datasets.checks_run import unusable
from queue_app.datasets.declarations import _code
from queue_app.datasets.locations import ROOTS_ENV
from queue_app.datasets.mappings import AllOf
from queue_app.datasets.models import DatasetCheckResult, Materialization, TriggerFire
from queue_app.datasets.quality import CheckResult, all_checks, check, undeclare
from queue_app.datasets.services import record_materialization
from queue_app.datasets.spark_runs import DatasetBlocked
from queue_app.models import QueueItem
from queue_app.registry import Context, Delivery, Settled, get_task
from queue_app.reservations import reserve
from queue_app.spark.models import SparkRun
from queue_app.spark.registry import _jobs
from queue_app.spark.runs import QUEUE, TASK, cancel_run, timing_split, trigger_run
from queue_app.spark.scripts import ROOTS_ENV as SCRIPT_ROOTS_ENV
from queue_app.spark.scripts import register_script
from queue_app.workflows import services as workflows
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import Workflow, WorkflowStep
from tests.support.datasets_spark_helpers import reserve_run_item, run_handler
from tests.support.paths import SPARK_SCRIPTS
from tests.support.spark_fixtures import require_spark, spark_session  # noqa: F401  (`spark`)
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]
SCRIPTS = SPARK_SCRIPTS
DAY = {"name": "day", "type": "date", "required": True}
REGIONAL = MultiPartitions(day="daily", region=StaticPartitions(["eu", "us"]))


@pytest.fixture
def data(tmp_path, monkeypatch):
    """The dataset root; the run's Spark children get local[2] and a start-up tuned JVM."""
    require_spark()
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv(ROOTS_ENV, str(root))
    monkeypatch.setenv(SCRIPT_ROOTS_ENV, str(SCRIPTS))
    monkeypatch.setenv("JOBSITE_SPARK_EVENT_LOG_DIR", str(tmp_path / "events"))
    monkeypatch.setenv("SPARK_MASTER", "local[2]")
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    datasets_before, jobs_before = set(_code.entries()), set(_jobs.entries())
    dataset("dsr_revenue", location="revenue/day={partition}", partitioning="daily")
    yield root
    for item in [c for c in all_checks() if c.dataset == "dsr_revenue"]:
        undeclare(item)
    for name in set(_jobs.entries()) - jobs_before:
        _jobs.unregister(name)
    for name in set(_code.entries()) - datasets_before:
        _code.unregister(name)


@pytest.fixture(scope="module", autouse=True)
def one_session(spark):
    """The checks run in this process read their partitions through the test session's one SparkSession
    (quality.read_spark's getOrCreate finds it). A session of their own would launch this process's JVM without
    the run defaults (the JDBC jar on its class path) that later Spark tests' session needs: a JVM's class path
    is fixed when it starts, so test_spark_pipelines' JDBC read then failed with ClassNotFoundException."""
    return spark


def declare_revenue_check() -> None:
    """A blocking check on the partition as a Spark DataFrame: every region has a revenue."""

    @check("dsr_revenue", on="spark", severity="error")
    def revenue_known(df, part):
        nulls = df.filter(df.revenue.isNull()).count()
        return CheckResult(nulls == 0, {"rows": df.count(), "null_count": nulls}, f"{nulls} regions without revenue")


def run_check_item(materialization_id: int) -> dict:
    """Reserve the materialization's check item and run its handler here, as a worker would."""
    task, queue = get_task(checks_run.TASK), QueueItem.objects.get(task=checks_run.TASK).queue_id
    held = reserve(queue, timeout=30, lease=300)
    assert held is not None and held.payload == {"materialization_id": materialization_id, "check": "revenue_known"}
    ctx = Context(
        item_id=held.item_id,
        reservation_id=held.reservation_id,
        attempt=held.attempt,
        max_attempts=held.max_attempts,
        task=checks_run.TASK,
        queue=queue,
        delivery=Delivery.AT_LEAST_ONCE,
        worker_id="test",
    )
    with held:
        held.result = task(held.payload, ctx)
    return held.result


def handler_ends(run_id: int) -> dict:
    """Run the Spark task's handler on the run's item as run_handler does, and read, inside the reservation's
    block (after the handler returned, before the block's own settle could come), what a reader sees then."""
    held, ctx = reserve_run_item(run_id)
    with held:
        held.result = get_task(TASK)(held.payload, ctx)
        step = WorkflowStep.objects.get(spark_run_id=run_id)
        return {
            "run": SparkRun.objects.get(id=run_id).state,
            "item": QueueItem.objects.get(id=held.item_id).state,
            "step": step.state,
            "workflow": Workflow.objects.get(id=step.workflow_id).state,
        }


def test_a_failed_runs_item_and_workflow_step_end_with_it_in_one_transaction(data, settings):
    """Issue 50: a run read final while its item was still held (test_spark_policy_workers' failure on a fresh
    clone). The run's end, its item's settle and so the workflow step the settle moves commit together: read
    right after the handler returns, before anyone else settles, all four are final."""
    settings.JOBSITE = {**settings.JOBSITE, "DEFAULT_MAX_ATTEMPTS": 2}  # a step's attempts: a retry, then the end
    register_script("dsr_failing_step", path=str(SCRIPTS / "failing.py"))
    graph = Graph("dsr_failing_flow")
    graph.spark("dsr_failing_step", name="fails")
    flow = workflows.start_graph(graph)
    [step] = workflows.status(flow.id)["steps"]
    assert QueueItem.objects.get(id=step["item_id"]).max_attempts == 2
    first = handler_ends(step["spark_run_id"])  # a retry: all four say so
    assert first == {"run": "queued", "item": "ready", "step": "queued", "workflow": "running"}, first
    assert services.retry_now([step["item_id"]]) == 1  # its backoff not waited for
    last = handler_ends(step["spark_run_id"])
    assert last == {"run": "failed", "item": "dead", "step": "failed", "workflow": "failed"}, last


def xmin(table: str, row_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT xmin::text FROM {table} WHERE id = %s", [row_id])
        return cursor.fetchone()[0]


def test_a_script_writing_a_daily_parquet_partition_materializes_it_with_the_run_that_succeeded(
    data, tmp_path, record_property
):
    source = tmp_path / "sales.csv"
    source.write_text("region,amount\n" + "".join(f"{r},{a}\n" for r in ("north", "south", "east") for a in (1, 2)))
    register_script(
        "dsr_sales",
        path=str(SCRIPTS / "sales_report.py"),
        args=[str(source), f"{data}/revenue/day={{day}}"],  # the script knows nothing of jobsite or datasets
        params=[DAY],
        conf={"spark.sql.shuffle.partitions": "2"},
        produces={"dsr_revenue": "day"},
    )
    declare_revenue_check()
    run = trigger_run("dsr_sales", {"day": "2026-11-26"}, trigger="orm")
    assert not Materialization.objects.exists()  # nothing before the run succeeds
    assert run_handler(run.id)["state"] == "succeeded"

    run = SparkRun.objects.get(id=run.id)
    assert run.state == "succeeded", (run.error, run.log_tail[-2000:])
    [m] = Materialization.objects.all()
    assert (m.dataset, m.partition, m.source, m.spark_run_id) == ("dsr_revenue", "2026-11-26", "spark_run", run.id)
    assert m.rows == 3 == run.metrics["output_records"]  # one row per region, from the event log
    parquet = list((data / "revenue" / "day=2026-11-26").glob("part-*.parquet"))
    assert parquet and m.files == len(parquet) and m.bytes > 0  # data files: not _SUCCESS or .crc
    assert m.metadata == {"job": "dsr_sales"}
    assert m.checks == "pending"  # its blocking check is queued with the record

    # Written by the transaction that marked the run succeeded: both rows carry its transaction id.
    assert xmin(Materialization._meta.db_table, m.id) == xmin(SparkRun._meta.db_table, run.id)
    # A figure, not a bound: child ended -> end recorded (the event log read, the files counted, the transaction)
    # against the whole run.
    steps = {s["step"]: s for s in timing_split(run)}
    record_property("ended_to_recorded_seconds", steps["recorded"]["took"])
    record_property("queued_to_recorded_seconds", steps["recorded"]["after"])
    print(f"ended -> recorded {steps['recorded']['took']}s of {steps['recorded']['after']}s queued -> recorded")

    assert run_check_item(m.id)["passed"] is True  # the partition read as a Spark DataFrame
    m.refresh_from_db()
    result = DatasetCheckResult.objects.get(materialization_id=m.id)
    assert (m.checks, result.passed, result.figures) == ("passed", True, {"rows": 3, "null_count": 0})


def test_a_script_that_reports_its_own_figures_replaces_the_event_logs_rows_and_adds_metadata(data, tmp_path):
    """Its day is a bad one: a region sold without an amount has no revenue, and the Spark check blocks it."""
    source = tmp_path / "sales.csv"
    rows = "".join(f"{r},{a}\n" for r in ("north", "south", "east") for a in (1, 2)) + "west,\n"
    source.write_text("region,amount\n" + rows)
    register_script(
        "dsr_reporting",
        path=str(SCRIPTS / "reporting_sales.py"),  # calls jobsite.spark_report.materialized(...)
        args=[str(source), f"{data}/revenue/day={{day}}", "dsr_revenue", "{day}"],
        params=[DAY],
        conf={"spark.sql.shuffle.partitions": "2"},
        produces={"dsr_revenue": "day"},
    )
    register_script("dsr_revenue_reader", path=str(SCRIPTS / "pi.py"), params=[DAY], consumes={"dsr_revenue": "day"})
    declare_revenue_check()
    run = trigger_run("dsr_reporting", {"day": "2026-11-26"}, trigger="orm")
    assert run_handler(run.id)["state"] == "succeeded"

    run = SparkRun.objects.get(id=run.id)
    assert "reported: True" in run.log_tail, run.log_tail[-2000:]
    [m] = Materialization.objects.all()
    assert m.rows == 7 and run.metrics["output_records"] == 4  # the orders it reported, not the rows written
    assert m.metadata["regions"] == 4 and m.metadata["job"] == "dsr_reporting"
    assert [r["region"] for r in m.metadata["preview"]] == ["east", "north", "south", "west"]

    assert run_check_item(m.id)["passed"] is False
    m.refresh_from_db()
    result = DatasetCheckResult.objects.get(materialization_id=m.id)
    assert (m.checks, result.passed, result.blocking) == ("failed", False, True)
    assert result.figures == {"rows": 4, "null_count": 1} and result.message == "1 regions without revenue"
    assert [u.materialization_id for u in unusable([("dsr_revenue", "2026-11-26")])] == [m.id]
    with pytest.raises(DatasetBlocked, match="dsr_revenue"):  # its consumer may not run on it
        trigger_run("dsr_revenue_reader", {"day": "2026-11-26"}, trigger="orm")
    assert not SparkRun.objects.filter(job="dsr_revenue_reader").exists()


def test_a_run_per_dimension_records_its_day_region_partition_and_the_last_region_starts_the_fan_in_once(
    data, tmp_path
):
    """Issue 48: a job producing `day|region` (one parameter per dimension) records `2026-11-30|eu` with its
    parts; the consumer reading a day of every region (AllOf("region")) is started once, by the transaction
    that records the day's last region: this run's success."""
    dataset("dsr_regional", location="regional/key={partition}", partitioning=REGIONAL)
    source = tmp_path / "eu.csv"
    source.write_text("region,amount\n" + "".join(f"{r},{a}\n" for r in ("eu-west", "eu-north") for a in (1, 2)))
    register_script(
        "dsr_regional_sales",
        path=str(SCRIPTS / "sales_report.py"),
        args=[str(source), f"{data}/regional/key={{day}}|{{region}}"],
        params=[DAY, {"name": "region", "type": "str", "required": True}],
        conf={"spark.sql.shuffle.partitions": "2"},
        produces={"dsr_regional": "day|region"},
    )
    register_script(
        "dsr_all_regions",
        path=str(SCRIPTS / "pi.py"),
        params=[DAY],
        on_update={"dsr_regional": ("day", AllOf("region"))},
    )
    record_materialization("dsr_regional", "2026-11-30|us")  # the other region, written outside jobsite
    assert not TriggerFire.objects.exists()  # eu is missing

    run = trigger_run("dsr_regional_sales", {"day": "2026-11-30", "region": "eu"}, trigger="orm")
    assert run_handler(run.id)["state"] == "succeeded", SparkRun.objects.get(id=run.id).log_tail[-2000:]

    m = Materialization.objects.get(spark_run_id=run.id)
    assert (m.dataset, m.partition, m.source) == ("dsr_regional", "2026-11-30|eu", "spark_run")
    assert REGIONAL.parts(m.partition) == {"day": "2026-11-30", "region": "eu"}
    assert m.rows == 2  # one row per zone of the region, from the run's event log
    parquet = list((data / "regional" / "key=2026-11-30|eu").glob("part-*.parquet"))
    assert parquet and m.files == len(parquet) and m.bytes > 0
    [fire] = TriggerFire.objects.filter(consumer="spark:dsr_all_regions")
    [consumer] = SparkRun.objects.filter(job="dsr_all_regions")
    assert fire.partition == "2026-11-30" and fire.started == [f"spark_run:{consumer.id}"]
    assert sorted(fire.upstream) == ["dsr_regional[2026-11-30|eu]", "dsr_regional[2026-11-30|us]"], fire.upstream
    assert consumer.params == {"day": "2026-11-30"} and consumer.state == "queued"
    assert xmin(TriggerFire._meta.db_table, fire.id) == xmin(SparkRun._meta.db_table, run.id)  # one transaction

    record_materialization("dsr_regional", "2026-11-30|us")  # one region again is not a new day of every region
    assert TriggerFire.objects.count() == 1 and SparkRun.objects.filter(job="dsr_all_regions").count() == 1


def test_a_failing_run_of_a_producer_records_nothing(data):
    register_script(
        "dsr_failing",
        path=str(SCRIPTS / "failing.py"),  # runs a Spark job, then raises
        params=[DAY],
        produces={"dsr_revenue": "day"},
        policy={"attempts": 1},
    )
    run = trigger_run("dsr_failing", {"day": "2026-11-26"}, trigger="orm")
    settled = run_handler(run.id)
    assert settled.fate == "dead" and settled.error.startswith("RunFailed: ") and "bad input" in settled.error
    run = SparkRun.objects.get(id=run.id)
    assert run.state == "failed" and run.finished_at is not None  # its end is written: nothing more will come
    assert QueueItem.objects.get(id=run.item_id).state == "dead"  # in the same transaction
    assert not Materialization.objects.exists()


# -- an attempt that does not end as a success records nothing ------------------------------------------------
# The materializations of a run are written by the transaction that records its success, under its item's row
# lock and only while the attempt's reservation is current (runs._finish). A run that waits at a gate
# (spark_scripts/gate.py: spark-submit of a script with no Spark session, the cheapest run there is) while its
# lease is lost, while it is cancelled or while its timeout passes: none of them may record its partition.


def gated(name: str, gate: Path, root: Path, **policy) -> None:
    gate.mkdir()
    register_script(
        name,
        path=str(SCRIPTS / "gate.py"),
        args=[str(gate), f"{root}/revenue/day={{day}}"],
        params=[DAY],
        produces={"dsr_revenue": "day"},
        policy=policy or None,
    )


def context_of(lease: engine.Lease, worker_id: str) -> Context:
    return Context(
        item_id=lease.item_id,
        reservation_id=lease.reservation_id,
        attempt=lease.attempt,
        max_attempts=lease.max_attempts,
        task=TASK,
        queue=QUEUE,
        delivery=Delivery.AT_LEAST_ONCE,
        worker_id=worker_id,
    )


def handler_in_thread(run_id: int, ctx: Context) -> tuple[threading.Thread, dict]:
    """The Spark task's handler on a thread of its own (as a worker's pool would run it), its end in `box`."""
    box: dict = {}

    def target() -> None:
        try:
            box["result"] = get_task(TASK)({"run_id": run_id}, ctx)
        except BaseException as exc:  # noqa: B036 — reported to the test, whatever it was
            box["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, name=f"spark-handler-{run_id}")
    thread.start()
    return thread, box


def test_an_attempt_whose_lease_lapsed_and_was_taken_records_nothing_the_next_records_once(data, tmp_path):
    gate = tmp_path / "gate"
    gated("dsr_gate", gate, data)
    run = trigger_run("dsr_gate", {"day": "2026-11-26"}, trigger="orm")
    # Leased with nobody to renew it: the worker that holds it is frozen, as far as the queue can tell.
    [first] = engine.lease([QUEUE], 1, "t-frozen", lease_timeout=2)
    thread, box = handler_in_thread(run.id, context_of(first, "t-frozen"))
    wait_for(lambda: (gate / "started").exists(), 120, what="the first attempt's script to start")
    wait_for(lambda: engine.rescue_expired()[0] == 1, 30, interval=0.2, what="its lease to lapse and be taken back")
    [second] = engine.lease([QUEUE], 1, "t-next", lease_timeout=300)
    assert (second.item_id, second.attempt) == (first.item_id, 2)

    (gate / "open").touch()  # the first attempt's script writes its partition and ends well
    thread.join(120)
    assert not thread.is_alive() and "error" not in box, box
    assert box["result"]["state"] == "stale"  # its end is not recorded: the reservation is not its own now
    assert not Materialization.objects.exists()
    assert SparkRun.objects.get(id=run.id).state in ("starting", "running")  # as the first attempt left it

    settled = get_task(TASK)({"run_id": run.id}, context_of(second, "t-next"))
    assert isinstance(settled, Settled) and settled.fate == "done", settled
    [m] = Materialization.objects.all()
    assert (m.dataset, m.partition, m.spark_run_id) == ("dsr_revenue", "2026-11-26", run.id)
    assert SparkRun.objects.get(id=run.id).attempt == 2


def test_a_run_cancelled_while_it_runs_records_nothing(data, tmp_path):
    gate = tmp_path / "gate"
    gated("dsr_gate_cancelled", gate, data)
    run = trigger_run("dsr_gate_cancelled", {"day": "2026-11-26"}, trigger="orm")
    [held] = engine.lease([QUEUE], 1, "t-cancel", lease_timeout=300)
    thread, box = handler_in_thread(run.id, context_of(held, "t-cancel"))
    wait_for(lambda: (gate / "started").exists(), 120, what="the script to start")
    assert cancel_run(run.id, actor="tester") is True
    thread.join(120)
    assert not thread.is_alive() and "error" not in box, box
    assert SparkRun.objects.get(id=run.id).state == "cancelled"
    (gate / "open").touch()  # too late: the child was stopped
    assert not Materialization.objects.exists()
    assert not (data / "revenue" / "day=2026-11-26").exists()


def test_a_run_past_its_timeout_records_nothing(data, tmp_path):
    gate = tmp_path / "gate"
    gated("dsr_gate_timeout", gate, data, timeout=3, attempts=1)
    run = trigger_run("dsr_gate_timeout", {"day": "2026-11-26"}, trigger="orm")
    ended = run_handler(run.id)  # the gate never opens
    run = SparkRun.objects.get(id=run.id)
    assert run.state == "timed_out", (run.error, run.log_tail[-2000:])
    assert ended["state"] == "timed_out"  # its item done (a timed-out run is not retried by this policy)
    assert QueueItem.objects.get(id=run.item_id).state == "done"
    assert not Materialization.objects.exists()
