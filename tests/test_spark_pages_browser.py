"""The custom Spark admin pages beside a stock admin page in a real browser: their breadcrumbs are the stock
`ol.breadcrumbs` (same box, colours and font as the item list's) with the app's link, and a failed run's page
says why at the top. No JVM: the run is a row."""

import pytest

from tests.admin_fixtures import fast_password_hashing_fixture  # noqa: F401 (autouse)
from tests.test_admin_browser import browser_page  # noqa: F401 (fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
STYLE = """() => { const e = document.querySelector('.breadcrumbs'); const s = getComputedStyle(e);
  return {tag: e.tagName, bg: s.backgroundColor, color: s.color, font: s.fontSize, pad: s.padding,
          items: e.querySelectorAll('li').length, links: [...e.querySelectorAll('a')].map(a => a.textContent)}; }"""


def test_spark_pages_have_the_stock_admin_breadcrumbs_and_a_failure_at_the_top(live_server, admin_user, browser_page):  # noqa: F811
    import datetime as dt

    from django.utils import timezone

    from queue_app.models import SparkRun

    end = timezone.now()
    run = SparkRun.objects.create(
        job="demo_sleep",
        state="failed",
        error="RuntimeError: demo_sleep failed on purpose",
        started_at=end - dt.timedelta(seconds=42),
        finished_at=end,
    )
    page = browser_page()
    base = live_server.url
    page.goto(f"{base}/admin/login/?next=/admin/queue_app/queueitem/")
    page.fill("#id_username", admin_user.username)
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_url("**/admin/queue_app/queueitem/")
    stock = page.evaluate(STYLE)
    assert stock["tag"] == "OL"
    for path, last in (("trigger/", "Trigger"), ("charts/", "Charts"), (f"{run.id}/change/", f"#{run.id}")):
        page.goto(f"{base}/admin/queue_app/sparkrun/{path}")
        mine = page.evaluate(STYLE)
        assert {k: mine[k] for k in ("tag", "bg", "color", "font", "pad")} == {
            k: stock[k] for k in ("tag", "bg", "color", "font", "pad")
        }, path
        assert mine["links"] == ["Home", "Queue", "Spark runs"] and mine["items"] == 4
        assert page.locator(".breadcrumbs li").last.inner_text() == last
    failure = page.locator("#run-failure")
    assert failure.inner_text() == "Failed: RuntimeError: demo_sleep failed on purpose"
    top = page.evaluate("() => document.querySelector('#run-failure').getBoundingClientRect().top")
    assert top < page.evaluate("() => document.querySelector('table.bars').getBoundingClientRect().top")


def test_the_charts_have_units_hover_values_a_time_range_and_click_through_to_a_run(
    live_server,
    admin_user,
    browser_page,  # noqa: F811
):
    import datetime as dt

    from django.utils import timezone

    from queue_app.models import SparkRun

    end = timezone.now()
    run = SparkRun.objects.create(
        job="demo_sleep", state="succeeded", started_at=end - dt.timedelta(seconds=42), finished_at=end
    )
    page = browser_page()
    base = live_server.url
    page.goto(f"{base}/admin/login/?next=/admin/queue_app/sparkrun/charts/")
    page.fill("#id_username", admin_user.username)
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    point = page.wait_for_selector("#chart-durations .cartesianlayer .scatterlayer .point")
    assert "duration (s)" in page.locator("#chart-durations .ytitle").text_content()
    assert "time (UTC)" in page.locator("#chart-durations .xtitle").text_content()
    assert page.locator("#chart-durations .rangeselector .button").count() == 4  # 1h 1d 7d all
    box = point.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    hover = page.wait_for_selector("#chart-durations .hoverlayer .hovertext")
    text = hover.text_content()
    assert f"run #{run.id} succeeded" in text and "42.0 s" in text
    page.mouse.click(x, y)
    page.wait_for_url(f"**/admin/queue_app/sparkrun/{run.id}/change/")
