"""Every jobsite admin page at a laptop's window (1,440 x 900) in a real browser (headless Debian Chromium through
Playwright, as test_admin_browser.py), with rows shaped like the demo's after a day (tests/support/pages_fixtures.py):
the queue overview's heads each on one line, no table wider than its box on any list or detail page, the
partition grid showing the range that exists with its failed partition, the charts' axes and legends, and the
words a reader needs (a check's kind, a delivery's last error). Issue 50's page findings.

Everything that touches the database from the test itself happens before Playwright starts (its sync API keeps
an event loop running in this thread, and Django refuses ORM calls there).
"""

import datetime as dt
import os
from pathlib import Path

import pytest
from django.contrib import admin
from django.utils import timezone

from tests.support.admin_fixtures import JOBSITE_LABELS, fast_password_hashing_fixture  # noqa: F401 (autouse)
from tests.support.admin_fixtures import url as admin_url
from tests.support.browser_fixtures import (
    browser_page,  # noqa: F401, F811 (a fixture)
    log_in,
)
from tests.support.pages_fixtures import DEMO_DAYS, REFUSAL, seed

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SHOTS = Path(os.environ.get("PAGES_SCREENSHOT_DIR", "/tmp"))

# Each head of the overview: its text, how many lines its text takes (distinct tops of its text's boxes), its
# width; and the table's width.
HEADS = """() => {
  const table = document.querySelector('#queue-overview table');
  const heads = [...table.querySelectorAll('thead th')].map(th => {
    const range = document.createRange(); range.selectNodeContents(th);
    const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
    return {text: th.textContent.trim(), lines: tops.size, width: th.getBoundingClientRect().width};
  });
  return {heads, table: table.getBoundingClientRect().width};
}"""
# Every table of the page's content wider than the box that holds it (its own overflow, or past the content's
# right edge), and the page's sideways scroll.
MISFITS = """() => {
  const content = document.querySelector('#content').getBoundingClientRect();
  const tables = [...document.querySelectorAll('#content table')].filter(t => t.offsetParent !== null).map(t => {
    const box = t.parentElement;
    return {table: t.id || t.className || box.id || box.className, width: Math.round(t.getBoundingClientRect().width),
            box: box.clientWidth, over: box.scrollWidth - box.clientWidth,
            past: Math.round(t.getBoundingClientRect().right - content.right)};
  }).filter(t => t.over > 1 || t.past > 1);
  const d = document.documentElement;
  return d.scrollWidth > d.clientWidth ? [...tables, {page: d.scrollWidth - d.clientWidth}] : tables;
}"""
# The page's plotly charts drawn to their boxes (the admin's sidebar opens after the first draw; the charts follow).
CHARTS_DRAWN = """() => [...document.querySelectorAll('figure.plotly-chart')].every(f => {
  const svg = f.querySelector('.main-svg');
  return svg && Math.abs(svg.getBoundingClientRect().width - f.getBoundingClientRect().width) < 2; })"""
FIRST_ROW = """() => { const a = document.querySelector('#result_list tbody tr a[href*="/change/"]');
  return a && a.href; }"""


def misfits_of(page) -> list:
    """MISFITS, once the page's charts (if any) are drawn to their boxes."""
    if page.locator("figure.plotly-chart").count():
        page.wait_for_function(CHARTS_DRAWN)
    return page.evaluate(MISFITS)


def jobsite_models() -> list[str]:
    return sorted(m._meta.model_name for m in admin.site._registry if m._meta.app_label in JOBSITE_LABELS)


