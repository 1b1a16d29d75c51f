"""How a dataset's checks run and settle its materializations, one function per state change:

- start(): in the transaction that records a materialization (services.record_materialization), one pending
  result row per declared check and one `queue_app.dataset_check` item per check, run by ordinary workers. The
  materialization's `checks` state was written with it: `pending` when the dataset has a blocking check (its
  consumers wait), else `none`; a usable one is announced (triggers.materialization_usable) in that transaction.
- record_check_result(): one check's result, stored under the materialization's row lock; the transaction that
  stores the last one settles the state (`failed` when a blocking check failed, `warned` when another did,
  else `passed`) and, when a pending materialization becomes usable, announces it.
- override_failed_checks(): someone with the `jobsite_datasets.override_dataset_check` permission makes a `failed`
  materialization usable (`overridden`), logged as an admin LogEntry with their comment.
- unusable(): what holds a consumer back: the latest materializations of the partitions it reads whose checks
  are pending or failed.
- park() and, when a materialization becomes usable, release: a consumer's queue item that met an unusable
  partition is handed back to the queue and parked (a DatasetBlock row per partition); the transaction that
  makes a materialization of that partition usable (recorded without blocking checks, its last blocking check
  passed, or overridden) deletes the rows and makes the items due at once (services.retry_now). No polling: a
  park that raced with the release is re-checked after park_recheck() seconds (DATASET_PARK_RECHECK), its safety net.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.db.models.functions import Now

from queue_app import services as queue_services
from queue_app.conf import queue_settings
from queue_app.registry import Context, Retry, job

from ..engine.alias import atomic, connection
from . import quality, triggers
from .declarations import Dataset, DatasetError, get_dataset
from .models import USABLE_CHECK_STATES, CheckState, DatasetBlock, DatasetCheckResult, Materialization
from .sql import CHECKS_PENDING, LOCK_MATERIALIZATIONS, RELEASE_BLOCKS, REWRITE_BLOCKS, UNUSABLE

logger = logging.getLogger("jobsite.datasets")

TASK = "queue_app.dataset_check"
PERMISSION = "jobsite_datasets.override_dataset_check"
MAX_FIGURES_BYTES = 16_384


def park_recheck() -> float:
    """Seconds a parked item waits before it checks again, should its release have been missed (the setting
    DATASET_PARK_RECHECK, 600 by default)."""
    return float(queue_settings.DATASET_PARK_RECHECK)


def initial_state(checks: list[quality.DataCheck]) -> str:
    """A new materialization's checks state: pending while a blocking check has not run, else none."""
    return CheckState.PENDING if any(c.blocking for c in checks) else CheckState.NONE


def start(materialization: Materialization, checks: list[quality.DataCheck], released: list[int]) -> None:
    """In the recording transaction: the pending results, the check items; for a usable materialization, the
    parked consumers its record released (sql.RECORD deleted their rows) made due, and the announcement."""
    if checks:
        with connection.cursor() as cursor:
            cursor.execute(
                CHECKS_PENDING,
                [
                    materialization.id,
                    materialization.dataset,
                    materialization.partition,
                    [c.name for c in checks],
                    [c.severity for c in checks],
                    [c.blocking for c in checks],
                ],
            )
        dataset_check.enqueue_many([{"materialization_id": materialization.id, "check": c.name} for c in checks])
    if materialization.checks == CheckState.PENDING:
        # Items parked on the partition now wait for this one's checks (named: nothing to read back).
        rewrite_blocks(materialization, [c.name for c in checks if c.blocking])
    if materialization.checks in USABLE_CHECK_STATES:
        _release(materialization, released)
        triggers.materialization_usable(materialization)


def became_usable(materialization: Materialization) -> None:
    """In the transaction that makes a recorded `materialization` usable (its last blocking check passed, or
    an override): release the items parked on its partition, and announce it to the data-aware triggers."""
    with connection.cursor() as cursor:
        cursor.execute(RELEASE_BLOCKS, [materialization.dataset, materialization.partition])
        items = sorted({row[0] for row in cursor.fetchall()})
    _release(materialization, items)
    triggers.materialization_usable(materialization)


