"""Workflows in the admin: the list, a workflow's page (graph laid out by Graphviz, fan-outs collapsed, steps
table, a backfill's partition grid), and start, backfill, cancel and repair behind their permissions, with
confirmation pages, LogEntries and CSRF."""

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from queue_app.models import QueueItem
from queue_app.workflows import services
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import Workflow, WorkflowStep
from tests.support.admin_fixtures import (
    JOBSITE_LABELS,
    fast_password_hashing_fixture,  # noqa: F401 (autouse)
)
from tests.tasks import workflow_tasks  # noqa: F401  (registers wf_* workflows)

pytestmark = pytest.mark.django_db


def url(view: str, *args) -> str:
    return reverse(f"admin:jobsite_workflows_workflow_{view}", args=args)


@pytest.fixture
def wf_client(django_user_model):
    def make(*codenames: str, username: str = "flow", csrf: bool = False) -> Client:
        user = django_user_model.objects.create_user(username=username, password="pw", is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(
                content_type__app_label__in=JOBSITE_LABELS, codename__in=["view_workflow", *codenames]
            )
        )
        client = Client(enforce_csrf_checks=csrf)
        client.force_login(user)
        return client

    return make


def test_list_shows_state_progress_duration_and_who_started_it(wf_client):
    services.start("wf_diamond", started_by="alice")
    html = wf_client().get(url("changelist")).content.decode()
    assert "wf_diamond" in html and "alice" in html and "running" in html
    assert '<progress max="4" value="0"' in html and "0/4" in html


def test_detail_draws_the_graph_with_dot_nodes_linked_to_items(wf_client):
    w = services.start("wf_diamond")
    a = WorkflowStep.objects.get(workflow=w, name="a")
    html = wf_client().get(url("change", w.id)).content.decode()
    assert "<svg" in html and 'class="node' in html  # dot's SVG
    assert reverse("admin:queue_app_queueitem_change", args=[a.item_id]) in html
    assert html.count("state-waiting") >= 3 and "state-queued" in html
    assert 'id="wf-steps"' in html


def test_a_big_fan_out_is_drawn_as_one_node_with_counts_by_state(wf_client):
    g = Graph("wide")
    first = g.task("wf.add", name="first")
    parts = [g.task("wf.add", name=f"part[{i}]", group="part", after=[first]) for i in range(2000)]
    g.task("wf.add", name="last", after=parts)
    w = services.start_graph(g)
    html = wf_client().get(url("change", w.id)).content.decode()
    graph = html[html.index('id="wf-graph"') :]
    svg = graph[: graph.index("</svg>")]
    assert svg.count('class="node') == 3
    assert "part ×2000" in svg and "2000 waiting" in svg


def test_backfill_page_confirms_then_starts_and_shows_the_partition_grid(wf_client):
    client = wf_client("start_workflow")
    form = {"job": "wf.add", "start": "2026-01-01", "end": "2026-01-05", "concurrency": "2", "params": ""}
    first = client.post(url("backfill"), form)
    assert first.status_code == 200 and "5 partitions" in first.content.decode()
    assert not Workflow.objects.exists()  # nothing until confirmed
    done = client.post(url("backfill"), {**form, "_confirm": "1"})
    w = Workflow.objects.get()
    assert done["Location"] == url("change", w.id) and w.kind == "backfill"
    html = client.get(url("change", w.id)).content.decode()
    assert 'id="wf-partitions"' in html and html.count('href="?group=2026-01-0') == 5
    assert LogEntry.objects.filter(object_id=str(w.id)).count() == 1


