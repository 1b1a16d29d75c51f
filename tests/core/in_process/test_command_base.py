"""What the jobsite commands share (queue_app/management/base.py, issue 50): a `--json` run logs only warnings
(so `2>&1` still parses) and puts the process's logging back after; a command acting as a Django user that does
not exist says who holds the permission and how to pass `--user`, and writes nothing."""

import io
import logging

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.core.management import CommandError, call_command

from queue_app.datasets.models import Materialization
from queue_app.datasets.services import record_materialization
from queue_app.management.base import SHOWN_USERS, JobsiteCommand, users_with

pytestmark = pytest.mark.django_db


class Chatty(JobsiteCommand):
    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, json, **options):
        logging.getLogger("jobsite.test").info("an info line")
        logging.getLogger("jobsite.test").warning("a warning")


def test_a_json_run_logs_only_warnings_and_restores_logging_after(caplog):
    caplog.set_level(logging.INFO, logger="jobsite.test")
    before = logging.root.manager.disable
    call_command(Chatty(), "--json", stdout=io.StringIO())
    assert [r.getMessage() for r in caplog.records] == ["a warning"]
    assert logging.root.manager.disable == before
    caplog.clear()
    call_command(Chatty(), stdout=io.StringIO())
    assert [r.getMessage() for r in caplog.records] == ["an info line", "a warning"]


def test_no_such_user_names_the_users_holding_the_permission_and_writes_nothing(django_user_model):
    failed = record_materialization("demo.events", "2026-11-29", rows=1)
    Materialization.objects.filter(id=failed.id).update(checks="failed")
    django_user_model.objects.create_superuser("admin", "a@example.com", "pw")
    holder = django_user_model.objects.create_user("ana")
    holder.user_permissions.add(Permission.objects.get(codename="override_dataset_check"))
    django_user_model.objects.create_user("bob")  # without the permission
    django_user_model.objects.create_superuser("zed", "z@example.com", "pw", is_active=False)

    with pytest.raises(CommandError) as refused:
        call_command("dataset", "override", "demo.events", "--partition", "2026-11-29", "--comment", "x",
                     "--user", "nobody")  # fmt: skip
    message = str(refused.value)
    assert message.startswith(
        "no Django user 'nobody' (from --user); users holding jobsite_datasets.override_dataset_check"
    )
    assert ": admin, ana (e.g. --user admin); nothing was written" in message
    assert Materialization.objects.get(id=failed.id).checks == "failed" and not LogEntry.objects.exists()
    for n in range(SHOWN_USERS + 2):
        django_user_model.objects.create_superuser(f"s{n}", f"s{n}@example.com", "pw")
    assert len(users_with("jobsite_datasets.override_dataset_check")) == SHOWN_USERS
    assert users_with("nope.nothing") == ["admin", "s0", "s1", "s2", "s3"]  # superusers hold every permission
