"""Security, enumerated rather than sampled: every admin action and every custom admin view that changes
something refuses a staff user lacking exactly its permission (403, nothing changes); every URL of the site
refuses a POST without a CSRF token; markup in any stored text is escaped on every page that shows it; secrets
never reach a command's output; production settings are enforced and `check --deploy` is clean under the
documented production environment; the embedded PostgreSQL opens no TCP port.

test_admin_security.py and test_spark_dashboard.py hold the hand-written examples (one permission at a time,
a few CSRF posts, one payload); this file walks the registry and the URL map, so a new action or view that
forgets its permission or its CSRF protection fails here without anyone writing a test for it.
"""

import json
import os
import re
import secrets
import socket
import stat
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve
from django.utils import timezone

from queue_app import engine
from queue_app.models import QueueItem, Reservation, Schedule, Worker
from queue_app.spark.models import QueueStatsHourly, SparkRun
from queue_app.spark.runs import trigger_run
from tests.conftest import ROOT, child_env
from tests.support.admin_fixtures import (
    JOBSITE_LABELS,
    action_post,
    cancelled,
    dead,
    detail_action_post,
    fast_password_hashing_fixture,  # noqa: F401 (autouse)
    live_worker,
    ready,
    url,
)
from tests.support.schedule_forms import post_data

pytestmark = pytest.mark.django_db

SCRIPT = "<script>alert(1)</script>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


def snapshot() -> dict[str, list[dict]]:
    """Every row of every queue_app table, and the admin log: "nothing changed" is this, unchanged."""
    rows = {
        m.__name__: list(m.objects.order_by("pk").values())
        for label in JOBSITE_LABELS
        for m in apps.get_app_config(label).get_models()
    }
    rows["LogEntry"] = list(LogEntry.objects.order_by("pk").values())
    return rows


@pytest.fixture
def world() -> dict:
    """One row for every operation to act on: dead, ready and waiting items, a running and a paused queue, an
    enabled and a disabled schedule, a queued and a finished Spark run, and an item dead for ten days."""
    from queue_app import services
    from queue_app.webhooks import services as webhooks

    dead_id = dead(queue="mail")
    old_dead = dead(queue="mail")
    QueueItem.objects.filter(id=old_dead).update(finished_at=timezone.now() - timedelta(days=10))
    ready(queue="paused")
    services.pause_queue("paused")
    finished = trigger_run("demo_sleep", {}, trigger="orm")
    SparkRun.objects.filter(id=finished.id).update(state="failed", finished_at=timezone.now())
    hook = webhooks.create_endpoint("https://example.com/hook", ["test"]).endpoint
    off_hook = webhooks.create_endpoint("https://example.com/off", ["test"], enabled=False).endpoint
    (failed_delivery,) = webhooks.send_test_event([hook.pk])
    QueueItem.objects.filter(id=failed_delivery.item_id).update(state="dead", finished_at=timezone.now())
    archived = cancelled(queue="mail")  # moved into the partitioned history (requeued from there)
    QueueItem.objects.filter(id=archived).update(finished_at=timezone.now() - timedelta(hours=1))
    engine.archive(100, grace=60)
    return {
        "itemhistory": {"requeue": archived},
        "queueitem": {
            "requeue": dead_id,
            "cancel": ready(queue="mail"),
            "retry_now": ready(queue="mail", delay=3600),
        },
        "deadletter": {"requeue": QueueItem.objects.get(id=dead_id).dead_letters.get().pk},
        "queue": {"pause": "mail", "resume": "paused"},
        "schedule": {
            "enable": Schedule.objects.create(name="off", cron="0 3 * * *", target="queue_app.noop", enabled=False).pk,
            "disable": Schedule.objects.create(name="on", cron="0 4 * * *", target="queue_app.noop").pk,
            "run_now": Schedule.objects.get(name="on").pk,
            "delete_selected": Schedule.objects.get(name="on").pk,
        },
        "sparkrun": {"cancel_runs": trigger_run("demo_sleep", {}, trigger="orm").id, "finished": finished.id},
        "webhookendpoint": {
            "send_test": hook.pk,
            "rotate_secret": hook.pk,
            "enable": off_hook.pk,
            "disable": hook.pk,
            "delete_selected": hook.pk,
        },
        "webhookdelivery": {"replay": failed_delivery.pk},
        "workflow": _workflows(),
        "datasetcheckresult": {"override_checks": _failed_check()},
    }


