"""The admin in a real browser: headless Chromium (Debian's `chromium`, installed by `manage.py test` where
missing) driven by Playwright with `executable_path`, so no browser is ever downloaded.

One journey: log in, land on the queue overview, filter the dead letters by queue, requeue one, run a real
worker (`manage.py run_worker --burst`) and watch the item end done, in the UI. The overview is saved as a
screenshot (OVERVIEW_SCREENSHOT, default /tmp/overview.png).

Everything that touches the database from the test itself happens before Playwright starts: its sync API
keeps an event loop running in this thread, and Django refuses ORM calls there.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from django.db import connection

from queue_app import engine
from tests.admin_fixtures import dead, done, failed, fast_password_hashing_fixture  # noqa: F401
from tests.admin_fixtures import url as admin_url

CHROMIUM = os.environ.get("JOBSITE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT = Path(os.environ.get("OVERVIEW_SCREENSHOT", "/tmp/overview.png"))
TIMEOUT_MS = 20_000
# Pairs of a plotly chart's labels (legend, tick labels) whose boxes intersect.
OVERLAPS = """chart => {
  const box = e => e.getBoundingClientRect();
  const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const root = document.querySelector(chart);
  const legend = root.querySelector('.legend');
  const ticks = [...root.querySelectorAll('.xtick text, .ytick text')].filter(t => t.textContent);
  const found = ticks.filter(t => hit(box(legend), box(t))).map(t => 'legend/' + t.textContent);
  const [x0] = [...root.querySelectorAll('.xtick text')].filter(t => t.textContent);
  const [y0] = [...root.querySelectorAll('.ytick text')].filter(t => t.textContent);
  if (x0 && y0 && hit(box(x0), box(y0))) found.push(x0.textContent + '/' + y0.textContent);
  return found;
}"""

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def browser_page():
    """A Playwright page in headless Debian Chromium (skips when either is missing)."""
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.skip(f"{CHROMIUM} not found: apt-get install chromium (manage.py test installs it when run as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")

    def open_page():
        playwright = sync_api.sync_playwright().start()
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        opened.append((playwright, browser))
        return page

    opened: list = []
    yield open_page
    for playwright, browser in opened:
        browser.close()
        playwright.stop()


def log_in(page, base: str, user, then: str) -> None:
    """Log `user` in on the admin's login page and land on the admin path `then`."""
    page.goto(f"{base}/admin/login/?next={then}")
    page.fill("#id_username", user.username)
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_url(f"**{then}")


@pytest.mark.slow  # a real run_worker --burst
def test_requeue_a_dead_letter_and_watch_a_worker_complete_it(live_server, admin_user, browser_page, spawn):
    # A queue worth looking at: recent completions and failures elsewhere, work waiting in "browser", and two
    # dead letters, one in "browser" (poison at first, a real task that succeeds once requeued).
    for _ in range(4):
        done(queue="mail")
    failed(queue="mail")
    dead(queue="other")
    engine.enqueue_many("queue_app.echo", [{"n": n} for n in range(12)], queue="browser")
    item_id = dead("queue_app.echo", {"order": 42}, queue="browser", reason="poison: handler crashed")

    page = browser_page()
    base = live_server.url

    page.goto(f"{base}/admin/")
    page.fill("#id_username", admin_user.username)
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/")
    overview = page.locator("#queue-overview")
    assert overview.is_visible()
    page.wait_for_selector("#chart-throughput .legend")
    overlaps = page.evaluate(OVERLAPS, "#chart-throughput")
    assert overlaps == [], overlaps  # the legend covers no tick label; the first x and y labels do not touch
    assert overview.locator('tr[data-queue="browser"] td.depth-dead').inner_text() == "1"
    assert overview.locator('tr[data-queue="browser"] td.depth-ready').inner_text() == "12"

    page.goto(f"{base}/admin/queue_app/deadletter/")
    assert page.locator("#result_list tbody tr").count() == 2
    page.locator("#changelist-filter").get_by_role("link", name="browser", exact=True).click()
    page.wait_for_url("**/deadletter/?item__queue__name__exact=browser")
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    assert "poison: handler crashed" in rows.first.inner_text()
    rows.first.locator("input.action-select").check()
    page.select_option("select[name=action]", "requeue")
    page.click("button[name=index]")
    assert page.locator(".messagelist .success").inner_text() == "Requeued the items of 1 dead letter."
    page.goto(f"{base}/admin/queue_app/queueitem/{item_id}/change/")
    assert page.locator(".field-state_shown .readonly").inner_text() == "ready"

    worker = spawn("run_worker", "--burst", "--queues", "browser", "--concurrency", "2")
    try:
        output, _ = worker.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        worker.kill()
        output, _ = worker.communicate()
        pytest.fail(f"run_worker --burst did not finish:\n{output}")
    assert worker.returncode == 0, output

    page.reload()
    assert page.locator(".field-state_shown .readonly").inner_text() == "done"
    assert "queue_app.echo" in page.locator(".field-task .readonly").inner_text()
    timeline = page.locator("table.queue-timeline tbody tr")
    assert timeline.count() == 2  # the poisoned attempt, then the worker's
    assert "Done" in timeline.nth(1).inner_text()

    page.goto(f"{base}/admin/")
    browser_row = page.locator('#queue-overview tr[data-queue="browser"]')
    assert browser_row.locator("td.depth-done").inner_text() == "13"
    assert browser_row.locator("td.depth-dead").inner_text() == "0"
    assert browser_row.locator("td.processed").inner_text() == "13"
    stamp = page.locator("#queue-overview time").get_attribute("datetime")
    page.wait_for_function(
        "stamp => document.querySelector('#queue-overview time').getAttribute('datetime') !== stamp",
        arg=stamp,
        timeout=15_000,
    )  # it re-rendered itself from the fragment, no reload
    page.screenshot(path=str(SCREENSHOT), full_page=True)


