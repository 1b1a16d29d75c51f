"""Rows for every jobsite admin page, shaped like the demo's after a day of use (issue 50): Spark runs of the demo's
jobs (one queued, one failed), the demo workflow, the demo's datasets with a failed blocking check on its bad day
long ago and a warn check, and a webhook delivery whose attempts were refused (the SSRF guard). Made through the
services where they exist, as rows where a run or a worker would have written them. Imported by
tests/core/browser/test_pages_browser.py; `seed()` also fills a development database to look at the pages by hand."""

from __future__ import annotations

import datetime as dt

from django.db import connection
from django.utils import timezone

from queue_app import engine
from tests.support.admin_fixtures import dead, done, failed, fast_password_hashing_fixture  # noqa: F401
from tests.support.browser_fixtures import browser_page  # noqa: F401, F811 (a fixture)

REFUSAL = (
    "refused: localhost resolves to 127.0.0.1 is a loopback address (server-side request forgery guard; "
    "JOBSITE_WEBHOOKS_ALLOW_PRIVATE=1 allows it)"
)
LOCAL_HOOK = "http://localhost:9999/hooks/jobsite"
PROGRESS = {"jobs_done": 3, "jobs_total": 3, "stages_done": 6, "stages_total": 6, "tasks_done": 99, "tasks_total": 99}
DEMO_DAYS = 6  # demo.events and demo.rollup materialized for the last days, and once for the bad day


def spark_runs() -> list[int]:
    from queue_app.spark.models import SparkRun

    now = timezone.now()
    folder = "/root/jobsite/var/demo_pipeline"
    runs = []
    for n, (job, state) in enumerate(
        [
            ("demo_rollup", "succeeded"),
            ("demo_analytics", "succeeded"),
            ("demo_rollup", "failed"),
            ("demo_sleep", "succeeded"),
            ("demo_rollup", "queued"),
            ("demo_rollup", "cancelling"),
        ]
    ):
        finished = now - dt.timedelta(minutes=10 * (5 - n)) if state not in ("queued", "cancelling") else None
        run = SparkRun.objects.create(
            job=job,
            state=state,
            trigger="workflow",
            requested_by=f"workflow demo_pipeline #{n + 1} step rollup",
            params={
                "input_dir": f"{folder}/input/2026-11-30",
                "output_dir": f"{folder}/rollup",
                "day": "2026-11-30",
            },
            progress={} if state == "queued" else PROGRESS,
            error="RuntimeError: blocked partition demo.events[2025-01-13] failed checks" if state == "failed" else "",
            started_at=now - dt.timedelta(minutes=10 * (5 - n), seconds=40 + 7 * n) if state != "queued" else None,
            finished_at=finished,
        )
        runs.append(run.id)
    return runs


def datasets(run_id: int) -> None:
    """The demo's datasets: the last DEMO_DAYS days of events (observed: files and bytes, no rows) and of the
    rollup (rows and bytes, by a run), and the bad day of January 2025 whose blocking check failed."""
    from jobsite.demo.data import BAD_DAY, EVENTS, ROLLUP
    from queue_app.datasets.checks_run import record_check_result
    from queue_app.datasets.models import DatasetCheckResult, Materialization
    from queue_app.datasets.services import record_materialization
    from queue_app.datasets.sync import sync_datasets

    sync_datasets()
    today = timezone.now().date()
    for day in [BAD_DAY] + [today - dt.timedelta(days=n) for n in range(DEMO_DAYS, 0, -1)]:
        at = timezone.make_aware(dt.datetime.combine(day + dt.timedelta(days=1), dt.time(5)))
        events = record_materialization(EVENTS, day, files=3, bytes=305_000 + day.day * 97, observed=True)
        rollup = record_materialization(
            ROLLUP, day, rows=9_000 + day.day * 11, bytes=210_000 + day.day * 51, spark_run_id=run_id
        )
        Materialization.objects.filter(id__in=[events.id, rollup.id]).update(at=at)
        bad = day == BAD_DAY
        for check in DatasetCheckResult.objects.filter(materialization_id=events.id):
            message = ""
            if bad and check.check_name.endswith("quantities_positive"):
                message = "12 of 3,310 rows have quantity < 1 (east.csv: rows 17, 44, 90, 131, 180, 211, 340 ...)"
            elif bad:
                message = "no rows in west.csv"
            record_check_result(events.id, check.check_name, passed=not bad, message=message)


