"""OpenLineage (issue 38): a workflow whose Spark step produces and consumes datasets sends START and COMPLETE
run events to a real HTTP receiver on loopback, through the openlineage-python client, after the transactions
that move the run commit: schema-valid, with the step's inputs and outputs (and the output's figures), the job's
facets and the parent run facet naming the workflow. With the receiver down, the next workflow still succeeds and
each event is dropped, logged and counted on /metrics. A run reading and writing `day|region` partitions (issue 48)
names each partition in the `jobsitePartition` facet with its dimensions, at START and COMPLETE.

One spark-submit per workflow (a script that starts no Spark session: the cheapest real run), the handler
executed in this process under a real reservation of its item, as a worker would.
"""

import datetime as dt
import json
import re
import socket
import uuid

import pytest
from django.test import Client

from queue_app.datasets import MultiPartitions, StaticPartitions, dataset
from queue_app.datasets.declarations import _code
from queue_app.datasets.locations import ROOTS_ENV
from queue_app.datasets.models import Materialization
from queue_app.datasets.openlineage import dropped_count, flush, run_id
from queue_app.spark.models import SparkRun
from queue_app.spark.registry import _jobs
from queue_app.spark.runs import trigger_run
from queue_app.spark.scripts import ROOTS_ENV as SCRIPT_ROOTS_ENV
from queue_app.spark.scripts import register_script
from queue_app.workflows import services
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import Workflow
from tests.support.datasets_spark_helpers import run_handler
from tests.support.paths import SPARK_SCRIPTS
from tests.support.spark_fixtures import require_spark
from tests.support.webhook_receiver import start_receiver

pytestmark = [pytest.mark.spark, pytest.mark.django_db(transaction=True)]
SCRIPTS = SPARK_SCRIPTS
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@pytest.fixture
def flow(tmp_path, monkeypatch):
    require_spark()
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv(ROOTS_ENV, str(root))
    monkeypatch.setenv(SCRIPT_ROOTS_ENV, str(SCRIPTS))
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
    datasets_before, jobs_before = set(_code.entries()), set(_jobs.entries())
    dataset("ol_events", location="table:raw.events", partitioning="daily")
    dataset("ol_touched", location="touched/day={partition}", partitioning="daily")
    register_script(
        "ol_touch",
        path=str(SCRIPTS / "touch_partition.py"),
        args=[f"{root}/touched/day={{day}}"],
        params=[{"name": "day", "type": "date", "required": True}],
        consumes=["ol_events"],
        produces={"ol_touched": "day"},
        policy={"attempts": 1},
    )

    def run_workflow() -> Workflow:
        graph = Graph("ol_nightly")
        graph.spark("ol_touch", {"day": "2026-11-26"})
        workflow = services.start_graph(graph, started_by="test")
        [run] = SparkRun.objects.filter(job="ol_touch").order_by("-id")[:1]
        assert run_handler(run.id)["state"] == "succeeded", SparkRun.objects.get(id=run.id).log_tail
        workflow.refresh_from_db()
        return workflow

    yield run_workflow
    for name in set(_jobs.entries()) - jobs_before:
        _jobs.unregister(name)
    for name in set(_code.entries()) - datasets_before:
        _code.unregister(name)


def lineage(settings, url: str) -> None:
    settings.JOBSITE = {
        **settings.JOBSITE,
        "OPENLINEAGE": {"transport": {"type": "http", "url": url, "timeout": 3}, "namespace": "shop"},
    }


def assert_facet(facet: dict) -> None:
    assert facet["_producer"].startswith("https://") and facet["_schemaURL"].startswith("https://openlineage.io/")


def assert_schema_valid(event: dict) -> None:
    """The RunEvent's required fields and formats (the OpenLineage 2-0-2 schema; the client ships no schema file)."""
    assert event["eventType"] in ("START", "RUNNING", "COMPLETE", "ABORT", "FAIL", "OTHER")
    assert dt.datetime.fromisoformat(event["eventTime"]).tzinfo is not None
    assert event["producer"].startswith("https://")
    assert event["schemaURL"].startswith("https://openlineage.io/spec/") and event["schemaURL"].endswith("RunEvent")
    assert UUID.match(event["run"]["runId"])
    assert event["job"]["namespace"] and event["job"]["name"]
    for ds in event["inputs"] + event["outputs"]:
        assert ds["namespace"] and ds["name"]
        for facet in [
            *ds["facets"].values(),
            *ds.get("inputFacets", {}).values(),
            *ds.get("outputFacets", {}).values(),
        ]:
            assert_facet(facet)
    for facet in [*event["run"]["facets"].values(), *event["job"]["facets"].values()]:
        assert_facet(facet)


