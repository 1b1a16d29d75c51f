"""Existing PySpark scripts as jobs: what is refused before anything runs (no JVM here).

Paths must lie under the allowed roots after symlinks and `..` are resolved; declarations (arguments, params,
conf, env, memory) are checked field by field; a refused CLI call exits non-zero and makes no run.
"""

import json
import os

import pytest

from queue_app.spark import scripts
from queue_app.spark.launcher import launch
from queue_app.spark.models import SparkRun, SparkScript
from queue_app.spark.registry import SparkParamError, get_job, validate
from queue_app.spark.runs import trigger_run
from tests.support.paths import SPARK_SCRIPTS

SCRIPTS = SPARK_SCRIPTS


@pytest.fixture
def roots(monkeypatch, tmp_path):
    root = tmp_path / "jobs"
    root.mkdir()
    (root / "ok.py").write_text("print('hi')\n")
    (root / "pkg").mkdir()
    (root / "pkg" / "mod.py").write_text("print('mod')\n")
    outside = tmp_path / "outside.py"
    outside.write_text("print('outside')\n")
    (root / "link.py").symlink_to(outside)
    monkeypatch.setenv(scripts.ROOTS_ENV, f"{root}:{tmp_path / 'missing-root'}")
    return root


def test_a_script_under_a_root_resolves_to_its_real_path(roots):
    assert scripts.resolve_path(str(roots / "ok.py")) == str(roots / "ok.py")
    assert scripts.resolve_path("pkg.mod") == str(roots / "pkg" / "mod.py")  # a module, found under a root


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("{root}/../outside.py", "outside the allowed script roots"),
        ("{root}/link.py", "outside the allowed script roots"),  # a symlink out of the root
        ("/etc/passwd", "outside the allowed script roots"),
        ("{root}/nope.py", "does not exist"),
        ("{root}/pkg", "does not exist or is not a file"),
        ("nope.module", "not found under the allowed script roots"),
        ("{root}/ok.py\0x", "not a usable path"),
        ("", "empty"),
    ],
)
def test_paths_outside_the_roots_or_missing_are_refused(roots, path, message):
    with pytest.raises(scripts.ScriptError, match=message):
        scripts.resolve_path(path.replace("{root}", str(roots)))


def test_without_roots_no_script_can_run(monkeypatch, tmp_path):
    monkeypatch.delenv(scripts.ROOTS_ENV, raising=False)
    with pytest.raises(scripts.ScriptError, match="no script roots are allowed"):
        scripts.resolve_path(str(tmp_path / "x.py"))


def test_argument_templates_only_substitute_declared_params():
    job = scripts.script_job(
        "wc",
        path="wordcount.py",
        args=["--input={input}", "{{literal}}", "{n}"],
        params=[{"name": "input", "type": "str", "required": True}, {"name": "n", "type": "int", "default": 3}],
    )
    values = {"input": "/data/x y", "n": 3}
    assert [scripts.render_arg(a, values) for a in job.script.args] == ["--input=/data/x y", "{literal}", "3"]
    with pytest.raises(scripts.ScriptError, match="undeclared parameters: other"):
        scripts.script_job("bad", path="x.py", args=["{other}"])
    with pytest.raises(scripts.ScriptError, match="lone brace"):  # no str.format attribute access
        scripts.script_job("bad", path="x.py", args=["{input.__class__}"], params=[{"name": "input"}])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"conf": {"spark.ui.port": "4040"}}, "set by jobsite"),
        ({"conf": {"java.home": "/x"}}, "starting with 'spark.'"),
        ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "cannot be overridden"),
        ({"env": {"BAD NAME": "x"}}, "not a variable name"),
        ({"driver_memory": "lots"}, "512m or 2g"),
        ({"executor_cores": 0}, "from 1 to 256"),
        ({"params": [{"name": "x", "type": "list"}]}, "type must be one of"),
        ({"params": [{"name": "x", "exec": "rm"}]}, "unknown keys exec"),
    ],
)
def test_bad_declarations_are_refused_with_the_reason(options, message):
    with pytest.raises(scripts.ScriptError, match=message):
        scripts.script_job("bad", path="x.py", **options)


