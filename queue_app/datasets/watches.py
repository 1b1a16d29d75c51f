"""File-arrival watches: data written outside jobsite, recorded when its files land (issue 38).

    from queue_app.datasets.watches import watch

    watch("events", "landing/{partition}/*.csv")   # a glob under the dataset roots; {partition}: one whole segment

Declared in the modules that declare datasets (an app's datasets.py, DATASET_MODULES), or in the DATASET_WATCHES
setting ([{"dataset": "events", "glob": "landing/{partition}/*.csv"}]; an entry that cannot be read: jobsite.E112).
The shipped "dataset-watch" schedule runs `queue_app.dataset_watch` every minute, which calls check_watches():
for each watch, the files the glob matches (regular files under the roots, at most MAX_FILES), grouped by partition (the
`{partition}` segment, a key of the dataset's partitioning; a segment that is not one is left out), fingerprinted
by their relative paths, sizes and modification times. A partition whose fingerprint differs from the one of its
last watched observation is observed once (services.record_materialization, source `observed`, metadata `watch`
and `watch_fingerprint`): under a transaction-scoped advisory lock per dataset and partition, so two checks at
once (two schedulers, a manual run) observe a new set of files once, and the same set never twice. The system
check jobsite.E110 reports a watch of an unknown dataset, a glob outside the roots, or a `{partition}` that does
not fit the dataset.

A dataset partitioned by one dynamic set (DynamicPartitions): a folder whose name is a key's shape and was never
a key of the set becomes one (dynamic.add_keys, by "watch:GLOB") before its files are observed, in the same
transaction; a key removed from the set is not added back by its folder.
"""

from __future__ import annotations

import glob as globbing
import hashlib
import json
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from queue_app.conf import queue_settings

from ..engine.alias import atomic, connection
from . import partitions
from .declarations import DatasetError, declared_datasets, get_dataset
from .dynamic import add_keys
from .locations import PLACEHOLDER, dataset_roots, within_roots
from .models import Materialization
from .partitions import STATIC_KEY, DynamicPartitions
from .services import record_materialization

logger = logging.getLogger("jobsite.datasets")

MAX_FILES = 10_000  # files one watch looks at per check, at most


@dataclass(frozen=True)
class Watch:
    dataset: str
    glob: str
    origin: str = ""


_watches: list[Watch] = []


def watch(dataset: str, glob: str) -> Watch:
    """Declare a file-arrival watch of `dataset`: files matching `glob` (see the module's docstring)."""
    if not isinstance(glob, str) or not glob.strip() or "\0" in glob:
        raise DatasetError(f"watch of dataset {dataset!r}: a glob is a non-empty path pattern")
    caller = sys._getframe(1)
    found = Watch(dataset, glob, f"{caller.f_globals.get('__name__', '?')}:{caller.f_lineno}")
    if found not in _watches:
        _watches.append(found)
    return found


def all_watches() -> list[Watch]:
    """The watches declared in code, then those of the DATASET_WATCHES setting."""
    declared_datasets()  # imports the modules that declare datasets, and so their watches
    return [*_watches, *settings_watches()[0]]


_parsed: list[Any] = [None, None]  # [the DATASET_WATCHES value last parsed, what it gave]


def settings_watches() -> tuple[list[Watch], dict[str, str]]:
    """The watches the DATASET_WATCHES setting declares ([{"dataset": "events", "glob": "landing/{partition}/*"}]),
    and {"DATASET_WATCHES[i]": why} for entries that cannot be read (jobsite.E112, left out). What depends on the
    dataset and the roots (problems()) is jobsite.E110, as for code. Parsed once per settings object."""
    raw = queue_settings.DATASET_WATCHES
    if _parsed[0] is not raw:
        found, errors = [], {}
        if not isinstance(raw, list | tuple):
            errors["DATASET_WATCHES"] = "a list of watches ([{dataset: ..., glob: ...}, ...])"
            raw_entries = []
        else:
            raw_entries = list(raw)
        for index, entry in enumerate(raw_entries):
            where = f"DATASET_WATCHES[{index}]"
            if not isinstance(entry, Mapping) or set(entry) != {"dataset", "glob"}:
                errors[where] = "a watch is a mapping with exactly the keys 'dataset' and 'glob'"
            elif not isinstance(entry["dataset"], str) or not entry["dataset"]:
                errors[where] = "'dataset' names a declared dataset"
            elif not isinstance(entry["glob"], str) or not entry["glob"].strip() or "\0" in entry["glob"]:
                errors[where] = "'glob' is a non-empty path pattern"
            else:
                found.append(Watch(entry["dataset"], entry["glob"], where))
        _parsed[:] = [raw, (found, errors)]
    return _parsed[1]


