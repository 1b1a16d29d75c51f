"""Dataset checks (issue 38): declarations and their system checks (jobsite.E120-E122), a pandera schema on a real
pandas DataFrame, the checks state a materialization gets when recorded and when its last check result is stored,
warn checks that never block, overrides (permission, LogEntry), the `dataset` CLI's checks and `override`, and
the blocking of a Spark run that consumes a partition whose blocking checks failed.

The proof with a real worker running the check items and a real Spark run of the consumer is the last test (one
JVM run)."""

import io
import json
import threading
import time

import pandas as pd
import pandera.pandas as pa
import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.core.exceptions import PermissionDenied
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections, transaction
from django.utils import timezone

from queue_app.datasets import DatasetError, dataset, get_dataset, triggers
from queue_app.datasets.checks import data_check_declarations
from queue_app.datasets.checks_run import (
    TASK,
    override_failed_checks,
    record_check_result,
    run_check,
    unusable,
)
from queue_app.datasets.models import DatasetBlock, DatasetCheckResult, Materialization
from queue_app.datasets.quality import check, schema_check
from queue_app.datasets.services import record_materialization
from queue_app.datasets.spark_runs import DatasetBlocked
from queue_app.datasets.status import check_results, detail, summaries
from queue_app.engine import dedicated_connection
from queue_app.models import QueueItem
from queue_app.reservations import reserve
from queue_app.spark.models import SparkRun
from queue_app.spark.runs import QUEUE, _blocked, trigger_run
from queue_app.spark.scripts import ROOTS_ENV as SCRIPT_ROOTS_ENV
from queue_app.spark.scripts import register_script
from queue_app.workflows import Graph
from queue_app.workflows import services as workflows
from queue_app.workflows.graph import step_states
from queue_app.workflows.models import Workflow
from tests.support import datasets_checks_fixtures
from tests.support.datasets_checks_fixtures import DAY, SCRIPTS, ctx_of, park_a_step, spark_ctx
from tests.support.spark_fixtures import require_spark
from tests.support.waiting import seen_waiting
from tests.support.waiting import wait_for as wait_until
from tests.tasks import datasets_checked
from tests.tasks.datasets_checked import CONSUMER

root = datasets_checks_fixtures.root  # the fixture


@pytest.fixture
def usable(monkeypatch):
    """Every materialization announced usable (the triggers' hook), in order."""
    seen = []
    monkeypatch.setattr(triggers, "materialization_usable", lambda m: seen.append((m.id, m.checks)))
    return seen


def user(name, *, may_override):
    u = User.objects.create_user(name, password="x", is_staff=True)
    if may_override:
        u.user_permissions.add(Permission.objects.get(codename="override_dataset_check"))
    return User.objects.get(pk=u.pk)  # permissions are cached per instance


def write_csv(path, frame):
    path.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path / "part-0.csv", index=False)


def check_items(materialization_id):
    return QueueItem.objects.filter(task=TASK, payload__materialization_id=materialization_id)


@pytest.mark.django_db
def test_bad_declarations_are_system_check_errors(root):
    dataset("dsc_known", location="known")

    @check("dsc_unknown")
    def of_nothing(part):
        return True

    @check("dsc_known", name="twice")
    def first(part):
        return True

    @check("dsc_known", name="twice")
    def second(part):
        return True

    @check("dsc_known", severity="fatal")
    def too_loud(part):
        return True

    errors = {e.id: e.msg for e in data_check_declarations()}
    assert set(errors) == {"jobsite.E120", "jobsite.E121", "jobsite.E122"}
    assert "'dsc_unknown'" in errors["jobsite.E120"] and "no such dataset" in errors["jobsite.E120"]
    assert "'twice'" in errors["jobsite.E121"] and "'fatal'" in errors["jobsite.E122"]
    with pytest.raises(TypeError):
        schema_check("dsc_known", "not a schema")
    # The first of a duplicated name runs; a bad severity never does.
    m = record_materialization("dsc_known")
    assert m.checks == "pending"
    assert sorted(DatasetCheckResult.objects.values_list("check_name", flat=True)) == ["twice"]


