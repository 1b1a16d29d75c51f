"""The Spark dashboard in a real browser (headless Debian Chromium through Playwright, as test_admin_browser.py):
trigger a run from its job's form, land on the run's page, and watch it, without reloading, go to succeeded as a
real worker runs it in a real spark-submit child.

Everything that touches the database from the test itself happens before Playwright starts (its sync API keeps
an event loop in this thread, and Django refuses ORM calls there).
"""

import os

import pytest

from tests.support.admin_fixtures import fast_password_hashing_fixture  # noqa: F401 (autouse)
from tests.support.browser_fixtures import (
    browser_page,  # noqa: F401, F811 (a fixture)
    log_in,
)
from tests.support.spark_fixtures import require_spark
from tests.support.spark_workers import WORKER_ENV

pytestmark = [pytest.mark.browser, pytest.mark.spark, pytest.mark.django_db(transaction=True)]


def test_trigger_a_run_from_the_dashboard_and_watch_it_succeed(live_server, admin_user, browser_page, spawn):  # noqa: F811
    require_spark()
    spawn("run_worker", "--queues", "spark", "--concurrency", "1", "--poll-interval", "0.5", env=WORKER_ENV)
    page = browser_page()
    base = live_server.url

    log_in(page, base, admin_user, "/admin/jobsite_spark/sparkrun/")
    page.get_by_role("link", name="Trigger a run").click()

    form = page.locator("#job-demo_sleep")
    if form.get_attribute("open") is None:
        form.locator("summary").click()
    form.locator("input[name=demo_sleep-tasks]").fill("0")  # refused first: the error is shown on its field
    form.locator("input[type=submit]").click()
    assert "greater than or equal to 1" in page.locator("#job-demo_sleep .errorlist").first.inner_text()

    form = page.locator("#job-demo_sleep")
    form.locator("input[name=demo_sleep-tasks]").fill("4")
    form.locator("input[name=demo_sleep-seconds]").fill("1")
    form.locator("input[type=submit]").click()
    page.wait_for_url("**/admin/jobsite_spark/sparkrun/*/change/")
    assert "queued" in page.locator(".messagelist").inner_text()

    # The live part refreshes itself: running with progress, then succeeded with its metrics; no reload.
    page.wait_for_function(
        "() => ['running', 'succeeded'].includes(document.querySelector('#run-state').textContent.trim())",
        timeout=120_000,
    )
    page.wait_for_function(
        "() => document.querySelector('#run-state').textContent.trim() === 'succeeded'", timeout=120_000
    )
    assert page.locator("tr.bar-tasks td.count").inner_text() == "4/4"
    assert "sum" in page.locator("#run-metrics").inner_text()
    assert page.locator("#rerun").is_visible() and page.locator("#cancel-run").count() == 0
    page.screenshot(path=os.environ.get("SPARK_RUN_SCREENSHOT", "/tmp/spark-run.png"), full_page=True)

    page.goto(f"{base}/admin/jobsite_spark/sparkrun/")
    assert page.locator(".spark-state").first.inner_text() == "succeeded"
    page.goto(f"{base}/admin/jobsite_spark/sparkrun/charts/")
    page.wait_for_selector("#chart-durations .cartesianlayer .scatterlayer .point")
    assert page.locator("#chart-durations .cartesianlayer .scatterlayer .point").count() == 1