def _release(materialization: Materialization, items: list[int]) -> None:
    if items:
        queue_services.retry_now(items)
        logger.info(
            "dataset %s[%s] usable: released parked items %s", materialization.dataset, materialization.partition, items
        )


def park(item_id: int, reads: list[tuple[str, str | None]], *, spark_run_id: int | None = None) -> list[Unusable]:
    """In the transaction that hands queue item `item_id` back to the queue (engine.release with park_recheck()):
    of the (dataset, partition) pairs it reads, those not usable, each recorded as a DatasetBlock row with its
    reason; returns them (empty: nothing holds it, no row written). Their latest materializations are read under
    a KEY SHARE lock, so a check result committing meanwhile is either seen here or waits for this transaction
    and then rewrites the reasons written here (record_check_result); a release that committed before is seen."""
    locked: set[int] = set()
    found = unusable(reads)
    while {u.materialization_id for u in found} - locked:
        ids = sorted({u.materialization_id for u in found} - locked)
        with connection.cursor() as cursor:
            cursor.execute(LOCK_MATERIALIZATIONS, [ids])
        locked.update(ids)
        found = unusable(reads)  # read again under the locks
    # Its rows of an earlier park go only now: deleted before the locks, they would be row locks a check result
    # holding one of those materializations could wait on while this waits on it.
    DatasetBlock.objects.filter(item_id=item_id).delete()
    DatasetBlock.objects.bulk_create(
        [
            DatasetBlock(
                item_id=item_id,
                spark_run_id=spark_run_id,
                dataset=u.dataset,
                partition=u.partition,
                materialization_id=u.materialization_id,
                reason=u.reason(),
            )
            for u in found
        ]
    )
    return found


def rewrite_blocks(materialization: Materialization, running: list[str] | None = None) -> None:
    """In the transaction that changes what holds the partition of `materialization` back (a blocking check's
    result stored, a new materialization recorded with blocking checks to run: `running`, their names), under its
    row lock: the reason of every item parked on that partition, when it is the partition's latest. A usable one
    deletes the rows instead (became_usable)."""
    held = Unusable(materialization.dataset, materialization.partition, materialization.id, materialization.checks)
    [held] = [replace(held, running=tuple(sorted(running)))] if running is not None else _described([held])
    with connection.cursor() as cursor:
        cursor.execute(
            REWRITE_BLOCKS,
            [
                held.materialization_id,
                held.reason(),
                held.dataset,
                held.partition,
                materialization.at,
                materialization.id,
            ],
        )


def unpark(item_id: int) -> None:
    """The item runs: forget what parked it before."""
    DatasetBlock.objects.filter(item_id=item_id).delete()


def blocked_items(item_ids: Iterable[int]) -> dict[int, str]:
    """{item id: why it is parked} of the given items that are parked."""
    found: dict[int, list[str]] = {}
    for item_id, reason in DatasetBlock.objects.filter(item_id__in=list(item_ids)).values_list("item_id", "reason"):
        found.setdefault(item_id, []).append(reason)
    return {item_id: "; ".join(reasons) for item_id, reasons in found.items()}


def settled_state(results: Iterable[tuple[bool, bool]]) -> str:
    """The state once every check ran, from (passed, blocking) pairs."""
    results = list(results)
    if any(not passed and blocking for passed, blocking in results):
        return CheckState.FAILED
    return CheckState.WARNED if any(not passed for passed, _ in results) else CheckState.PASSED


def _figures(figures: Any) -> dict[str, Any]:
    if figures is None:
        return {}
    if not isinstance(figures, dict):
        raise DatasetError(f"a check's figures are a mapping, not {type(figures).__name__}")
    text = json.dumps(figures, default=lambda v: v.item() if hasattr(v, "item") else str(v), allow_nan=False)
    if len(text) > MAX_FIGURES_BYTES:
        raise DatasetError(f"a check's figures are {len(text)} bytes as JSON; at most {MAX_FIGURES_BYTES}")
    return json.loads(text)


