"""`manage.py spark_sample_data`: the file_rollup job's sample input, exactly as many rows as asked for."""

import csv
import io
import json

import pytest
from django.core.management import CommandError, call_command

from queue_app.spark.pipelines.file_rollup import SAMPLE_COLUMNS


def test_csv_sample_has_the_requested_rows_spread_over_the_days(tmp_path):
    out = io.StringIO()
    call_command("spark_sample_data", "--output", str(tmp_path), "--rows", "1001", "--days", "2", stdout=out)
    assert "wrote 1001 rows over 2 day(s) from 2025-01-01 into 2 csv file(s)" in out.getvalue()
    per_day = {}
    for path in sorted(tmp_path.iterdir()):
        with open(path) as f:
            rows = list(csv.DictReader(f))
        assert list(rows[0]) == list(SAMPLE_COLUMNS)
        per_day[path.name] = {r["event_date"] for r in rows}, len(rows)
    assert per_day == {
        "events-2025-01-01-0000.csv": ({"2025-01-01"}, 501),
        "events-2025-01-02-0000.csv": ({"2025-01-02"}, 500),
    }


def test_json_sample_is_json_lines_and_the_same_for_the_same_seed(tmp_path):
    for name in ("a", "b"):
        call_command(
            "spark_sample_data",
            "--output",
            str(tmp_path / name),
            "--rows",
            "10",
            "--days",
            "1",
            "--format",
            "json",
            "--start",
            "2025-06-01",
            "--files-per-day",
            "2",
            stdout=io.StringIO(),
        )
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == ["events-2025-06-01-0000.json", "events-2025-06-01-0001.json"]
    lines = (tmp_path / "a" / files[0]).read_text().splitlines()
    assert len(lines) == 5 and set(json.loads(lines[0])) == set(SAMPLE_COLUMNS)
    assert (tmp_path / "a" / files[0]).read_text() == (tmp_path / "b" / files[0]).read_text()


def test_bad_sizes_are_refused(tmp_path):
    with pytest.raises(CommandError, match="days and files_per_day >= 1"):
        call_command("spark_sample_data", "--output", str(tmp_path), "--days", "0", stdout=io.StringIO())
