"""Idempotent starts (issue 39): `start(name, key=...)` and `workflow start NAME --key K` start a workflow once per
key; the claim is a unique key row written in the start's transaction, so concurrent starters agree."""

import json
import threading

import pytest
from django.db import connection, transaction

from queue_app.workflows import WorkflowError, services
from queue_app.workflows.models import Workflow, WorkflowStartKey, WorkflowStep
from tests.support.waiting import seen_waiting
from tests.tasks import workflow_tasks  # noqa: F401  (registers wf_diamond)

pytestmark = pytest.mark.django_db(transaction=True)
IMPORT = ("--import", "tests.tasks.workflow_tasks")


def test_a_second_start_with_the_key_returns_the_first_and_writes_nothing():
    first = services.start("wf_diamond", key="order-1")
    again = services.start("wf_diamond", key="order-1")
    other = services.start("wf_diamond", key="order-2")
    assert (first.created, again.created, other.created) == (True, False, True)
    assert again.id == first.id != other.id
    assert Workflow.objects.count() == 2
    assert WorkflowStep.objects.filter(workflow_id=first.id).count() == 4


def test_the_key_is_per_workflow_name():
    a = services.start("wf_diamond", key="same")
    b = services.start("wf_fails", key="same")
    assert a.id != b.id and a.created and b.created


def test_a_window_ends_the_key_and_a_deleted_workflow_frees_it():
    first = services.start("wf_diamond", key="k", key_window=3600)
    assert services.start("wf_diamond", key="k", key_window=3600).id == first.id
    with connection.cursor() as cur:  # the window has passed
        cur.execute("UPDATE queue_app_workflowstartkey SET expires_at = now() - interval '1 second'")
    second = services.start("wf_diamond", key="k")
    assert second.created and second.id != first.id
    assert services.start("wf_diamond", key="k").id == second.id  # no window now: held for its lifetime
    Workflow.objects.filter(id=second.id).delete()
    third = services.start("wf_diamond", key="k")
    assert third.created and third.id not in (first.id, second.id)
    assert WorkflowStartKey.objects.get(name="wf_diamond", key="k").workflow_id == third.id


def test_a_start_rolled_back_releases_its_key():
    with pytest.raises(RuntimeError), transaction.atomic():
        services.start("wf_diamond", key="k")
        raise RuntimeError("caller fails")
    assert not WorkflowStartKey.objects.exists() and not Workflow.objects.exists()
    assert services.start("wf_diamond", key="k").created


def test_concurrent_starters_with_one_key_start_one_workflow():
    n = 8
    barrier = threading.Barrier(n)
    ids: list[int] = []
    created: list[bool] = []
    errors: list[BaseException] = []

    def starter():
        try:
            barrier.wait(30)
            w = services.start("wf_diamond", key="race")
            ids.append(w.id)
            created.append(w.created)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=starter) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(set(ids)) == 1 and len(ids) == n
    assert created.count(True) == 1
    assert Workflow.objects.count() == 1


@pytest.mark.parametrize("first_ends", ["commit", "rollback"])
def test_a_start_while_another_holds_the_key_uncommitted_waits_for_it(first_ends):
    """Forced: the first start holds its transaction open after claiming the key; the second is seen waiting on
    the key row's lock (pg_stat_activity), then the first commits (the second returns its workflow, created
    False) or rolls back (the second starts its own)."""
    holding, release, first_ids, second, errors = threading.Event(), threading.Event(), [], [], []

    def first():
        try:
            with transaction.atomic():
                first_ids.append(services.start("wf_diamond", key="forced").id)
                holding.set()
                assert release.wait(30)
                if first_ends == "rollback":
                    transaction.set_rollback(True)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            holding.set()
        finally:
            connection.close()

    def then():
        try:
            second.append(services.start("wf_diamond", key="forced"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    holder, other = threading.Thread(target=first), threading.Thread(target=then)
    holder.start()
    assert holding.wait(30) and not errors, errors
    other.start()
    try:
        seen_waiting(what="the second start waiting for the first's key")
    finally:
        release.set()
        holder.join(30)
        other.join(30)
    assert errors == []
    (started,) = second
    if first_ends == "commit":
        assert (started.id, started.created) == (first_ids[0], False)
    else:
        assert started.created and started.id != first_ids[0]
    assert list(Workflow.objects.values_list("id", flat=True)) == [started.id]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key": "x" * 201}, "bad key"),
        ({"key": ""}, "bad key"),
        ({"key": "a\nb"}, "bad key"),
        ({"key": "k", "key_window": 0}, "key window"),
        ({"key": "k", "key_window": -5}, "key window"),
        ({"key_window": 10}, "needs a key"),
    ],
)
def test_a_bad_key_is_refused_and_writes_nothing(kwargs, message):
    with pytest.raises(WorkflowError, match=message):
        services.start("wf_diamond", **kwargs)
    assert not Workflow.objects.exists() and not WorkflowStartKey.objects.exists()


def test_cli_start_with_a_key_twice_and_concurrently_starts_once(manage, spawn):
    out = manage("workflow", *IMPORT, "start", "wf_diamond", "--key", "cli-1", "--json")
    assert out.returncode == 0, out.stderr
    first = json.loads(out.stdout)
    assert first["created"] is True
    again = manage("workflow", *IMPORT, "start", "wf_diamond", "--key", "cli-1", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["id"] == first["id"] and json.loads(again.stdout)["created"] is False
    text = manage("workflow", *IMPORT, "start", "wf_diamond", "--key", "cli-1")
    assert f"workflow {first['id']} was already started with key 'cli-1'" in text.stdout
    procs = [spawn("workflow", *IMPORT, "start", "wf_diamond", "--key", "cli-2", "--json") for _ in range(4)]
    shown = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert len({s["id"] for s in shown}) == 1
    assert [s["created"] for s in shown].count(True) == 1
    assert Workflow.objects.count() == 2
    bad = manage("workflow", *IMPORT, "start", "wf_diamond", "--key", "k", "--key-window", "0")
    assert bad.returncode == 1 and "key window" in bad.stderr and Workflow.objects.count() == 2