def record_check_result(
    materialization_id: int, check: str, *, passed: bool, figures: dict[str, Any] | None = None, message: str = ""
) -> str:
    """Store one check's result (once: a repeated call changes nothing) and, when it is the last, settle the
    materialization's checks state; returns that state. DatasetError for a check the materialization has not."""
    figures = _figures(figures)
    with atomic():
        m = Materialization.objects.select_for_update().filter(id=materialization_id).first()
        if m is None:
            raise DatasetError(f"no materialization {materialization_id}")
        rows = DatasetCheckResult.objects.filter(materialization_id=m.id)
        stored = rows.filter(check_name=check, passed__isnull=True).update(
            passed=bool(passed), figures=figures, message=str(message)[: quality.MAX_MESSAGE], at=Now()
        )
        if not stored:
            if not rows.filter(check_name=check).exists():
                raise DatasetError(f"materialization {m.id} of {m.dataset!r} has no check {check!r}")
            return m.checks  # stored already: a re-delivered check item
        results = list(rows.values_list("passed", "blocking"))
        if any(p is None for p, _ in results) or m.checks not in (CheckState.PENDING, CheckState.NONE):
            if m.checks == CheckState.PENDING:
                rewrite_blocks(m)  # the items parked on it say which checks failed or still run
            return m.checks
        was_usable = m.checks in USABLE_CHECK_STATES
        m.checks = settled_state(results)
        m.save(update_fields=["checks"])
        if not was_usable and m.checks in USABLE_CHECK_STATES:
            became_usable(m)
        elif m.checks == CheckState.FAILED:
            rewrite_blocks(m)  # the items parked on it name the failed check and the override
    logger.info("dataset %s[%s] materialization %s: checks %s", m.dataset, m.partition, m.id, m.checks)
    return m.checks


def run_check(materialization_id: int, check: str) -> dict[str, Any]:
    """Run one check of a materialization (outside any transaction: it may read files for minutes) and record
    its result. A check no longer declared, or a dataset no longer declared, is a failed result saying so."""
    m = Materialization.objects.filter(id=materialization_id).first()
    pending = DatasetCheckResult.objects.filter(materialization_id=materialization_id, check_name=check)
    if m is None or not pending.filter(passed__isnull=True).exists():
        return {"materialization_id": materialization_id, "check": check, "state": "nothing to run"}
    item = quality.get_check(m.dataset, check)
    try:
        ds: Dataset | None = get_dataset(m.dataset)
    except DatasetError as exc:
        ds, result = None, quality.CheckResult(False, {}, str(exc))
    if ds is not None and item is None:
        result = quality.CheckResult(False, {}, f"check {check!r} of dataset {m.dataset!r} is no longer declared")
    elif ds is not None:
        result = quality.run(item, quality.Partition(ds, m.partition, m))
    try:
        state = record_check_result(m.id, check, passed=result.passed, figures=result.figures, message=result.message)
    except DatasetError as exc:  # figures that cannot be stored: the check fails, saying why
        result = quality.CheckResult(False, {}, str(exc))
        state = record_check_result(m.id, check, passed=False, message=result.message)
    return {"materialization_id": m.id, "check": check, "passed": result.passed, "checks": state}


@job(TASK, retry=Retry(times=3), hard_timeout=1800.0)
def dataset_check(payload: Any, ctx: Context) -> dict[str, Any]:
    """Run one check of one materialization (payload {"materialization_id": id, "check": name})."""
    return run_check(int(payload["materialization_id"]), str(payload["check"]))


def latest(dataset: str, partition: str) -> Materialization:
    """The newest materialization of a partition (canonical key); DatasetError when there is none."""
    found = Materialization.objects.filter(dataset=dataset, partition=partition).order_by("-at", "-id").first()
    if found is None:
        raise DatasetError(f"dataset {dataset!r} has no materialization of partition {partition!r}")
    return found


def may_override(user: Any) -> bool:
    return bool(user is not None and user.is_active and user.has_perm(PERMISSION))