def test_a_workflow_spark_step_sends_its_run_events_and_a_receiver_down_fails_nothing(flow, settings):
    receiver = start_receiver()
    try:
        lineage(settings, f"http://127.0.0.1:{receiver.server.server_address[1]}")
        workflow = flow()
        assert flush(10)
        events = [json.loads(r.body) for r in receiver.wait_for(2)]
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()

    assert workflow.state == "succeeded"
    assert {r.path for r in receiver.requests} == {"/api/v1/lineage"}
    start, complete = events
    run = SparkRun.objects.get(job="ol_touch")
    for event in events:
        assert_schema_valid(event)
        assert event["run"]["runId"] == run_id("spark_run", run.id)  # one run: the same id at each event
        assert (event["job"]["namespace"], event["job"]["name"]) == ("shop", "ol_touch")
        assert event["job"]["facets"]["jobType"]["processingType"] == "BATCH"
        assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [("jobsite", "ol_events")]
        assert [(d["namespace"], d["name"]) for d in event["outputs"]] == [("jobsite", "ol_touched")]
        parent = event["run"]["facets"]["parent"]
        assert parent["job"] == {"namespace": "shop", "name": "ol_nightly", "facets": {}}
        assert parent["run"]["runId"] == run_id("workflow", workflow.id) == parent["root"]["run"]["runId"]
    assert (start["eventType"], complete["eventType"]) == ("START", "COMPLETE")
    assert start["inputs"][0]["facets"]["dataSource"]["uri"] == "table:raw.events"
    assert complete["outputs"][0]["facets"]["dataSource"]["uri"].startswith("file:///")
    m = Materialization.objects.get(spark_run_id=run.id)
    assert complete["outputs"][0]["outputFacets"]["outputStatistics"] == {
        **complete["outputs"][0]["outputFacets"]["outputStatistics"],
        "fileCount": m.files,
        "size": m.bytes,
    }
    assert uuid.UUID(start["run"]["runId"]).version == 5

    # The receiver down: nothing listens on the port. The workflow succeeds; both events are dropped and counted.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    lineage(settings, f"http://127.0.0.1:{port}")
    assert dropped_count() == 0

    second = flow()

    assert second.state == "succeeded"
    assert flush(30)
    assert dropped_count() == 2
    metrics = Client().get("/metrics").content.decode()
    assert "jobsite_openlineage_events_dropped_total 2.0" in metrics


def test_a_run_of_day_region_partitions_names_them_with_their_dimensions(flow, settings, tmp_path):
    """The facet docs/how-to/datasets.md gives: the canonical key and {"dimensions": {"day": ..., "region": ...}},
    on the output the run writes and the input it reads, at START (from the run's parameters) and COMPLETE."""
    regions = MultiPartitions(day="daily", region=StaticPartitions(["eu", "us"]))
    dataset("ol_orders", location="table:raw.orders", partitioning=regions)
    dataset("ol_regional", location="regional/key={partition}", partitioning=regions)
    register_script(
        "ol_touch_regions",
        path=str(SCRIPTS / "touch_partition.py"),
        args=[f"{tmp_path}/data/regional/key={{day}}|{{region}}"],
        params=[{"name": "day", "type": "date", "required": True}, {"name": "region", "type": "str", "required": True}],
        consumes={"ol_orders": "day|region"},
        produces={"ol_regional": "day|region"},
        policy={"attempts": 1},
    )
    receiver = start_receiver()
    try:
        lineage(settings, f"http://127.0.0.1:{receiver.server.server_address[1]}")
        run = trigger_run("ol_touch_regions", {"day": "2026-11-30", "region": "eu"}, trigger="orm")
        assert run_handler(run.id)["state"] == "succeeded", SparkRun.objects.get(id=run.id).log_tail
        assert flush(10)
        events = [json.loads(r.body) for r in receiver.wait_for(2)]
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()

    assert [e["eventType"] for e in events] == ["START", "COMPLETE"]
    assert Materialization.objects.get(spark_run_id=run.id).partition == "2026-11-30|eu"
    expected = {"partition": "2026-11-30|eu", "dimensions": {"day": "2026-11-30", "region": "eu"}}
    for event in events:
        assert_schema_valid(event)
        [written], [read] = event["outputs"], event["inputs"]
        assert (written["name"], read["name"]) == ("ol_regional", "ol_orders")
        for side, facet in (
            ("Output", written["outputFacets"]["jobsitePartition"]),
            ("Input", read["inputFacets"]["jobsitePartition"]),
        ):
            assert {k: v for k, v in facet.items() if not k.startswith("_")} == expected, event
            assert facet["_schemaURL"].endswith(f"#/$defs/{side}DatasetFacet")  # the spec's facet of its side
