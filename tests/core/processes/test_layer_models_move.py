"""The layer apps' models move to their own app labels with no row lost (issue 45): a database of its own,
migrated to queue_app 0046 (before the move) with Django's MigrationExecutor and filled with raw SQL with rows of
every kind (items, reservations, history partitions, dead letters, schedules and fires, Spark runs, workflows with
steps, edges and a wait, datasets and materializations, webhook endpoints, deliveries and attempts, and a user
granted permissions on layer models with an admin LogEntry), migrates forward: every row of every table is still
there and equal; the content types changed label and kept their ids, so the grants hold
(`has_perm("jobsite_spark.view_sparkrun")`). A content type of the new label that post_migrate had already made
is folded into the kept one. Backward to 0046 and forward again touches no table. Then a real worker
(`run_worker --burst`), the CLI (`queue_stats`) and the layers' admin pages work on it, in child processes.
"""

import json
import subprocess
import sys

import psycopg
import pytest
from django.db import connection

from tests.conftest import ROOT, child_env
from tests.support import fresh_databases

BEFORE = ("queue_app", "0046_sub48_child_start_payload")
CREATED_SINCE = {"queue_app_handoff"}  # by queue_app's migrations after BEFORE
LAYERS = {
    "jobsite_spark": {"sparkconnectserver", "sparkrun", "queuestatshourly", "sparkscript", "sparkwatermark"},
    "jobsite_workflows": {
        "workflow",
        "workflowstartkey",
        "workflowversion",
        "workflowstep",
        "stepdependency",
        "workflowevent",
    },
    "jobsite_datasets": {
        "dataset",
        "materialization",
        "datasetcheckresult",
        "datasetblock",
        "staleepisode",
        "openlineagecounter",
        "triggerstate",
        "triggerfire",
        "dynamicpartitionkey",
    },
    "jobsite_webhooks": {"webhookendpoint", "webhookdelivery", "webhookattempt"},
}
LABEL_OF = {model: label for label, models in LAYERS.items() for model in models}

