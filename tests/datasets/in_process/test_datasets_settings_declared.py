"""Data checks and file-arrival watches declared in settings (DATASET_CHECKS, DATASET_WATCHES), as datasets can
be: a check by the dotted path of a function or of a pandera schema, a watch by dataset and glob. They run as
code's do (a failing schema check on a real CSV blocks; a watch observes new files once), and bad entries are
system-check errors: an unknown dataset (E120, E110), a glob outside the roots (E110), a path that cannot be
imported or is not a function or schema (E123), a watch entry of the wrong shape (E112). In-process, real
PostgreSQL, real files."""

import pandas as pd
import pytest
from django.test import override_settings

from queue_app.datasets.checks import data_check_declarations, watch_declarations
from queue_app.datasets.checks_run import run_check
from queue_app.datasets.locations import ROOTS_ENV
from queue_app.datasets.models import Materialization
from queue_app.datasets.quality import checks_for
from queue_app.datasets.services import record_materialization
from queue_app.datasets.watches import check_watches

DATASETS = {
    "sd_sales": {"location": "sales/day={partition}", "partitioning": "daily"},
    "sd_landing": {"location": "landing/{partition}", "partitioning": "daily"},
}
CHECKS = [
    {"dataset": "sd_sales", "schema": "tests.tasks.settings_declared_checks.SALES", "fmt": "csv"},
    {"dataset": "sd_sales", "function": "tests.tasks.settings_declared_checks.has_rows", "severity": "warn"},
]
WATCHES = [{"dataset": "sd_landing", "glob": "landing/{partition}/*.csv"}]


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path))
    return tmp_path


@pytest.mark.django_db
def test_settings_checks_run_like_code_ones_and_settings_watches_observe_new_files(root):
    with override_settings(JOBSITE={"DATASETS": DATASETS, "DATASET_CHECKS": CHECKS, "DATASET_WATCHES": WATCHES}):
        assert [e for e in data_check_declarations() + watch_declarations() if "sd_" in e.msg] == []
        declared = {c.name: c for c in checks_for("sd_sales")}
        assert {n: (c.on, c.severity, c.blocking, c.origin) for n, c in declared.items()} == {
            "schema": ("pandas", "error", True, "DATASET_CHECKS[0]"),
            "has_rows": ("partition", "warn", False, "DATASET_CHECKS[1]"),
        }
        day = root / "sales/day=2026-11-26"
        day.mkdir(parents=True)
        pd.DataFrame({"region": ["eu", "asia"], "amount": [1.0, -2.0]}).to_csv(day / "part-0.csv", index=False)
        bad = record_materialization("sd_sales", "2026-11-26", rows=2)
        assert bad.checks == "pending"
        assert run_check(bad.id, "has_rows")["checks"] == "pending"  # the warn check passed; the schema waits
        assert run_check(bad.id, "schema")["checks"] == "failed"
        assert Materialization.objects.get(id=bad.id).checks == "failed"

        (root / "landing/2026-11-26").mkdir(parents=True)
        (root / "landing/2026-11-26/a.csv").write_text("a\n1\n")
        [seen] = check_watches()
        assert (seen.dataset, seen.partition, seen.files, seen.source) == ("sd_landing", "2026-11-26", 1, "observed")
        assert check_watches() == []  # the same files: nothing new


def test_bad_settings_checks_and_watches_are_system_check_errors(root, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    checks = [
        {"dataset": "sd_nowhere", "function": "tests.tasks.settings_declared_checks.has_rows"},
        {"dataset": "sd_sales", "function": "tests.no_such_module.check"},
        {"dataset": "sd_sales", "schema": "tests.tasks.settings_declared_checks.NOT_A_SCHEMA"},
        {"dataset": "sd_sales", "function": "tests.tasks.settings_declared_checks.has_rows", "schema": "x.y"},
        {"dataset": "sd_sales", "function": "has_rows"},
        {"dataset": "sd_sales", "function": "tests.tasks.settings_declared_checks.has_rows", "severity": "fatal"},
        {"dataset": "sd_sales", "function": "tests.tasks.settings_declared_checks.has_rows", "typo": 1},
    ]
    watches = [
        {"dataset": "sd_nowhere", "glob": "landing/{partition}/*.csv"},
        {"dataset": "sd_landing", "glob": f"{outside}/{{partition}}/*.csv"},
        {"dataset": "sd_landing", "glob": "../{partition}/*.csv"},
        {"dataset": "sd_landing"},
        "landing/*",
    ]
    with override_settings(JOBSITE={"DATASETS": DATASETS, "DATASET_CHECKS": checks, "DATASET_WATCHES": watches}):
        found = [(e.id, e.msg) for e in data_check_declarations() + watch_declarations()]
    by_id = {}
    for check_id, message in found:
        by_id.setdefault(check_id, []).append(message)
    e123 = "\n".join(by_id.pop("jobsite.E123"))
    assert "DATASET_CHECKS[1] is left out: 'function' 'tests.no_such_module.check' cannot be imported" in e123
    assert "DATASET_CHECKS[2] is left out: 'tests.tasks.settings_declared_checks.NOT_A_SCHEMA' is not a pandera" in e123
    assert "DATASET_CHECKS[3] is left out: give one of 'function'" in e123
    assert "DATASET_CHECKS[4] is left out: 'function' is a dotted path" in e123
    assert "DATASET_CHECKS[6] is left out: unknown keys typo" in e123
    assert by_id.pop("jobsite.E120") == [
        "check 'has_rows' of dataset 'sd_nowhere' (DATASET_CHECKS[0]): no such dataset is declared"
    ]
    assert by_id.pop("jobsite.E122") == [
        "check 'has_rows' of dataset 'sd_sales' (DATASET_CHECKS[5]): severity 'fatal' is not one of ('warn', 'error')"
    ]
    e110 = "\n".join(by_id.pop("jobsite.E110"))
    assert "watch of dataset 'sd_nowhere' (DATASET_WATCHES[0]): unknown dataset 'sd_nowhere'" in e110
    assert "(DATASET_WATCHES[1]): glob " in e110 and "is outside the allowed dataset roots" in e110
    assert "(DATASET_WATCHES[2]): glob '../{partition}/*.csv' is outside the allowed dataset roots" in e110
    e112 = by_id.pop("jobsite.E112")
    assert e112 == [
        "DATASET_WATCHES[3] is left out: a watch is a mapping with exactly the keys 'dataset' and 'glob'",
        "DATASET_WATCHES[4] is left out: a watch is a mapping with exactly the keys 'dataset' and 'glob'",
    ]
    assert by_id == {}