def _failed_check() -> int:
    """A materialization whose blocking check failed (to override)."""
    from queue_app.datasets.models import DatasetCheckResult, Materialization

    m = Materialization.objects.create(dataset="security", source="code", checks="failed")
    return DatasetCheckResult.objects.create(
        materialization_id=m.id, dataset="security", check_name="rows", severity="error", blocking=True,
        passed=False, at=timezone.now(),
    ).pk  # fmt: skip


def _workflows() -> dict:
    """A running workflow (to cancel) and a failed one (to repair)."""
    from queue_app.workflows import services as workflows
    from queue_app.workflows.definition import Graph
    from queue_app.workflows.models import Workflow

    def one() -> int:
        graph = Graph("security")
        graph.task("queue_app.noop", name="only")
        return workflows.start_graph(graph).id

    running, failed = one(), one()
    Workflow.objects.filter(id=failed).update(state="failed")
    return {"cancel_workflows": running, "repair_workflows": failed}


@pytest.fixture
def staff_without(django_user_model):
    """staff_without("queue_app.requeue_queueitem") -> a logged-in Client of a staff user holding every
    queue_app permission except that one."""

    def make(missing: str) -> Client:
        app_label, codename = missing.split(".")
        username = f"lacks-{codename}-{secrets.token_hex(3)}"
        user = django_user_model.objects.create_user(username=username, password="pw", is_staff=True)
        every = Permission.objects.filter(content_type__app_label__in=JOBSITE_LABELS)
        perms = every.exclude(content_type__app_label=app_label, codename=codename)
        assert perms.count() == every.count() - 1
        user.user_permissions.set(perms)
        client = Client()
        client.force_login(user)
        return client

    return make


# -- every admin action -------------------------------------------------------------------------------------

# The permission behind each (model, action). The test below fails when the admin grows an action missing here.
ACTION_PERMISSIONS = {
    ("queueitem", "requeue"): "queue_app.requeue_queueitem",
    ("queueitem", "retry_now"): "queue_app.requeue_queueitem",
    ("queueitem", "cancel"): "queue_app.cancel_queueitem",
    ("deadletter", "requeue"): "queue_app.requeue_queueitem",
    ("itemhistory", "requeue"): "queue_app.requeue_queueitem",
    ("queue", "pause"): "queue_app.pause_queue",
    ("queue", "resume"): "queue_app.pause_queue",
    ("schedule", "enable"): "queue_app.change_schedule",
    ("schedule", "disable"): "queue_app.change_schedule",
    ("schedule", "run_now"): "queue_app.change_schedule",
    ("schedule", "delete_selected"): "queue_app.delete_schedule",
    ("sparkrun", "cancel_runs"): "jobsite_spark.cancel_sparkrun",
    ("webhookendpoint", "send_test"): "jobsite_webhooks.send_test_webhookendpoint",
    ("webhookendpoint", "rotate_secret"): "jobsite_webhooks.rotate_secret_webhookendpoint",
    ("webhookendpoint", "enable"): "jobsite_webhooks.change_webhookendpoint",
    ("webhookendpoint", "disable"): "jobsite_webhooks.change_webhookendpoint",
    ("webhookendpoint", "delete_selected"): "jobsite_webhooks.delete_webhookendpoint",
    ("webhookdelivery", "replay"): "jobsite_webhooks.replay_webhookdelivery",
    ("workflow", "cancel_workflows"): "jobsite_workflows.cancel_workflow",
    ("workflow", "repair_workflows"): "jobsite_workflows.repair_workflow",
    ("datasetcheckresult", "override_checks"): "jobsite_datasets.override_dataset_check",
}


def registered_actions(request) -> set[tuple[str, str]]:
    """(model, action) of every action a superuser is offered on any queue_app screen, Django's own included."""
    return {
        (model._meta.model_name, name)
        for model, model_admin in admin.site._registry.items()
        if model._meta.app_label in JOBSITE_LABELS
        for name in model_admin.get_actions(request)
    }


def test_every_action_offered_has_a_known_permission(admin_client):
    """Rows written by the engine (items, letters, runs...) offer only operations, never Django's bulk delete;
    schedules, which are configuration, offer it behind delete_schedule. A new action fails this until it is
    added to ACTION_PERMISSIONS, and so to the refusal test below."""
    request = admin_client.get(url("queueitem")).wsgi_request
    assert registered_actions(request) == set(ACTION_PERMISSIONS)