@pytest.mark.django_db(transaction=True)
def test_a_pandera_schema_on_a_real_dataframe_fails_with_its_figures_and_blocks_until_a_good_partition(root, usable):
    dataset("dsc_sales", location="sales/day={partition}", partitioning="daily")
    schema_check(
        "dsc_sales",
        pa.DataFrameSchema(
            {"region": pa.Column(str, pa.Check.isin(["eu", "us"])), "amount": pa.Column(float, pa.Check.ge(0))}
        ),
        fmt="csv",
    )
    write_csv(
        root / "sales/day=2026-11-26", pd.DataFrame({"region": ["eu", "asia", "us"], "amount": [1.0, -2.0, None]})
    )
    bad = record_materialization("dsc_sales", "2026-11-26", rows=3)
    assert bad.checks == "pending" and usable == []  # blocking checks to run: not usable yet
    [item] = check_items(bad.id)
    assert item.payload == {"materialization_id": bad.id, "check": "schema"}

    assert run_check(bad.id, "schema")["checks"] == "failed"
    [result] = DatasetCheckResult.objects.filter(materialization_id=bad.id)
    assert result.passed is False and result.severity == "error" and result.blocking
    assert result.figures["rows"] == 3 and result.figures["null_count"] == {"amount": 1}
    assert result.figures["failure_cases"] >= 3  # asia, -2.0, the null amount
    assert "asia" in result.message
    assert Materialization.objects.get(id=bad.id).checks == "failed" and usable == []
    [held] = unusable([("dsc_sales", "2026-11-26")])
    assert (held.materialization_id, held.checks) == (bad.id, "failed")
    assert unusable([("dsc_sales", None)]) == [held]  # every partition read
    assert run_check(bad.id, "schema")["state"] == "nothing to run"  # a re-delivered item changes nothing

    write_csv(root / "sales/day=2026-11-26", pd.DataFrame({"region": ["eu", "us"], "amount": [1.0, 2.0]}))
    good = record_materialization("dsc_sales", "2026-11-26", rows=2)
    assert run_check(good.id, "schema")["checks"] == "passed"
    assert usable == [(good.id, "passed")]  # announced in the transaction that stored the last result
    assert unusable([("dsc_sales", "2026-11-26")]) == []  # the new materialization releases the partition
    shown = detail(get_dataset("dsc_sales"), timezone.now())
    assert [m["checks"] for m in shown["materializations"]] == ["passed", "failed"]
    assert check_results([bad.id])[bad.id][0]["figures"]["null_count"] == {"amount": 1}
    assert summaries([get_dataset("dsc_sales")], timezone.now())[0]["checks"] == "passed"


@pytest.mark.django_db
def test_a_warn_check_never_blocks(root, usable):
    dataset("dsc_warned", location="warned")

    @check("dsc_warned", severity="warn")
    def always_warns(part):
        return False

    m = record_materialization("dsc_warned", rows=1)
    assert m.checks == "none" and usable == [(m.id, "none")]  # usable at once: no blocking check
    assert unusable([("dsc_warned", "")]) == []
    assert run_check(m.id, "always_warns")["checks"] == "warned"
    assert usable == [(m.id, "none")]  # not announced twice
    assert unusable([("dsc_warned", "")]) == []
    assert summaries([get_dataset("dsc_warned")], timezone.now())[0]["checks"] == "warned"
    with pytest.raises(DatasetError, match="not failed"):
        override_failed_checks(user("ana", may_override=True), m, "nothing to override")