# Rows of every kind, as the code of 0046 wrote them (ids fixed, so the snapshot compares them by value).
FILL = """
INSERT INTO queue_app_queue (name, paused, lease_timeout, max_attempts, retention, created_at, fair)
VALUES ('move', false, 60, 3, interval '7 days', now(), false);
INSERT INTO queue_app_queueitem (id, queue_id, task, payload, state, priority, run_at, visible_at, attempts,
    max_attempts, error, created_at, updated_at, finished_at)
VALUES (101, 'move', 'queue_app.noop', '{"n": 1}', 'ready', 0, now(), now(), 0, 3, '', now(), now(), NULL),
       (102, 'move', 'queue_app.noop', '{"n": 2}', 'dead', 0, now(), now(), 3, 3, 'boom', now(), now(), now()),
       (103, 'move', 'queue_app.spark_run', '{"run_id": 1}', 'done', 0, now(), now(), 1, 3, '', now(), now(), now()),
       (104, 'move', 'queue_app.noop', '{"n": 4}', 'done', 0, now(), now(), 1, 3, '', now(), now(), now());
INSERT INTO queue_app_reservation (id, item_id, attempt, worker_id, reserved_at, lease_expires_at, heartbeat_at,
    finished_at, outcome, error, traceback)
VALUES (201, 102, 3, 'w1', now(), now(), now(), now(), 'failed', 'boom', 'Traceback...'),
       (203, 103, 1, 'w1', now(), now(), now(), now(), 'done', '', ''),
       (204, 104, 1, 'w1', now(), now(), now(), now(), 'done', '', '');
UPDATE queue_app_queueitem SET reservation_id = id + 100 WHERE id IN (102, 103, 104);
INSERT INTO queue_app_deadletter (id, item_id, reason, last_error, died_at, requeued_by)
VALUES (301, 102, 'failed', 'boom', now(), '');
SELECT queue_app_history_partition((now() AT TIME ZONE 'UTC')::date - 1);
INSERT INTO queue_app_itemhistory (id, queue_id, task, payload, state, priority, attempts, max_attempts, error,
    created_at, updated_at, finished_at)
VALUES (90, 'move', 'queue_app.noop', '{"old": true}', 'done', 0, 1, 3, '', now() - interval '1 day',
        now() - interval '1 day', now() - interval '1 day');
INSERT INTO queue_app_reservationhistory (id, item_id, attempt, worker_id, reserved_at, lease_expires_at,
    heartbeat_at, finished_at, outcome, error, traceback, item_finished_at)
SELECT 190, 90, 1, 'w0', finished_at, finished_at, finished_at, finished_at, 'done', '', '', finished_at
  FROM queue_app_itemhistory WHERE id = 90;
INSERT INTO queue_app_schedule (id, name, cron, timezone, target_kind, target, payload, enabled, catch_up,
    last_error, created_at)
VALUES (401, 'nightly-move', '0 3 * * *', 'UTC', 'task', 'queue_app.noop', '{}', false, 'none', '', now());
INSERT INTO queue_app_schedulefire (id, schedule_id, fire_at, manual, item_id, created_at)
VALUES (402, 401, now(), true, 104, now());
INSERT INTO queue_app_sparkrun (id, job, params, state, trigger, requested_by, item_id, attempt, app_id, ui_url,
    driver_host, progress, log_tail, error, queued_at, finished_at)
VALUES (1, 'word_count', '{"day": "2026-01-01"}', 'succeeded', 'cli', 'boss', 103, 1, 'app-1', '', '', '{}',
        'done', '', now(), now());
INSERT INTO queue_app_sparkscript (id, name, description, enabled, path, py_files, args, params, conf, env,
    driver_memory, executor_memory, policy, produces, consumes, updated_at, updated_by)
VALUES (1, 'rollup', '', true, 'rollup.py', '[]', '[]', '[]', '{}', '{}', '', '', '{}', '{}', '{}', now(), 'boss');
INSERT INTO queue_app_sparkwatermark (name, value, as_of, run_id, updated_at) VALUES ('qa', 5, now(), 1, now());
INSERT INTO queue_app_queuestats_hourly (queue, task, hour, processed, failed, dead, retries, computed_at)
VALUES ('move', 'queue_app.noop', date_trunc('hour', now()), 3, 1, 1, 0, now());
INSERT INTO queue_app_sparkconnectserver (id, url, master, host, healthy, restarts, last_error)
VALUES ('localhost:15002', 'sc://localhost:15002', 'local[2]', 'localhost', false, 0, '');
INSERT INTO queue_app_workflow (id, name, kind, params, state, attempt, started_by, steps_total, steps_open,
    steps_failed, callbacks, channel, error, created_at, default_max_attempts, version, fork_step)
VALUES (501, 'approve_then_run', 'workflow', '{}', 'running', 1, 'boss', 2, 2, 0, '{}', 'jobsite_queue', '', now(),
        3, 'v1', '');
INSERT INTO queue_app_workflowstep (id, workflow_id, attempt, name, "group", kind, target, spec, on_failure, kept,
    state, pending, error, created_at)
VALUES (601, 501, 1, 'wait_paid', '', 'event', 'paid', '{"event": "paid", "key": "o-1"}', 'fail', false,
        'waiting', 0, '', now()),
       (602, 501, 1, 'ship', '', 'task', 'queue_app.noop', '{}', 'fail', false, 'waiting', 1, '', now());
INSERT INTO queue_app_stepdependency (upstream_id, downstream_id, order_only) VALUES (601, 602, false);
INSERT INTO queue_app_workflowevent (id, name, key, payload, created_at, expires_at, step_id)
VALUES (701, 'paid', 'o-2', '{"amount": 5}', now(), now() + interval '1 day', NULL);
INSERT INTO queue_app_workflowversion (name, version, fingerprint, shape, created_at)
VALUES ('approve_then_run', 'v1', 'f1', '{"steps": 2}', now());
INSERT INTO queue_app_dataset (name, config, declared_in, synced_at)
VALUES ('move.events', '{"partitions": "day"}', 'code', now());
INSERT INTO queue_app_materialization (id, dataset, partition, at, rows, bytes, files, schema_fingerprint, metadata,
    source, spark_run_id, checks)
VALUES (801, 'move.events', '2026-01-01', now(), 10, 100, 1, 'abc', '{}', 'spark_run', 1, 'none');
INSERT INTO queue_app_datasetcheckresult (id, materialization_id, dataset, partition, check_name, severity,
    blocking, passed, figures, message, at)
VALUES (802, 801, 'move.events', '2026-01-01', 'not_empty', 'error', true, true, '{}', '', now());
INSERT INTO queue_app_dynamicpartitionkey (id, partition_set, key, added_at, added_by, removed_by)
VALUES (803, 'regions', 'eu', now(), 'code', '');
INSERT INTO queue_app_webhookendpoint (id, url, description, event_types, item_event_queues, enabled, ordered,
    secret, previous_secret, disabled_reason, created_at)
VALUES (901, 'https://example.com/hook', '', '["spark_run.finished"]', '[]', true, false, 'whsec_x', '', '', now());
INSERT INTO queue_app_webhookdelivery (id, webhook_id, endpoint_id, event_type, body, item_id, created_at,
    attempt_count, last_status_code, delivered_at)
VALUES (902, 'msg_1', 901, 'spark_run.finished', '{"run": 1}', 104, now(), 1, 200, now());
INSERT INTO queue_app_webhookattempt (id, delivery_id, attempt, status_code, latency_ms, response_body, error,
    started_at)
VALUES (903, 902, 1, 200, 12.5, 'ok', '', now());
"""


