"""OpenLineage run events of Spark runs (issue 38), sent by datasets/openlineage.py once the transaction that
moves the run commits: emit_run is registered (from the datasets app's ready()) on the Spark run's hook
state_changed (spark/hooks.py), which spark/runs.py calls inside that transaction. Only a run whose job
produces or consumes datasets emits, and only while OPENLINEAGE is set:

| the run | event |
|---|---|
| claimed by an attempt (`starting`) | START |
| succeeded (with its materializations) | COMPLETE, each output with its rows, bytes and files |
| failed for good, timed out | FAIL, with the error (an errorMessage facet) |
| cancelled | ABORT |

An attempt that fails and is retried sends nothing (the run goes on: the next attempt sends START again, with the
same runId). The job is the Spark job or script (namespace: the setting's `namespace`); inputs and outputs are its
declared datasets (namespace `dataset_namespace`, name the dataset's, a datasource facet with its location, and
the jobsitePartition facet naming the one partition the run writes or reads, with its dimensions);
a run of a workflow's Spark step carries the parent run facet naming the workflow (its name, and a runId stable
for the workflow) and the root facet: the same, or, in a child workflow (a sub-workflow step's), the top of its
parent chain.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ..spark import hooks
from ..spark.models import SparkRun, SparkRunState, SparkTrigger
from ..spark.registry import SparkJobError, SparkParamError, get_job
from ..workflows.models import Workflow, WorkflowStep
from .declarations import DatasetError, get_dataset
from .locations import dataset_roots
from .openlineage import PRODUCER, config, emit_on_commit, enabled, run_id
from .partitions import MultiPartitions, PartitionError
from .spark_runs import consumed_reads, run_partitions

logger = logging.getLogger(__name__)

EVENT_OF_STATE = {
    SparkRunState.STARTING: "START",
    SparkRunState.SUCCEEDED: "COMPLETE",
    SparkRunState.FAILED: "FAIL",
    SparkRunState.TIMED_OUT: "FAIL",
    SparkRunState.CANCELLED: "ABORT",
}


def emit_run(run: SparkRun, state: str, *, outputs: list[Mapping[str, Any]] = (), error: str = "") -> None:
    """Queue the event of `run` entering `state` for after the current transaction commits (nothing for a
    state without one, a job that declares no datasets, or lineage off). Never raises."""
    if not enabled() or state not in EVENT_OF_STATE:
        return
    try:
        event = run_event(run, EVENT_OF_STATE[state], outputs=outputs, error=error)
    except Exception:  # building an event must not fail a run either
        logger.exception("OpenLineage: the %s event of spark run %s could not be built", state, run.id)
        return
    emit_on_commit(event)


def register() -> None:
    """Send a Spark run's events (the datasets app's ready())."""
    hooks.state_changed.register(emit_run)


def run_event(run: SparkRun, event_type: str, *, outputs: list[Mapping[str, Any]] = (), error: str = "") -> Any:
    """The RunEvent of `run` (None when its job declares no datasets or lineage is off)."""
    from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
    from openlineage.client.facet_v2 import (
        datasource_dataset,
        documentation_job,
        error_message_run,
        job_type_job,
        output_statistics_output_dataset,
        processing_engine_run,
    )

    settings = config()
    if settings is None:
        return None
    try:
        spark_job = get_job(run.job)
    except SparkJobError:
        return None
    if not spark_job.produces and not spark_job.consumes:
        return None
    namespace, ds_namespace = settings["namespace"], settings["dataset_namespace"]

    def facets(name: str) -> dict[str, Any]:
        try:
            uri = location_uri(get_dataset(name).location)
        except DatasetError:
            return {}
        return {"dataSource": datasource_dataset.DatasourceDatasetFacet(name=name, uri=uri)}

    figures = {out["dataset"]: out for out in outputs}
    produced, read = _partitions(spark_job, run.params or {})
    written = []
    for ref in spark_job.produces:
        out = figures.get(ref.name)
        stats = {}
        if out and any(out.get(k) is not None for k in ("rows", "bytes", "files")):
            stats["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                rowCount=out.get("rows"), size=out.get("bytes"), fileCount=out.get("files")
            )
        if key := (out or {}).get("partition") or produced.get(ref.name):
            stats["jobsitePartition"] = partition_facet(ref.name, key)
        written.append(
            OutputDataset(namespace=ds_namespace, name=ref.name, facets=facets(ref.name), outputFacets=stats)
        )
    job_facets: dict[str, Any] = {
        "jobType": job_type_job.JobTypeJobFacet(
            processingType="BATCH", integration="SPARK", jobType="SCRIPT" if spark_job.script else "JOB"
        )
    }
    if spark_job.description:
        job_facets["documentation"] = documentation_job.DocumentationJobFacet(description=spark_job.description)
    run_facets: dict[str, Any] = {
        "processing_engine": processing_engine_run.ProcessingEngineRunFacet(
            version="1", name="jobsite", openlineageAdapterVersion="1"
        )
    }
    if parent := _parent(run, namespace):
        run_facets["parent"] = parent
    if event_type == "FAIL" and error:
        run_facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=error[:4000], programmingLanguage="python"
        )
    return RunEvent(
        eventType=RunState[event_type],
        eventTime=dt.datetime.now(dt.UTC).isoformat(),
        run=Run(runId=run_id("spark_run", run.id), facets=run_facets),
        job=Job(namespace=namespace, name=spark_job.name, facets=job_facets),
        inputs=[
            InputDataset(
                namespace=ds_namespace,
                name=ref.name,
                facets=facets(ref.name),
                inputFacets={"jobsitePartition": partition_facet(ref.name, read[ref.name], "input")}
                if ref.name in read
                else {},
            )
            for ref in spark_job.consumes
        ],
        outputs=written,
        producer=PRODUCER,
    )


def _partitions(spark_job: Any, params: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """({dataset: the one partition the run writes}, {dataset: the one partition it reads}) from the run's
    parameters: a dataset written or read whole, or in several partitions (a batched backfill), has none."""
    try:
        produced = {name: keys[0] for name, keys in run_partitions(spark_job, params).items() if len(keys) == 1}
    except SparkParamError:
        produced = {}
    read = {name: key for name, key in consumed_reads(spark_job, params) if key}
    return produced, read


def partition_facet(name: str, key: str, side: str = "output") -> Any:
    """The facet `jobsitePartition` of an output (and of an input: the partition a run reads):
    {"partition": the canonical key, "dimensions": {dimension: key}} (a multi-dimension dataset; {} for one
    dimension), the key as the CLI and the admin print it."""
    try:
        part = get_dataset(name).partitioning
        dimensions = part.parts(key) if isinstance(part, MultiPartitions) else {}
    except (DatasetError, PartitionError):
        dimensions = {}
    return _partition_facet_class(side)(partition=key, dimensions=dimensions, producer=PRODUCER)


@functools.cache
def _partition_facet_class(side: str) -> Any:
    """The facet's class for an "input" or an "output" (each with its side's schema URL)."""
    import attr
    from openlineage.client.generated.base import InputDatasetFacet, OutputDatasetFacet

    base = InputDatasetFacet if side == "input" else OutputDatasetFacet

    @attr.define
    class JobsitePartitionDatasetFacet(base):  # type: ignore[misc,valid-type]
        partition: str
        dimensions: dict

    return JobsitePartitionDatasetFacet


def location_uri(location: Any) -> str:
    """A dataset's location as a URI: table:schema.name as it is; a path as file:// and its directory (the part
    before {partition}), under the first dataset root when relative."""
    if location.table:
        return location.text
    path = location.path
    if "{partition}" in path:
        path = path.split("{partition}")[0].rpartition("/")[0] or "."
    if not os.path.isabs(path):
        path = os.path.join(dataset_roots()[0], path)
    return "file://" + quote(os.path.normpath(path))


def _parent(run: SparkRun, namespace: str) -> Any:
    """The parent run facet of a workflow step's run: the workflow (its name; a runId stable for it); its root
    the top of the workflow's parent chain when it is a child workflow (issue 48: workflows/children.py), else
    the workflow itself."""
    from openlineage.client.facet_v2 import parent_run

    from ..workflows.children import root_of

    if run.trigger != SparkTrigger.WORKFLOW or run.item_id is None:
        return None
    step = WorkflowStep.objects.filter(item_id=run.item_id, spark_run_id=run.id).values("workflow_id").first()
    workflow = Workflow.objects.filter(id=step["workflow_id"]).values("id", "name").first() if step else None
    if workflow is None:
        return None
    workflow_run, workflow_job = run_id("workflow", workflow["id"]), workflow["name"]
    root_id, root_job = root_of(workflow["id"])
    root_run = run_id("workflow", root_id)
    return parent_run.ParentRunFacet(
        run=parent_run.Run(runId=workflow_run),
        job=parent_run.Job(namespace=namespace, name=workflow_job),
        root=parent_run.Root(
            run=parent_run.RootRun(runId=root_run), job=parent_run.RootJob(namespace=namespace, name=root_job)
        ),
    )