@pytest.mark.django_db
def test_the_last_result_settles_the_state_and_a_check_that_raises_fails(root):
    dataset("dsc_two", location="two")

    @check("dsc_two", severity="error")
    def raises(part):
        raise RuntimeError("boom")

    @check("dsc_two", severity="error", blocking=False)
    def advisory(part):
        return True

    m = record_materialization("dsc_two")
    assert run_check(m.id, "advisory")["checks"] == "pending"  # one result still to come
    outcome = run_check(m.id, "raises")
    assert outcome == {"materialization_id": m.id, "check": "raises", "passed": False, "checks": "failed"}
    assert DatasetCheckResult.objects.get(check_name="raises").message == "the check raised RuntimeError: boom"
    with pytest.raises(DatasetError, match="no check 'nope'"):
        record_check_result(m.id, "nope", passed=True)


@pytest.mark.django_db
def test_an_override_needs_the_permission_and_a_comment_and_is_logged(root, usable):
    datasets_checked.declare()
    m = record_materialization(datasets_checked.DATASET, "2026-11-26", rows=50)
    record_check_result(m.id, "enough_rows", passed=True)
    assert record_check_result(m.id, "no_bad_marker", passed=False, message="a BAD marker") == "failed"

    with pytest.raises(PermissionDenied):
        override_failed_checks(user("bo", may_override=False), m, "ship it")
    ana = user("ana", may_override=True)
    with pytest.raises(DatasetError, match="comment"):
        override_failed_checks(ana, m, "  ")
    assert Materialization.objects.get(id=m.id).checks == "failed" and not LogEntry.objects.exists()

    # The CLI: a user without the permission, then one with it (exit status 1 is a CommandError here).
    with pytest.raises(CommandError, match="permission"):
        call_command("dataset", "override", "dsc_daily", "--partition", "2026-11-26", "--comment", "x", "--user", "bo")
    with pytest.raises(CommandError, match="no Django user"):
        call_command("dataset", "override", "dsc_daily", "--partition", "2026-11-26", "--comment", "x", "--user", "zz")
    call_command(
        "dataset", "override", "dsc_daily", "--partition", "2026-11-26", "--comment", "known bad row", "--user", "ana"
    )
    assert Materialization.objects.get(id=m.id).checks == "overridden"
    assert usable == [(m.id, "overridden")]
    [entry] = LogEntry.objects.all()
    assert entry.user == ana and entry.object_id == str(m.id) and "known bad row" in entry.change_message
    with pytest.raises(CommandError, match="not failed"):
        call_command("dataset", "override", "dsc_daily", "--partition", "2026-11-26", "--comment", "x", "--user", "ana")
    out = io.StringIO()
    call_command("dataset", "show", "dsc_daily", stdout=out)
    assert "checks overridden" in out.getvalue() and "no_bad_marker (error): FAILED a BAD marker" in out.getvalue()
    out = io.StringIO()
    call_command("dataset", "list", "--json", stdout=out)
    assert {"name": "dsc_daily", "checks": "warned"}.items() <= next(
        d for d in json.loads(out.getvalue()) if d["name"] == "dsc_daily"
    ).items()