@pytest.mark.parametrize(("model", "action"), ACTION_PERMISSIONS, ids=[f"{m}-{a}" for m, a in ACTION_PERMISSIONS])
def test_each_action_is_refused_to_staff_lacking_exactly_its_permission(staff_without, world, model, action):
    client = staff_without(ACTION_PERMISSIONS[model, action])
    pk = world[model][action]
    before = snapshot()

    listed = client.get(url(model))
    responses = [
        client.post(url(model), action_post(action, pk)),
        client.post(url(model, "change", pk), detail_action_post(action, pk)),
    ]

    assert action not in (
        listed.context["action_form"].fields["action"].choices if listed.context["action_form"] else []
    )
    assert [r.status_code for r in responses] == [403, 403]
    assert snapshot() == before


# -- every custom view that changes something ---------------------------------------------------------------


def bulk_posts(world) -> list[tuple[str, str, str]]:
    """(permission, url, id) of every "all matching" page (one per Operation with a bulk button)."""
    posts = []
    for model, model_admin in admin.site._registry.items():
        name = model._meta.model_name
        for op in getattr(model_admin, "operations", ()):
            if op.bulk_button:
                posts.append((ACTION_PERMISSIONS[name, op.name], url(name, "bulk", op.name), f"bulk-{name}-{op.name}"))
    return posts


CUSTOM_POSTS = {
    # id: (permission, view, args, data)
    "spark-trigger": ("jobsite_spark.trigger_sparkrun", "sparkrun", ("trigger",), {"job": "demo_sleep"}),
    "spark-rerun": ("jobsite_spark.trigger_sparkrun", "sparkrun", ("rerun", "finished"), {}),
    "spark-cancel": ("jobsite_spark.cancel_sparkrun", "sparkrun", ("cancel", "cancel_runs"), {}),
    "dead-letter-purge": ("queue_app.delete_deadletter", "deadletter", ("purge",), {"older_than": "1d"}),
    "queue-options": (
        "queue_app.change_queue",
        "queue",
        ("change", "pause"),
        {"lease_timeout": "9", "max_attempts": "2", "retention": "1 00:00:00", "_save": "Save"},
    ),
    "schedule-add": ("queue_app.add_schedule", "schedule", ("add",), post_data(name="new")),
    "schedule-change": ("queue_app.change_schedule", "schedule", ("change", "run_now"), post_data(name="renamed")),
    "schedule-delete": ("queue_app.delete_schedule", "schedule", ("delete", "run_now"), {"post": "yes"}),
    "webhook-endpoint-add": (
        "jobsite_webhooks.add_webhookendpoint",
        "webhookendpoint",
        ("add",),
        {"url": "https://example.com/new", "event_types": ["test"], "enabled": "on"},
    ),
    "webhook-endpoint-delete": (
        "jobsite_webhooks.delete_webhookendpoint",
        "webhookendpoint",
        ("delete", "send_test"),
        {"post": "yes"},
    ),
    "workflow-start": ("jobsite_workflows.start_workflow", "workflow", ("start",), {"workflow": "demo_pipeline"}),
    "workflow-backfill": (
        "jobsite_workflows.start_workflow",
        "workflow",
        ("backfill",),
        {"job": "queue_app.noop", "start": "2026-01-01", "end": "2026-01-02", "concurrency": "1", "_confirm": "1"},
    ),
    "workflow-cancel": ("jobsite_workflows.cancel_workflow", "workflow", ("cancel", "cancel_workflows"), {}),
    "workflow-repair": ("jobsite_workflows.repair_workflow", "workflow", ("repair", "repair_workflows"), {}),
}


def custom_url(world, model: str, args: tuple) -> str:
    view, *rest = args
    return url(model, view, *[world[model][key] for key in rest])


@pytest.mark.parametrize("case", CUSTOM_POSTS, ids=CUSTOM_POSTS)
def test_each_custom_view_is_refused_to_staff_lacking_exactly_its_permission(staff_without, world, case):
    permission, model, args, data = CUSTOM_POSTS[case]
    client = staff_without(permission)
    before = snapshot()

    response = client.post(custom_url(world, model, args), data)

    assert response.status_code == 403
    assert snapshot() == before


