"""The Spark dashboard in the admin, without a JVM: its pages render, the trigger form is built from a job's
declared parameters and refuses bad input per field (nothing queued), every change needs its permission
(trigger_sparkrun, cancel_sparkrun) and a CSRF token."""

import datetime as dt

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from queue_app.models import QueueItem
from queue_app.spark.models import QueueStatsHourly, SparkRun
from queue_app.spark.runs import trigger_run
from tests.support.admin_fixtures import (
    JOBSITE_LABELS,
    fast_password_hashing_fixture,  # noqa: F401 (autouse)
)

pytestmark = pytest.mark.django_db


def url(view: str, *args) -> str:
    return reverse(f"admin:jobsite_spark_sparkrun_{view}", args=args)


@pytest.fixture
def spark_client(django_user_model):
    """spark_client("trigger_sparkrun", ...) -> a logged-in staff Client with view_sparkrun plus these."""

    def make(*codenames: str, username: str = "sparky", csrf: bool = False) -> Client:
        user = django_user_model.objects.create_user(username=username, password="pw", is_staff=True)
        user.user_permissions.set(
            Permission.objects.filter(
                content_type__app_label__in=JOBSITE_LABELS, codename__in=["view_sparkrun", *codenames]
            )
        )
        client = Client(enforce_csrf_checks=csrf)
        client.force_login(user)
        return client

    return make


def finished_run(job: str = "demo_sleep", state: str = "succeeded", seconds: float = 12.0, **fields) -> SparkRun:
    run = trigger_run(job, fields.pop("params", {}), trigger="orm")
    end = timezone.now()
    SparkRun.objects.filter(id=run.id).update(
        state=state, started_at=end - dt.timedelta(seconds=seconds), finished_at=end, attempt=1, **fields
    )
    return SparkRun.objects.get(id=run.id)


def demo_post(**params) -> dict:
    return {"job": "demo_sleep", **{f"demo_sleep-{k}": v for k, v in params.items()}}


# -- pages ----------------------------------------------------------------------------------------------------


def test_run_list_shows_state_progress_duration_trigger_who_and_params(spark_client):
    run = trigger_run("demo_sleep", {"tasks": 4}, trigger="orm", requested_by="dora")
    SparkRun.objects.filter(id=run.id).update(
        state="running", started_at=timezone.now(), progress={"tasks_done": 1, "tasks_total": 4}
    )
    page = spark_client().get(url("changelist"))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'class="spark-state state-running"' in html
    assert '<progress max="100" value="25">' in html and "1/4 tasks" in html
    assert "dora" in html and "tasks=4" in html
    assert url("list_live") in html  # the page refreshes its live cells from there
    other = spark_client(username="other")
    for query in ("?state__exact=succeeded", "?job=file_rollup"):
        assert f'data-run="{run.id}"' not in other.get(url("changelist") + query).content.decode()
    assert (
        f'data-run="{run.id}"' in other.get(url("changelist") + "?job=demo_sleep&state__exact=running").content.decode()
    )


def test_list_live_json_reports_the_runs_asked_for(spark_client):
    running = trigger_run("demo_sleep", {}, trigger="orm")
    SparkRun.objects.filter(id=running.id).update(state="running", progress={"tasks_done": 3, "tasks_total": 6})
    done = finished_run()
    data = spark_client().get(url("list_live") + f"?ids={running.id},{done.id},x").json()
    assert data[str(running.id)]["pct"] == 50 and data[str(running.id)]["final"] is False
    assert data[str(done.id)] == {**data[str(done.id)], "state": "succeeded", "final": True, "pct": 100}


def test_run_page_shows_progress_log_metrics_and_the_spark_ui_while_running(spark_client):
    run = trigger_run("demo_sleep", {}, trigger="orm")
    SparkRun.objects.filter(id=run.id).update(
        state="running",
        started_at=timezone.now(),
        ui_url="http://driver:4040",
        app_id="local-1",
        log_tail="line one\n<b>line two</b>",
        progress={
            "jobs_done": 0,
            "jobs_total": 1,
            "stages_done": 0,
            "stages_total": 1,
            "tasks_done": 2,
            "tasks_total": 8,
        },
    )
    client = spark_client("cancel_sparkrun")
    html = client.get(url("change", run.id)).content.decode()
    assert 'href="http://driver:4040"' in html
    assert "triggered from code (ORM)</td>" in html
    assert "&lt;b&gt;line two&lt;/b&gt;" in html  # log lines are shown, not run
    assert '<progress max="8" value="2">' in html
    assert 'id="cancel-run"' in html and 'id="rerun"' not in html  # no trigger permission, and not final
    assert url("live", run.id) in html
    fragment = client.get(url("live", run.id)).content.decode()
    assert 'data-final="0"' in fragment and "<html" not in fragment

    assert 'id="run-timings"' not in html  # no attempt has ended: no split yet
    done = finished_run(metrics={"tasks": 8, "sum": 28}, error="", ui_url="http://driver:4040")
    q = done.queued_at.timestamp()
    SparkRun.objects.filter(id=done.id).update(timings={"leased": q + 0.5, "driver_up": q + 6.5, "recorded": q + 9})
    html = client.get(url("change", done.id)).content.decode()
    assert 'data-final="1"' in html and "sum" in html and "28" in html
    assert 'id="run-timings"' in html
    assert '<tr class="timing-driver_up"><th scope="row">driver up</th><td class="count">6.50 s</td>' in html
    assert '<td class="count">6.00 s</td>' in html  # leased -> driver up
    assert "driver:4040" not in html and 'id="cancel-run"' not in html


