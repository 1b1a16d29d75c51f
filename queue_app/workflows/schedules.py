"""Workflows as schedule targets (hooks.schedule_targets["workflow"]): a schedule of kind "workflow" starts its
workflow with its payload as the params, in the fire's transaction (no item id); the schedule form refuses an
unknown workflow or params it would refuse."""

from __future__ import annotations

from typing import Any

from ..hooks import ScheduleTarget
from .definition import UnknownWorkflow, WorkflowError, get_workflow


def fire(schedule: Any) -> int | None:
    from . import services

    services.start(schedule.target, schedule.payload, started_by=f"schedule {schedule.name}")
    return None


def problems(target: str, payload: Any) -> list[tuple[str, Any, str]]:
    try:
        get_workflow(target).validate(payload if isinstance(payload, dict) else {})
    except UnknownWorkflow as exc:
        return [("target", str(exc), "unknown_workflow")]
    except WorkflowError as exc:
        return [("payload", str(exc), "invalid_payload")]
    return []


TARGET = ScheduleTarget(fire=fire, problems=problems)
