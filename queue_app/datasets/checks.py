"""System checks of the dataset declarations (run by `manage.py check`, `migrate`, `runserver` and every command
that checks the project), so a bad declaration is found before anything runs:

- jobsite.E101: a dataset declared in code and in settings with different partitionings
- jobsite.E102: a dataset's path outside the allowed dataset roots
- jobsite.E103: an invalid freshness policy
- jobsite.E104: a bad static partition key
- jobsite.E105: a settings declaration that cannot be read (it is left out)
- jobsite.E111: a dataset with trigger_producer_when_stale and no freshness policy, or not exactly one producer
- jobsite.E110: a file-arrival watch (watches.py) of an unknown dataset, with a glob outside the roots, or a
  {partition} that does not fit the dataset (it is not checked)
- jobsite.E112: a DATASET_WATCHES entry that cannot be read (it is left out)
- jobsite.E120: a data check (quality.py) of a dataset that is not declared
- jobsite.E121: two data checks of one dataset with the same name (the first declared runs)
- jobsite.E122: a data check with a severity other than warn or error (it never runs)
- jobsite.E123: a DATASET_CHECKS entry that cannot be used: its shape, or a path that cannot be imported (left out)
"""

from __future__ import annotations

from typing import Any

from django.core import checks

from .declarations import Dataset, code_datasets, declared_datasets, settings_datasets
from .locations import LocationError
from .producers import producers_of
from .quality import SEVERITIES, all_checks, settings_checks
from .watches import all_watches, settings_watches
from .watches import problems as watch_problems


def _where(ds: Dataset) -> str:
    return f"dataset {ds.name!r} ({ds.declared_in}: {ds.origin})"


def declaration_errors(ds: Dataset) -> list[checks.CheckMessage]:
    """What is wrong with one declaration: its location, static keys and freshness policy."""
    errors = []
    if ds.location.path:
        try:
            ds.location.resolve()
        except LocationError as exc:
            errors.append(checks.Error(f"{_where(ds)}: {exc}", id="jobsite.E102"))
    errors += [checks.Error(f"{_where(ds)}: {p}", id="jobsite.E104") for p in ds.partitioning.problems()]
    if ds.freshness is not None:
        errors += [
            checks.Error(f"{_where(ds)}: {p}", id="jobsite.E103") for p in ds.freshness.problems(ds.partitioning)
        ]
    return errors


@checks.register("jobsite")
def dataset_declarations(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    code = code_datasets()
    from_settings, unreadable = settings_datasets()
    errors = [
        checks.Error(f"DATASETS[{name!r}] is left out: {why}", id="jobsite.E105") for name, why in unreadable.items()
    ]
    for name in sorted(code.keys() & from_settings.keys()):
        ours, theirs = code[name], from_settings[name]
        if ours.partitioning != theirs.partitioning:
            errors.append(
                checks.Error(
                    f"dataset {name!r} is declared twice with different partitionings: "
                    f"{ours.partitioning.describe()!r} in code ({ours.origin}) and "
                    f"{theirs.partitioning.describe()!r} in settings ({theirs.origin})",
                    hint="a partitioning names the partitions already recorded: keep one, or rename the dataset",
                    id="jobsite.E101",
                )
            )
    for ds in {**code, **from_settings}.values():
        errors += declaration_errors(ds)
    return errors


@checks.register("jobsite")
def data_check_declarations(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    known = declared_datasets()  # finds the modules that declare datasets, and so their checks
    errors = [
        checks.Error(f"{where} is left out: {why}", id="jobsite.E123") for where, why in settings_checks()[1].items()
    ]
    seen = {}
    for item in all_checks():
        where = f"check {item.name!r} of dataset {item.dataset!r} ({item.origin})"
        if item.dataset not in known:
            errors.append(checks.Error(f"{where}: no such dataset is declared", id="jobsite.E120"))
        if (item.dataset, item.name) in seen:
            errors.append(
                checks.Error(
                    f"{where}: the name is taken by the check declared at {seen[item.dataset, item.name]}",
                    hint="results are stored per (materialization, check name): rename one",
                    id="jobsite.E121",
                )
            )
        else:
            seen[item.dataset, item.name] = item.origin
        if item.severity not in SEVERITIES:
            errors.append(
                checks.Error(f"{where}: severity {item.severity!r} is not one of {SEVERITIES}", id="jobsite.E122")
            )
    return errors


@checks.register("jobsite")
def watch_declarations(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    unreadable = [
        checks.Error(f"{where} is left out: {why}", id="jobsite.E112") for where, why in settings_watches()[1].items()
    ]
    return unreadable + [
        checks.Error(f"watch of dataset {w.dataset!r} ({w.origin}): {problem}", id="jobsite.E110")
        for w in all_watches()
        for problem in watch_problems(w)
    ]


@checks.register("jobsite")
def stale_producer_declarations(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """jobsite.E111: a dataset that asks for its producer when stale must be able to go stale and have one."""
    errors = []
    for ds in declared_datasets().values():
        if not ds.trigger_producer_when_stale:
            continue
        if ds.freshness is None:
            errors.append(
                checks.Error(
                    f"{_where(ds)}: trigger_producer_when_stale needs a freshness policy (it never goes stale)",
                    id="jobsite.E111",
                )
            )
        found = producers_of(ds.name)
        if len(found) != 1:
            listed = ", ".join(p.key for p in found)
            errors.append(
                checks.Error(
                    f"{_where(ds)}: trigger_producer_when_stale, but "
                    + (f"several jobs produce it ({listed})" if found else "nothing produces it"),
                    hint="declare produces= on the one Spark job or script that writes it, or "
                    "producer_task(task, produces=[...]) (queue_app.datasets.producers)",
                    id="jobsite.E111",
                )
            )
    return errors
