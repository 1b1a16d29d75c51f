"""Spark jobs as schedule targets (hooks.schedule_targets["spark"]): a schedule of kind "spark" fires one run of
its job with its payload as the params (trigger "schedule"), in the fire's transaction; the schedule form refuses
an unknown job or params the job would refuse."""

from __future__ import annotations

from typing import Any

from ..hooks import ScheduleTarget
from ..registries import shown_names
from .registry import SparkParamError, UnknownSparkJob, all_jobs, get_job


def fire(schedule: Any) -> int | None:
    from .runs import trigger_run  # the runs module registers the run task; imported when a schedule fires

    run = trigger_run(schedule.target, schedule.payload, trigger="schedule", requested_by=f"schedule {schedule.name}")
    return run.item_id


def problems(target: str, payload: Any) -> list[tuple[str, Any, str]]:
    try:
        job = get_job(target)
    except UnknownSparkJob:
        known = shown_names([job.name for job in all_jobs()])
        return [("target", f"No Spark job named {target!r}. Registered Spark jobs: {known}.", "unknown_job")]
    try:
        job.validate(payload if payload is not None else {})
    except SparkParamError as exc:
        lines = [f"{name}: {message}" if name != "__all__" else message for name, message in sorted(exc.errors.items())]
        return [("payload", [f"Invalid params for Spark job {target!r}:", *lines], "invalid_params")]
    return []


TARGET = ScheduleTarget(fire=fire, problems=problems)
