"""The workflow pages in a real browser (headless Debian Chromium through Playwright), beside a stock admin page:
start a workflow from its form, let real workers run it, and see its graph coloured by state. Screenshots of
both pages go to WORKFLOW_SCREENSHOT_DIR (default /tmp) to look at side by side."""

import os
from pathlib import Path

import pytest

from tests.support.admin_fixtures import fast_password_hashing_fixture  # noqa: F401
from tests.support.browser_fixtures import browser_page  # noqa: F401, F811 (a fixture)
from tests.tasks import workflow_tasks  # noqa: F401  (registers wf_fan here, for the live server)

SHOTS = Path(os.environ.get("WORKFLOW_SCREENSHOT_DIR", "/tmp"))
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.slow  # a real run_worker
def test_start_a_workflow_and_watch_its_graph_turn_green_like_a_stock_admin_page(
    live_server,
    admin_user,
    browser_page,  # noqa: F811  (the fixture imported above)
    spawn,
):
    for _ in range(2):
        spawn("run_worker", "--concurrency", "4", "--pool", "thread", "--import", "tests.tasks.workflow_tasks")
    page = browser_page()
    base = live_server.url
    page.goto(f"{base}/admin/")
    page.fill("#id_username", admin_user.username)
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/")

    page.goto(f"{base}/admin/auth/group/")  # a stock page, for the looks
    stock = page.evaluate(
        "() => [getComputedStyle(document.querySelector('#header')).backgroundColor,"
        " getComputedStyle(document.querySelector('.breadcrumbs')).backgroundColor]"
    )
    page.screenshot(path=str(SHOTS / "stock_admin.png"), full_page=True)

    page.goto(f"{base}/admin/jobsite_workflows/workflow/start/")
    page.locator("#wf-wf_fan summary").click()
    page.fill("#id_wf_fan-n", "12")
    page.click("#wf-wf_fan input[type=submit]")
    page.wait_for_url("**/admin/jobsite_workflows/workflow/*/change/")
    assert page.locator(".messagelist .success").inner_text().startswith("Started wf_fan")
    for _ in range(60):
        page.reload()
        if "succeeded" in page.locator("#wf-summary").inner_text().split("\n")[0]:
            break
        page.wait_for_timeout(500)
    assert page.locator("#wf-summary tr").first.inner_text().endswith("succeeded")
    graph = page.locator("#wf-graph svg")
    assert graph.locator("g.node").count() == 3  # split, the 12 parts as one node, sum
    assert graph.locator("g.node.state-succeeded").count() == 3
    assert "part ×12" in graph.text_content()
    ours = page.evaluate(
        "() => [getComputedStyle(document.querySelector('#header')).backgroundColor,"
        " getComputedStyle(document.querySelector('.breadcrumbs')).backgroundColor]"
    )
    assert ours == stock  # the admin's own header and breadcrumbs
    page.screenshot(path=str(SHOTS / "workflow_detail.png"), full_page=True)
    page.goto(f"{base}/admin/jobsite_workflows/workflow/")
    assert page.locator("#result_list tbody tr").count() == 1
    assert page.locator("#result_list tbody tr td.field-progress").inner_text().strip() == "14/14"
    page.screenshot(path=str(SHOTS / "workflow_list.png"), full_page=True)