def _pattern(w: Watch) -> tuple[str, int | None]:
    """The absolute glob (the placeholder as `*`) and the index of the partition's path segment."""
    roots = dataset_roots()
    text = w.glob if os.path.isabs(w.glob) else os.path.join(roots[0], w.glob)
    text = os.path.normpath(os.path.expanduser(text))
    parts = text.split(os.sep)
    index = parts.index(PLACEHOLDER) if PLACEHOLDER in parts else None
    return text.replace(PLACEHOLDER, "*"), index


def problems(w: Watch) -> list[str]:
    """What is wrong with a watch (jobsite.E110)."""
    try:
        ds = get_dataset(w.dataset)
    except DatasetError as exc:
        return [str(exc)]
    found = []
    pattern, index = _pattern(w)
    fixed = pattern.split(os.sep)
    fixed = fixed[: next((i for i, p in enumerate(fixed) if any(c in p for c in "*?[")), len(fixed))]
    if ".." in w.glob.split("/") or not within_roots(os.path.realpath(os.sep.join(fixed) or os.sep), dataset_roots()):
        found.append(f"glob {w.glob!r} is outside the allowed dataset roots ({':'.join(dataset_roots())})")
    partitioned = ds.partitioning.describe() is not None
    if w.glob.count(PLACEHOLDER) > 1 or (PLACEHOLDER in w.glob and index is None):
        found.append(f"glob {w.glob!r}: {PLACEHOLDER} is one whole path segment, at most once")
    elif partitioned and index is None:
        found.append(f"glob {w.glob!r}: the dataset is partitioned, the glob needs a {PLACEHOLDER} segment")
    elif not partitioned and index is not None:
        found.append(f"glob {w.glob!r}: the dataset is not partitioned, the glob takes no {PLACEHOLDER}")
    return found


def scan(w: Watch) -> dict[str, list[tuple[str, int, int]]]:
    """{partition key: [(path, size, mtime_ns)]} of the files the watch matches now."""
    ds = get_dataset(w.dataset)
    pattern, index = _pattern(w)
    roots = dataset_roots()
    found: dict[str, list[tuple[str, int, int]]] = {}
    for count, path in enumerate(globbing.iglob(pattern, recursive=True)):
        if count >= MAX_FILES:
            logger.warning("watch of %s: more than %s files match %s; the rest wait", w.dataset, MAX_FILES, w.glob)
            break
        real = os.path.realpath(path)
        if not os.path.isfile(real) or not within_roots(real, roots):
            continue
        segment = path.split(os.sep)[index] if index is not None else None
        try:
            key = ds.partition_key(segment)
        except DatasetError:
            if not isinstance(ds.partitioning, DynamicPartitions) or not STATIC_KEY.match(segment or ""):
                continue  # a directory that is not a partition of the dataset
            key = segment  # a new folder: a new key of the dynamic set (_observe adds it)
        stat = os.stat(real)
        found.setdefault(key, []).append((path, stat.st_size, stat.st_mtime_ns))
    return found


def dynamic_lookup_has(part: DynamicPartitions, key: str) -> bool:
    return key in partitions.dynamic_lookup.keys(part.name, [key])


def fingerprint(files: list[tuple[str, int, int]]) -> str:
    return hashlib.sha256(json.dumps(sorted(files)).encode()).hexdigest()


def check_watches() -> list[Materialization]:
    """Observe each watched partition whose set of files is new; returns the materializations recorded."""
    recorded = []
    for w in all_watches():
        if problems(w):
            continue  # jobsite.E110 says why
        for key, files in sorted(scan(w).items()):
            made = _observe(w, key, files)
            if made is not None:
                recorded.append(made)
    return recorded


def _observe(w: Watch, key: str, files: list[tuple[str, int, int]]) -> Materialization | None:
    seen = fingerprint(files)
    with atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"dataset watch {w.dataset} {key}"])
        last = (
            Materialization.objects.filter(dataset=w.dataset, partition=key, metadata__has_key="watch_fingerprint")
            .order_by("-id")
            .values_list("metadata", flat=True)
            .first()
        )
        if last is not None and last.get("watch_fingerprint") == seen:
            return None
        part = get_dataset(w.dataset).partitioning
        new_key = isinstance(part, DynamicPartitions) and not dynamic_lookup_has(part, key)
        if new_key and not add_keys(part.name, [key], by=f"watch:{w.glob}"[:150], never_seen=True):
            return None  # removed from the set: its folder does not bring it back
        return record_materialization(
            w.dataset,
            key,
            files=len(files),
            bytes=sum(size for _, size, _ in files),
            metadata={"watch": w.glob, "watch_fingerprint": seen},
            observed=True,
        )