def run_sql(db_url: str, sql: str, params=None) -> list[tuple]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def snapshot(db_url: str) -> dict[str, list[tuple]]:
    """Every table's rows (partitions and their parents both), in a stable order; the migration recorder's own
    table left out (it changes by design)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname ="
                " 'public' AND c.relkind IN ('r', 'p') AND c.relname <> 'django_migrations' ORDER BY 1"
            )
        ]
        return {table: sorted(conn.execute(f'SELECT * FROM "{table}"').fetchall(), key=repr) for table in tables}


MIGRATE = """
import sys
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
targets = {targets!r}
executor = MigrationExecutor(connection)
leaves = executor.loader.graph.leaf_nodes()
executor.migrate([*targets, *(node for node in leaves if node[0] in {apps!r})] if targets else leaves)
"""


def migrate(db_name: str, targets: list[tuple[str, str]] = (), apps: tuple[str, ...] = ()) -> None:
    """Migrate database `db_name` with Django's MigrationExecutor, in a child process on it: to `targets` and the
    latest of `apps`, or every app's latest."""
    done = manage_on(db_name, "shell", "-c", MIGRATE.format(targets=list(targets), apps=apps))
    assert done.returncode == 0, done.stderr[-3000:]


def content_types(db_url: str) -> dict[int, tuple[str, str]]:
    return {
        i: (label, model) for i, label, model in run_sql(db_url, "SELECT id, app_label, model FROM django_content_type")
    }


def fill_grants(db_url: str) -> dict[str, int]:
    """Content types and permissions as `migrate` made them at 0046 (the layer models under queue_app), the
    jobsite_spark row post_migrate would have made for SparkScript had the app been installed with its label, a
    user granted view and trigger on Spark runs and view on scripts (through the duplicate), and a LogEntry."""
    ids = {}
    for model in [*LABEL_OF, "queueitem"]:
        ids[model] = run_sql(
            db_url,
            "INSERT INTO django_content_type (app_label, model) VALUES ('queue_app', %s) RETURNING id",
            [model],
        )[0][0]
    ids["dup_sparkscript"] = run_sql(
        db_url,
        "INSERT INTO django_content_type (app_label, model) VALUES ('jobsite_spark', 'sparkscript') RETURNING id",
    )[0][0]
    perms = [
        ("view_sparkrun", "sparkrun"),
        ("trigger_sparkrun", "sparkrun"),
        ("view_sparkscript", "sparkscript"),
        ("view_workflow", "workflow"),
        ("view_queueitem", "queueitem"),
        ("view_sparkscript", "dup_sparkscript"),  # the duplicate's twin of the kept row's permission
        ("change_sparkscript", "dup_sparkscript"),  # the duplicate's own: moves to the kept row
    ]
    for codename, model in perms:
        ids[f"{codename}@{model}"] = run_sql(
            db_url,
            "INSERT INTO auth_permission (name, content_type_id, codename) VALUES (%s, %s, %s) RETURNING id",
            [codename.replace("_", " "), ids[model], codename],
        )[0][0]
    ids["user"] = run_sql(
        db_url,
        "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, email, is_staff, is_active,"
        " date_joined) VALUES ('!', false, 'operator', '', '', '', true, true, now()) RETURNING id",
    )[0][0]
    granted = ["view_sparkrun@sparkrun", "trigger_sparkrun@sparkrun", "view_workflow@workflow"]
    granted += ["view_queueitem@queueitem", "view_sparkscript@dup_sparkscript", "change_sparkscript@dup_sparkscript"]
    for perm in granted:
        run_sql(
            db_url,
            "INSERT INTO auth_user_user_permissions (user_id, permission_id) VALUES (%s, %s)",
            [ids["user"], ids[perm]],
        )
    run_sql(
        db_url,
        "INSERT INTO django_admin_log (action_time, object_id, object_repr, action_flag, change_message,"
        " content_type_id, user_id) VALUES (now(), '1', 'word_count run #1', 2, '[]', %s, %s)",
        [ids["sparkrun"], ids["user"]],
    )
    run_sql(
        db_url,
        "INSERT INTO django_admin_log (action_time, object_id, object_repr, action_flag, change_message,"
        " content_type_id, user_id) VALUES (now(), '1', 'rollup', 2, '[]', %s, %s)",
        [ids["dup_sparkscript"], ids["user"]],
    )
    return ids


