"""Spark job registry and parameters: bad input is refused with every problem named, before anything runs.

No JVM here: these run with `-m "not spark"` too.
"""

import datetime as dt
import json
import subprocess

import pytest

from queue_app.spark import commandline, launcher
from queue_app.spark.db import PostgresSource, resolve_reader
from queue_app.spark.registry import Param, SparkParamError, UnknownSparkJob, all_jobs, get_job, validate

pytestmark = pytest.mark.django_db  # the registry also lists the scripts stored by the admin


def test_shipped_jobs_are_registered():
    assert {"queue_analytics", "file_rollup", "demo_sleep"} <= {job.name for job in all_jobs()}


def test_unknown_job_names_the_registered_ones():
    with pytest.raises(UnknownSparkJob, match=r"unknown Spark job 'nope'; registered jobs: .*queue_analytics"):
        get_job("nope")


def test_every_bad_parameter_is_reported_at_once(tmp_path):
    with pytest.raises(SparkParamError) as caught:
        validate(
            "file_rollup",
            {"input_dir": str(tmp_path / "missing"), "format": "xml", "day": "2025-13-01", "colour": "red"},
        )
    errors = caught.value.errors
    assert set(errors) == {"input_dir", "output_dir", "format", "day", "colour"}
    assert errors["output_dir"] == "this parameter is required"
    assert "does not exist" in errors["input_dir"]
    assert errors["format"] == "must be one of csv, json; got 'xml'"
    assert "YYYY-MM-DD" in errors["day"]
    assert errors["colour"].startswith("unknown parameter")
    message = str(caught.value)
    assert message.startswith("invalid parameters for Spark job 'file_rollup': ")
    for name in errors:
        assert f"{name}: " in message


def test_raw_strings_become_declared_types():
    values = validate("demo_sleep", {"tasks": " 12 ", "seconds": "0.25", "fail": "yes"})
    assert values == {"tasks": 12, "seconds": 0.25, "fail": True}


def test_missing_and_empty_parameters_take_their_defaults():
    assert validate("demo_sleep", {"tasks": "", "fail": None}) == {"tasks": 8, "seconds": 1.0, "fail": False}


@pytest.mark.parametrize(
    ("raw", "field", "message"),
    [
        ({"tasks": "1.5"}, "tasks", "must be an integer, got '1.5'"),
        ({"tasks": "0"}, "tasks", "must be >= 1"),
        ({"tasks": True}, "tasks", "must be an integer"),
        ({"seconds": "nan"}, "seconds", "must be a finite number"),
        ({"fail": "maybe"}, "fail", "must be true or false, got 'maybe'"),
    ],
)
def test_malformed_values_are_rejected_with_the_reason(raw, field, message):
    with pytest.raises(SparkParamError) as caught:
        validate("demo_sleep", raw)
    assert caught.value.errors == {field: message}


def test_rules_across_fields_are_checked():
    with pytest.raises(SparkParamError) as caught:
        validate("queue_analytics", {"since": "2025-01-02", "until": "2025-01-02"})
    assert caught.value.errors == {"until": "must be after since (2025-01-02); until is exclusive"}


def test_date_parameters_refuse_datetimes():
    with pytest.raises(SparkParamError, match="not a date and time"):
        validate("queue_analytics", {"since": dt.datetime(2025, 1, 1, 12)})


def test_params_survive_the_trip_to_the_child_as_json():
    job = get_job("queue_analytics")
    values = job.validate({"since": "2025-01-01", "until": dt.date(2025, 1, 3), "partitions": 2})
    assert job.validate(json.loads(json.dumps(job.dump_params(values)))) == values


def test_param_declarations_are_checked():
    with pytest.raises(ValueError, match="needs choices"):
        Param("x", "choice")
    with pytest.raises(ValueError, match="type must be one of"):
        Param("x", "list")
    with pytest.raises(ValueError, match="cannot have a default"):
        Param("x", "int", required=True, default=1)


def test_launch_with_bad_params_starts_nothing(monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("spark-submit was started"))
    result = launcher.launch("demo_sleep", {"tasks": "many"}, run_id=1)
    assert result.outcome == "failed"
    assert result.error == "invalid parameters for Spark job 'demo_sleep': tasks: must be an integer, got 'many'"


def test_missing_java_is_reported_clearly(monkeypatch, tmp_path):
    from queue_app.spark import java

    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("spark-submit was started"))
    result = launcher.launch("demo_sleep", {}, run_id=1)
    assert result.outcome == "failed"
    assert result.error.startswith(f"Java not found (JAVA_HOME={tmp_path} has no bin/java).")
    assert "openjdk-17-jre-headless" in result.error
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(java.JavaNotFound, match=r"no `java` on PATH"):
        java.check_java()


