"""Existing PySpark scripts run unmodified by path: standard example programs that know nothing of jobsite
(tests/tasks/spark_scripts/) run under spark-submit, with progress, app id, metrics and the failure reason read from
the driver's event log (and its status REST API once a job has run a while), and cancel stopping the whole
process group.

One spark-submit at a time (two cores shared with other suites): local[2], a start-up tuned JVM, small data.
"""

import json
import os
import zipfile

import pytest
from django.core.management import call_command

from queue_app.models import ItemState, QueueItem
from queue_app.spark import eventlog, statusapi
from queue_app.spark.launcher import launch
from queue_app.spark.models import SparkRun
from queue_app.spark.runs import cancel_run, trigger_run
from queue_app.spark.scripts import ROOTS_ENV, register_script
from queue_app.spark.watch import group_members
from tests.conftest import child_env
from tests.support.paths import SPARK_SCRIPTS
from tests.support.spark_fixtures import require_spark
from tests.support.waiting import wait_for

pytestmark = pytest.mark.spark
SCRIPTS = SPARK_SCRIPTS
FAST = {"JAVA_TOOL_OPTIONS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}


@pytest.fixture(autouse=True)
def _roots(monkeypatch, tmp_path):
    require_spark()
    monkeypatch.setenv(ROOTS_ENV, str(SCRIPTS))
    monkeypatch.setenv("JOBSITE_SPARK_EVENT_LOG_DIR", str(tmp_path / "events"))


def run_script(name, run_id, params, **kwargs):
    seen = []
    result = launch(name, params, run_id, master="local[2]", env=FAST, on_progress=seen.append, **kwargs)
    return result, seen


@pytest.mark.django_db
def test_word_count_runs_by_path_with_progress_app_id_and_metrics(tmp_path, monkeypatch):
    # Its job is short on a quiet machine; on a loaded one it may run past API_AFTER, which is not what this
    # test is about: here the event log alone must give live progress.
    monkeypatch.setattr(statusapi, "API_AFTER", 3600.0)
    text = tmp_path / "words.txt"
    text.write_text("the quick brown fox\njumps over the lazy dog\nthe end\n" * 50)
    result, seen = run_script("script", "wc", {"path": str(SCRIPTS / "wordcount.py"), "args": json.dumps([str(text)])})
    assert result.outcome == "succeeded", (result.error, result.log_tail[-2000:])
    assert "the: 150" in result.log_tail.splitlines()  # the script's own output, in the run's log
    assert result.app_id.startswith("local-")
    assert seen and seen[0]["tasks_total"] <= seen[-1]["tasks_total"]  # live progress, from its event log
    assert {p.get("source") for p in seen} == {"event log"}, seen  # never the driver's status API
    assert result.progress["jobs_done"] == result.progress["jobs_total"] >= 1
    assert result.progress["tasks_done"] == result.progress["tasks_total"] > 0
    assert result.metrics["input_bytes"] >= text.stat().st_size and result.metrics["tasks"] > 0
    assert eventlog.log_for("wc", result.app_id).endswith(result.app_id)  # the run's event log is kept


@pytest.mark.django_db
def test_a_registered_dataframe_sql_script_renders_its_args_and_writes_parquet(tmp_path):
    source = tmp_path / "sales.csv"
    source.write_text("region,amount\n" + "".join(f"{r},{a}\n" for r in ("north", "south", "east") for a in (1, 2)))
    register_script(
        "sales_report_test",
        path=str(SCRIPTS / "sales_report.py"),
        args=["{input}", "{output}"],
        params=[
            {"name": "input", "type": "path", "required": True, "must_exist": True},
            {"name": "output", "type": "path", "required": True},
        ],
        conf={"spark.sql.shuffle.partitions": "2"},
        driver_memory="512m",
    )
    out = tmp_path / "report"
    result, _ = run_script("sales_report_test", "sales", {"input": str(source), "output": str(out)})
    assert result.outcome == "succeeded", (result.error, result.log_tail[-2000:])
    assert f"wrote 3 regions to {out}" in result.log_tail
    assert list(out.glob("part-*.parquet")) and (out / "_SUCCESS").exists()
    assert result.metrics["output_records"] == 3 and result.metrics["jobs"] == result.progress["jobs_total"]


@pytest.mark.django_db
def test_a_script_imports_a_helper_shipped_as_a_zip_by_its_py_files(tmp_path, monkeypatch):
    # letter_stats.py imports `textstats`, which is not installed and not beside it: only the registered
    # --py-files zip provides it, to the driver and to the executors' Python workers that call it.
    deps = tmp_path / "deps"
    deps.mkdir()
    helper = deps / "textstats.zip"
    with zipfile.ZipFile(helper, "w") as zipped:
        zipped.write(SCRIPTS / "deps" / "textstats" / "__init__.py", "textstats/__init__.py")
    monkeypatch.setenv(ROOTS_ENV, f"{SCRIPTS}:{deps}")
    text = tmp_path / "words.txt"
    text.write_text("the quick brown fox\njumps over the lazy dog\n" * 20)
    register_script(
        "letter_stats_test",
        path=str(SCRIPTS / "letter_stats.py"),
        args=["{input}"],
        params=[{"name": "input", "type": "path", "required": True, "must_exist": True}],
        py_files=[str(helper)],
    )
    result, _ = run_script("letter_stats_test", "pyfiles", {"input": str(text)})
    assert result.outcome == "succeeded", (result.error, result.log_tail[-2000:])
    lines = result.log_tail.splitlines()
    assert "long: 100" in lines and "short: 80" in lines  # quick brown jumps over lazy / the fox the dog
    assert any(line.startswith("helper loaded from: ") and "textstats.zip" in line for line in lines)
    assert result.metrics["input_bytes"] >= text.stat().st_size and result.progress["jobs_done"] >= 1


@pytest.mark.django_db
def test_a_failing_script_shows_its_python_exception():
    result, _ = run_script("script", "fail", {"path": str(SCRIPTS / "failing.py"), "args": "[]"})
    assert result.outcome == "failed" and result.returncode not in (0, None)
    assert result.error == "ValueError: bad input: expected 11 rows, found 10"
    assert result.progress["jobs_done"] == result.progress["jobs_total"] >= 1  # its Spark jobs ran before it raised


def start_script_worker(spawn, **extra: str):
    return spawn(
        "run_worker",
        "--queues",
        "spark",
        "--concurrency",
        "1",
        "--poll-interval",
        "0.5",
        env={
            ROOTS_ENV: str(SCRIPTS),
            "SPARK_MASTER": "local[2]",
            "JOBSITE_SPARK_STOP_GRACE": "3",
            "JOBSITE_SPARK_EVENT_LOG_DIR": os.environ["JOBSITE_SPARK_EVENT_LOG_DIR"],
            **FAST,
            **extra,
        },
    )


@pytest.fixture
def script_worker(spawn, test_db_name):
    return start_script_worker(spawn)


@pytest.mark.django_db(transaction=True)
def test_cli_runs_a_script_through_a_worker_and_prints_one_json_object(script_worker, manage):
    result = manage(
        "spark_run",
        "--script",
        str(SCRIPTS / "pi.py"),
        "--arg",
        "3",
        "--arg",
        "20000",
        "--wait",
        "--json",
        "--poll",
        "0.5",
        timeout=240,
        env={ROOTS_ENV: str(SCRIPTS)},
    )
    assert result.returncode == 0, (result.stdout, result.stderr[-3000:])
    out = json.loads(result.stdout)
    assert set(out) >= {"id", "state", "app_id", "error", "metrics", "progress"}
    assert out["state"] == "succeeded" and out["error"] is None and out["app_id"].startswith("local-")
    assert out["progress"]["tasks"] == {"done": 3, "total": 3}
    assert out["progress"]["jobs"] == {"done": 1, "total": 1} and out["progress"]["stages"]["done"] == 1
    assert out["metrics"]["tasks"] == 3
    # The split of the run: every step, in order (seconds after queued; the task times are the driver's own,
    # from its event log).
    steps = ["queued", "leased", "launched", "driver_up", "first_task", "last_task", "ended", "recorded"]
    assert list(out["timings"]) == steps, out["timings"]
    at = [out["timings"][step] for step in steps]
    assert at[0] == 0 and at == sorted(at), out["timings"]
    run = SparkRun.objects.get(id=out["id"])
    assert run.job == "script" and "Pi is roughly 3.1" in run.log_tail
    assert QueueItem.objects.get(id=run.item_id).state == ItemState.DONE


@pytest.mark.django_db(transaction=True)
def test_cancel_of_a_running_script_stops_its_process_group(spawn, test_db_name):
    # Its tasks are counted live by the status API, asked once its job has run API_AFTER: 2 s here, not 30.
    start_script_worker(spawn, JOBSITE_SPARK_STATUS_API_AFTER="2")
    run = trigger_run("script", {"path": str(SCRIPTS / "slow.py"), "args": '["2", "120"]'}, trigger="orm")
    running = wait_for(
        lambda: (r := SparkRun.objects.get(id=run.id)).progress.get("tasks_active") and r,
        180,
        what="the script's tasks to run",
    )
    assert running.state == "running" and running.app_id and running.ui_url.startswith("http://127.0.0.1:")
    assert running.progress["source"] == "status API"  # a job past API_AFTER has its tasks counted live
    assert group_members(running.driver_pgid)
    assert cancel_run(run.id, actor="tester")
    ended = wait_for(lambda: (r := SparkRun.objects.get(id=run.id)).is_final and r, 60, what="the run to end")
    assert ended.state == "cancelled"
    assert group_members(running.driver_pgid) == []
    assert QueueItem.objects.get(id=run.item_id).state == ItemState.CANCELLED


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_bench_times_a_script_bare_and_through_jobsite_with_the_split(test_db_name, monkeypatch, capsys):
    """`spark_bench --vs-submit 1`: one bare spark-submit and one `spark_run --script --wait` of the same word
    count (its own worker), both times, their difference, and the jobsite run's split."""
    for key, value in child_env(test_db_name).items():
        monkeypatch.setenv(key, value)  # the bench's worker and CLI use the test database
    call_command("spark_bench", "--vs-submit", "1", "--json")
    figures = json.loads(capsys.readouterr().out)
    (pair,) = figures["pairs"]
    assert pair["bare_s"] > 0 and pair["jobsite_s"] > 0
    assert pair["diff_s"] == figures["diff_median_s"] == round(pair["jobsite_s"] - pair["bare_s"], 2)
    steps = ["queued", "leased", "launched", "driver_up", "first_task", "last_task", "ended", "recorded"]
    assert list(pair["split"]) == [*steps, "cli_start", "cli_end"], pair["split"]
    assert pair["split"]["recorded"] < pair["jobsite_s"]  # the run itself is inside the CLI's time
    run = SparkRun.objects.get()
    assert run.state == "succeeded" and run.trigger == "cli" and "spark: " in run.log_tail  # the words counted
