"""A blocked step says why on its three pages, in a real browser at 1,440 x 900 (issue 50: with the demo's bad
day the step stayed "... has blocking checks still running" after its check failed, the workflow page's error
column was empty, and the Spark run and item pages said "queued · attempt 0").

A workflow's Spark step parked on a partition whose blocking check then fails on its files (a real check run,
as test_datasets_checks.py's client-side test); the workflow, run and item pages then show, visible and not cut
inside their box, that the check failed and the override command, and the run page keeps saying so after its
live part re-renders. Everything that touches the database from the test happens before Playwright starts.
"""

import pytest

from queue_app.datasets.checks_run import run_check
from queue_app.datasets.models import DatasetBlock
from queue_app.spark.runs import _blocked
from tests.support.admin_fixtures import fast_password_hashing_fixture  # noqa: F401 (autouse)
from tests.support.browser_fixtures import (
    browser_page,  # noqa: F401, F811 (a fixture)
    log_in,
)
from tests.support.datasets_checks_fixtures import (
    park_a_step,
    root,  # noqa: F401, F811 (a fixture)
    spark_ctx,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

FAILED = "blocking check no_bad_marker failed on dataset dsc_daily[2026-11-26]"
OVERRIDE = "override with: manage.py dataset override dsc_daily --partition 2026-11-26 --comment"
# The element whose text says `words` (the innermost), whether it is visible, and how much of it its own box or
# any box around it inside #content cuts off sideways.
SHOWN = """words => {
  const all = [...document.querySelectorAll('#content *')].filter(e => e.textContent.includes(words));
  const el = all.filter(e => ![...e.children].some(c => c.textContent.includes(words))).pop();
  if (!el) return null;
  let cut = 0;
  for (let box = el; box && box.id !== 'content'; box = box.parentElement) {
    const style = getComputedStyle(box);
    if (style.overflowX !== 'visible' || style.textOverflow === 'ellipsis')
      cut = Math.max(cut, box.scrollWidth - box.clientWidth);
  }
  const r = el.getBoundingClientRect();
  return {tag: el.tagName, text: el.textContent.trim(), visible: r.width > 0 && r.height > 0, cut};
}"""


def parked_step(data_root, monkeypatch) -> dict:
    """A workflow whose Spark step is parked on dsc_daily[2026-11-26], whose blocking check no_bad_marker then
    failed (a BAD marker in its files) and whose other checks ran: the paths of its three pages."""
    flow, m, step, _ = park_a_step(data_root, monkeypatch)
    run_id = step["spark_run_id"]
    assert _blocked(run_id, spark_ctx(run_id))["state"] == "blocked"
    run_check(m.id, "no_bad_marker")
    run_check(m.id, "enough_rows")
    assert DatasetBlock.objects.get().reason.startswith(f"{FAILED} (materialization {m.id}): a BAD marker")
    return {
        "workflow": f"/admin/jobsite_workflows/workflow/{flow.id}/change/",
        "run": f"/admin/jobsite_spark/sparkrun/{run_id}/change/",
        "item": f"/admin/queue_app/queueitem/{step['item_id']}/change/",
    }


def test_a_blocked_steps_reason_names_the_failed_check_on_the_workflow_run_and_item_pages(
    root,  # noqa: F811
    monkeypatch,
    live_server,
    admin_user,
    browser_page,  # noqa: F811
):
    pages = parked_step(root, monkeypatch)
    page = browser_page()
    page.set_viewport_size({"width": 1440, "height": 900})
    base = live_server.url
    log_in(page, base, admin_user, pages["workflow"])
    for name, path in pages.items():
        page.goto(base + path)
        if name == "run":  # its live part re-rendered from the server once (a queued run is not final)
            with page.expect_response(lambda r: "/live/" in r.url and r.ok):
                pass
        for words in (FAILED, OVERRIDE):
            shown = page.evaluate(SHOWN, words)
            assert shown and shown["visible"] and shown["cut"] <= 1, (name, words, shown)
        body = page.inner_text("#content")
        assert "still running" not in body, name
        if name == "run":
            assert page.inner_text("#run-state") == "blocked" and "attempt 0" not in body
        if name == "item":
            assert "(blocked)" in page.title() or "(blocked)" in body