def override_failed_checks(user: Any, materialization: Materialization | int, comment: str) -> Materialization:
    """Make a materialization whose blocking checks failed usable (`overridden`): `user` must hold
    jobsite_datasets.override_dataset_check (PermissionDenied otherwise), `comment` says why; logged as a LogEntry.
    DatasetError, nothing written, when it is not `failed`."""
    if not may_override(user):
        raise PermissionDenied(f"overriding failed dataset checks needs the {PERMISSION} permission")
    comment = (comment or "").strip()
    if not comment:
        raise DatasetError("an override needs a comment saying why")
    pk = materialization.id if isinstance(materialization, Materialization) else materialization
    with atomic():
        m = Materialization.objects.select_for_update().filter(id=pk).first()
        if m is None:
            raise DatasetError(f"no materialization {pk}")
        if m.checks != CheckState.FAILED:
            raise DatasetError(
                f"materialization {m.id} of {m.dataset}[{m.partition}]: its checks are {m.checks}, not failed; "
                "nothing to override"
            )
        m.checks = CheckState.OVERRIDDEN
        m.save(update_fields=["checks"])
        LogEntry.objects.log_actions(
            user_id=user.pk,
            queryset=Materialization.objects.filter(pk=m.pk),
            action_flag=CHANGE,
            change_message=f"Overrode the failed checks of {m.dataset}[{m.partition}]: {comment[:1000]}",
        )
        became_usable(m)
    logger.warning(
        "dataset %s[%s] materialization %s: failed checks overridden by %s", m.dataset, m.partition, m.id, user
    )
    return m


@dataclass(frozen=True)
class Unusable:
    dataset: str
    partition: str
    materialization_id: int
    checks: str  # pending or failed
    failed: tuple[tuple[str, str], ...] = ()  # its blocking checks that failed: (name, message)
    running: tuple[str, ...] = ()  # its blocking checks that have not run yet

    def reason(self) -> str:
        """Why a consumer of the partition waits, naming the checks, and what to do about it."""
        where = f"{self.dataset}[{self.partition}]" if self.partition else self.dataset
        what = f"dataset {where} (materialization {self.materialization_id})"
        running = f"blocking check{'s' if len(self.running) > 1 else ''} {', '.join(self.running)} still running"
        if not self.failed:
            return f"{what}: {running if self.running else 'its checks still running (the blocking ones passed)'}"
        names = ", ".join(name for name, _ in self.failed)
        said = "; ".join(
            f"{name}: {message}" if len(self.failed) > 1 else message for name, message in self.failed if message
        )
        text = f"blocking check{'s' if len(self.failed) > 1 else ''} {names} failed on {what}" + (
            f": {said}" if said else ""
        )
        if self.checks != CheckState.FAILED:  # the override waits for the other checks
            return f"{text}; {running if self.running else 'its other checks still running'}"
        partition = f" --partition {self.partition}" if self.partition else ""
        return (
            f"{text}; materialize it again, or override with: "
            f'manage.py dataset override {self.dataset}{partition} --comment "why"'
        )


def _described(found: list[Unusable]) -> list[Unusable]:
    """`found` with their blocking checks that failed and those still to run (one query)."""
    if not found:
        return found
    failed: dict[int, list[tuple[str, str]]] = {}
    running: dict[int, list[str]] = {}
    rows = (
        DatasetCheckResult.objects.filter(materialization_id__in=[u.materialization_id for u in found], blocking=True)
        .exclude(passed=True)
        .order_by("check_name")
        .values_list("materialization_id", "check_name", "passed", "message")
    )
    for m_id, name, passed, message in rows:
        if passed is None:
            running.setdefault(m_id, []).append(name)
        else:
            failed.setdefault(m_id, []).append((name, " ".join(message.split())[:300]))
    return [
        replace(
            u, failed=tuple(failed.get(u.materialization_id, ())), running=tuple(running.get(u.materialization_id, ()))
        )
        for u in found
    ]


def unusable(reads: Iterable[tuple[str, str | None]]) -> list[Unusable]:
    """Of the (dataset, partition key) pairs a consumer reads (None: every partition of the dataset), the
    partitions whose latest materialization is not usable, with the blocking checks that hold each back. A
    partition never materialized is not reported."""
    reads = list(reads)
    if not reads:
        return []
    with connection.cursor() as cursor:
        cursor.execute(UNUSABLE, [[d for d, _ in reads], [p for _, p in reads]])
        return _described([Unusable(*row) for row in cursor.fetchall()])