@pytest.mark.django_db(transaction=True)
def test_a_workflow_step_meeting_a_failed_check_is_parked_blocked_and_released_by_the_override(
    root, monkeypatch, admin_client
):
    monkeypatch.setenv(SCRIPT_ROOTS_ENV, str(SCRIPTS))
    datasets_checked.declare()
    register_script("dsc_reader", path=str(SCRIPTS / "pi.py"), params=[DAY], consumes={"dsc_daily": "day"})
    graph = Graph("dsc_flow")
    graph.spark("dsc_reader", {"day": "2026-11-26"}, name="read")
    flow = workflows.start_graph(graph)  # queued before the bad day is recorded
    m = record_materialization(datasets_checked.DATASET, "2026-11-26", rows=50)
    record_check_result(m.id, "enough_rows", passed=True)
    record_check_result(m.id, "no_bad_marker", passed=False)
    with pytest.raises(DatasetBlocked, match=r"no_bad_marker failed on dataset dsc_daily\[2026-11-26\]"):
        trigger_run("dsc_reader", {"day": "2026-11-26"}, trigger="orm")
    [step] = workflows.status(flow.id)["steps"]
    ctx = spark_ctx(step["spark_run_id"])
    parked = _blocked(step["spark_run_id"], ctx)
    assert parked["state"] == "blocked" and "no_bad_marker failed" in parked["reason"]
    item = QueueItem.objects.get(id=ctx.item_id)
    assert item.state == "ready" and item.attempts == 0 and item.visible_at > timezone.now()  # parked, not spent
    [step] = workflows.status(flow.id)["steps"]
    assert step["state"] == "blocked" and step["blocked_by"].startswith(
        "blocking check no_bad_marker failed on dataset dsc_daily[2026-11-26]"
    )
    assert SparkRun.objects.get(id=step["spark_run_id"]).state == "queued"
    assert [state for _, state in step_states(Workflow.objects.get(id=flow.id))] == ["blocked"]
    assert b"state-blocked" in admin_client.get(f"/admin/jobsite_workflows/workflow/{flow.id}/change/").content

    override_failed_checks(user("ana", may_override=True), m, "known")
    item.refresh_from_db()
    assert item.visible_at <= timezone.now() and not DatasetBlock.objects.exists()  # due now, in that transaction
    assert workflows.status(flow.id)["steps"][0]["state"] == "queued"
    assert _blocked(step["spark_run_id"], spark_ctx(step["spark_run_id"])) is None  # it may start now
    assert unusable([("dsc_daily", "2026-11-26"), ("dsc_daily", "2026-11-25")]) == []


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.django_db(transaction=True)
def test_a_failed_blocking_check_run_by_a_worker_holds_its_consumer_until_an_override(
    root, tmp_path, monkeypatch, worker
):
    """A real worker runs the check items and the Spark runs. A run queued before the bad day was recorded does
    not start: parked (blocked) while the checks run and after one failed; a trigger is refused; the override
    (logged) releases the parked run, which then runs (one JVM run)."""
    require_spark()
    monkeypatch.setenv(SCRIPT_ROOTS_ENV, str(SCRIPTS))
    monkeypatch.setenv("JOBSITE_SPARK_EVENT_LOG_DIR", str(tmp_path / "events"))
    monkeypatch.setenv("SPARK_MASTER", "local[1]")
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    datasets_checked.declare()
    datasets_checked.declare_consumer()
    queued = trigger_run(CONSUMER, {"day": "2026-11-26"}, trigger="orm")  # nothing recorded yet: free

    (root / "dsc/day=2026-11-26").mkdir(parents=True)
    (root / "dsc/day=2026-11-26/BAD").write_text("x")
    with transaction.atomic():  # as a producer's settle would
        bad = record_materialization(datasets_checked.DATASET, "2026-11-26", rows=5)
    assert bad.checks == "pending" and check_items(bad.id).count() == 2

    proc = worker(
        "w1", "--import", "tests.tasks.datasets_checked_worker", "--queues", "default,spark", "--concurrency", "2"
    )
    wait_for(lambda: Materialization.objects.get(id=bad.id).checks == "failed", proc)
    results = dict(DatasetCheckResult.objects.filter(materialization_id=bad.id).values_list("check_name", "passed"))
    assert results == {"no_bad_marker": False, "enough_rows": False}  # the warn check failed too
    wait_for(lambda: DatasetBlock.objects.filter(item_id=queued.item_id, materialization_id=bad.id).exists(), proc)
    run = SparkRun.objects.get(id=queued.id)
    assert run.state == "queued" and run.started_at is None  # parked, never started
    with pytest.raises(DatasetBlocked):
        trigger_run(CONSUMER, {"day": "2026-11-26"}, trigger="orm")

    override_failed_checks(user("ana", may_override=True), bad, "the BAD marker is a test fixture")
    assert LogEntry.objects.get().change_message.endswith("the BAD marker is a test fixture")
    wait_for(lambda: SparkRun.objects.get(id=queued.id).state in ("succeeded", "failed"), proc, timeout=180)
    run = SparkRun.objects.get(id=queued.id)
    assert run.state == "succeeded", (run.error, run.log_tail[-2000:])


