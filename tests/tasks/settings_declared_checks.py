"""A check function and a pandera schema named by dotted path in the DATASET_CHECKS setting
(tests/datasets/in_process/test_datasets_settings_declared.py and the chaos trigger scenario's settings-free twin)."""

import pandera.pandas as pa

from queue_app.datasets.quality import CheckResult

SALES = pa.DataFrameSchema(
    {"region": pa.Column(str, pa.Check.isin(["eu", "us"])), "amount": pa.Column(float, pa.Check.ge(0))}
)
NOT_A_SCHEMA = 42


def has_rows(part):
    rows = part.materialization.rows or 0
    return CheckResult(rows > 0, figures={"rows": rows}, message="" if rows else "an empty partition")