def test_each_bulk_page_is_refused_to_staff_lacking_exactly_its_permission(staff_without, world):
    posts = bulk_posts(world)
    assert {name for _, _, name in posts} == {
        "bulk-queueitem-requeue",
        "bulk-deadletter-requeue",
        "bulk-webhookdelivery-replay",
        "bulk-workflow-cancel_workflows",
    }
    for permission, target, name in posts:
        client = staff_without(permission)
        before = snapshot()
        assert (client.get(target).status_code, client.post(target).status_code) == (403, 403), name
        assert snapshot() == before, name


@pytest.mark.parametrize("case", CUSTOM_POSTS, ids=CUSTOM_POSTS)
def test_each_custom_view_works_with_its_permission(admin_client, world, case):
    """The refusals above are the permission's doing: the same POST by a superuser changes something."""
    _, model, args, data = CUSTOM_POSTS[case]
    before = snapshot()

    response = admin_client.post(custom_url(world, model, args), data)

    assert response.status_code == 302, response.content[:2000]
    assert snapshot() != before


# -- CSRF on every URL ----------------------------------------------------------------------------------------


def all_url_patterns(resolver: URLResolver | None = None, prefix: str = "") -> list[str]:
    """Every URL pattern of the project as a route string ("admin/jobsite_spark/sparkrun/<int:run_id>/cancel/")."""
    resolver = resolver or get_resolver()
    routes = []
    for entry in resolver.url_patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            routes += all_url_patterns(entry, route)
        elif isinstance(entry, URLPattern):
            routes.append(route)
    return routes


def concrete(route: str) -> str:
    """A path that matches `route` itself: every regex group and converter filled with a value it accepts (the
    app label where one is asked for, else "1"). CSRF is checked before the view runs: the row need not exist."""

    def value(name: str) -> str:
        return "queue_app" if name == "app_label" else "1"

    path = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: value(m.group(1)), route)
    path = re.sub(r"<(?:\w+:)?(\w+)>", lambda m: value(m.group(1)), path)
    return "/" + path.replace("^", "").replace("$", "").replace("\\Z", "")


# Machine-to-machine endpoints that authenticate each request by its Standard Webhooks signature instead of a
# session: exempt from CSRF (a caller has no CSRF cookie), so a POST without a signature must be refused by them.
SIGNED_ROUTES = {"events/<str:source>/"}


def test_every_url_refuses_a_post_without_a_csrf_token(admin_user, world):
    client = Client(enforce_csrf_checks=True)
    client.force_login(admin_user)
    routes = all_url_patterns()
    before = snapshot()

    refused, unsigned, other = [], [], []
    for route in routes:
        reached = resolve(concrete(route)).route
        assert reached.replace("^", "") == route.replace("^", ""), route  # this route, not a catch-all
        response = client.post(concrete(route), {"action": "requeue", "_selected_action": ["1"], "index": "0"})
        if route in SIGNED_ROUTES:
            (unsigned if response.status_code in (400, 401, 404) else other).append((route, response.status_code))
        elif response.status_code == 403 and b"CSRF verification failed" in response.content:
            refused.append((route, response.status_code))
        else:
            other.append((route, response.status_code))

    assert other == []
    assert len(unsigned) == len(SIGNED_ROUTES)  # each signed endpoint exists and refused the unsigned POST
    assert len(refused) == len(routes) - len(SIGNED_ROUTES) >= 80  # the admin's, the queue screens', /metrics...
    assert snapshot() == before


# -- markup in every stored text is escaped -----------------------------------------------------------------