def wait_for(condition, proc, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None and time.monotonic() < deadline, proc.log.read_text()[-3000:]
        time.sleep(0.1)


@pytest.mark.django_db
def test_the_admin_lists_results_and_overrides_only_with_the_permission(root, client):
    datasets_checked.declare()
    m = record_materialization(datasets_checked.DATASET, "2026-11-26", rows=50)
    record_check_result(m.id, "enough_rows", passed=True)
    record_check_result(m.id, "no_bad_marker", passed=False, message="a BAD marker")
    failed = DatasetCheckResult.objects.get(check_name="no_bad_marker")
    url = "/admin/jobsite_datasets/datasetcheckresult/"
    viewer = user("viewer", may_override=False)
    viewer.user_permissions.add(Permission.objects.get(codename="view_datasetcheckresult"))
    client.force_login(viewer)
    page = client.get(url)
    assert page.status_code == 200
    assert b"failed: a BAD marker" in page.content and b"override_checks" not in page.content
    refused = client.post(
        url, {"action": "override_checks", "_selected_action": [failed.pk], "post": "yes", "comment": "x"}
    )
    assert refused.status_code == 403
    assert Materialization.objects.get(id=m.id).checks == "failed" and not LogEntry.objects.exists()

    ana = user("ana", may_override=True)
    ana.user_permissions.add(Permission.objects.get(codename="view_datasetcheckresult"))
    client.force_login(ana)
    confirm = client.post(url, {"action": "override_checks", "_selected_action": [failed.pk]})
    assert confirm.status_code == 200 and b"dsc_daily[2026-11-26]" in confirm.content
    assert Materialization.objects.get(id=m.id).checks == "failed"  # the confirmation page changes nothing
    done = client.post(
        url, {"action": "override_checks", "_selected_action": [failed.pk], "post": "yes", "comment": "known issue"}
    )
    assert done.status_code == 302
    assert Materialization.objects.get(id=m.id).checks == "overridden"
    assert LogEntry.objects.get().change_message.endswith("known issue")
    assert b"overridden" in client.get(url).content


@pytest.mark.django_db(transaction=True)
def test_a_parked_steps_reason_names_the_failed_check_on_the_workflow_run_and_item_pages(
    root, monkeypatch, admin_client
):
    """A Spark step parked while its input's blocking check runs: the check then fails on the partition's files
    (a real check run), and the transaction that stores that result rewrites the reason the three pages show."""
    flow, m, step, day = park_a_step(root, monkeypatch)
    run_id = step["spark_run_id"]
    parked = _blocked(run_id, spark_ctx(run_id))
    assert parked["reason"] == (
        f"dataset dsc_daily[2026-11-26] (materialization {m.id}): blocking check no_bad_marker still running"
    )
    pages = {
        "workflow": f"/admin/jobsite_workflows/workflow/{flow.id}/change/",
        "run": f"/admin/jobsite_spark/sparkrun/{run_id}/change/",
        "item": f"/admin/queue_app/queueitem/{step['item_id']}/change/",
    }

    def shown(page):
        return admin_client.get(pages[page]).content.decode()

    assert run_check(m.id, "no_bad_marker")["checks"] == "pending"  # the warn check has not run yet
    failed = f"blocking check no_bad_marker failed on dataset dsc_daily[2026-11-26] (materialization {m.id})"
    assert DatasetBlock.objects.get().reason == f"{failed}: a BAD marker; its other checks still running"
    assert run_check(m.id, "enough_rows")["checks"] == "failed"
    override = "override with: manage.py dataset override dsc_daily --partition 2026-11-26 --comment"
    assert DatasetBlock.objects.get().reason.startswith(f"{failed}: a BAD marker; materialize it again, or {override}")
    assert workflows.status(flow.id)["steps"][0]["blocked_by"] == DatasetBlock.objects.get().reason
    for page in pages:
        html = shown(page)
        assert f"{failed}: a BAD marker" in html and override in html, page
    assert "queued · attempt 0" not in shown("run") and ">blocked<" in shown("run")
    assert "(blocked)" in shown("item")

    # A new materialization of the partition changes the reason; its checks passing clear it.
    (day / "BAD").unlink()
    again = record_materialization(datasets_checked.DATASET, "2026-11-26", rows=50)
    running = f"dataset dsc_daily[2026-11-26] (materialization {again.id}): blocking check no_bad_marker still running"
    assert DatasetBlock.objects.get().reason == running
    assert run_check(again.id, "no_bad_marker")["checks"] == "pending"
    assert DatasetBlock.objects.get().reason.endswith("its checks still running (the blocking ones passed)")
    assert run_check(again.id, "enough_rows")["checks"] == "passed"
    assert not DatasetBlock.objects.exists()
    for page in pages:
        assert "no_bad_marker" not in shown(page), page


@pytest.mark.django_db(transaction=True)
def test_a_park_that_missed_its_release_checks_again_after_the_recheck_and_may_start(root, monkeypatch, settings):
    """The race the recheck is for, forced: a consumer is parked on a failed partition while a new materialization
    of it is recorded and its checks pass. The park's transaction is held open (its item's row locked by another
    session when it hands the item back) while the new one commits, so the release deletes no row of the park's,
    and the item waits for DATASET_PARK_RECHECK (here 1 s) instead of being due at once. Then it checks again,
    finds the partition usable and may start."""
    settings.JOBSITE = {**getattr(settings, "JOBSITE", {}), "DATASET_PARK_RECHECK": 1.0}
    monkeypatch.setenv(SCRIPT_ROOTS_ENV, str(SCRIPTS))
    datasets_checked.declare()
    register_script("dsc_rechecked", path=str(SCRIPTS / "pi.py"), params=[DAY], consumes={"dsc_daily": "day"})
    run = trigger_run("dsc_rechecked", {"day": "2026-11-26"}, trigger="orm")  # queued before the bad day
    item = run.item_id
    bad = record_materialization(datasets_checked.DATASET, "2026-11-26", rows=50)
    record_check_result(bad.id, "enough_rows", passed=True)
    record_check_result(bad.id, "no_bad_marker", passed=False)
    ctx = spark_ctx(run.id)

    holder = dedicated_connection()
    holder.execute("BEGIN")
    holder.execute("SELECT 1 FROM queue_app_queueitem WHERE id = %s FOR UPDATE", [item])
    parked: dict = {}

    def park_it() -> None:
        try:
            parked["result"] = _blocked(run.id, ctx)
        finally:
            connections.close_all()

    parking = threading.Thread(target=park_it)
    parking.start()
    try:
        seen_waiting(what="the park's hand-back waiting on the item's row")
        good = record_materialization(datasets_checked.DATASET, "2026-11-26", rows=60)  # its own transaction
        record_check_result(good.id, "enough_rows", passed=True)
        record_check_result(good.id, "no_bad_marker", passed=True)  # usable: the release finds no row to delete
    finally:
        holder.execute("COMMIT")
        holder.close()
        parking.join(30)
    assert parked["result"]["state"] == "blocked"  # it read the bad one, under its lock
    assert DatasetBlock.objects.filter(item_id=item).exists()  # missed by the release
    assert QueueItem.objects.get(id=item).visible_at > timezone.now()  # not due now: only the recheck brings it back

    again = wait_until(lambda: reserve(QUEUE, timeout=1, lease=60), 30, what="the item back at its recheck")
    assert again.item_id == item and again.attempt == 1  # parking spent no attempt
    assert _blocked(run.id, ctx_of(again)) is None  # usable now: it may start
    assert not DatasetBlock.objects.filter(item_id=item).exists()