def test_the_overview_heads_are_one_line_and_no_jobsite_page_has_a_table_wider_than_its_box(
    live_server,
    admin_user,
    browser_page,  # noqa: F811
):
    ids = seed()
    models = jobsite_models()
    page = browser_page()
    page.set_viewport_size({"width": 1440, "height": 900})
    base = live_server.url
    log_in(page, base, admin_user, "/admin/")

    overview = page.evaluate(HEADS)
    page.screenshot(path=str(SHOTS / "pages-overview.png"), full_page=True)
    assert [h["text"] for h in overview["heads"] if h["lines"] != 1] == [], overview  # "R E A D Y" no more
    queue = overview["heads"][0]
    assert queue["text"] == "Queue" and queue["width"] < 0.3 * overview["table"], overview
    assert misfits_of(page) == []

    misfits, visited = {}, []
    extra = [
        f"/admin/jobsite_workflows/workflow/{ids['workflow']}/change/",
        "/admin/jobsite_spark/sparkrun/charts/",
        "/admin/jobsite_datasets/dataset/demo.events/change/",
        "/admin/jobsite_datasets/dataset/demo.events/lineage/",
    ]
    for model in models:
        pages = [admin_url(model)]
        for path in pages:
            page.goto(base + path)
            found = misfits_of(page)
            if found:
                misfits[path] = found
            visited.append(path)
            row = page.evaluate(FIRST_ROW) if path == pages[0] else None
            if row:
                pages.append(row.removeprefix(base))
    for path in extra:
        page.goto(base + path)
        if found := misfits_of(page):
            misfits[path] = found
        visited.append(path)
    assert misfits == {}
    changed = [p for p in visited if p.endswith("/change/")]
    assert len(changed) >= len(models), visited  # a detail page of every model with rows (and the extra ones)


def test_the_partition_grid_shows_the_range_that_exists_with_its_failed_day_and_the_chart_labels_its_axes(
    live_server,
    admin_user,
    browser_page,  # noqa: F811
):
    from jobsite.demo.data import BAD_DAY
    from tests.support.pages_fixtures import datasets, spark_runs

    datasets(spark_runs()[0])
    page = browser_page()
    page.set_viewport_size({"width": 1440, "height": 900})
    base = live_server.url
    log_in(page, base, admin_user, "/admin/jobsite_datasets/dataset/demo.events/change/")

    grid = page.locator("#ds-partitions")
    failed = grid.locator(f'a.state-failed-checks[href="?partition={BAD_DAY.isoformat()}"]')
    assert failed.count() == 1  # the failed day of January 2025, on the grid
    assert grid.locator("a").count() == DEMO_DAYS + 1  # the days materialized (yesterday's the last complete)
    assert grid.locator("a.state-missing").count() == 0
    gap = grid.locator("span.state-gap")
    assert gap.count() == 1 and "missing" in gap.inner_text()  # the hundreds of days between, as one cell
    settled(page, "#chart-materializations")
    page.screenshot(path=str(SHOTS / "pages-dataset.png"), full_page=True)
    axes = page.evaluate(AXES, "#chart-materializations")
    assert axes["y"]["title"] == "bytes" and axes["y"]["ticks"], axes  # observed: bytes, not an empty rows axis
    assert axes["clipped"] == [] and axes["overlaps"] == [], axes

    page.goto(f"{base}/admin/jobsite_datasets/dataset/demo.rollup/change/")
    settled(page, "#chart-materializations")
    axes = page.evaluate(AXES, "#chart-materializations")
    assert axes["y"]["title"] == "rows" and axes["y"]["ticks"], axes
    assert axes["y2"]["title"] == "bytes" and axes["y2"]["ticks"], axes
    assert axes["clipped"] == [] and axes["overlaps"] == [], axes


def settled(page, chart: str) -> None:
    """Wait until plotly drew `chart` at its box's width: the page's ResizeObserver redraws a chart whose box
    changed after its first draw (the sidebar opening), and a measure taken before that redraw sees the first
    draw's labels outside the box."""
    page.wait_for_selector(f"{chart} .main-svg")
    page.wait_for_function(
        """chart => { const root = document.querySelector(chart), svg = root.querySelector('.main-svg');
                      return svg && Math.abs(svg.getBoundingClientRect().width - root.clientWidth) < 2; }""",
        arg=chart,
    )