@pytest.fixture
def hostile_world() -> dict:
    """Rows whose every free text holds a script tag: payload, error, traceback, reason, task name, keys,
    worker id and stats, schedule name, target, payload and error, Spark run params, log tail, error, metrics
    and requester, queue analytics' queue and task names, and the admin log."""
    from queue_app import engine

    item_id = dead(
        task=f"t.{SCRIPT}",
        payload={"x": SCRIPT},
        reason=f"poison {SCRIPT}",
        error=f"error {SCRIPT}",
        traceback=f"Traceback\n{SCRIPT}",
        dedup_key=f"d{SCRIPT}",
        ordering_key=f"o{SCRIPT}",
    )
    done_id = ready(f"t.{SCRIPT}", {"y": SCRIPT}, priority=100)
    (held,) = engine.lease(["mail"], 1, f"w{SCRIPT}", lease_timeout=600)
    engine.complete(held, {"result": SCRIPT})
    live_worker(f"worker-{SCRIPT}", host=f"host{SCRIPT}", stats={SCRIPT: SCRIPT})
    schedule = Schedule.objects.create(
        name=f"s{SCRIPT}", cron="0 3 * * *", target=f"t.{SCRIPT}", payload={"p": SCRIPT}, last_error=SCRIPT
    )
    run = trigger_run("demo_sleep", {}, trigger="orm", requested_by=f"u{SCRIPT}")
    SparkRun.objects.filter(id=run.id).update(
        state="failed",
        params={"tasks": SCRIPT},
        log_tail=f"line\n{SCRIPT}",
        error=f"err {SCRIPT}",
        metrics={SCRIPT: SCRIPT},
        started_at=timezone.now() - timedelta(seconds=5),
        finished_at=timezone.now(),
    )
    QueueStatsHourly.objects.create(
        queue="mail", task=f"t.{SCRIPT}", hour=timezone.now().replace(minute=0, second=0, microsecond=0), processed=1
    )
    return {
        "item": item_id,
        "done": done_id,
        "letter": QueueItem.objects.get(id=item_id).dead_letters.get().pk,
        "reservation": Reservation.objects.filter(item_id=item_id).get().pk,
        "worker": Worker.objects.get().pk,
        "schedule": schedule.pk,
        "run": run.id,
    }


def hostile_pages(w: dict) -> dict[str, str]:
    return {
        "overview": "/admin/",
        "overview page": url("queue", "overview"),
        "overview fragment": url("queue", "overview_fragment"),
        "item list": url("queueitem"),
        "item list searched": url("queueitem") + f"?q={SCRIPT}",
        "item page": url("queueitem", "change", w["item"]),
        "done item page": url("queueitem", "change", w["done"]),
        "item history": url("queueitem", "history", w["item"]),
        "dead letters": url("deadletter"),
        "dead letter page": url("deadletter", "change", w["letter"]),
        "reservations": url("reservation"),
        "reservation page": url("reservation", "change", w["reservation"]),
        "workers": url("worker"),
        "worker page": url("worker", "change", w["worker"]),
        "queues": url("queue"),
        "schedules": url("schedule"),
        "schedule page": url("schedule", "change", w["schedule"]),
        "spark runs": url("sparkrun"),
        "spark run page": url("sparkrun", "change", w["run"]),
        "spark run live fragment": url("sparkrun", "live", w["run"]),
        "spark charts": url("sparkrun", "charts") + "?queue=mail",
        "spark trigger": url("sparkrun", "trigger"),
        "bulk confirmation": url("queueitem", "bulk", "requeue") + f"?q={SCRIPT}",
    }


def test_markup_in_every_stored_text_is_escaped_on_every_page(admin_client, admin_user, hostile_world):
    from django.contrib.admin.models import CHANGE

    LogEntry.objects.log_actions(  # the index page's "recent actions" and the history page show these
        user_id=admin_user.pk,
        queryset=QueueItem.objects.filter(id=hostile_world["item"]),
        action_flag=CHANGE,
        change_message=SCRIPT,
    )
    escaped_on = []
    for name, page in hostile_pages(hostile_world).items():
        response = admin_client.get(page)
        assert response.status_code == 200, name
        html = response.content.decode()
        assert SCRIPT not in html, name
        assert "<script>alert" not in html, name
        if ESCAPED in html:
            escaped_on.append(name)

    # The pages that show the hostile text do show it, escaped (not merely left out).
    expected = set(hostile_pages(hostile_world)) - {"overview page", "overview fragment", "spark trigger", "queues"}
    expected -= {"spark charts"}
    assert expected - set(escaped_on) == set()


def test_list_live_json_carries_text_for_text_content_only(admin_client, hostile_world):
    """The run list refreshes its cells from JSON through textContent; the JSON itself escapes < for safety."""
    run = hostile_world["run"]
    response = admin_client.get(url("sparkrun", "list_live") + f"?ids={run}")

    assert response["Content-Type"] == "application/json"
    assert SCRIPT not in response.content.decode()
    page = (ROOT / "queue_app/spark/templates/admin/jobsite_spark/spark/run_list.html").read_text()
    assert "innerHTML" not in page


# -- secrets stay out of output -----------------------------------------------------------------------------

PASSWORD = "hunter2-" + secrets.token_hex(8)
SECRET_KEY = "sk-" + secrets.token_urlsafe(40)