def test_tcp_database_is_read_over_jdbc_and_a_socket_one_over_psycopg():
    tcp = PostgresSource(host="127.0.0.1", port=5433, dbname="test db", user="u", password="p")
    assert tcp.jdbc_url == "jdbc:postgresql://127.0.0.1:5433/test%20db"
    assert tcp.jdbc_properties() == {"driver": "org.postgresql.Driver", "user": "u", "password": "p"}
    assert resolve_reader("auto", tcp) == "jdbc"
    socket = PostgresSource(host="/work/main/var/pg", port=5432, dbname="jobsite", user="postgres")
    assert resolve_reader("auto", socket) == "psycopg"
    assert socket.psycopg_kwargs()["host"] == "/work/main/var/pg"
    with pytest.raises(ValueError, match="unix socket"):
        resolve_reader("jdbc", socket)


def test_submit_command_runs_the_child_with_the_run_conf(monkeypatch):
    pytest.importorskip("pyspark")
    monkeypatch.setenv("SPARK_MASTER", "spark://127.0.0.1:7077")
    cmd = commandline.submit_command("demo_sleep", {"tasks": 2}, 7, "/tmp/out.json", conf={"spark.driver.memory": "2g"})
    assert cmd[0].endswith("/pyspark/bin/spark-submit")
    assert cmd[1:5] == ["--master", "spark://127.0.0.1:7077", "--name", "jobsite-run-7"]
    assert "spark.driver.memory=2g" in cmd and "spark.sql.session.timeZone=UTC" in cmd
    assert cmd[cmd.index(commandline.CHILD_SCRIPT) + 1 :] == [
        "--job",
        "demo_sleep",
        "--params-json",
        '{"tasks":2}',
        "--run-id",
        "7",
        "--output-file",
        "/tmp/out.json",
    ]


def test_without_the_jdbc_jar_auto_reads_through_psycopg_and_jdbc_is_refused():
    tcp = PostgresSource(host="127.0.0.1", port=5433, dbname="jobsite")
    assert resolve_reader("auto", tcp, jar=None) == "psycopg"
    with pytest.raises(ValueError, match="libpostgresql-jdbc-java"):
        resolve_reader("jdbc", tcp, jar=None)


def test_a_jdbc_run_without_the_driver_jar_fails_before_its_jvm_starts(monkeypatch, tmp_path):
    """The first-run trap: reader=jdbc on a machine without the jar is refused when triggered, and a run that
    gets to a worker anyway fails at once with the same message (not a ClassNotFoundException five times)."""
    monkeypatch.setenv("JOBSITE_JDBC_JAR", str(tmp_path / "postgresql.jar"))
    with pytest.raises(SparkParamError) as refused:
        validate("queue_analytics", {"reader": "jdbc"})
    assert f"the PostgreSQL JDBC driver jar {tmp_path}/postgresql.jar is missing" in refused.value.errors["reader"]
    assert validate("queue_analytics", {"reader": "auto"})["reader"] == "auto"  # auto falls back instead
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("spark-submit was started"))
    result = launcher.launch("queue_analytics", {"reader": "jdbc"}, run_id=1)
    assert result.outcome == "failed" and result.returncode is None  # returncode None: the run is not retried
    assert "apt-get install libpostgresql-jdbc-java" in result.error


def test_progress_never_goes_backwards_nor_shrinks_its_total():
    from queue_app.spark.protocol import monotonic

    running = {"tasks_done": 604, "tasks_total": 807, "stages_done": 3, "stages_total": 5, "jobs_total": 1}
    ended = {"tasks_done": 605, "tasks_total": 605, "stages_done": 3, "stages_total": 3, "jobs_done": 1}
    merged = monotonic(running, ended)
    assert (merged["tasks_done"], merged["tasks_total"]) == (605, 807)
    assert (merged["stages_done"], merged["stages_total"]) == (3, 5)
    assert (merged["jobs_done"], merged["jobs_total"]) == (1, 1)
    assert monotonic(merged, {"tasks_done": 10, "tasks_total": 900})["tasks_done"] == 605


def test_the_registry_imports_no_pipeline_registration_flows_one_way():
    import ast
    import inspect

    from queue_app.conf import queue_settings
    from queue_app.spark import registry

    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(inspect.getsource(registry)))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert not [name for name in imported if name and "pipelines" in name]
    assert "queue_app.spark.pipelines" in queue_settings.SPARK_JOB_MODULES
