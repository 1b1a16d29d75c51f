"""The datasets layer as an app of its own (queue_app.datasets, issue 45): what its AppConfig wires into the
core's hooks, and its declared dependency checked by `check` (jobsite.E100), not an ImportError.

A project installing the datasets app without the core is a real `django-admin check` in a child process, with
settings that drop queue_app (and the jobsite project's apps, which need it) from the jobsite project's."""

import subprocess
import sys
from pathlib import Path

from django.apps import apps

from queue_app import hooks
from queue_app.datasets.checks_run import blocked_items
from queue_app.datasets.producers import producer_succeeded

ROOT = Path(__file__).resolve().parent.parent

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
    assert apps.get_model("queue_app", "Dataset")._meta.db_table == "queue_app_dataset"  # state not moved yet
    assert blocked_items in list(hooks.held_reasons)
    assert producer_succeeded in list(hooks.producer_succeeded)
    assert {"dataset_staleness", "dataset_watch"} <= set(hooks.maintenance_units)
    assert len(list(hooks.metric_collectors)) == 2


def test_a_maintenance_unit_no_app_registers_is_skipped_not_an_error():
    assert hooks.run_maintenance("no_such_unit") == {
        "skipped": "no installed app registers the maintenance unit 'no_such_unit'"
    }


def test_the_datasets_app_without_the_core_is_a_check_error(tmp_path):
    (tmp_path / "layer_settings.py").write_text(SETTINGS)
    (tmp_path / "layer_urls.py").write_text(URLS)
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": f"{tmp_path}:{ROOT}",
        "DJANGO_SETTINGS_MODULE": "layer_settings",
        "JOBSITE_NO_BOOTSTRAP": "1",
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres",  # check opens no connection
    }
    checked = subprocess.run(
        [sys.executable, "-m", "django", "check"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert "(jobsite.E100) the datasets app (queue_app.datasets) needs 'queue_app' in INSTALLED_APPS" in checked.stderr
    assert "Traceback" not in checked.stderr