@pytest.mark.slow  # a real run_worker and `manage.py up` (tests/support/slow_guard.py sees them start)
@pytest.mark.django_db(transaction=True)
def test_secrets_never_reach_the_output_of_commands_or_the_worker(test_db_name, db_proxy):
    """A DATABASE_URL with a password (through a TCP proxy to the test database, whose server trusts local
    connections and ignores the password) and a secret key: neither reaches any command's output."""
    env = child_env(test_db_name)
    env |= {"DATABASE_URL": db_proxy.url(password=PASSWORD), "SECRET_KEY": SECRET_KEY, "LOG_LEVEL": "DEBUG"}
    unreachable = env | {"DATABASE_URL": f"postgres://postgres:{PASSWORD}@127.0.0.1:1/nowhere"}

    def manage(*args: str, environment: dict = env) -> str:
        result = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
        )
        return result.stdout + result.stderr

    outputs = {
        "enqueue": manage("enqueue", "queue_app.fail", "--payload", '{"n": 1}'),
        "bad enqueue": manage("enqueue", "queue_app.echo", "--payload", "{nope"),
        "worker": manage("run_worker", "--burst", "--concurrency", "1", "--verbosity", "3"),
        "queue_stats": manage("queue_stats"),
        "check": manage("check", "--deploy"),
        "check database": manage("check", "--database", "default"),
        "database down": manage("queue_stats", environment=unreachable),
    }

    assert "worker stopped" in outputs["worker"], outputs["worker"][-2000:]
    assert "connection" in outputs["database down"].lower()
    for name, output in outputs.items():
        assert PASSWORD not in output, name
        assert SECRET_KEY not in output, name
    stored = " ".join(QueueItem.objects.values_list("error", flat=True)) + " ".join(
        Reservation.objects.values_list("traceback", flat=True)
    )
    assert PASSWORD not in stored and SECRET_KEY not in stored


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_up_prints_the_generated_admin_password_once_and_no_other_secret(spawn, db_proxy, tmp_path):
    """`up` prints the generated admin password once, by design (README); never the database password or the
    secret key, neither itself nor through gunicorn or the worker it starts."""
    import signal

    from tests.support.waiting import wait_for

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "DATABASE_URL": db_proxy.url(password=PASSWORD),
        "SECRET_KEY": SECRET_KEY,
        "LOG_LEVEL": "DEBUG",
        "JOBSITE_NO_SYSTEM_PACKAGES": "1",
    }
    log = tmp_path / "up.log"
    with log.open("w") as out:
        proc = spawn("up", "--port", str(port), "--web-workers", "1", env=env, stdout=out)
    try:
        wait_for(lambda: "jobsite is up" in log.read_text(), 120, what="`up` to say it is up")
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()

    generated = re.findall(r"created superuser  admin  with password  (\S+)", output)
    assert len(generated) == 1 and output.count(generated[0]) == 1
    assert PASSWORD not in output and SECRET_KEY not in output


# -- production settings ------------------------------------------------------------------------------------

# The documented production environment (README, "Security"): everything else keeps its default.
PRODUCTION = {
    "DEBUG": "false",
    "SECRET_KEY": "prod-" + secrets.token_urlsafe(50),
    "ALLOWED_HOSTS": "jobs.example.com",
    "CSRF_TRUSTED_ORIGINS": "https://jobs.example.com",
}


