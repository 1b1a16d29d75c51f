"""A Spark run's trace spans (issue 40), on the core's tracer (queue_app/engine/tracing.py): the run's attempt, and
its Spark jobs and stages from its event log. Called only when `tracing.enabled` (spark/runs.py checks the flag).
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace

from ..engine import tracing


@contextmanager
def spark_run(run_id: int, job: str, attempt: int) -> Iterator[trace.Span]:
    """The span of one Spark run's attempt, under the current one (the spark_run item's attempt)."""
    with tracing.tracer.start_as_current_span(
        f"spark run {job}",
        attributes={"jobsite.spark_run_id": run_id, "jobsite.spark_job": job, "jobsite.attempt": attempt},
    ) as span:
        yield span


def spark_timeline(run_span: trace.Span, timeline: list[dict[str, Any]]) -> None:
    """Child spans of a Spark run from its event log (eventlog.timeline): a span per Spark job under the run's,
    and per stage under its job's (the run's when its job is unknown), at the driver's times."""
    parent = trace.set_span_in_context(run_span)
    job_spans: dict[int, trace.Span] = {}
    for entry in sorted(timeline, key=lambda e: (e["kind"] != "job", e["start"])):
        context = parent
        if entry["kind"] == "stage" and entry.get("job") in job_spans:
            context = trace.set_span_in_context(job_spans[entry["job"]])
        attributes = {f"spark.{entry['kind']}_id": entry["id"]}
        if entry.get("tasks") is not None:
            attributes["spark.tasks"] = entry["tasks"]
        span = tracing.tracer.start_span(
            entry["name"], context=context, start_time=int(entry["start"] * 1e9), attributes=attributes
        )
        if not entry.get("ok", True):
            span.set_status(trace.StatusCode.ERROR)
        if entry["kind"] == "job":
            job_spans[entry["id"]] = span
        else:
            span.end(end_time=int(entry["end"] * 1e9))
    for entry in timeline:  # jobs end after their stages were started under them
        if entry["kind"] == "job":
            job_spans[entry["id"]].end(end_time=int(entry["end"] * 1e9))
