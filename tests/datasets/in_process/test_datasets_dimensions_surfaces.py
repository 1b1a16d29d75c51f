"""Multi-dimension and dynamic partitions on the surfaces: `manage.py dataset partitions add|remove|list` and
`dataset materialize --partition 'D|R'` / ranges with '*' as real processes (JSON shapes, errors naming the
dimension, nothing queued or written on a bad input), and the admin (the dataset page's time-by-region matrix,
the Partitions page behind jobsite_datasets.change_dynamic_partitions, logged), and a consumer of one `day|region`
partition held back by that partition's failed checks alone."""

import json
import threading

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.db import connections, transaction
from django.test import Client
from django.urls import reverse

from queue_app.datasets import DatasetError, dynamic
from queue_app.datasets.materialize import materialize
from queue_app.datasets.models import DynamicPartitionKey, Materialization
from queue_app.datasets.services import record_materialization
from queue_app.datasets.spark_runs import DatasetBlocked
from queue_app.datasets.sync import sync_datasets
from queue_app.models import QueueItem
from queue_app.spark.models import SparkRun
from queue_app.spark.registry import SparkParamError
from queue_app.spark.runs import trigger_run
from queue_app.workflows import services
from queue_app.workflows.definition import WorkflowParamError
from queue_app.workflows.models import Workflow
from tests.support.admin_fixtures import (
    JOBSITE_LABELS,
    fast_password_hashing_fixture,  # noqa: F401 (autouse)
)
from tests.support.waiting import seen_waiting
from tests.tasks import dimensions_declared  # noqa: F401  (declares in this process what the children --import)

IMPORT = ("--import", "tests.tasks.dimensions_declared")


@pytest.mark.django_db(transaction=True)
def test_the_cli_adds_lists_and_removes_dynamic_keys_and_materializes_over_dimensions(manage):
    def cli(*args):
        return manage("dataset", *IMPORT, *args)

    added = cli("partitions", "add", "dim_orders", "acme", "globex", "--json")
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout) == {"set": "dim_customers", "added": ["acme", "globex"]}
    bad = cli("partitions", "add", "dim_orders", "ok", "../x")
    assert bad.returncode == 1 and "not a dynamic partition key" in bad.stderr
    assert bad.stdout == "" and not DynamicPartitionKey.objects.filter(key="ok").exists()
    assert "not partitioned by a dynamic set" in cli("partitions", "list", "dim_sales").stderr
    removed = cli("partitions", "remove", "dim_orders", "globex", "--json")
    assert json.loads(removed.stdout) == {"set": "dim_customers", "removed": ["globex"]}
    listed = json.loads(cli("partitions", "list", "dim_orders", "--history", "--json").stdout)
    assert [(k["key"], k["removed_at"] is not None) for k in listed["keys"]] == [("acme", False), ("globex", True)]
    assert set(listed["keys"][0]) == {"key", "added_at", "added_by", "removed_at", "removed_by"}

    one = cli("materialize", "dim_sales", "--partition", "2026-11-30|eu", "--json")
    assert one.returncode == 0, one.stderr
    shown = json.loads(one.stdout)
    assert shown["partitions"] == ["2026-11-30|eu"] and shown["dimensions"] == ["day", "region"]
    assert SparkRun.objects.get(id=shown["runs"][0]).params == {"day": "2026-11-30", "region": "eu"}
    ranged = json.loads(
        cli("materialize", "dim_sales", "--from", "2026-11-01|*", "--to", "2026-11-02|*", "--json").stdout
    )
    assert ranged["partitions"] == [f"2026-11-0{d}|{r}" for d in (1, 2) for r in ("apac", "eu", "us")]
    assert len(ranged["runs"]) == 6
    refused = cli("materialize", "dim_sales", "--partition", "2026-11-30|asia")
    assert (
        refused.returncode == 1 and "dimension 'region': 'asia' is not one of the static partitions" in refused.stderr
    )
    assert SparkRun.objects.count() == 7


def _client(django_user_model, *codenames):
    user = django_user_model.objects.create_user(username="-".join(codenames) or "viewer", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label__in=JOBSITE_LABELS, codename__in=["view_dataset", *codenames])
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.django_db
def test_the_admin_shows_a_matrix_and_changes_dynamic_keys_behind_their_permission(django_user_model):
    sync_datasets()
    for day in ("2026-11-01", "2026-11-02", "2026-11-20"):
        record_materialization("dim_sales", f"{day}|eu")
    record_materialization("dim_sales", "2026-11-02|us")
    viewer = _client(django_user_model)
    page = viewer.get(reverse("admin:jobsite_datasets_dataset_change", args=["dim_sales"])).content.decode()
    assert '<table class="ds-matrix">' in page and "<th>apac</th><th>eu</th><th>us</th>" in page
    assert "<th>2026-11-02</th>" in page and 'href="?partition=2026-11-02%7Cus"' in page
    assert "2026-11-03 to 2026-11-19" in page  # one gap row, not seventeen rows of missing days
    assert "/partitions/" not in page  # not a dynamic dataset

    partitions_url = reverse("admin:jobsite_datasets_dataset_partitions", args=["dim_orders"])
    seen = viewer.get(partitions_url)
    assert seen.status_code == 200 and 'name="keys"' not in seen.content.decode()  # no form without the permission
    refused = viewer.post(partitions_url, {"verb": "add", "partition_set": "dim_customers", "keys": "x"})
    assert refused.status_code == 403
    assert viewer.get(reverse("admin:jobsite_datasets_dataset_partitions", args=["dim_sales"])).status_code == 404
    editor = _client(django_user_model, "change_dynamic_partitions")
    done = editor.post(partitions_url, {"verb": "add", "partition_set": "dim_customers", "keys": "acme\ninitech"})
    assert done.status_code == 302 and [k["key"] for k in dynamic.list_keys("dim_customers")] == ["acme", "initech"]
    assert LogEntry.objects.get().change_message == "Added dim_customers: acme, initech"
    hostile = editor.post(partitions_url, {"verb": "add", "partition_set": "dim_customers", "keys": "<script>"})
    assert hostile.status_code == 200 and "&lt;script&gt;" in hostile.content.decode()
    assert DynamicPartitionKey.objects.count() == 2
    other_set = editor.post(partitions_url, {"verb": "add", "partition_set": "elsewhere", "keys": "a"})
    assert other_set.status_code == 200 and DynamicPartitionKey.objects.count() == 2