@pytest.mark.django_db
def test_the_adhoc_script_job_validates_path_and_arguments(roots):
    assert validate("script", {"path": str(roots / "ok.py"), "args": '["a", "b"]'})["args"] == '["a", "b"]'
    with pytest.raises(SparkParamError) as refused:
        validate("script", {"path": "/etc/passwd", "args": '{"a": 1}'})
    assert set(refused.value.errors) == {"path", "args"}


@pytest.mark.parametrize(
    "entry",
    ["/tmp/evil.zip", "{root}/../evil.zip", "{root}/dep-link.zip", "{root}/ok.txt"],
    ids=["outside", "dotdot", "symlink-out", "not-py-zip-egg"],
)
@pytest.mark.django_db
def test_py_files_entries_are_confined_to_the_roots_and_no_run_is_made(roots, entry):
    (roots.parent / "evil.zip").write_bytes(b"PK\x05\x06" + bytes(18))
    (roots / "dep-link.zip").symlink_to(roots.parent / "evil.zip")
    (roots / "ok.txt").write_text("x")
    hostile = entry.replace("{root}", str(roots))
    scripts.register_script("pyfiles_hostile", path=str(roots / "ok.py"), py_files=[hostile])
    with pytest.raises(SparkParamError, match="--py-files entry .*(outside the allowed script roots|must end with)"):
        trigger_run("pyfiles_hostile", {}, trigger="orm")
    assert not SparkRun.objects.exists()


@pytest.mark.django_db
def test_a_py_files_entry_swapped_for_a_link_out_after_the_trigger_is_refused_at_launch(roots):
    dep = roots / "dep.zip"
    dep.write_bytes(b"PK\x05\x06" + bytes(18))
    scripts.register_script("pyfiles_swapped", path=str(roots / "ok.py"), py_files=[str(dep)])
    run = trigger_run("pyfiles_swapped", {}, trigger="orm")  # under the root when triggered
    dep.unlink()
    dep.symlink_to(roots.parent / "outside.py")
    result = launch("pyfiles_swapped", run.params, run.id)
    assert result.outcome == "failed" and result.returncode is None  # nothing was started
    assert "--py-files entry" in result.error and "outside the allowed script roots" in result.error


@pytest.mark.django_db
def test_stored_script_checks_every_field_and_writes_nothing_when_bad(roots):
    row = SparkScript(
        name="queue_analytics",  # a code job's name
        path="/etc/passwd",
        py_files=[str(roots / "ok.py"), "/tmp/evil.zip"],
        args=["{missing}"],
        conf={"spark.eventLog.dir": "/tmp"},
        env={"SPARK_HOME": "/x"},
        driver_memory="1 gigabyte",
    )
    with pytest.raises(SparkParamError) as refused:
        scripts.save_script(row, actor="alice")
    assert set(refused.value.errors) == {"name", "path", "py_files", "conf", "env", "driver_memory"}
    assert not SparkScript.objects.exists()

    row = SparkScript(
        name="ok-script",
        path=str(roots / "ok.py"),
        args=["{day}"],
        params=[{"name": "day", "type": "date", "required": True}],
        conf={"spark.sql.shuffle.partitions": 4},
        driver_memory="1G",
    )
    scripts.save_script(row, actor="alice")
    job = get_job("ok-script")
    assert job.script.path == str(roots / "ok.py") and job.source == "admin" and row.updated_by == "alice"
    assert job.conf == {"spark.sql.shuffle.partitions": "4"} and job.script.driver_memory == "1g"
    with pytest.raises(SparkParamError, match="day: must be a date"):
        validate("ok-script", {"day": "tomorrow"})


