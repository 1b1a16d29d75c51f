"""The admin in a real browser: headless Chromium (Debian's `chromium`, installed by `manage.py test` where
missing) driven by Playwright with `executable_path`, so no browser is ever downloaded.

One journey: log in, land on the queue overview, filter the dead letters by queue, requeue one, run a real
worker (`manage.py run_worker --burst`) and watch the item end done, in the UI. The overview is saved as a
screenshot (OVERVIEW_SCREENSHOT, default /tmp/overview.png).

Everything that touches the database from the test itself happens before Playwright starts: its sync API
keeps an event loop running in this thread, and Django refuses ORM calls there.
"""

import os
import subprocess
from pathlib import Path

import pytest

from queue_app import engine
from tests.support import browser_fixtures
from tests.support.admin_fixtures import dead, done, failed, fast_password_hashing_fixture  # noqa: F401
from tests.support.admin_fixtures import url as admin_url
from tests.support.browser_fixtures import log_in
from tests.support.pages_fixtures import LONG_TASK, long_valued_rows

browser_page = browser_fixtures.browser_page  # the fixture

SCREENSHOT = Path(os.environ.get("OVERVIEW_SCREENSHOT", "/tmp/overview.png"))
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