# -- a laptop's window ----------------------------------------------------------------------------------------

LONG_TASK = "billing.invoices.generate_monthly_statement_for_enterprise_customer"
LONG_QUEUE = "billing-statements-eu-west-1-primary"
LONG_HOST = "ip-10-0-12-34.eu-west-1.compute.internal"
# Per list, the columns that must be on screen (their `column-<name>` heads).
LISTS = {
    "queueitem": ("state_shown", "attempts_of", "run_at_short"),
    "itemhistory": ("state_shown", "attempts_of", "finished_at_short"),
    "deadletter": ("reason_short", "died", "requeued"),
    "webhookdelivery": ("state", "attempts", "status"),
    "worker": ("state", "alive", "heartbeat"),
    "queue": ("paused", "flow_control", "links"),
    "sparkrun": ("state_badge", "params_short", "queued"),
    "reservation": ("outcome", "attempt", "finished"),
    "reservationhistory": ("outcome", "attempt", "finished"),
}
# The page's and the list box's overflow, and the right edge of each head against the window and the list box.
FIT = """columns => {
  const d = document.documentElement, results = document.querySelector('.results');
  const right = c => { const th = document.querySelector('#result_list thead th.column-' + c);
                       return th ? Math.round(th.getBoundingClientRect().right) : null; };
  return {page: d.scrollWidth - d.clientWidth, list: results.scrollWidth - results.clientWidth,
          window: window.innerWidth, box: Math.round(results.getBoundingClientRect().right),
          columns: Object.fromEntries(columns.map(c => [c, right(c)]))};
}"""


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


def test_every_list_shows_what_matters_in_a_laptop_window(live_server, admin_user, browser_page):
    """At 1,440 x 900 (the admin's sidebar and filters open) no list scrolls sideways, the page does not, and
    each list's state, attempts and status columns are on screen; long values are cut, whole on hover."""
    long_valued_rows()
    page = browser_page()
    page.set_viewport_size({"width": 1440, "height": 900})
    base = live_server.url
    log_in(page, base, admin_user, "/admin/queue_app/queueitem/")
    misfits = {}
    for model, columns in LISTS.items():
        page.goto(f"{base}{admin_url(model)}")
        fit = page.evaluate(FIT, list(columns))
        off_screen = [
            c for c, right in fit["columns"].items() if right is None or right > min(fit["window"], fit["box"])
        ]
        if fit["page"] > 0 or fit["list"] > 0 or off_screen:
            misfits[model] = {**fit, "off_screen": off_screen}
    assert misfits == {}
    page.goto(f"{base}/admin/queue_app/queueitem/")
    cell = page.locator(f'#result_list .cut[title="{LONG_TASK}"]').first  # the whole value, on hover
    assert cell.evaluate("e => e.scrollWidth > e.clientWidth")  # shown cut (an ellipsis)
