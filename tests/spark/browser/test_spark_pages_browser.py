"""The custom Spark admin pages beside a stock admin page in a real browser: their breadcrumbs are the stock
`ol.breadcrumbs` (same box, colours and font as the item list's) with the app's link, and a failed run's page
says why at the top. No JVM: the run is a row."""

import pytest

from tests.support.admin_fixtures import fast_password_hashing_fixture  # noqa: F401 (autouse)
from tests.support.browser_fixtures import (
    browser_page,  # noqa: F401, F811 (a fixture)
    log_in,
)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
STYLE = """() => { const e = document.querySelector('.breadcrumbs'); const s = getComputedStyle(e);
  return {tag: e.tagName, bg: s.backgroundColor, color: s.color, font: s.fontSize, pad: s.padding,
          items: e.querySelectorAll('li').length, links: [...e.querySelectorAll('a')].map(a => a.textContent)}; }"""


def test_spark_pages_have_the_stock_admin_breadcrumbs_and_a_failure_at_the_top(live_server, admin_user, browser_page):  # noqa: F811
    import datetime as dt

    from django.utils import timezone

    from queue_app.spark.models import SparkRun

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
    log_in(page, base, admin_user, "/admin/queue_app/queueitem/")
    stock = page.evaluate(STYLE)
    assert stock["tag"] == "OL"
    for path, last in (("trigger/", "Trigger"), ("charts/", "Charts"), (f"{run.id}/change/", f"#{run.id}")):
        page.goto(f"{base}/admin/jobsite_spark/sparkrun/{path}")
        mine = page.evaluate(STYLE)
        assert {k: mine[k] for k in ("tag", "bg", "color", "font", "pad")} == {
            k: stock[k] for k in ("tag", "bg", "color", "font", "pad")
        }, path
        # the breadcrumbs name the run's app (jobsite_spark, "Spark"), whose page lists its models
        assert mine["links"] == ["Home", "Spark", "Spark runs"] and mine["items"] == 4
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

    from queue_app.spark.models import SparkRun

    end = timezone.now()
    run = SparkRun.objects.create(
        job="demo_sleep", state="succeeded", started_at=end - dt.timedelta(seconds=42), finished_at=end
    )
    page = browser_page()
    base = live_server.url
    log_in(page, base, admin_user, "/admin/jobsite_spark/sparkrun/charts/")
    page.wait_for_selector("#chart-durations .cartesianlayer .scatterlayer .point")
    # The chart redraws when its box changes size (the admin's sidebar opens after the first draw): hover the
    # point only once the drawing has followed its box, or the point moves under the mouse (a miss under load).
    page.wait_for_function(
        """() => { const f = document.querySelector('#chart-durations');
                   const svg = f && f.querySelector('.main-svg');
                   return svg && Math.abs(svg.getBoundingClientRect().right - f.getBoundingClientRect().right) < 2; }"""
    )
    point = page.wait_for_selector("#chart-durations .cartesianlayer .scatterlayer .point")
    assert "duration (s)" in page.locator("#chart-durations .ytitle").text_content()
    assert "time (UTC)" in page.locator("#chart-durations .xtitle").text_content()
    assert page.locator("#chart-durations .rangeselector .button").count() == 4  # 1h 1d 7d all
    box = point.bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    hover = page.wait_for_selector("#chart-durations .hoverlayer .hovertext")
    text = hover.text_content()
    assert f"demo_sleep run #{run.id} succeeded" in text and "42.0 s" in text  # the point names its job and run
    page.mouse.click(x, y)
    page.wait_for_url(f"**/admin/jobsite_spark/sparkrun/{run.id}/change/")


# Where the charts' parts are: the page's overflow, each chart's drawing against its box, the title's box and
# the range buttons' boxes.
GEOMETRY = """() => {
  const box = e => e.getBoundingClientRect();
  const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const d = document.documentElement;
  return {
    overflow: d.scrollWidth - d.clientWidth,
    charts: [...document.querySelectorAll('figure.plotly-chart')].map(f => ({
      id: f.id, box: Math.round(box(f).right), drawn: Math.round(box(f.querySelector('.main-svg')).right)})),
    titleOverButtons: [...document.querySelectorAll('figure.plotly-chart')].some(f => {
      const title = f.querySelector('.gtitle');
      return title && [...f.querySelectorAll('.rangeselector .button')].some(b => hit(box(title), box(b)));
    }),
  };
}"""


@pytest.mark.parametrize("viewport", [(1440, 900), (1920, 1080)])
def test_the_charts_fit_their_box_at_laptop_and_desktop_widths(live_server, admin_user, browser_page, viewport):  # noqa: F811
    """The charts are drawn in their box (the admin's sidebar opens after the first draw: the chart follows its
    box, not the window), the page never scrolls sideways, and a chart's title is clear of its range buttons."""
    import contextlib
    import datetime as dt

    from django.utils import timezone
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    from queue_app.spark.models import SparkRun

    end = timezone.now()
    for n in range(12):
        finished = end - dt.timedelta(hours=n)
        SparkRun.objects.create(
            job=("file_rollup", "queue_analytics", "demo_sleep")[n % 3],
            state="failed" if n % 5 == 0 else "succeeded",
            started_at=finished - dt.timedelta(seconds=10 + 3 * n),
            finished_at=finished,
        )
    page = browser_page()
    page.set_viewport_size({"width": viewport[0], "height": viewport[1]})
    base = live_server.url
    log_in(page, base, admin_user, "/admin/jobsite_spark/sparkrun/charts/")
    page.wait_for_selector("#chart-durations .scatterlayer .point")
    page.wait_for_selector("#chart-outcomes .barlayer .point")
    with contextlib.suppress(PlaywrightTimeout):  # drawn to their boxes (redrawn after the sidebar opened, if
        page.wait_for_function(  # it did); the asserts below say how, if not
            "() => [...document.querySelectorAll('figure.plotly-chart')].every(f => Math.abs("
            "f.querySelector('.main-svg').getBoundingClientRect().width - f.getBoundingClientRect().width) < 2)"
        )
    geometry = page.evaluate(GEOMETRY)
    assert geometry["overflow"] <= 0, geometry
    assert all(chart["drawn"] <= chart["box"] + 1 for chart in geometry["charts"]), geometry
    assert len(geometry["charts"]) == 2 and not geometry["titleOverButtons"], geometry