@pytest.mark.django_db(transaction=True)
def test_cli_refuses_a_script_outside_the_roots_and_makes_no_run(manage, tmp_path):
    outside = tmp_path / "x.py"
    outside.write_text("print(1)\n")
    result = manage(
        "spark_run", "--script", str(outside), "--arg", "1", "--json", env={scripts.ROOTS_ENV: str(SCRIPTS)}
    )
    assert result.returncode != 0
    assert f"invalid parameters for script {outside}; nothing was queued" in result.stderr
    assert "outside the allowed script roots" in result.stderr
    assert result.stdout == ""
    assert not SparkRun.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_cli_without_script_roots_refuses_naming_the_setting_and_the_workers_environment(manage):
    """Issue 50: the README's example set the roots in a second terminal only; the triggering process checks them
    (no run made without) and its message says the worker needs them too."""
    result = manage("spark_run", "--script", str(SCRIPTS / "pi.py"), "--arg", "1", env={scripts.ROOTS_ENV: ""})
    assert result.returncode == 1 and "nothing was queued" in result.stderr
    assert "no script roots are allowed in this process" in result.stderr and scripts.ROOTS_ENV in result.stderr
    assert "of the worker that runs it" in result.stderr and "before `manage.py up`" in result.stderr
    assert not SparkRun.objects.exists()


def test_failure_reason_is_the_python_exception_or_the_spark_error():
    from queue_app.spark.watch import failure_reason

    tail = [
        "Pi is roughly 3.14",
        "Traceback (most recent call last):",
        '  File "/srv/x.py", line 8, in <module>',
        "    raise ValueError('bad')",
        "ValueError: bad input: expected 11 rows, found 10",
        "26/11/25 INFO ShutdownHookManager: Shutdown hook called",
    ]
    assert failure_reason(tail) == "ValueError: bad input: expected 11 rows, found 10"
    spark_error = [
        "Traceback (most recent call last):",
        '  File "/srv/y.py", line 3, in <module>',
        "pyspark.errors.exceptions.captured.AnalysisException: [TABLE_OR_VIEW_NOT_FOUND] The table `nope` "
        "cannot be found.",
        "JVM stacktrace:",
        "org.apache.spark.sql.AnalysisException: ...",
    ]
    assert failure_reason(spark_error).endswith("[TABLE_OR_VIEW_NOT_FOUND] The table `nope` cannot be found.")
    assert failure_reason(["just a log line"]) == ""


# The one example that reports its own figures through jobsite's in-script helper (jobsite/spark_report.py):
# it imports that module, and nothing else of jobsite.
REPORTING = {"reporting_sales.py"}


def test_example_scripts_know_nothing_of_jobsite():
    for script in SCRIPTS.glob("*.py"):
        text = script.read_text()
        if script.name in REPORTING:
            assert "queue_app" not in text and "django" not in text, script
            imports = {line.strip() for line in text.splitlines() if "import" in line and "jobsite" in line}
            assert imports == {"from jobsite import spark_report"}, script
            continue
        assert "jobsite" not in text and "queue_app" not in text and "django" not in text, script
    assert json.loads(json.dumps(os.fspath(SCRIPTS)))


def _form(**fields):
    data = {
        "name": "pi",
        "description": "",
        "enabled": "on",
        "path": "",
        "args": "[]",
        "params": "[]",
        "py_files": "[]",
        "conf": "{}",
        "env": "{}",
        "driver_memory": "",
        "executor_memory": "",
        "driver_cores": "",
        "executor_cores": "",
    }
    return {**data, **fields}


@pytest.mark.django_db
def test_admin_user_with_permission_registers_a_script_and_the_change_is_logged(roots, client, django_user_model):
    from django.contrib.admin.models import LogEntry
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("ops", password="pw", is_staff=True)
    client.force_login(user)
    url = "/admin/jobsite_spark/sparkscript/add/"
    assert client.post(url, _form(path=str(roots / "ok.py"))).status_code == 403  # no add permission
    user.user_permissions.add(*Permission.objects.filter(codename__in=["add_sparkscript", "view_sparkscript"]))

    refused = client.post(url, _form(path=str(roots / "link.py"), args='["{x}"]'))
    assert refused.status_code == 200 and not SparkScript.objects.exists()
    assert "outside the allowed script roots" in refused.content.decode()

    created = client.post(
        url, _form(path=str(roots / "ok.py"), args='["{n}"]', params='[{"name": "n", "type": "int"}]')
    )
    assert created.status_code == 302, created.content.decode()[:2000]
    row = SparkScript.objects.get(name="pi")
    assert row.updated_by == "ops" and get_job("pi").script.args == ("{n}",)
    assert LogEntry.objects.filter(object_id=str(row.pk), user=user).exists()