def test_trigger_page_has_a_form_per_job_built_from_its_params(spark_client):
    html = spark_client("trigger_sparkrun").get(url("trigger")).content.decode()
    for job in ("demo_sleep", "file_rollup", "queue_analytics"):
        assert f'value="Run {job}"' in html
    assert 'name="demo_sleep-tasks"' in html and 'type="number"' in html
    assert 'name="demo_sleep-fail"' in html and 'type="checkbox"' in html
    assert '<select name="file_rollup-format"' in html
    assert 'name="queue_analytics-since"' in html and 'type="date"' in html


def test_trigger_form_queues_a_run_and_opens_its_page(spark_client):
    response = spark_client("trigger_sparkrun").post(url("trigger"), demo_post(tasks="3", seconds="0.5", timeout="60"))
    run = SparkRun.objects.get()
    assert response.status_code == 302 and response["Location"] == url("change", run.id)
    assert (run.params, run.trigger, run.requested_by, run.timeout) == (
        {"tasks": 3, "seconds": 0.5, "fail": False},
        "dashboard",
        "sparky",
        60.0,
    )
    assert QueueItem.objects.get(id=run.item_id).queue_id == "spark"


def test_trigger_form_shows_errors_per_field_and_queues_nothing(spark_client, tmp_path):
    client = spark_client("trigger_sparkrun")
    response = client.post(url("trigger"), demo_post(tasks="0", seconds="x"))
    assert response.status_code == 400
    form = next(f["form"] for f in response.context["job_forms"] if f["job"].name == "demo_sleep")
    assert set(form.errors) == {"tasks", "seconds"}
    # Rules only the job's own validation knows (a path that must exist) land on their field too.
    missing = {"job": "file_rollup", "file_rollup-input_dir": str(tmp_path / "nope"), "file_rollup-output_dir": "/x"}
    response = client.post(url("trigger"), missing)
    form = next(f["form"] for f in response.context["job_forms"] if f["job"].name == "file_rollup")
    assert response.status_code == 400 and "does not exist" in form.errors["input_dir"][0]
    assert not SparkRun.objects.exists() and not QueueItem.objects.exists()


def test_charts_draw_durations_per_job_and_the_queue_analytics(spark_client):
    finished_run(seconds=10)
    finished_run(seconds=20, state="failed")
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    QueueStatsHourly.objects.bulk_create(
        [
            QueueStatsHourly(queue="mail", task="t", hour=hour - dt.timedelta(hours=h), processed=10 + h, failed=h)
            for h in range(5)
        ]
        + [QueueStatsHourly(queue="mail", task="u", hour=hour, processed=1, wait_p95=2.0, run_p95=0.5)]
        + [QueueStatsHourly(queue="reports", task="r", hour=hour, processed=3)]
    )
    client = spark_client()
    page = client.get(url("charts") + "?queue=mail")
    assert page.status_code == 200
    figures = {name: figure for name, _, figure in page.context["figures"]}
    (durations,) = figures["durations"]["data"]
    assert durations["name"] == "demo_sleep" and sorted(durations["y"]) == [10.0, 20.0]
    assert {c[0] for c in durations["customdata"]} == {url("change", r.id) for r in SparkRun.objects.all()}
    assert figures["durations"]["layout"]["yaxis"]["title"]["text"] == "duration (s)"
    assert figures["durations"]["layout"]["xaxis"]["rangeselector"]["buttons"]  # a chosen time range
    outcomes = {t["name"]: t["y"] for t in figures["outcomes"]["data"]}
    assert outcomes == {"succeeded": [1], "failed": [1]}
    stats = page.context["stats"]
    assert stats["queue"] == "mail" and stats["queues"] == ["mail", "reports"]
    (_, _, processed), (_, _, p95) = stats["figures"]
    bars = {t["name"]: t["y"] for t in processed["data"]}
    assert list(bars["processed"]) == [14, 13, 12, 11, 10 + 1] and list(bars["failed"]) == [4, 3, 2, 1, 0]
    assert [t["name"] for t in p95["data"]] == ["wait p95", "run p95"]
    html = page.content.decode()
    plotly_js = reverse("admin:queue_app_queue_plotly_js")
    assert plotly_js in html and "cdn" not in html.lower()
    js = client.get(plotly_js)
    assert js.status_code == 200 and js["Content-Type"] == "text/javascript"


