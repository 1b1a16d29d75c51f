"""The admin's "Pending approvals" in a real browser (headless Debian Chromium through Playwright), beside a stock
admin page: it looks like the admin (same header, breadcrumbs, table and buttons), and approving with a comment
ends the workflow. Screenshots of both go to WORKFLOW_SCREENSHOT_DIR (default /tmp) to look at side by side."""

import os
from pathlib import Path

import pytest

from queue_app.workflows import services
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import WorkflowStep
from tests.support.admin_fixtures import fast_password_hashing_fixture  # noqa: F401
from tests.support.browser_fixtures import browser_page  # noqa: F401, F811 (a fixture)

SHOTS = Path(os.environ.get("WORKFLOW_SCREENSHOT_DIR", "/tmp"))
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
LOOKS = """() => [
  getComputedStyle(document.querySelector('#header')).backgroundColor,
  getComputedStyle(document.querySelector('.breadcrumbs')).backgroundColor,
  getComputedStyle(document.querySelector('#result_list thead th')).backgroundColor,
  getComputedStyle(document.querySelector('#result_list')).borderCollapse,
]"""


def test_approve_in_the_pending_approvals_page_which_looks_like_a_stock_admin_list(
    live_server,
    admin_user,
    browser_page,  # noqa: F811  (the fixture imported above)
):
    g = Graph("refund")
    g.approval("approve", permission="jobsite_workflows.repair_workflow", timeout=3600)
    w = services.start_graph(g)  # no worker needed: the decision settles the step, which ends the workflow
    step_id = WorkflowStep.objects.get(workflow_id=w.id, name="approve").id
    page = browser_page()
    base = live_server.url
    page.goto(f"{base}/admin/")
    page.fill("#id_username", admin_user.username)
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/")

    page.goto(f"{base}/admin/auth/user/")  # a stock list page, for the looks
    stock = page.evaluate(LOOKS)
    page.screenshot(path=str(SHOTS / "stock_admin_list.png"), full_page=True)

    page.goto(f"{base}/admin/jobsite_workflows/workflow/approvals/")
    ours = page.evaluate(LOOKS)
    page.screenshot(path=str(SHOTS / "pending_approvals.png"), full_page=True)
    assert ours == stock
    row = page.locator("#result_list tbody tr", has=page.locator(f'input[name=step][value="{step_id}"]'))
    assert f"refund #{w.id}" in row.inner_text()
    row.locator("input[name=comment]").fill("refund ok")
    row.locator("input[name=decision][value=approve]").click()
    page.wait_for_url("**/admin/jobsite_workflows/workflow/approvals/")
    assert page.locator(".messagelist .success").inner_text() == f"Approved step 'approve' of refund #{w.id}"
    assert "No approval is waiting" in page.locator("#content-main").inner_text()
    page.screenshot(path=str(SHOTS / "pending_approvals_done.png"), full_page=True)
    page.goto(
        f"{base}/admin/jobsite_workflows/workflow/{w.id}/change/"
    )  # no ORM here: Playwright's loop runs in this thread
    assert page.locator("#wf-summary tr").first.inner_text().endswith("succeeded")