def webhooks() -> None:
    """An endpoint on this machine (allowed when it was added) and a delivery refused twice at send time."""
    from queue_app.webhooks import services
    from queue_app.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint

    endpoint = WebhookEndpoint.objects.create(url=LOCAL_HOOK, event_types=["test"], secret="whsec_" + "a" * 32)
    (delivery,) = services.send_test_event([endpoint.pk])
    for attempt in (1, 2):
        WebhookAttempt.objects.create(delivery=delivery, attempt=attempt, error=REFUSAL)
    WebhookDelivery.objects.filter(id=delivery.id).update(attempt_count=2)


def seed() -> dict[str, int]:
    """Everything above plus the laptop-window rows of test_admin_browser (long values in every list), a Spark
    script and the demo workflow started (its steps queued: no worker runs here)."""
    from queue_app.spark.models import SparkScript
    from queue_app.workflows import services as workflows
    from tests.support.pages_fixtures import long_valued_rows

    long_valued_rows()
    runs = spark_runs()
    datasets(runs[0])
    webhooks()
    SparkScript.objects.create(name="pi", path="tests/tasks/spark_scripts/pi.py", description="The pi example script.")
    workflow = workflows.start("demo_pipeline", started_by="admin: a-rather-long-user-name@example.com")
    return {"workflow": workflow.id, "run": runs[0]}


LONG_TASK = "billing.invoices.generate_monthly_statement_for_enterprise_customer"


LONG_QUEUE = "billing-statements-eu-west-1-primary"


LONG_HOST = "ip-10-0-12-34.eu-west-1.compute.internal"


def long_valued_rows() -> None:
    """Rows of every list with the long values a real install has: task, queue, keys, payloads, errors, a
    webhook endpoint's URL, a worker's id and host, a Spark run's paths."""
    from django.db import transaction
    from django.utils import timezone

    from queue_app.models import ItemHistory, Worker
    from queue_app.spark.models import SparkRun
    from queue_app.webhooks import services as webhooks
    from queue_app.webhooks.models import WebhookAttempt

    keys = {"dedup_key": "statement-2026-11-customer-000042-enterprise-plan", "group_key": "tenant-0042-acme-corp"}
    payload = {"customer": "cust-000042", "lines": list(range(40)), "note": "x" * 300}
    for n in range(3):
        engine.enqueue(LONG_TASK, payload, queue=LONG_QUEUE, ordering_key=f"account-{n:06d}-eu-west-1", **keys)
        keys = {}
    error = "HTTPSConnectionPool(host='ledger.internal.example.com', port=443): Read timed out. (read timeout=30)"
    dead(LONG_TASK, payload, queue=LONG_QUEUE, reason="poison: " + error, error=error)
    failed(LONG_TASK, queue=LONG_QUEUE, error=error)
    finished = done(LONG_TASK, queue=LONG_QUEUE, dedup_key="statement-2026-11-customer-000043-enterprise-plan")
    with connection.cursor() as cur:
        cur.execute("UPDATE queue_app_queueitem SET finished_at = now() - interval '1 hour' WHERE id = %s", [finished])
    with transaction.atomic():
        engine.archive(1000, grace=60)
    assert ItemHistory.objects.filter(id=finished).exists()
    url = "https://hooks.example-customer-with-a-long-domain-name.com/api/v2/webhooks/jobsite/receive?tenant=acme"
    endpoint = webhooks.create_endpoint(url, ["test"]).endpoint
    (delivery,) = webhooks.send_test_event([endpoint.pk])
    WebhookAttempt.objects.create(delivery=delivery, attempt=1, status_code=503, error=error)
    now = timezone.now()
    Worker.objects.create(
        id=f"worker-{LONG_HOST}-4242-7f3a9c",
        host=LONG_HOST,
        pid=4242,
        queues=[LONG_QUEUE, "mail", "webhooks", "notifications-high-priority"],
        concurrency=16,
        state="running",
        started_at=now,
        last_heartbeat=now,
        stats={"processed": 123456, "failed": 12, "timed_out": 0, "dead": 3, "rate": 412.5},
    )
    folder = "/var/lib/jobsite/demo_pipeline"
    SparkRun.objects.create(
        job="file_rollup",
        state="succeeded",
        trigger="workflow",
        requested_by="workflow demo_pipeline #12 step rollup",
        params={"input_dir": f"{folder}/input/2026-11-26", "output_dir": f"{folder}/rollup", "day": "2026-11-26"},
        started_at=now,
        finished_at=now,
    )
