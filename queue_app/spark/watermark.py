"""Watermarks of incremental Spark pipelines (SparkWatermark rows): read when a run is triggered, advanced in the
transaction that marks a run succeeded (its job's publish hook), never moved back."""

from __future__ import annotations

import datetime as dt

from ..engine.alias import connection

ADVANCE = """
INSERT INTO queue_app_sparkwatermark (name, value, as_of, run_id, updated_at)
VALUES (%(name)s, %(value)s, %(as_of)s, %(run_id)s, now())
ON CONFLICT (name) DO UPDATE
SET value = GREATEST(queue_app_sparkwatermark.value, EXCLUDED.value),
    as_of = GREATEST(queue_app_sparkwatermark.as_of, EXCLUDED.as_of),
    run_id = CASE WHEN EXCLUDED.value > queue_app_sparkwatermark.value
                  THEN EXCLUDED.run_id ELSE queue_app_sparkwatermark.run_id END,
    updated_at = now()
"""


def read(name: str) -> int | None:
    from .models import SparkWatermark

    return SparkWatermark.objects.filter(name=name).values_list("value", flat=True).first()


def advance(name: str, value: int, as_of: dt.datetime, run_id: int | str | None) -> None:
    """Move `name` forward to `value` (a smaller value, from a re-run of an older window, changes nothing).
    Runs in the caller's transaction."""
    with connection.cursor() as cursor:
        cursor.execute(
            ADVANCE,
            {"name": name, "value": int(value), "as_of": as_of, "run_id": None if run_id is None else int(run_id)},
        )
