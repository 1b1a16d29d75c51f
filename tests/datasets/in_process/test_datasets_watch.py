"""File-arrival watches (issue 38): a glob under the dataset roots, checked by the `queue_app.dataset_watch` task
(the shipped "dataset-watch" schedule), observes each partition once per new set of files; jobsite.E110 reports a
glob outside the roots or a partition segment that does not fit. In-process, real files, real PostgreSQL."""

import os
import threading

import pytest
from django.core import checks
from django.db import connection, transaction

from queue_app.datasets import DynamicPartitions, dataset, dynamic
from queue_app.datasets.declarations import _code
from queue_app.datasets.locations import ROOTS_ENV
from queue_app.datasets.models import Materialization
from queue_app.datasets.watches import _watches, check_watches, watch
from tests.support.waiting import ADVISORY_LOCK_WAITERS, seen_waiting

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def root(tmp_path, monkeypatch):
    data = tmp_path / "data"
    (data / "landing").mkdir(parents=True)
    monkeypatch.setenv(ROOTS_ENV, str(data))
    datasets, watches = set(_code.entries()), list(_watches)
    dataset("dw_events", location="landing/{partition}", partitioning="daily")
    yield data
    for name in set(_code.entries()) - datasets:
        _code.unregister(name)
    _watches[:] = watches


def _land(root, day: str, name: str, text: str = "a,b\n1,2\n") -> None:
    folder = root / "landing" / day
    folder.mkdir(exist_ok=True)
    (folder / name).write_text(text)


def test_each_new_set_of_files_is_observed_once_per_partition(root):
    watch("dw_events", "landing/{partition}/*.csv")
    _land(root, "2026-11-26", "a.csv")
    _land(root, "2026-11-27", "a.csv")
    _land(root, "not-a-day", "a.csv")  # not a partition of the dataset: left out
    _land(root, "2026-11-26", "notes.txt")  # not matched

    first = check_watches()
    assert sorted((m.partition, m.files, m.source) for m in first) == [
        ("2026-11-26", 1, "observed"),
        ("2026-11-27", 1, "observed"),
    ]
    assert check_watches() == []  # the same files: nothing new

    _land(root, "2026-11-26", "b.csv")
    [again] = check_watches()
    assert (again.partition, again.files) == ("2026-11-26", 2)
    assert again.metadata["watch"] == "landing/{partition}/*.csv"
    assert Materialization.objects.filter(dataset="dw_events").count() == 3


def test_two_checks_at_once_observe_a_new_set_once(root):
    """Forced: the first check holds its transaction open once it recorded the new set (and holds the partition's
    advisory lock); the second is seen waiting on that lock (pg_locks), then the first commits and the second finds
    the set already observed. Without the lock the second would not wait, would not see the first's uncommitted
    record, and would record the set again."""
    watch("dw_events", "landing/{partition}/*.csv")
    _land(root, "2026-11-26", "a.csv")
    recorded, release, errors, found = threading.Event(), threading.Event(), [], []

    def first():
        try:
            with transaction.atomic():
                found.append(check_watches())
                recorded.set()
                assert release.wait(30)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
            recorded.set()
        finally:
            connection.close()

    def second():
        try:
            found.append(check_watches())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    holder, other = threading.Thread(target=first), threading.Thread(target=second)
    holder.start()
    assert recorded.wait(30) and not errors, errors
    other.start()
    try:
        seen_waiting(ADVISORY_LOCK_WAITERS, what="the second check waiting for the first's lock")
    finally:
        release.set()
        holder.join(30)
        other.join(30)
    assert errors == []
    assert sorted(len(f) for f in found) == [0, 1]  # one check recorded the set, the other nothing
    assert Materialization.objects.filter(dataset="dw_events").count() == 1


def _e110() -> list[str]:
    return [m.msg for m in checks.run_checks() if m.id == "jobsite.E110"]


def test_a_glob_outside_the_roots_or_without_a_partition_segment_is_a_system_check(root, tmp_path):
    watch("dw_events", "landing/{partition}/*.csv")
    assert _e110() == []
    watch("dw_events", str(tmp_path / "elsewhere" / "{partition}" / "*.csv"))
    watch("dw_events", "landing/*.csv")
    watch("dw_events", "landing/day-{partition}/*.csv")
    watch("dw_nope", "landing/{partition}/*.csv")
    found = _e110()
    assert len(found) == 4, found
    assert any("outside the allowed dataset roots" in m for m in found)
    assert any("needs a {partition} segment" in m for m in found)
    assert any("one whole path segment" in m for m in found)
    assert any("unknown dataset 'dw_nope'" in m for m in found)
    assert check_watches() == [] and not os.path.exists(tmp_path / "elsewhere")  # only the valid watch runs


def test_a_new_folder_becomes_a_key_of_a_dynamic_set_and_a_removed_one_does_not_come_back(root):
    dataset("dw_sources", location="landing/{partition}", partitioning=DynamicPartitions("dw_sources"))
    watch("dw_sources", "landing/{partition}/*.csv")
    _land(root, "acme", "a.csv")
    _land(root, "globex", "a.csv")
    _land(root, "bad key!", "a.csv")  # not a key's shape: left out

    assert sorted(m.partition for m in check_watches()) == ["acme", "globex"]
    assert [k["added_by"] for k in dynamic.list_keys("dw_sources")] == ["watch:landing/{partition}/*.csv"] * 2
    dynamic.remove_keys("dw_sources", ["globex"])
    _land(root, "globex", "b.csv")  # new files in a removed key's folder
    _land(root, "initech", "a.csv")
    assert [m.partition for m in check_watches()] == ["initech"]
    assert [k["key"] for k in dynamic.list_keys("dw_sources")] == ["acme", "initech"]
