"""The datasets, check and tasks of tests/datasets/processes/test_datasets_checks_triggers_workers.py, loaded by its
workers with `run_worker --import tests.tasks.checks_triggers_declared` (which calls declare()); in process the test
calls declare() and undeclare() itself.

- ctr_a and ctr_b (daily) are the upstreams of tests.ctr_consume (`all`), which records ctr_out for the
  partition with the upstream ids it was given, so "ran once" is one ctr_out row per partition;
- ctr_a has a blocking check, ctr_not_bad, that fails a materialization whose metadata says {"bad": true};
- tests.ctr_upstream {"dataset", "partition", "hold", "bad"}: records the partition in its transaction and holds
  it open `hold` seconds, so the two upstreams of a partition (and their checks) overlap across workers.
"""

import time

from django.db import transaction

from queue_app.datasets import dataset, quality
from queue_app.datasets.declarations import _code
from queue_app.datasets.quality import CheckResult, all_checks, check
from queue_app.datasets.services import record_materialization
from queue_app.datasets.triggers import forget_task, trigger_task
from queue_app.registry import Context, Retry, job

UPSTREAMS = ("ctr_a", "ctr_b")
OUTPUT = "ctr_out"
CONSUMER = "tests.ctr_consume"


def not_bad(part):
    bad = bool(part.materialization.metadata.get("bad"))
    return CheckResult(not bad, {"bad": int(bad)}, "marked bad" if bad else "")


def declare() -> None:
    for name in (*UPSTREAMS, OUTPUT):
        if _code.get(name) is None:
            dataset(name, location=f"table:tests.{name}", partitioning="daily")
    if not any(c.dataset == "ctr_a" for c in all_checks()):
        check("ctr_a", name="ctr_not_bad", severity="error")(not_bad)
    trigger_task(CONSUMER, on_update=list(UPSTREAMS), mode="all", produces=[OUTPUT])


def undeclare() -> None:
    forget_task(CONSUMER)
    for item in [c for c in all_checks() if c.dataset == "ctr_a"]:
        quality.undeclare(item)
    for name in (*UPSTREAMS, OUTPUT):
        _code.unregister(name)


@job("tests.ctr_upstream", retry=Retry(times=1, delay=0))
def upstream(payload: dict, ctx: Context) -> None:
    with transaction.atomic():
        metadata = {"bad": True} if payload.get("bad") else {}
        record_materialization(payload["dataset"], payload["partition"], item_id=ctx.item_id, metadata=metadata)
        time.sleep(payload.get("hold", 0))


@job(CONSUMER)
def consume(payload: dict, ctx: Context) -> None:
    with transaction.atomic():
        record_materialization(
            OUTPUT, payload["partition"], item_id=ctx.item_id, metadata={"upstream": payload["upstream"]}
        )
