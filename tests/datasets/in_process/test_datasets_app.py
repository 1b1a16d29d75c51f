"""The datasets layer as an app of its own (queue_app.datasets, issue 45): what its AppConfig wires into the
core's hooks, and its declared dependency checked by `check` (jobsite.E100), not an ImportError.

A project installing the datasets app without the core is a real `django-admin check` in a child process, with
settings that drop queue_app (and the jobsite project's apps, which need it) from the jobsite project's. So is
the other way round: the core without the datasets app, whose Spark jobs and workflows still declare datasets
(jobsite.E113, not an ImportError: the vocabulary is the core's, queue_app/dataset_refs.py)."""

import subprocess
import sys

from django.apps import apps

from queue_app import dataset_refs, hooks
from queue_app.datasets import workflow_triggers
from queue_app.datasets.checks_run import blocked_items
from queue_app.datasets.producers import producer_succeeded
from queue_app.datasets.refs import ref_problems
from queue_app.datasets.spark_lineage import emit_run
from queue_app.datasets.spark_runs import check_trigger, output_figures, park_blocked, record_outputs
from queue_app.spark import hooks as spark_hooks
from queue_app.workflows import hooks as workflow_hooks
from tests.support.paths import ROOT

SETTINGS = """
from jobsite.settings import *  # noqa: F403

INSTALLED_APPS = [a for a in INSTALLED_APPS if a not in ("queue_app", "jobsite", "jobsite.demo")]
DATABASE_ROUTERS = []
ROOT_URLCONF = "layer_urls"
"""
URLS = """
from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
"""


def test_the_datasets_app_is_installed_with_its_label_and_registers_on_the_cores_hooks():
    config = apps.get_app_config("jobsite_datasets")
    assert (config.name, config.verbose_name) == ("queue_app.datasets", "Datasets")
    # Its models are its own, on the tables the core's migrations made
    assert apps.get_model("jobsite_datasets", "Dataset")._meta.db_table == "queue_app_dataset"
    assert blocked_items in list(hooks.held_reasons)
    assert producer_succeeded in list(hooks.producer_succeeded)
    assert {"dataset_staleness", "dataset_watch"} <= set(hooks.maintenance_units)
    assert len(list(hooks.metric_collectors)) == 2
    # A Spark run's hooks (spark/hooks.py) and the declarations' reader (dataset_refs.py)
    assert list(spark_hooks.trigger_checks) == [check_trigger]
    assert list(spark_hooks.start_checks) == [park_blocked]
    assert list(spark_hooks.success_outputs) == [output_figures]
    assert list(spark_hooks.succeeded) == [record_outputs]
    assert list(spark_hooks.state_changed) == [emit_run]
    assert list(dataset_refs.problems) == [ref_problems]
    # A workflow's hooks (workflows/hooks.py): a partition parameter's dynamic key held while the workflow starts
    assert list(workflow_hooks.start_checks) == [workflow_triggers.check_start]


def test_a_maintenance_unit_no_app_registers_is_skipped_not_an_error():
    assert hooks.run_maintenance("no_such_unit") == {
        "skipped": "no installed app registers the maintenance unit 'no_such_unit'"
    }


def django_check(tmp_path, settings_module: str) -> subprocess.CompletedProcess:
    """`django check` as its own process, a project of `settings_module` (written under tmp_path) on jobsite's
    checkout."""
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{tmp_path}:{ROOT}",
        "DJANGO_SETTINGS_MODULE": settings_module,
        "JOBSITE_NO_BOOTSTRAP": "1",
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres",  # check opens no connection
    }
    return subprocess.run(
        [sys.executable, "-m", "django", "check"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def test_the_datasets_app_without_the_core_is_a_check_error(tmp_path):
    (tmp_path / "layer_settings.py").write_text(SETTINGS)
    (tmp_path / "layer_urls.py").write_text(URLS)
    checked = django_check(tmp_path, "layer_settings")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "(jobsite.E100) the datasets app (queue_app.datasets) needs 'queue_app' in INSTALLED_APPS" in checked.stderr
    assert "(jobsite.E100) the webhooks app (queue_app.webhooks) needs 'queue_app' in INSTALLED_APPS" in checked.stderr
    assert "Traceback" not in checked.stderr


CORE_SETTINGS = """
from jobsite.settings import *  # noqa: F403

INSTALLED_APPS = [a for a in INSTALLED_APPS if a not in ("queue_app.datasets", "jobsite.demo")] + ["shop"]
"""
SHOP_SPARK_JOBS = """
from queue_app.spark.registry import spark_job


@spark_job("shop_rollup", produces=["shop_sales"], consumes={"shop_orders": None})
def rollup(spark, params):
    return {}
"""
SHOP_TASKS = """
from queue_app.workflows.definition import workflow


@workflow("shop_refresh", on_update=["shop_sales"])
def refresh(wf, params):
    pass
"""


def test_the_core_without_the_datasets_app_says_a_declaration_naming_datasets_is_unread(tmp_path):
    """spark/registry.py, spark/scripts.py and workflows/definition.py import nothing of the datasets app: the
    core alone imports them, and a job or workflow declaring datasets is jobsite.E113 naming the app to add."""
    (tmp_path / "core_settings.py").write_text(CORE_SETTINGS)
    (tmp_path / "shop").mkdir()
    (tmp_path / "shop" / "__init__.py").write_text("")
    (tmp_path / "shop" / "spark_jobs.py").write_text(SHOP_SPARK_JOBS)
    (tmp_path / "shop" / "tasks.py").write_text(SHOP_TASKS)
    checked = django_check(tmp_path, "core_settings")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "Traceback" not in checked.stderr
    said = "it names datasets, but the datasets app is not installed"
    assert f"(jobsite.E113) Spark job 'shop_rollup': {said}" in checked.stderr
    assert f"(jobsite.E113) workflow 'shop_refresh': {said}" in checked.stderr
    assert "jobsite.E106" not in checked.stderr  # the datasets' own checks are not run: the app is not there
