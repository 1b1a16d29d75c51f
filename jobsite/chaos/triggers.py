"""`queue_chaos --triggers`: kill -9 workers while data-aware triggers fire (datasets/triggers.py), then check
what they promise. The workers import trigger_tasks.py: two upstream datasets (chaos_a, chaos_b) whose partitions
are recorded by transactional items that sleep inside their transaction (kills land mid-record), an `all`
consumer and an `any` consumer of both, each recording its own output partition transactionally. Every
`bad_every`-th partition's chaos_a is recorded bad: its blocking check (a queue item the same workers run) fails
it. Once everything has drained, the harness overrides half the bad partitions (jobsite.chaos_override items)
and records the other half's chaos_a again, good; the workers (and the kills) go on until that drains too.

Checks (trigger_checks.py): every queue drained (nothing stuck); the `all` consumer was queued exactly once per
partition (hot and archived items counted) and ran exactly once (one output row), with both upstream materialization
ids; the `any` consumer once per usable upstream materialization; no consumer queued before its upstreams were
recorded (its item's first lease comes after both upstreams' recording transactions); every upstream recorded once
(a re-recorded bad partition's chaos_a twice); every bad chaos_a failed its check (then was overridden, or not),
every good one passed; a bad partition ran no consumer of its bad chaos_a while blocked (every consumer item naming
it was queued after the second phase began, by its override) and ran the `all` consumer exactly once after its
override or its new good record.

Mappings and dynamic partitions (the same kills): a weekly consumer of chaos_b (TimeWindow to weekly) and a
fan-in of chaos_region (by day and a source of the dynamic set chaos_sources, whose keys the harness adds first)
each queued exactly once per complete set of the partitions its mapping names, with their ids, never for an
incomplete one, run once, after all of them.

Dynamic keys removed while their runs start (the same kills): the keys of chaos_customers, added first, are
removed and added again by jobsite.chaos_churn items planted among the others, racing jobsite.chaos_request_cust
items that ask `materialize` for a key's partition of chaos_cust (its producer task's item, then the trigger task
it fires). Checked: no item or materialization of a key started while it was removed, none open at a removal, a
refusal names runs of the key, the key rows' removals are the committed churn items'.

Same private cluster and worker fleet as the item run (runner.py); the faults here are kill -9 only.
"""

import time
from dataclasses import dataclass
from datetime import timedelta

from django.contrib.auth.models import User
from django.db.models import Max

from queue_app import engine
from queue_app.datasets.models import DynamicPartitionKey
from queue_app.models import ItemHistory, Queue, QueueItem

from . import trigger_tasks
from .checks import Check
from .fleet import Fleet
from .runner import ALIAS, MIN_AGE, ChaosRun
from .trigger_checks import CHURN_SET, TriggerRun, check_triggers

QUEUE = "default"
QUEUE_LEASE = 10.0


@dataclass(frozen=True)
class TriggerSizes:
    partitions: int
    workers: int
    concurrency: int
    kills: int
    gap: float  # seconds between kills
    deadline: float
    sleep: float  # seconds each upstream item sleeps inside its transaction
    bad_every: int = 10  # every Nth partition's chaos_a is recorded bad (its blocking check fails)
    requests: int = 40  # jobsite.chaos_request_cust items (a partition of a dynamic key asked for)
    churns: int = 30  # jobsite.chaos_churn items (a key removed, or added again)
    churn_seconds: float = 20.0  # they come due over this long (the upstreams' phase lasts about that long)


SOURCES = ("s1", "s2", "s3")  # the keys of the dynamic set chaos_sources
CUSTOMERS = ("c1", "c2", "c3")  # the keys of chaos_customers, removed and added again during the run
MAPPED_DAYS = 28  # the days whose chaos_region partitions are planted (every source)
QUICK = TriggerSizes(partitions=150, workers=3, concurrency=4, kills=2, gap=2.0, deadline=300.0, sleep=0.05)
FULL = TriggerSizes(
    partitions=1500,
    workers=3,
    concurrency=4,
    kills=6,
    gap=3.0,
    deadline=900.0,
    sleep=0.02,
    requests=400,
    churns=300,
    churn_seconds=120.0,
)