# A chart's y axes (title, tick labels), the labels drawn outside the figure's box, and the legend's overlaps
# with tick labels.
AXES = """chart => {
  const root = document.querySelector(chart), box = root.getBoundingClientRect();
  const r = e => e.getBoundingClientRect();
  const hit = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
  const axis = name => ({title: (root.querySelector('.g-' + name + 'title') || {}).textContent || null,
                         ticks: [...root.querySelectorAll('.' + name + 'tick text')].map(t => t.textContent)
                                .filter(Boolean)});
  const labels = [...root.querySelectorAll('.xtick text, .ytick text, .y2tick text, .g-ytitle, .g-y2title')];
  const clipped = labels.filter(t => { const b = r(t); return b.width && (b.left < box.left - 1 ||
    b.right > box.right + 1 || b.top < box.top - 1 || b.bottom > box.bottom + 1); }).map(t => t.textContent);
  const legend = root.querySelector('.legend');
  const overlaps = legend ? labels.filter(t => hit(r(legend), r(t))).map(t => t.textContent) : [];
  return {y: axis('y'), y2: axis('y2'), clipped, overlaps};
}"""
# The durations chart's legend entries (job, colour) and its failed runs' point symbols; a bar chart's time range
# (ms) and its one bar's width against the plot's.
DURATIONS = """() => {
  const f = document.querySelector('#chart-durations');
  return {legend: [...f.querySelectorAll('.legend .traces')].map(t => [t.textContent,
                    getComputedStyle(t.querySelector('path.js-line')).stroke]),
          symbols: f._fullData.map(d => [d.name, d.marker.symbol, d.marker.color])};
}"""
ONE_HOUR = """chart => {
  const f = document.querySelector(chart), axis = f._fullLayout.xaxis, range = axis.range.map(x => axis.r2l(x));
  const bar = f.querySelector('.barlayer .point path'), plot = f.querySelector('.nsewdrag');
  return {hours: (range[1] - range[0]) / 3600e3, bar: bar && bar.getBoundingClientRect().width,
          plot: plot.getBoundingClientRect().width,
          ticks: [...f.querySelectorAll('.xtick text')].map(t => t.textContent)};
}"""


def test_checks_say_blocking_or_warn_deliveries_say_why_and_the_charts_have_a_range_and_colour_by_job(
    live_server,
    admin_user,
    browser_page,  # noqa: F811
):
    from queue_app.spark.models import QueueStatsHourly
    from tests.support.pages_fixtures import datasets, spark_runs, webhooks

    datasets(spark_runs()[0])
    webhooks()
    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - dt.timedelta(hours=2)
    QueueStatsHourly.objects.create(
        queue="mail", task="t.mail", hour=hour, processed=40, failed=2, wait_p95=0.2, run_p95=1.5
    )
    page = browser_page()
    page.set_viewport_size({"width": 1440, "height": 900})
    base = live_server.url
    log_in(page, base, admin_user, "/admin/jobsite_datasets/datasetcheckresult/")

    kinds = page.locator("#result_list td.field-blocking_shown")
    assert set(kinds.all_inner_texts()) == {"blocking", "warn"}  # words: a warn check is no red cross
    assert page.locator("#result_list td.field-blocking_shown img").count() == 0
    warn = page.locator("#result_list tr", has_text="every_region").first
    assert warn.locator("td.field-blocking_shown").inner_text() == "warn"

    page.goto(f"{base}/admin/jobsite_webhooks/webhookdelivery/")
    refused = page.locator(f'#result_list td.field-last_error_short .cut[title="{REFUSAL}"]')
    assert refused.count() == 1 and refused.inner_text().startswith("refused: localhost")
    refused.locator("xpath=ancestor::tr").locator("th a, td a").first.click()
    assert page.locator(".field-last_error_shown .readonly").inner_text().strip() == REFUSAL  # whole on its page

    page.goto(f"{base}/admin/jobsite_spark/sparkrun/charts/?queue=mail")
    page.wait_for_selector("#chart-durations .scatterlayer .point")
    page.wait_for_selector("#chart-processed .barlayer .point")
    page.screenshot(path=str(SHOTS / "pages-charts.png"), full_page=True)
    durations = page.evaluate(DURATIONS)
    jobs = [name for name, _ in durations["legend"]]
    assert sorted(jobs) == ["demo_analytics", "demo_rollup", "demo_sleep"], durations  # the legend: the jobs
    assert len({colour for _, colour in durations["legend"]}) == 3, durations  # one colour each, not all green
    points = {name: colour for name, _, colour in durations["symbols"]}
    assert all(isinstance(c, str) for c in points.values()) and len(set(points.values())) == 3, durations
    rollup = next(s for s in durations["symbols"] if s[0] == "demo_rollup")
    assert "x" in rollup[1] and "circle" in rollup[1], durations  # its failed run's symbol, beside the succeeded
    for chart in ("#chart-processed", "#chart-p95"):
        settled(page, chart)
        one = page.evaluate(ONE_HOUR, chart)
        assert one["hours"] >= 6, one  # not a millisecond either side of the one hour
        assert all(":59.999" not in t and ":00.001" not in t for t in one["ticks"]), one
        if one["bar"] is not None:
            assert one["bar"] < 0.25 * one["plot"], one  # one bar is an hour wide, not the chart's width
