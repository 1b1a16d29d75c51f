"""Lineage (issue 38): the graph of datasets and the jobs between them from the jobs' declarations
(queue_app/datasets/lineage.py), and `manage.py dataset lineage NAME --json` as a real process: the exact
fields, depth, and exit status 1 for an unknown dataset."""

import json

import pytest

from queue_app.datasets import graph
from queue_app.datasets.lineage import LineageGraph
from queue_app.datasets.spark_runs import users
from tests.tasks import datasets_lineage_declared  # noqa: F401  (declares in this process what the children --import)

IMPORT = ("--import", "tests.tasks.datasets_lineage_declared")


@pytest.mark.django_db
def test_upstream_downstream_and_jobs_follow_the_declarations_to_a_depth():
    graph = LineageGraph(users())

    whole = graph.neighbourhood("ln_daily")
    assert whole.upstream == ["ln_clean", "ln_raw", "ln_regions"]
    assert whole.downstream == ["ln_report"]
    assert whole.jobs == ["ln_agg_job", "ln_clean_job", "ln_report_job"]
    assert ("job:ln_agg_job", "dataset:ln_daily") in whole.edges
    assert ("dataset:ln_raw", "job:ln_clean_job") in whole.edges

    near = graph.neighbourhood("ln_daily", depth=1)
    assert (near.upstream, near.downstream, near.jobs) == (
        ["ln_clean", "ln_regions"],
        ["ln_report"],
        ["ln_agg_job", "ln_report_job"],
    )
    source = graph.neighbourhood("ln_raw")
    assert source.upstream == [] and source.downstream == ["ln_clean", "ln_daily", "ln_report", "ln_side"]


def test_a_cycle_is_walked_once_and_a_big_neighbourhood_is_cut():
    loop = LineageGraph(
        {
            "a": {"producers": ["j2"], "consumers": ["j1"]},
            "b": {"producers": ["j1"], "consumers": ["j2"]},
            "self": {"producers": ["j3"], "consumers": ["j3"]},
        }
    )
    seen = loop.neighbourhood("a")
    assert (seen.upstream, seen.downstream, seen.jobs) == (["b"], ["b"], ["j1", "j2"])
    itself = loop.neighbourhood("self")
    assert (itself.upstream, itself.downstream, itself.jobs) == ([], [], ["j3"])

    fan = LineageGraph(
        {"root": {"consumers": [f"j{i}" for i in range(100)]}} | {f"d{i}": {"producers": [f"j{i}"]} for i in range(100)}
    )
    cut = fan.neighbourhood("root", max_nodes=51)
    assert cut.truncated and len(cut.jobs) + len(cut.downstream) + 1 == 51


@pytest.mark.django_db
def test_a_drawing_reuses_the_layout_of_the_same_graph_and_shows_the_freshness_of_now():
    seen = LineageGraph(users()).neighbourhood("ln_daily", depth=1)
    links = {"dataset_url": lambda name: f"/ds/{name}/", "job_url": lambda job: f"/runs/?job={job}"}
    first = graph.svg(seen, {"ln_daily": {"freshness": "stale", "checks": "failed"}}, **links)
    laid_out = graph.layout(seen, **links)

    again = graph.svg(
        seen, {"ln_daily": {"freshness": "fresh", "last_materialized": "2026-11-27T05:00:00+00:00"}}, **links
    )

    assert graph.layout(seen, **links) is laid_out  # the same layout, from the cache
    assert "freshness&#45;stale" in first and "#fbe3e1" in first and "checks failed" in first
    assert "freshness&#45;fresh" in again and "freshness&#45;stale" not in again and "#dff2dc" in again
    assert "last materialized 2026-11-27T05:00:00+00:00" in again
    assert "freshness&#45;unknown" in again  # ln_regions: no summary
    assert not graph.PLACEHOLDER.search(again)
    wider = LineageGraph(users()).neighbourhood("ln_daily", depth=2)
    assert graph.fingerprint(wider, **links) != graph.fingerprint(seen, **links)


@pytest.mark.django_db(transaction=True)
def test_lineage_json_prints_the_exact_fields_and_an_unknown_dataset_exits_1(manage):
    done = manage("dataset", *IMPORT, "lineage", "ln_clean", "--json")

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "dataset": "ln_clean",
        "upstream": ["ln_raw"],
        "downstream": ["ln_daily", "ln_report"],
        "jobs": ["ln_agg_job", "ln_clean_job", "ln_report_job"],
    }

    for args, message in (
        (("lineage", "ln_dialy"), "unknown dataset 'ln_dialy' (did you mean 'ln_daily'?)"),
        (("lineage", "ln_daily", "--depth", "0", "--json"), "--depth must be at least 1"),
    ):
        bad = manage("dataset", *IMPORT, *args)
        assert bad.returncode == 1 and message in bad.stderr and "Traceback" not in bad.stderr
