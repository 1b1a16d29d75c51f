"""The queue overview (the admin's landing page), /metrics in Prometheus' format, and /healthz."""

import json
import socket
import urllib.error
import urllib.request
from datetime import timedelta
from unittest import mock

import pytest
from django.db import connection
from django.db.models import F
from prometheus_client.parser import text_string_to_metric_families

from queue_app import health, monitoring
from queue_app.models import QueueItem
from tests.support.admin_fixtures import (
    dead,
    done,
    failed,
    fast_password_hashing_fixture,  # noqa: F401 (autouse)
    live_worker,
    ready,
    reserved,
    staff_client_fixture,  # noqa: F401
    url,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def activity():
    """mail: 2 ready, 1 reserved, 2 done, 1 retrying, 1 dead; billing: 1 ready; one live worker."""
    ready(queue="mail")
    ready(queue="mail")
    reserved(queue="mail")
    done(queue="mail")
    done(queue="mail")
    failed(queue="mail")
    dead(queue="mail")
    ready(queue="billing")
    live_worker("worker-1", queues=["mail"], stats={"processed": 7, "failed": 2})


# -- the overview ---------------------------------------------------------------------------------------------


def test_the_overview_is_the_landing_page_after_login(client, admin_user, activity):
    response = client.post("/admin/login/?next=/admin/", {"username": "admin", "password": "password"}, follow=True)

    html = response.content.decode()
    assert response.redirect_chain == [("/admin/", 302)]
    assert 'id="queue-overview"' in html
    assert 'data-queue="mail"' in html
    assert url("queueitem") in html  # Django's app list is still there, below
    assert 'id="recent-actions-module"' in html


def test_the_overview_shows_depth_by_state_and_recent_flow(admin_client, activity):
    context = admin_client.get("/admin/").context
    mail = next(row["stats"] for row in context["rows"] if row["stats"].name == "mail")

    assert {state: count.value for state, count in mail.depth.items()} == {
        "ready": 2,  # due now
        "scheduled": 1,  # retrying later: queue_stats' word for it
        "reserved": 1,
        "done": 2,
        "dead": 1,
        "cancelled": 0,
    }
    assert mail.in_flight.value == 1
    assert (mail.processed, mail.failed, mail.lease_expirations) == (2, 2, 0)
    assert mail.dead_letters.value == 1
    assert mail.oldest_ready_age is not None
    assert mail.workers == 1
    assert context["snapshot"].processed_per_minute[-1] == 2


def test_the_overview_links_each_count_to_its_filtered_list(admin_client, activity):
    html = admin_client.get("/admin/").content.decode()

    assert f'href="{url("queueitem")}?queue__name__exact=mail&amp;state__exact=ready"' in html
    assert f'href="{url("deadletter")}?item__queue__name__exact=mail&amp;status=open"' in html


def test_the_overview_draws_a_throughput_chart(admin_client, activity):
    response = admin_client.get("/admin/")
    html = response.content.decode()

    completed, failed = response.context["chart"]["data"]
    assert len(completed["x"]) == len(failed["x"]) == 15  # a bar per minute of the window
    assert (list(completed["y"])[-1], list(failed["y"])[-1]) == (2, 2)  # this minute: 2 completed, 2 failed
    assert response.context["chart"]["layout"]["yaxis"]["title"]["text"] == "attempts per minute"
    assert completed["customdata"][0][0] == f"{url('queueitem')}?state__exact=done"
    layout = response.context["chart"]["layout"]
    assert layout["legend"]["x"] > 1  # beside the plot, not over the time axis' labels
    assert layout["xaxis"]["range"][0] < min(completed["x"])  # room left of the first bar for its tick label
    assert 'id="figure-throughput"' in html and url("queue", "plotly_js") in html
    assert admin_client.get(url("queue", "plotly_js"))["Content-Type"] == "text/javascript"


def test_the_overview_refreshes_itself_from_its_fragment(admin_client, activity):
    fragment = admin_client.get(url("queue", "overview_fragment"))
    for home in ("/admin/", url("queue", "overview")):  # the project's admin home, and the overview's own page
        page = admin_client.get(home).content.decode()
        assert f'data-refresh-url="{url("queue", "overview_fragment")}"' in page
        assert "setInterval(refresh" in page
        assert "completed" in page and 'id="figure-throughput"' in page
    assert fragment.status_code == 200
    assert fragment.content.decode().lstrip().startswith("<style")
    assert "<html" not in fragment.content.decode()


def test_the_overview_counts_only_live_workers(admin_client, activity):
    live_worker("worker-gone", age=timedelta(minutes=5))
    live_worker("worker-stopped", state="stopped")

    snapshot = admin_client.get("/admin/").context["snapshot"]

    assert [w.id for w in snapshot.workers] == ["worker-1"]


def test_the_overview_is_hidden_from_staff_without_queue_view_permission(staff_client, django_user_model):
    client = staff_client()
    user = django_user_model.objects.get(username="staff")
    user.user_permissions.remove(*user.user_permissions.filter(codename="view_queue"))

    assert 'id="queue-overview"' not in client.get("/admin/").content.decode()
    assert client.get(url("queue", "overview")).status_code == 403


def test_depths_beyond_the_cap_are_estimated():
    for _ in range(4):
        ready(queue="big")
    with connection.cursor() as cur:
        cur.execute("ANALYZE queue_app_queueitem")

    big = next(q for q in monitoring.snapshot(cap=2).queues if q.name == "big")

    assert big.depth["ready"].exact is False
    assert big.depth["ready"].value >= 3
    assert str(big.depth["ready"]).startswith("≈ ")
    assert big.depth["done"].exact is True


# -- /metrics -------------------------------------------------------------------------------------------------


def metrics(client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def test_metrics_export_depth_per_queue_and_state(client, activity):
    values = metrics(client)

    assert values["jobsite_queue_depth", (("queue", "mail"), ("state", "ready"))] == 2
    assert values["jobsite_queue_depth", (("queue", "mail"), ("state", "scheduled"))] == 1  # its retry is due later
    assert values["jobsite_queue_depth", (("queue", "mail"), ("state", "dead"))] == 1
    assert values["jobsite_queue_depth", (("queue", "billing"), ("state", "ready"))] == 1


def test_metrics_export_flow_dead_letters_and_workers(client, activity):
    waited = timedelta(seconds=90)  # one of mail's due items has waited that long
    oldest = QueueItem.objects.filter(queue_id="mail", state="ready", task="t.ready").order_by("id").first()
    QueueItem.objects.filter(id=oldest.id).update(run_at=F("run_at") - waited, visible_at=F("visible_at") - waited)
    values = metrics(client)
    mail = (("queue", "mail"),)

    assert 90 <= values["jobsite_queue_oldest_ready_age_seconds", mail] < 90 + 60
    assert values["jobsite_queue_oldest_ready_age_seconds", (("queue", "billing"),)] < 60  # enqueued just now
    assert values["jobsite_queue_in_flight", mail] == 1
    assert values["jobsite_queue_processed_recent", mail] == 2
    assert values["jobsite_queue_failed_recent", mail] == 2
    assert values["jobsite_queue_lease_expirations_recent", mail] == 0
    assert values["jobsite_queue_dead_letters", mail] == 1
    assert values["jobsite_queue_paused", mail] == 0
    assert values["jobsite_queue_workers_alive", mail] == 1
    assert values["jobsite_queue_workers_alive", (("queue", "billing"),)] == 0
    assert values["jobsite_workers_alive", ()] == 1


def test_metrics_export_each_live_workers_counters(client, activity):
    values = metrics(client)

    assert values["jobsite_worker_processed_total", (("worker", "worker-1"),)] == 7
    assert values["jobsite_worker_failed_total", (("worker", "worker-1"),)] == 2


def test_metrics_count_expired_leases(client):
    ready(queue="mail", lease_timeout=0.001)
    from queue_app import engine

    engine.lease(["mail"], 1, "worker-1", lease_timeout=0.001)
    with connection.cursor() as cur:  # the lease ran out: the next lease takes the item over
        cur.execute("UPDATE queue_app_queueitem SET visible_at = now() - interval '1 second'")
    engine.lease(["mail"], 1, "worker-2")

    assert metrics(client)["jobsite_queue_lease_expirations_recent", (("queue", "mail"),)] == 1


@pytest.mark.django_db(transaction=True)
def test_metrics_say_which_limit_holds_each_queue_back(client):
    from queue_app import engine, services

    engine.enqueue_many("t", [{}] * 5, queue="partner-api")
    services.set_queue_options("partner-api", rate_limit=2, rate_period=3600)
    engine.enqueue_many("t", [{}] * 3, queue="tenants", group_key="acme")
    engine.enqueue_many("t", [{}] * 2, queue="tenants", group_key="bolt")
    engine.enqueue("t", queue="tenants", group_key="tiny")
    services.set_queue_options("tenants", group_concurrency=1, concurrency_limit=10)
    engine.enqueue_many("t", [{}] * 2, queue="single")
    services.set_queue_options("single", concurrency_limit=1)
    engine.enqueue("t", queue="free")
    engine.lease(["partner-api", "tenants", "single"], 10, "w1", lease_timeout=600)

    values = metrics(client)

    def held(queue: str) -> dict[str, float]:
        return {
            dict(labels)["limit"]: value
            for (name, labels), value in values.items()
            if name == "jobsite_queue_held_back" and dict(labels)["queue"] == queue
        }

    assert held("partner-api") == {"rate": 1}  # 2 of 2 leased in this hour's window, 3 waiting
    assert values["jobsite_queue_rate_window_leases", (("queue", "partner-api"),)] == 2
    assert held("tenants") == {"concurrency": 0, "group": 1}  # 3 in flight of 10; acme and bolt at 1 each
    assert values["jobsite_queue_group_keys_at_limit", (("queue", "tenants"),)] == 2  # tiny has nothing waiting
    assert held("single") == {"concurrency": 1}
    assert held("free") == {}  # no limit set: no sample
    assert ("jobsite_queue_rate_window_leases", (("queue", "tenants"),)) not in values


# -- /healthz -------------------------------------------------------------------------------------------------


def test_healthz_is_ok_with_database_migrations_and_a_live_worker(client):
    live_worker()

    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": True, "migrations": True, "live_workers": 1}


def test_healthz_fails_without_a_live_worker(client):
    live_worker(age=timedelta(minutes=5))

    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["live_workers"] == 0


def test_healthz_fails_with_unapplied_migrations(client, monkeypatch):
    live_worker()
    monkeypatch.setattr(health, "_migrations_applied", False)
    with mock.patch.object(health.MigrationExecutor, "migration_plan", return_value=[("0099_next", False)]):
        response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["migrations"] is False


# -- a real outage: the site's server reaches PostgreSQL through a proxy that drops it ----------------------


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_metrics_and_healthz_say_503_while_the_database_is_unreachable_and_recover_after(spawn, db_proxy):
    """A running site (`manage.py runserver`) whose database connection is cut, and every reconnect refused,
    for a while: both endpoints answer 503 with the reason meanwhile, and 200 once the database is back."""
    live_worker()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = spawn("runserver", f"127.0.0.1:{port}", "--noreload", env={"DATABASE_URL": db_proxy.url()})
    wait_for(lambda: _probe(port), timeout=60, what="the site to answer")
    assert _get(port, "/healthz")[0] == 200
    assert _get(port, "/metrics")[0] == 200

    db_proxy.cut(60)
    metrics_status, metrics_body = _get(port, "/metrics")
    health_status, health_body = _get(port, "/healthz")

    assert metrics_status == 503 and metrics_body.startswith("database unavailable: ")
    assert health_status == 503
    health = json.loads(health_body)
    assert health["status"] == "fail" and health["database"] is False and health["error"]
    db_proxy.cut(0)  # the database is reachable again: both recover without a restart
    assert _get(port, "/healthz") == (200, json.dumps(_healthy()))
    assert _get(port, "/metrics")[0] == 200
    assert server.poll() is None


def _healthy() -> dict:
    return {"status": "ok", "database": True, "migrations": True, "live_workers": 1}


def _probe(port: int) -> bool:
    try:
        _get(port, "/healthz")
    except OSError:
        return False
    return True
