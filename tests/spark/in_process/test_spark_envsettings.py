"""The Spark layer's numeric environment variables (read by queue_app.conf.env_number): a bad value stops the
import that reads it with an error naming the variable, never a bare ValueError, and unset or blank means the
default."""

import os
import subprocess
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from queue_app.conf import env_number


@pytest.mark.parametrize("raw", ["abc", "nan", "inf", "-1", "0"])
def test_a_value_that_is_not_seconds_in_range_is_refused_by_name(monkeypatch, raw):
    monkeypatch.setenv("JOBSITE_SPARK_MAX_TIMEOUT", raw)
    with pytest.raises(
        ImproperlyConfigured, match=rf"^JOBSITE_SPARK_MAX_TIMEOUT='{raw}': expected a number of seconds > 0"
    ):
        env_number("JOBSITE_SPARK_MAX_TIMEOUT", 3600.0, zero_allowed=False, unit=" of seconds")


def test_zero_is_taken_where_allowed_and_unset_or_blank_is_the_default(monkeypatch):
    monkeypatch.setenv("JOBSITE_SPARK_STOP_GRACE", "0")
    assert env_number("JOBSITE_SPARK_STOP_GRACE", 10.0, unit=" of seconds") == 0.0
    monkeypatch.setenv("JOBSITE_SPARK_STOP_GRACE", " 2.5 ")
    assert env_number("JOBSITE_SPARK_STOP_GRACE", 10.0, unit=" of seconds") == 2.5
    monkeypatch.setenv("JOBSITE_SPARK_STOP_GRACE", " ")
    assert env_number("JOBSITE_SPARK_STOP_GRACE", 10.0, unit=" of seconds") == 10.0
    monkeypatch.delenv("JOBSITE_SPARK_STOP_GRACE")
    assert env_number("JOBSITE_SPARK_STOP_GRACE", 10.0, unit=" of seconds") == 10.0


@pytest.mark.parametrize(
    ("module", "variable"),
    [
        ("queue_app.spark.statusapi", "JOBSITE_SPARK_STATUS_API_AFTER"),
        ("queue_app.spark.protocol", "JOBSITE_SPARK_PROGRESS_INTERVAL"),
    ],
)
def test_the_modules_that_read_them_stop_at_import_with_the_named_error(module, variable):
    # A fresh interpreter: these modules read their variable once, as they are imported (the Spark child imports
    # protocol without Django's set-up, so this is the import it does).
    env = {**os.environ, variable: "soon"}
    done = subprocess.run([sys.executable, "-c", f"import {module}"], env=env, capture_output=True, text=True)
    assert done.returncode == 1
    assert f"ImproperlyConfigured: {variable}='soon': expected a number of seconds" in done.stderr