def test_backfill_page_runs_a_workflows_days_as_children(wf_client):
    client = wf_client("start_workflow")
    form = {"job": "wf_daily", "start": "2026-01-01", "end": "2026-01-03", "concurrency": "2", "params": ""}
    first = client.post(url("backfill"), {**form, "as_children": "on"})
    assert "3 partitions</strong>, at most 2 at a time, each a child workflow?" in first.content.decode()
    client.post(url("backfill"), {**form, "as_children": "on", "_confirm": "1"})
    w = Workflow.objects.get(kind="backfill")  # its first K days' children started with it
    assert w.params["as_children"] is True
    assert {s.kind for s in WorkflowStep.objects.filter(workflow=w)} == {"workflow"}


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"start": "2026-02-01", "end": "2026-01-01"}, "after"),
        ({"start": "2000-01-01", "end": "2026-01-01"}, "--force"),
        ({"job": "no.such.thing"}, "unknown task"),
        ({"params": "[1, 2]"}, "JSON object"),
        ({"concurrency": "0"}, "greater than or equal to 1"),
        ({"as_children": "on"}, "only a workflow runs as child workflows"),
    ],
)
def test_a_bad_backfill_shows_the_error_and_starts_nothing(wf_client, form, message):
    base = {"job": "wf.add", "start": "2026-01-01", "end": "2026-01-02", "concurrency": "2", "params": ""}
    response = wf_client("start_workflow").post(url("backfill"), {**base, **form, "_confirm": "1"})
    assert response.status_code == 400 and message in response.content.decode()
    assert not Workflow.objects.exists() and not QueueItem.objects.exists()


def test_start_form_starts_a_workflow_and_logs_it(wf_client):
    client = wf_client("start_workflow")
    page = client.get(url("start")).content.decode()
    assert 'value="Start wf_fan"' in page and 'name="wf_fan-n"' in page
    response = client.post(url("start"), {"workflow": "wf_fan", "wf_fan-n": "3"})
    w = Workflow.objects.get()
    assert response["Location"] == url("change", w.id) and w.params == {"n": 3}
    assert LogEntry.objects.get(object_id=str(w.id)).change_message.startswith("Started")


def test_start_form_refuses_bad_params_and_starts_nothing(wf_client):
    response = wf_client("start_workflow").post(url("start"), {"workflow": "wf_fan", "wf_fan-n": "0"})
    assert response.status_code == 400 and not Workflow.objects.exists()


def test_cancel_and_repair_ask_first_then_call_the_services_and_log_it(wf_client):
    w = services.start("wf_diamond")
    client = wf_client("cancel_workflow", "repair_workflow")
    assert "Yes, cancel it" in client.get(url("cancel", w.id)).content.decode()
    assert Workflow.objects.get(id=w.id).state == "running"  # asking changed nothing
    assert client.post(url("cancel", w.id)).status_code == 302
    assert Workflow.objects.get(id=w.id).state == "cancelled"
    assert client.post(url("repair", w.id)).status_code == 302
    w.refresh_from_db()
    assert w.state == "running" and w.attempt == 2
    assert LogEntry.objects.filter(object_id=str(w.id)).count() == 2


def test_without_permissions_no_buttons_and_posts_are_refused(wf_client):
    w = services.start("wf_diamond")
    client = wf_client()
    assert "Start a workflow" not in client.get(url("changelist")).content.decode()
    assert client.post(url("start"), {"workflow": "wf_fan", "wf_fan-n": "3"}).status_code == 403
    assert (
        client.post(
            url("backfill"),
            {"job": "wf.add", "start": "2026-01-01", "end": "2026-01-01", "concurrency": "1", "_confirm": "1"},
        ).status_code
        == 403
    )
    assert client.post(url("cancel", w.id)).status_code == 403
    assert client.post(url("repair", w.id)).status_code == 403
    bulk = client.post(url("changelist"), {"action": "cancel_workflows", "index": "0", "_selected_action": [w.id]})
    assert bulk.status_code == 403
    assert Workflow.objects.count() == 1 and Workflow.objects.get().state == "running"


def test_csrf_is_enforced_on_every_change(wf_client):
    w = services.start("wf_diamond")
    client = wf_client("start_workflow", "cancel_workflow", "repair_workflow", csrf=True)
    assert client.post(url("start"), {"workflow": "wf_fan", "wf_fan-n": "3"}).status_code == 403
    assert client.post(url("cancel", w.id)).status_code == 403
    assert Workflow.objects.get().state == "running"


def test_views_need_view_permission(django_user_model):
    user = django_user_model.objects.create_user(username="nobody", password="pw", is_staff=True)
    client = Client()
    client.force_login(user)
    for view in ("changelist", "start", "backfill"):
        assert client.get(url(view)).status_code == 403
