"""The dataset pages in a real browser (headless Debian Chromium through Playwright), beside a stock admin page:
the Datasets list, a dataset's page with its partition grid, its rows/bytes chart drawn by plotly.js (served by
the admin) and its lineage drawn by Graphviz. Screenshots go to DATASET_SCREENSHOT_DIR (default /tmp) to look at
side by side."""

import datetime as dt
import os
import re
from pathlib import Path

import pytest
from django.utils import timezone

from queue_app.datasets.models import Materialization
from queue_app.datasets.services import record_materialization
from queue_app.datasets.sync import sync_datasets
from tests.support.admin_fixtures import fast_password_hashing_fixture  # noqa: F401
from tests.support.browser_fixtures import browser_page  # noqa: F401, F811 (a fixture)
from tests.tasks import datasets_declared, datasets_lineage_declared  # noqa: F401  (declare the datasets and jobs)

SHOTS = Path(os.environ.get("DATASET_SCREENSHOT_DIR", "/tmp"))
pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
STYLE = (
    "() => [getComputedStyle(document.querySelector('#header')).backgroundColor,"
    " getComputedStyle(document.querySelector('.breadcrumbs')).backgroundColor,"
    " getComputedStyle(document.querySelector('#content h1')).fontSize]"
)


def test_the_dataset_pages_draw_their_chart_and_lineage_and_look_like_the_admin(
    live_server,
    admin_user,
    browser_page,  # noqa: F811  (the fixture imported above)
):
    sync_datasets()
    now = timezone.now()
    for days in range(12, 0, -1):
        if days == 5:
            continue  # a missing day in the grid
        m = record_materialization("ln_daily", rows=1000 + 37 * days, bytes=50_000 + 900 * days, spark_run_id=days)
        Materialization.objects.filter(id=m.id).update(at=now - dt.timedelta(days=days))
    page = browser_page()
    base = live_server.url
    page.goto(f"{base}/admin/")
    page.fill("#id_username", admin_user.username)
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_url(f"{base}/admin/")

    page.goto(f"{base}/admin/auth/group/")
    stock = page.evaluate(STYLE)
    page.screenshot(path=str(SHOTS / "stock_admin.png"), full_page=True)

    page.goto(f"{base}/admin/jobsite_datasets/dataset/")
    assert page.locator("#result_list tbody tr").count() >= 8
    assert page.evaluate(STYLE) == stock
    page.screenshot(path=str(SHOTS / "datasets_list.png"), full_page=True)

    # the whole suite's modules declare more datasets than a page holds (50): find it as a user would, by search
    page.goto(f"{base}/admin/jobsite_datasets/dataset/?q=ln_daily")
    page.click("#result_list a:text-is('ln_daily')")
    # the admin quotes "_", and keeps the list's search in the link (?_changelist_filters=...)
    page.wait_for_url(re.compile(r".*/admin/jobsite_datasets/dataset/ln_5Fdaily/change/(\?.*)?$"))
    page.wait_for_selector("#chart-materializations .main-svg")  # plotly.js drew it
    assert page.locator("#chart-materializations .legend .traces").count() == 2  # rows and bytes
    assert page.locator("#ds-lineage svg g.node").count() == 8  # 5 datasets, 3 jobs within two hops
    assert page.locator("#ds-partitions a").count() == 1
    assert page.evaluate(STYLE) == stock
    page.screenshot(path=str(SHOTS / "dataset_page.png"), full_page=True)

    page.click("a:text-is('Lineage')")
    page.wait_for_url("**/ln_daily/lineage/")
    assert page.locator("#ds-lineage svg g.node").count() == 8  # not ln_side (a sibling, neither up nor down)
    assert "ln_side" not in page.locator("#ds-lineage svg").text_content()
    page.screenshot(path=str(SHOTS / "dataset_lineage.png"), full_page=True)