@pytest.mark.django_db
def test_a_dynamic_key_is_not_removed_while_a_spark_run_of_it_is_open():
    dynamic.add_keys("dim_customers", ["acme", "globex"])
    run = trigger_run("dim_orders_build", {"day": "2026-11-30", "customer": "acme"}, trigger="cli")
    with pytest.raises(DatasetError, match=rf"a run of these keys is open \(spark_run:{run.id}\)"):
        dynamic.remove_keys("dim_customers", ["acme"])
    assert dynamic.remove_keys("dim_customers", ["globex"]) == ["globex"]  # no run of it
    with pytest.raises(SparkParamError, match="dimension 'customer': 'globex' is not a partition"):
        trigger_run("dim_orders_build", {"day": "2026-11-30", "customer": "globex"}, trigger="cli")
    SparkRun.objects.filter(id=run.id).update(state="succeeded")
    assert dynamic.remove_keys("dim_customers", ["acme"]) == ["acme"]


@pytest.mark.django_db
def test_a_consumer_of_a_day_region_partition_is_held_back_by_that_partition_alone():
    failed = record_materialization("dim_sales", "2026-11-29|us")
    Materialization.objects.filter(id=failed.id).update(checks="failed")
    record_materialization("dim_sales", "2026-11-30|eu")

    run = trigger_run("dim_sales_report", {"day": "2026-11-30", "region": "eu"}, trigger="cli")

    assert run.state == "queued"  # another partition's failed checks do not hold it back
    with pytest.raises(DatasetBlocked, match=r"dim_sales\[2026-11-29\|us\]"):
        trigger_run("dim_sales_report", {"day": "2026-11-29", "region": "us"}, trigger="cli")


@pytest.mark.django_db
def test_a_dynamic_key_is_not_removed_while_a_workflow_or_a_producer_item_of_it_is_open():
    dynamic.add_keys("dim_customers", ["acme", "globex"])
    with transaction.atomic():  # the trigger starts the workflow with one parameter per dimension
        record_materialization("dim_orders", "2026-11-30|acme")
    flow = Workflow.objects.get(name="dim_orders_flow")
    assert flow.params == {"day": "2026-11-30", "customer": "acme"}
    (item_id,) = materialize("dim_accounts", partition="globex")["items"]  # the @job producer's item
    with pytest.raises(DatasetError, match=rf"a run of these keys is open \(item:{item_id}, workflow:{flow.id}\)"):
        dynamic.remove_keys("dim_customers", ["acme", "globex"])
    assert [k["key"] for k in dynamic.list_keys("dim_customers")] == ["acme", "globex"]  # nothing removed
    with pytest.raises(WorkflowParamError, match="'initech' is not a partition of the dynamic set"):
        services.start("dim_orders_flow", {"day": "2026-11-30", "customer": "initech"})
    with pytest.raises(DatasetError, match="'initech' is not a partition of the dynamic set"):
        materialize("dim_accounts", partition="initech")
    assert Workflow.objects.count() == 1 and not QueueItem.objects.filter(task="tests.dim_accounts_build")[1:]

    Workflow.objects.filter(id=flow.id).update(state="succeeded")
    QueueItem.objects.filter(id=item_id).update(state="done")
    assert dynamic.remove_keys("dim_customers", ["acme", "globex"]) == ["acme", "globex"]
    with pytest.raises(WorkflowParamError, match="'acme' is not a partition"):
        services.start("dim_orders_flow", {"day": "2026-11-30", "customer": "acme"})


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("starter", ["workflow", "producer item"])
def test_a_removal_arriving_while_a_start_holds_the_key_waits_for_it_then_refuses(starter):
    """A start validated the key (its row FOR SHARE) and has not committed; the removal (FOR UPDATE) waits on
    that row, then sees the run the start committed and refuses: nothing removed."""
    dynamic.add_keys("dim_customers", ["acme"])
    validated, release, started = threading.Event(), threading.Event(), []

    def start():
        try:
            with transaction.atomic():
                if starter == "workflow":
                    started.append(
                        f"workflow:{services.start('dim_orders_flow', {'day': '2026-11-30', 'customer': 'acme'}).id}"
                    )
                else:
                    started.append(f"item:{materialize('dim_accounts', partition='acme')['items'][0]}")
                validated.set()
                release.wait(10)
        finally:
            connections.close_all()

    outcome = []

    def remove():
        try:
            outcome.append(dynamic.remove_keys("dim_customers", ["acme"]))
        except DatasetError as exc:
            outcome.append(str(exc))
        finally:
            connections.close_all()

    starting = threading.Thread(target=start)
    starting.start()
    assert validated.wait(10)
    removing = threading.Thread(target=remove)
    removing.start()
    seen_waiting(what="the removal waiting on the key's row", timeout=10)
    assert outcome == []
    release.set()
    starting.join(10)
    removing.join(10)
    assert outcome == [f"a run of these keys is open ({started[0]}): removal refused; nothing removed"]
    assert [k["key"] for k in dynamic.list_keys("dim_customers")] == ["acme"]