class TriggerChaosRun(ChaosRun):
    def __init__(self, options, write, sizes: TriggerSizes) -> None:
        super().__init__(options, write)
        self.tr_sizes = sizes
        self.kills: list[str] = []
        self.second_phase_from: int | None = None  # the first item id the second phase could have queued

    def run(self) -> int:
        checks: list[Check] = []
        try:
            self._setup()
            for queue in (QUEUE, trigger_tasks.KEYS_QUEUE):
                engine.ensure_queue(queue, using=ALIAS)
            Queue.objects.using(ALIAS).filter(name__in=[QUEUE, trigger_tasks.KEYS_QUEUE]).update(
                lease_timeout=QUEUE_LEASE
            )
            self._plant_upstreams()
            self._kill_phase()
            checks = self._judge()
        finally:
            self._teardown()
        return 0 if checks and all(c.passed for c in checks) else 1

    def _partitions(self) -> list[str]:
        return [f"2025-{1 + i // 28:02d}-{1 + i % 28:02d}" for i in range(self.tr_sizes.partitions)]

    def _bad(self) -> tuple[list[str], list[str]]:
        """The bad partitions: (those the second phase overrides, those it records again good)."""
        bad = self._partitions()[self.tr_sizes.bad_every // 2 :: self.tr_sizes.bad_every]
        return bad[::2], bad[1::2]

    def _plant_upstreams(self) -> None:
        bad = set(sum(self._bad(), []))
        items = [
            {"dataset": name, "partition": day, "sleep": self.tr_sizes.sleep}
            | ({"bad": True} if name == trigger_tasks.CHECKED and day in bad else {})
            for day in self._partitions()
            for name in trigger_tasks.UPSTREAMS
        ]
        # The fan-in over a dynamic set: its keys added first (as `dataset partitions add` would), then each
        # day's partition of every source of the first MAPPED_DAYS days, racing like the others.
        DynamicPartitionKey.objects.using(ALIAS).bulk_create(
            [
                DynamicPartitionKey(partition_set=trigger_tasks.SOURCES_SET, key=k, added_by="queue_chaos")
                for k in SOURCES
            ]
            + [DynamicPartitionKey(partition_set=CHURN_SET, key=k, added_by="queue_chaos") for k in CUSTOMERS]
        )
        churn = [(trigger_tasks.CHURN_REQUEST, self.rng.choice(CUSTOMERS)) for _ in range(self.tr_sizes.requests)]
        churn += [(trigger_tasks.CHURN_TASK, self.rng.choice(CUSTOMERS)) for _ in range(self.tr_sizes.churns)]
        items += [
            {"dataset": trigger_tasks.REGION, "partition": f"{day}|{source}", "sleep": self.tr_sizes.sleep}
            for day in self._partitions()[:MAPPED_DAYS]
            for source in SOURCES
        ]
        self.rng.shuffle(items)
        # Below the default priority: the dynamic keys' items (and the checks and consumers) come due among them
        engine.enqueue_many(trigger_tasks.UPSTREAM_TASK, items, queue=QUEUE, priority=-1, using=ALIAS)
        # Key removals and the partitions asked of those keys, spread over the upstreams' time (delayed items, on
        # a queue of their own: each starts when due, not behind the upstreams' backlog)
        now = self._db_now()
        for task, key in churn:
            run_at = now + timedelta(seconds=self.rng.uniform(0, self.tr_sizes.churn_seconds))
            engine.enqueue(task, {"key": key}, queue=trigger_tasks.KEYS_QUEUE, run_at=run_at, using=ALIAS)
        self.say(f"planted {len(items):,} upstream records over {self.tr_sizes.partitions} partitions, {len(bad)} bad")
        User.objects.db_manager(ALIAS).create_superuser(trigger_tasks.OVERRIDE_USER, "chaos@example.com", None)

    def _second_phase(self) -> None:
        """Override half the bad partitions and record the other half's chaos_a again, good."""
        overridden, rewritten = self._bad()
        newest = [m.objects.using(ALIAS).aggregate(n=Max("id"))["n"] or 0 for m in (QueueItem, ItemHistory)]
        self.second_phase_from = max(newest) + 1
        engine.enqueue_many(
            trigger_tasks.OVERRIDE_TASK, [{"partition": d} for d in overridden], queue=QUEUE, using=ALIAS
        )
        engine.enqueue_many(
            trigger_tasks.UPSTREAM_TASK,
            [{"dataset": trigger_tasks.CHECKED, "partition": d, "sleep": self.tr_sizes.sleep} for d in rewritten],
            queue=QUEUE,
            using=ALIAS,
        )
        self.say(f"second phase: {len(overridden)} overrides, {len(rewritten)} bad partitions recorded again")

    def _open(self) -> int | None:
        return self._q(lambda: QueueItem.objects.using(ALIAS).filter(state__in=["ready", "reserved"]).count())

    def _kill_phase(self) -> None:
        sizes = self.tr_sizes
        self.fleet = Fleet(
            self._worker_env(),
            self.run_dir,
            sizes.concurrency,
            (QUEUE, trigger_tasks.KEYS_QUEUE),
            imports=("jobsite.chaos.trigger_tasks",),
        )
        for _ in range(sizes.workers):
            self.fleet.spawn()
        started = time.monotonic()
        deadline = started + sizes.deadline
        next_kill = started + MIN_AGE + sizes.gap
        while time.monotonic() < deadline:
            for proc in self.fleet.reap():
                self.crashes.append(proc.unasked())
            while len(self.fleet.running()) < sizes.workers:
                self.fleet.spawn()
            if self._open() == 0:
                if self.second_phase_from is not None:
                    break
                self._second_phase()
            if len(self.kills) < sizes.kills and time.monotonic() >= next_kill and self._kill_a_worker():
                next_kill = time.monotonic() + sizes.gap
            time.sleep(0.3)
        self.phase_times["triggers"] = time.monotonic() - started
        for proc in self.fleet.running():
            self.fleet.sigterm(proc, fate="stopped")
        self.fleet.wait_all(60)
        self.fleet.kill_all()

    # -- judging ----------------------------------------------------------------------------------------------

    def _judge(self) -> list[Check]:
        overridden, rewritten = self._bad()
        run = TriggerRun(
            self._partitions(),
            overridden,
            rewritten,
            self.second_phase_from,
            self.crashes,
            len(self.kills),
            list(SOURCES),
        )
        checks = check_triggers(ALIAS, run)
        days = run.days

        self._write("")
        self._write(f"== queue_chaos --triggers: seed {self.opts.seed}, {len(days)} partitions, "
                    f"kills: {'; '.join(self.kills)} ==")  # fmt: skip
        for check in checks:
            figures = " ".join(f"{k}={v}" for k, v in check.figures.items())
            self._write(f"{check.name:<48} {'PASS' if check.passed else 'FAIL':<7} {figures}")
            for p in check.problems:
                self._write(f"    - {p}")
        passed = sum(c.passed for c in checks)
        self._write(f"RESULT: {'PASS' if passed == len(checks) else 'FAIL'} ({passed}/{len(checks)} checks passed)")
        return checks