# -- permissions and CSRF -------------------------------------------------------------------------------------


def test_without_trigger_permission_no_trigger_button_and_posts_are_refused(spark_client):
    client = spark_client()
    assert "Trigger a run" not in client.get(url("changelist")).content.decode()
    html = client.get(url("trigger")).content.decode()
    assert 'value="Run demo_sleep"' not in html
    assert client.post(url("trigger"), demo_post(tasks="2")).status_code == 403
    done = finished_run()
    assert 'id="rerun"' not in client.get(url("change", done.id)).content.decode()
    assert client.post(url("rerun", done.id)).status_code == 403
    assert SparkRun.objects.count() == 1


def test_without_cancel_permission_no_cancel_button_and_posts_are_refused(spark_client):
    run = trigger_run("demo_sleep", {}, trigger="orm")
    client = spark_client("trigger_sparkrun")
    assert 'id="cancel-run"' not in client.get(url("change", run.id)).content.decode()
    assert client.post(url("cancel", run.id)).status_code == 403
    assert (
        client.post(
            url("changelist"), {"action": "cancel_runs", "index": "0", "_selected_action": [run.id]}
        ).status_code
        == 403
    )
    assert SparkRun.objects.get(id=run.id).state == "queued"


def test_cancel_and_rerun_buttons_call_the_services_and_log_it(spark_client):
    run = trigger_run("demo_sleep", {}, trigger="orm")
    client = spark_client("cancel_sparkrun", "trigger_sparkrun")
    assert client.post(url("cancel", run.id)).status_code == 302
    assert SparkRun.objects.get(id=run.id).state == "cancelled"
    response = client.post(url("rerun", run.id))
    again = SparkRun.objects.exclude(id=run.id).get()
    assert response["Location"] == url("change", again.id) and again.trigger == "dashboard"
    from django.contrib.admin.models import LogEntry

    assert LogEntry.objects.filter(object_id__in=[str(run.id), str(again.id)]).count() == 2


def test_csrf_is_enforced_on_every_change(spark_client):
    run = trigger_run("demo_sleep", {}, trigger="orm")
    client = spark_client("cancel_sparkrun", "trigger_sparkrun", csrf=True)
    assert client.post(url("trigger"), demo_post(tasks="2")).status_code == 403
    assert client.post(url("cancel", run.id)).status_code == 403
    assert client.post(url("rerun", run.id)).status_code == 403
    assert SparkRun.objects.count() == 1 and SparkRun.objects.get().state == "queued"


def test_views_need_view_permission_and_staff(django_user_model):
    user = django_user_model.objects.create_user(username="nobody", password="pw", is_staff=True)
    client = Client()
    client.force_login(user)
    for view in ("changelist", "trigger", "charts"):
        assert client.get(url(view)).status_code == 403
    anonymous = Client().get(url("trigger"))
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]


def test_run_list_shows_the_spark_connect_servers_health_and_a_run_page_its_path(spark_client, monkeypatch):
    from queue_app.spark.models import SparkConnectServer

    monkeypatch.setenv("JOBSITE_SPARK_CONNECT", "sc://127.0.0.1:15002")
    client = spark_client()
    page = client.get(url("changelist")).content.decode()
    assert "configured, but no supervisor has reported" in page  # no row yet: said, not hidden

    SparkConnectServer.objects.create(
        id="host:15002",
        url="sc://127.0.0.1:15002",
        master="local[*]",
        host="host",
        pid=4242,
        healthy=True,
        restarts=2,
        last_heartbeat=timezone.now(),
    )
    page = client.get(url("changelist")).content.decode()
    assert "(used by runs)" in page and "healthy" in page and "4242" in page and "unhealthy" not in page
    SparkConnectServer.objects.filter(id="host:15002").update(last_heartbeat=timezone.now() - dt.timedelta(minutes=5))
    assert "no heartbeat" in client.get(url("changelist")).content.decode()

    run = finished_run(progress={"path": "spark-submit", "fallback": "Spark Connect server sc://x lost mid-run"})
    page = client.get(url("change", run.id)).content.decode()
    assert "fell back from Spark Connect: Spark Connect server sc://x lost mid-run" in page
    warm = finished_run(progress={"path": "connect"})
    assert "warm (Spark Connect server)" in client.get(url("change", warm.id)).content.decode()