@pytest.fixture
def fresh_db(transactional_db):
    """A database of its own beside the test database: (its name, its URL)."""
    name = f"{connection.settings_dict['NAME']}_layers_move"
    db_url = fresh_databases.create(name)
    try:
        yield name, db_url
    finally:
        fresh_databases.drop(name)


def manage_on(db_name: str, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """`manage.py ARGS` in a child process on database `db_name`."""
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=child_env(db_name),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


ADMIN_CHECK = """
import json
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.test import Client
from queue_app.spark.models import SparkRun, SparkScript
user = get_user_model().objects.get(username="operator")
perms = {p: user.has_perm(p) for p in ("jobsite_spark.view_sparkrun", "jobsite_spark.trigger_sparkrun",
         "jobsite_spark.view_sparkscript", "jobsite_spark.change_sparkscript", "jobsite_workflows.view_workflow",
         "queue_app.view_queueitem", "queue_app.view_sparkrun")}
logs = sorted(type(e.get_edited_object()).__name__ for e in LogEntry.objects.all())
boss = get_user_model().objects.create_superuser("boss", "boss@example.com", "pw")
client = Client(HTTP_HOST="localhost")
client.force_login(boss)
pages = [
    "/admin/jobsite_spark/sparkrun/", "/admin/jobsite_spark/sparkrun/1/change/", "/admin/jobsite_spark/sparkscript/",
    "/admin/jobsite_workflows/workflow/", "/admin/jobsite_workflows/workflow/501/change/",
    "/admin/jobsite_datasets/dataset/", "/admin/jobsite_datasets/datasetcheckresult/",
    "/admin/jobsite_webhooks/webhookendpoint/", "/admin/jobsite_webhooks/webhookdelivery/902/change/",
    "/admin/queue_app/queueitem/", "/admin/queue_app/deadletter/",
]
answers = {page: client.get(page).status_code for page in pages}
operator = Client(HTTP_HOST="localhost")
operator.force_login(user)
answers["operator /admin/jobsite_spark/sparkrun/"] = operator.get("/admin/jobsite_spark/sparkrun/").status_code
print(json.dumps({"perms": perms, "logs": logs, "pages": answers}))
"""


@pytest.mark.slow
def test_a_filled_database_moves_its_layer_models_with_no_row_lost(fresh_db):
    name, db_url = fresh_db
    migrate(name, [BEFORE], apps=("auth", "admin", "contenttypes", "sessions"))
    applied = {app for app, _ in run_sql(db_url, "SELECT app, name FROM django_migrations")}
    assert "queue_app" in applied and not applied & set(LAYERS)  # the layer apps' 0001 not applied yet
    run_sql(db_url, FILL)
    ids = fill_grants(db_url)
    before = snapshot(db_url)
    assert len(before["queue_app_itemhistory"]) == 1 and len(before["queue_app_reservationhistory"]) == 1
    filled = {t: len(rows) for t, rows in before.items() if t.startswith("queue_app_") and rows}
    for table in ("queueitem", "reservation", "deadletter", "schedulefire", "sparkrun", "workflowstep",
                  "stepdependency", "workflowevent", "dataset", "materialization", "webhookendpoint",
                  "webhookdelivery", "webhookattempt"):  # fmt: skip
        assert filled.get(f"queue_app_{table}"), table

    migrate(name)
    after = snapshot(db_url)
    applied = {app for app, _ in run_sql(db_url, "SELECT app, name FROM django_migrations")}
    assert set(LAYERS) <= applied

    # Every table but the content types, permissions and grants (which the duplicate's fold changes): equal.
    folded = {"django_content_type", "auth_permission", "auth_user_user_permissions", "django_admin_log"}
    # Tables queue_app's later migrations create, empty (0052: the idle workers' hand-off offers).
    assert {t: rows for t, rows in after.items() if t not in before} == {t: [] for t in CREATED_SINCE}
    assert {t: rows for t, rows in after.items() if t not in folded | CREATED_SINCE} == {
        t: rows for t, rows in before.items() if t not in folded
    }
    assert sum(len(rows) for t, rows in after.items() if t.startswith("queue_app_")) == sum(
        len(rows) for t, rows in before.items() if t.startswith("queue_app_")
    )
    # The content types kept their ids and took their app's label; the duplicate was folded into the kept row.
    assert content_types(db_url) == {ids[m]: (LABEL_OF.get(m, "queue_app"), m) for m in [*LABEL_OF, "queueitem"]}
    kept = ids["sparkscript"]
    perms = {
        (codename, ct) for codename, ct in run_sql(db_url, "SELECT codename, content_type_id FROM auth_permission")
    }
    assert ("view_sparkscript", kept) in perms and ("change_sparkscript", kept) in perms
    assert not {p for p in perms if p[1] == ids["dup_sparkscript"]}
    granted = {pid for (pid,) in run_sql(db_url, "SELECT permission_id FROM auth_user_user_permissions")}
    assert ids["view_sparkscript@sparkscript"] in granted and ids["view_sparkscript@dup_sparkscript"] not in granted
    logs = {ct for (ct,) in run_sql(db_url, "SELECT content_type_id FROM django_admin_log")}
    assert logs == {ids["sparkrun"], kept}

    # Backward to 0046: the state goes back, the content types too, no table touched; forward again: the same.
    migrate(name, [BEFORE])
    back = snapshot(db_url)
    assert {t: rows for t, rows in back.items() if t not in folded} == {
        t: rows for t, rows in before.items() if t not in folded
    }
    assert {label for i, (label, model) in content_types(db_url).items() if model in LABEL_OF} == {"queue_app"}
    migrate(name)
    assert snapshot(db_url) == after

    # The app on it: the permissions granted before hold under the new labels, LogEntry rows find their objects,
    # the layers' admin pages answer, the CLI reads it and a worker runs its ready item.
    shown = manage_on(name, "shell", "-c", ADMIN_CHECK)
    assert shown.returncode == 0, shown.stderr[-3000:]
    seen = json.loads(shown.stdout.strip().splitlines()[-1])
    assert seen["perms"] == {
        "jobsite_spark.view_sparkrun": True,
        "jobsite_spark.trigger_sparkrun": True,
        "jobsite_spark.view_sparkscript": True,
        "jobsite_spark.change_sparkscript": True,
        "jobsite_workflows.view_workflow": True,
        "queue_app.view_queueitem": True,
        "queue_app.view_sparkrun": False,  # the old name is gone: the grant moved with its content type
    }
    assert seen["logs"] == ["SparkRun", "SparkScript"]
    assert seen["pages"] == {page: 200 for page in seen["pages"]}, seen["pages"]

    stats = manage_on(name, "queue_stats", "--json")
    assert stats.returncode == 0, stats.stderr[-3000:]
    assert "move" in stats.stdout
    ran = manage_on(name, "run_worker", "--burst", "--queues", "move", "--pool", "thread", timeout=240)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert run_sql(db_url, "SELECT state FROM queue_app_queueitem WHERE id = 101") == [("done",)]


def test_the_webhooks_trigger_names_the_spark_final_states():
    """The webhooks app's trigger SQL names a Spark run's final states itself (it does not build on the Spark
    app): the same as the Spark app's."""
    from queue_app.spark.models import SPARK_FINAL_STATES
    from queue_app.webhooks.triggers import SPARK_FINAL_STATES as NAMED

    assert set(NAMED) == {str(state) for state in SPARK_FINAL_STATES}


@pytest.mark.django_db
def test_the_relabel_folds_a_duplicate_and_goes_back():
    """queue_app/relabel.py on the test database: a content type of the new label already there is folded into
    the kept one (its grants repointed, its twin permission deleted), and the reverse relabels back."""
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django.contrib.contenttypes.models import ContentType

    from queue_app.relabel import relabel

    kept = ContentType.objects.create(app_label="old_label", model="thing")
    dup = ContentType.objects.create(app_label="new_label", model="thing")
    mine = Permission.objects.create(content_type=kept, codename="view_thing", name="v")
    twin = Permission.objects.create(content_type=dup, codename="view_thing", name="v")
    only = Permission.objects.create(content_type=dup, codename="poke_thing", name="p")

    user = get_user_model().objects.create_user("relabel")
    user.user_permissions.set([twin, only])
    assert relabel(connection, "old_label", "new_label", ["thing", "absent"]) == 1
    assert ContentType.objects.filter(pk=dup.pk).count() == 0
    assert ContentType.objects.get(pk=kept.pk).app_label == "new_label"
    assert set(user.user_permissions.values_list("pk", flat=True)) == {mine.pk, only.pk}
    assert set(Permission.objects.filter(content_type=kept).values_list("codename", flat=True)) == {
        "view_thing",
        "poke_thing",
    }
    assert relabel(connection, "new_label", "old_label", ["thing"]) == 1
    assert ContentType.objects.get(pk=kept.pk).app_label == "old_label"
