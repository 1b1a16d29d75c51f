"""The idle path's floor on bare PostgreSQL (jobsite/bench/idle_floor.py), at a toy size: three figures in ms,
each step after an idle pause, the full path's stages adding up to it, and nothing left behind."""

import psycopg
import pytest
from django.db import connection

from jobsite.bench import idle_floor

pytestmark = pytest.mark.django_db(transaction=True)


def _connect() -> psycopg.Connection:
    params = {**connection.get_connection_params(), "autocommit": True, "prepare_threshold": 0}
    return psycopg.connect(**params)


def test_the_floor_times_a_round_trip_a_durable_commit_and_the_whole_path_after_a_pause():
    figures = {f.key: f for f in idle_floor.measure(_connect, samples=12, pause=0.01)}

    trip, commit, start = (figures[f"ceiling.idle_{name}"] for name in ("round_trip", "commit", "start"))
    assert all(f.unit == "ms" and f.value > 0 and f.detail["samples"] == 12 for f in (trip, commit, start))
    assert trip.detail["idle"]["p50_ms"] <= trip.detail["idle"]["p99_ms"]
    # The whole path is a commit, a notification and a lease: each stage at most the total, their p50s near it.
    stages = [start.detail[name]["p50_ms"] for name in ("commit", "notify", "lease")]
    assert all(0 < s <= start.detail["total"]["p99_ms"] for s in stages)
    assert start.value >= start.detail["commit"]["p50_ms"]
    assert "commit" in start.note and "lease" in start.note and "back to back" in trip.note
    with connection.cursor() as cur:
        cur.execute("SELECT to_regclass(%s)", [idle_floor.TABLE])
        assert cur.fetchone()[0] is None  # its table is dropped