def manage_with(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """manage.py in a clean environment: only what a deployment would set, plus PATH and the database."""
    base = {k: os.environ[k] for k in ("PATH", "HOME", "DATABASE_URL", "LANG") if k in os.environ}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env={**base, "JOBSITE_NO_BOOTSTRAP": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("missing", "message"),
    [
        ({"SECRET_KEY": None}, "jobsite: SECRET_KEY must be set when DEBUG is off."),
        ({"SECRET_KEY": ""}, "jobsite: SECRET_KEY must be set when DEBUG is off."),
        ({"ALLOWED_HOSTS": None}, "jobsite: ALLOWED_HOSTS must be set when DEBUG is off."),
        ({"ALLOWED_HOSTS": ""}, "jobsite: ALLOWED_HOSTS must be set when DEBUG is off."),
    ],
    ids=["no-secret-key", "empty-secret-key", "no-allowed-hosts", "empty-allowed-hosts"],
)
def test_with_debug_off_the_app_refuses_to_start_without_its_secrets(missing, message):
    env = {k: v for k, v in {**PRODUCTION, **missing}.items() if v is not None}

    result = manage_with(env, "check")

    assert result.returncode == 1
    assert result.stderr.strip() == message  # one line for the operator, no traceback


def test_the_wsgi_application_refuses_too():
    env = {k: v for k, v in PRODUCTION.items() if k != "SECRET_KEY"}
    code = "import jobsite.wsgi"
    base = {k: os.environ[k] for k in ("PATH", "HOME", "DATABASE_URL") if k in os.environ}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 1
    assert "SECRET_KEY must be set when DEBUG is off" in result.stderr


def test_check_deploy_is_clean_under_the_documented_production_settings():
    result = manage_with(PRODUCTION, "check", "--deploy", "--fail-level", "DEBUG")

    assert result.returncode == 0, result.stderr
    assert "System check identified no issues" in result.stdout
    assert "WARNINGS" not in result.stdout + result.stderr


def test_production_settings_are_what_check_deploy_checks():
    code = (
        "import django, json; django.setup(); from django.conf import settings as s; print(json.dumps({k: "
        "getattr(s, k) for k in ('DEBUG', 'SESSION_COOKIE_SECURE', 'CSRF_COOKIE_SECURE', 'SECURE_SSL_REDIRECT', "
        "'SECURE_HSTS_SECONDS', 'SECURE_HSTS_INCLUDE_SUBDOMAINS', 'SECURE_CONTENT_TYPE_NOSNIFF', 'X_FRAME_OPTIONS', "
        "'SESSION_COOKIE_HTTPONLY', 'ALLOWED_HOSTS')}))"
    )
    base = {k: os.environ[k] for k in ("PATH", "HOME", "DATABASE_URL") if k in os.environ}
    env = {**base, **PRODUCTION, "DJANGO_SETTINGS_MODULE": "jobsite.settings"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)

    assert json.loads(result.stdout) == {
        "DEBUG": False,
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_SSL_REDIRECT": True,
        "SECURE_HSTS_SECONDS": 31536000,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
        "SECURE_CONTENT_TYPE_NOSNIFF": True,
        "X_FRAME_OPTIONS": "DENY",
        "SESSION_COOKIE_HTTPONLY": True,
        "ALLOWED_HOSTS": ["jobs.example.com"],
    }


# -- the embedded database ----------------------------------------------------------------------------------

EMBEDDED_PROBE = """
import json, os, django
django.setup()
import psycopg
from jobsite import embedded_pg
params = embedded_pg.ensure_running()
with psycopg.connect(host=params["host"], port=params["port"], user=params["user"], dbname="postgres") as conn:
    shown = {name: conn.execute(f"SHOW {name}").fetchone()[0]
             for name in ("listen_addresses", "unix_socket_directories", "unix_socket_permissions")}
print(json.dumps({**shown, "pid": embedded_pg.status()["pid"], "pgdata": str(embedded_pg.pgdata_dir())}))
"""


def listening_tcp_inodes() -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    inodes.add(fields[9])
    return inodes


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


@pytest.mark.slow
def test_the_embedded_database_listens_on_a_private_unix_socket_only(tmp_path):
    try:
        import pgserver  # noqa: F401
    except ImportError:
        pytest.skip("no pgserver wheel (the embedded database then uses the machine's binaries)")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL" and not k.startswith("PYTEST_")}
    env |= {"JOBSITE_VAR_DIR": str(tmp_path / "var"), "JOBSITE_NO_BOOTSTRAP": "1"}
    env |= {"DJANGO_SETTINGS_MODULE": "jobsite.settings", "JOBSITE_DB_NAME": "jobsite"}

    def run(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)

    try:
        probe = run(sys.executable, "-c", EMBEDDED_PROBE)
        assert probe.returncode == 0, probe.stderr[-3000:]
        shown = json.loads(probe.stdout.strip().splitlines()[-1])

        assert shown["listen_addresses"] == ""
        socket_dir = Path(shown["unix_socket_directories"])
        mode = stat.S_IMODE(socket_dir.stat().st_mode)
        assert mode & 0o077 == 0, oct(mode)  # only the server's user (and root) reach the socket
        assert stat.S_IMODE(Path(shown["pgdata"]).stat().st_mode) & 0o077 == 0
        assert socket_inodes(shown["pid"]), "the postmaster has no sockets at all?"
        assert socket_inodes(shown["pid"]) & listening_tcp_inodes() == set()
    finally:
        run(sys.executable, str(ROOT / "manage.py"), "embedded_db", "stop")
