"""One chaos run, start to end: private cluster and proxy, migrate, plant the items, start the workers, fire the
fault schedule while they work, stop the faults and drain with `--burst` workers, then check and report.

The run's own queries (enqueue, progress, checks) go straight to the cluster under the connection alias
ALIAS; the workers go through the proxy, so a cut hits them and not the judge.
"""

import copy
import json
import os
import random
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.core.management import call_command
from django.db import connections
from django.db.utils import InterfaceError, OperationalError

from jobsite.bench.webhooks import Receiver
from jobsite.embedded_pg import var_dir
from queue_app import engine
from queue_app.models import Queue, QueueItem, Reservation, Schedule, Worker
from queue_app.webhooks.events import WEBHOOK_QUEUE
from queue_app.webhooks.models import WebhookEndpoint
from queue_app.webhooks.sender import new_secret

from . import plan as plan_mod
from .checks import AT_LEAST_ONCE, POISON, Check, Expect, run_checks
from .cluster import Cluster
from .debounce import DebounceFeed, check_chunks, check_debounce
from .faults import Fault, Fired, schedule
from .fleet import Fleet
from .handoff import HandoffFeed, check_handoff
from .harness_checks import check_faults, check_webhooks, check_workers
from .history import load
from .proxy import Proxy
from .report import Report

ALIAS = "jobsite_chaos"
DB_NAME = "chaos"
MIN_AGE = 3.0  # seconds a worker runs before it may be killed or stopped (it has work in flight by then)
STOP_TIMEOUT = 60.0  # seconds a SIGTERMed worker gets to exit (its grace period is 25 s)


@dataclass
class Options:
    sizes: plan_mod.Sizes
    seed: int
    keep: bool = False
    json_out: Path | None = None


class ChaosRun:
    def __init__(self, options: Options, write) -> None:
        self.opts = options
        self.sizes = options.sizes
        self.rng = random.Random(options.seed)
        self._write = write
        self.t0 = time.monotonic()
        self.work_started = self.t0
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        self.run_dir = var_dir() / "chaos" / f"{stamp}-seed{options.seed}"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.cluster: Cluster | None = None
        self.proxy: Proxy | None = None
        self.receiver: Receiver | None = None  # every dead letter's item.dead_lettered webhook lands here
        self.webhook_secret = new_secret()
        self.fleet: Fleet | None = None
        self.fired: list[Fired] = []
        self.crashes: list[str] = []
        self.burst_rounds = 0
        self.planted: plan_mod.Planted | None = None
        self.phase_times: dict[str, float] = {}
        self.drained = False
        self.unfired: list[Fault] = []
        self.outages: list[tuple[datetime, datetime]] = []  # wall clock (UTC) of each restart and cut
        self.debounce: DebounceFeed | None = None  # debounced enqueues fed while the faults fire
        self.handoff: HandoffFeed | None = None  # plain enqueues fed to the hand-off worker meanwhile

    def say(self, message: str) -> None:
        self._write(f"[{time.monotonic() - self.t0:7.1f}s] {message}")

    # -- the whole run --------------------------------------------------------------------------------------

    def run(self) -> int:
        try:
            self._setup()
            self._plant()
            self._faults()
            self._drain()
            checks = self._judge()
        finally:
            self._teardown()
        return 0 if all(c.passed for c in checks) else 1

    def _setup(self) -> None:
        self.cluster = Cluster()
        self.say(f"private PostgreSQL in {self.cluster.root} (binaries {self.cluster.bindir})")
        self.cluster.start(DB_NAME)
        self.proxy = Proxy("127.0.0.1", self.cluster.port)
        self.proxy.start()
        self.say(f"cluster on 127.0.0.1:{self.cluster.port}, workers reach it through the proxy on :{self.proxy.port}")
        settings = copy.deepcopy(connections["default"].settings_dict)
        settings.update(
            ENGINE="django.db.backends.postgresql", NAME=DB_NAME, HOST="127.0.0.1", PORT=str(self.cluster.port),
            USER="postgres", PASSWORD="", OPTIONS={}, TEST={"NAME": DB_NAME},
        )  # fmt: skip
        connections.settings[ALIAS] = settings
        call_command("migrate", database=ALIAS, verbosity=0, interactive=False)
        Schedule.objects.using(ALIAS).all().delete()  # the shipped schedules would enqueue items nobody planted
        for queue in plan_mod.QUEUES:
            engine.ensure_queue(queue, using=ALIAS)
        Queue.objects.using(ALIAS).filter(name__in=plan_mod.QUEUES).update(lease_timeout=plan_mod.QUEUE_LEASE)
        rate_limit, rate_period = plan_mod.FLOW_RATE
        Queue.objects.using(ALIAS).filter(name=plan_mod.FLOW_QUEUE).update(
            rate_limit=rate_limit, rate_period=rate_period, group_concurrency=plan_mod.FLOW_GROUP_LIMIT
        )
        self.receiver = Receiver()
        # The harness's own row, on its own database alias (the webhook services write on the default one).
        WebhookEndpoint.objects.using(ALIAS).create(
            url=self.receiver.url, event_types=["item.dead_lettered"], secret=self.webhook_secret
        )
        self.phase_times["setup"] = time.monotonic() - self.t0

    def _plant(self) -> None:
        started = time.monotonic()
        batches = plan_mod.plan(self.sizes, self.rng)
        step = max(1, self.sizes.items // 5)
        mark = [step]

        def progress(done: int) -> None:
            if done >= mark[0]:
                self.say(f"enqueued {done:,}/{self.sizes.items:,}")
                mark[0] += step

        self.planted = plan_mod.enqueue(batches, ALIAS, progress)
        counts = ", ".join(f"{mode} {len(ids):,}" for mode, ids in sorted(self.planted.by_mode.items()))
        ordered = sum(map(len, self.planted.by_key.values()))
        self.say(
            f"planted {self.planted.total:,} items: {counts}, poison {len(self.planted.poison)}, "
            f"{ordered:,} on {len(self.planted.by_key)} ordering keys, {len(self.planted.flow):,} on the flow queue "
            f"(rate {plan_mod.FLOW_RATE[0]}/{plan_mod.FLOW_RATE[1]}s, {plan_mod.FLOW_KEYS} group keys at most "
            f"{plan_mod.FLOW_GROUP_LIMIT} each in flight)"
        )
        self.phase_times["enqueue"] = time.monotonic() - started

    # -- queries straight to the cluster (None while it restarts) -------------------------------------------

    def _q(self, fn, default=None):
        try:
            return fn()
        except (OperationalError, InterfaceError):
            connections[ALIAS].close()
            return default

    def _db_now(self) -> datetime:
        with connections[ALIAS].cursor() as cur:
            cur.execute("SELECT clock_timestamp()")
            return cur.fetchone()[0]

    def _wait_for_statements_before(self, moment: datetime | None, timeout: float = 30.0) -> None:
        """Until no other session of the run's database is still running a statement begun before `moment`
        (the server's clock), or `timeout` seconds."""
        if moment is None:
            return

        def running() -> int:
            with connections[ALIAS].cursor() as cur:
                cur.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND state = 'active' AND query_start < %s",
                    [moment],
                )
                return cur.fetchone()[0]

        deadline = time.monotonic() + timeout
        while self._q(running, 0) and time.monotonic() < deadline:
            time.sleep(0.05)

    def _open(self) -> int | None:
        return self._q(lambda: QueueItem.objects.using(ALIAS).filter(state__in=["ready", "reserved"]).count())

    def _runs(self) -> int | None:
        def count() -> int:
            with connections[ALIAS].cursor() as cur:
                cur.execute("SELECT count(*) FROM queue_app_executionlog")
                return cur.fetchone()[0]

        return self._q(count)

    def _registered(self) -> set[str]:
        return set(self._q(lambda: list(Worker.objects.using(ALIAS).values_list("id", flat=True)), []))

    def _kill_a_worker(self) -> bool:
        """The scenarios' fault (workflows, triggers, waits): kill -9 a registered worker old enough to hold work,
        note what it held in `self.kills`, start its replacement. False when none was old enough yet."""
        victim = self.fleet.pick(self.rng, MIN_AGE, self._registered())
        if victim is None:
            return False
        self.fleet.kill(victim)
        held = self._q(
            Reservation.objects.using(ALIAS).filter(worker_id=victim.worker_id, outcome__isnull=True).count, -1
        )
        self.kills.append(f"{victim.worker_id} holding {held}")
        self.say(f"FAULT kill -9 {victim.worker_id} (pid {victim.pid}), holding {held} reservations")
        self.fleet.spawn()
        return True

    def _progress_line(self, open_items: int | None, extra: str = "") -> None:
        total = self.planted.total
        settled = "?" if open_items is None else f"{100 * (1 - open_items / total):5.1f}%"
        running = ", ".join(p.worker_id for p in self.fleet.running())
        self.say(f"settled {settled}  open {open_items if open_items is not None else '?'}  runs {self._runs()}  "
                 f"workers [{running}]{extra}")  # fmt: skip

    # -- the fault phase ------------------------------------------------------------------------------------

    def _worker_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env.update(
            JOBSITE_NO_BOOTSTRAP="1", PYTHONUNBUFFERED="1", DJANGO_SETTINGS_MODULE="jobsite.settings",
            DATABASE_URL=f"postgres://postgres@127.0.0.1:{self.proxy.port}/{DB_NAME}",
            JOBSITE_WORKER_LOST_AFTER=str(plan_mod.WORKER_LOST_AFTER),
            JOBSITE_WEBHOOKS_ALLOW_PRIVATE="1",  # the receiver is on loopback
            # The workers archive finished items into the partitioned history seconds after they finish, so
            # the faults strike moves too; the checks read hot and history (history.load).
            JOBSITE_ARCHIVE_AFTER=str(plan_mod.ARCHIVE_AFTER),
        )  # fmt: skip
        env.pop("JOBSITE_DB_NAME", None)
        return env

    def _faults(self) -> None:
        sizes = self.sizes
        queues = (*plan_mod.QUEUES, WEBHOOK_QUEUE)
        self.fleet = Fleet(self._worker_env(), self.run_dir, sizes.concurrency, queues)
        for _ in range(sizes.workers):
            self.fleet.spawn()
        self.fleet.spawn(handoff_queue=plan_mod.HANDOFF_QUEUE)
        self.work_started = time.monotonic()
        pending = schedule(
            self.rng, kills=sizes.kills, sigterms=sizes.sigterms, restarts=sizes.restarts, cuts=sizes.cuts,
            cut_seconds=sizes.cut_seconds, amo_kills=sizes.amo_kills, handoff_kills=sizes.handoff_kills,
        )  # fmt: skip
        self.say(f"{sizes.workers} workers started; faults: " + ", ".join(f"{f.kind}@{f.at:.0%}" for f in pending))
        next_fault, next_line = self.work_started + MIN_AGE, 0.0
        deadline = self.t0 + sizes.deadline
        # Its own random stream, so the fault schedule and victims of a seed stay what they were.
        self.debounce = DebounceFeed(sizes.debounce_keys, sizes.debounce_per_key, ALIAS, random.Random(self.opts.seed))
        self.handoff = HandoffFeed(sizes.handoff_items, ALIAS)
        while pending and time.monotonic() < deadline:
            self._replace_crashed()
            self.debounce.tick()
            self.handoff.tick()
            open_items = self._open()
            now = time.monotonic()
            if open_items is not None:
                progress = 1 - open_items / self.planted.total
                if now >= next_line:
                    self._progress_line(open_items, f"  faults {len(self.fired)}/{len(self.fired) + len(pending)}")
                    next_line = now + (5.0 if sizes.items <= 10_000 else 10.0)
                if now >= next_fault and (progress >= pending[0].at or progress >= 0.9):
                    fired = self._fire(pending[0], progress, open_items)
                    if fired is not None:
                        pending.pop(0)
                        next_fault = time.monotonic() + sizes.min_gap + fired.seconds * (fired.kind == "cut")
            time.sleep(0.2)
        self.unfired = pending
        self.debounce.finish()
        self.say(f"debounced: {sum(map(len, self.debounce.sent.values()))} enqueues over {sizes.debounce_keys} keys")
        self.handoff.finish()
        self.say(f"hand-off feed: {len(self.handoff.sent)} plain enqueues ({self.handoff.failed} failed, sent again)")
        self.phase_times["faults"] = time.monotonic() - self.work_started

    def _replace_crashed(self) -> None:
        for proc in self.fleet.reap():
            if proc.fate == "crashed":
                self.crashes.append(proc.unasked())
                self.say(f"worker {proc.worker_id} CRASHED (exit {proc.exit_code}); replacing it")
        while sum(not p.handoff for p in self.fleet.running()) < self.sizes.workers:
            self.fleet.spawn()
        if not any(p.handoff for p in self.fleet.running()):
            self.fleet.spawn(handoff_queue=plan_mod.HANDOFF_QUEUE)

    def _fire(self, fault: Fault, progress: float, open_items: int) -> Fired | None:
        t = time.monotonic() - self.work_started
        fired = Fired(fault.kind, round(t, 2), round(progress, 4), detail={"open": open_items})
        if fault.kind == "kill_amo":
            if not self._kill_amo(fired):
                return None  # no worker is running an at-most-once handler right now: look again soon
        elif fault.kind == "kill_handoff":
            victim = self.fleet.pick(self.rng, MIN_AGE, self._registered(), handoff=True)
            if victim is None:
                return None  # the hand-off worker is brand new: wait for it to get going
            fired.worker_id, fired.pid = victim.worker_id, victim.pid
            self.fleet.kill(victim)
            held = Reservation.objects.using(ALIAS).filter(worker_id=victim.worker_id, outcome__isnull=True)
            fired.held = self._q(held.count, -1)
            self.say(f"FAULT kill -9 the hand-off worker {victim.worker_id} (pid {victim.pid}), holding {fired.held}")
            self.fleet.spawn(handoff_queue=plan_mod.HANDOFF_QUEUE)
        elif fault.kind in ("kill", "sigterm"):
            victim = self.fleet.pick(self.rng, MIN_AGE, self._registered())
            if victim is None:
                return None  # every worker is brand new: wait for one to get going
            fired.worker_id, fired.pid = victim.worker_id, victim.pid
            if fault.kind == "kill":
                self.fleet.kill(victim)
                held = Reservation.objects.using(ALIAS).filter(worker_id=victim.worker_id, outcome__isnull=True)
                fired.held = self._q(held.count, -1)
                self.say(f"FAULT kill -9 {victim.worker_id} (pid {victim.pid}), holding {fired.held} reservations")
            else:
                self.fleet.sigterm(victim)
                self.say(f"FAULT SIGTERM {victim.worker_id} (pid {victim.pid})")
            self.fleet.spawn()
        elif fault.kind == "restart":
            self.say("FAULT PostgreSQL restart (pg_ctl restart -m fast)")
            began = datetime.now(UTC)
            fired.seconds = round(self.cluster.restart(), 2)
            self.outages.append((began, datetime.now(UTC)))
            connections[ALIAS].close()
            self.say(f"PostgreSQL back after {fired.seconds:.1f}s")
        elif fault.kind == "cut":
            began = datetime.now(UTC)
            fired.connections = self.proxy.cut(fault.seconds)
            self.outages.append((began, began + timedelta(seconds=fault.seconds)))
            fired.seconds = fault.seconds
            self.say(f"FAULT connection loss: {fired.connections} connections reset, new ones refused "
                     f"for {fault.seconds:g}s")  # fmt: skip
        self.fired.append(fired)
        return fired

    def _kill_amo(self, fired: Fired) -> bool:
        """kill -9 a worker while it runs at-most-once handlers (started, not settled); record their items."""
        running = {p.worker_id: p for p in self.fleet.running()}

        def started() -> dict[str, list[int]]:
            rows = Reservation.objects.using(ALIAS).filter(
                started_at__isnull=False, outcome__isnull=True, worker_id__in=list(running)
            )
            by_worker: dict[str, list[int]] = {}
            for worker_id, item_id in rows.values_list("worker_id", "item_id"):
                by_worker.setdefault(worker_id, []).append(item_id)
            return by_worker

        candidates = self._q(started, {})
        if not candidates:
            return False
        worker_id = self.rng.choice(sorted(candidates))
        victim = running[worker_id]
        killed_at = self._q(self._db_now)
        self.fleet.kill(victim)
        # What it ran at the moment it died (a handler that finished between the query and the kill settled). A
        # statement the worker sent before it died still runs to its end in the server (a settle it had sent
        # commits after the kill): read the reservations once every statement begun before the kill has ended.
        self._wait_for_statements_before(killed_at)
        fired.worker_id, fired.pid = victim.worker_id, victim.pid
        fired.amo_running = sorted(self._q(started, {}).get(worker_id, []))
        self.say(f"FAULT kill -9 {worker_id} (pid {victim.pid}) mid at-most-once run of items {fired.amo_running}")
        self.fleet.spawn()
        return True

    # -- the end: no more faults, drain with --burst workers ------------------------------------------------

    def _drain(self) -> None:
        started = time.monotonic()
        deadline = self.t0 + self.sizes.deadline
        wait_until = time.monotonic() + STOP_TIMEOUT
        while time.monotonic() < wait_until and {p.worker_id for p in self.fleet.running()} - self._registered():
            time.sleep(0.2)  # a replacement still starting up: SIGTERM it once its handlers are in place
        for proc in self.fleet.running():
            self.fleet.sigterm(proc, fate="stopped")
        self.say("faults over: fault-phase workers SIGTERMed; draining with --burst workers")
        if not self.fleet.wait_all(STOP_TIMEOUT):
            self.say(f"some workers did not stop within {STOP_TIMEOUT:g}s")
        while time.monotonic() < deadline:
            open_items = self._open()
            if open_items == 0:
                self.drained = True
                break
            self.burst_rounds += 1
            for _ in range(self.sizes.workers):
                self.fleet.spawn(burst=True)
            next_line = 0.0
            while not self.fleet.wait_all(1.0) and time.monotonic() < deadline:
                if time.monotonic() >= next_line:
                    self._progress_line(self._open(), f"  burst round {self.burst_rounds}")
                    next_line = time.monotonic() + 5.0
            if self._open():
                # What is left is held by killed workers until their leases come back: wait, then burst again.
                time.sleep(2.0)
        self.fleet.kill_all()
        self._progress_line(self._open(), "  drained" if self.drained else "  NOT DRAINED")
        self.phase_times["drain"] = time.monotonic() - started

    # -- judging ----------------------------------------------------------------------------------------------

    def _expect(self) -> Expect:
        modes: dict[int, str] = {}
        for mode, ids in self.planted.by_mode.items():
            modes.update(dict.fromkeys(ids, mode))
        modes.update(dict.fromkeys(self.planted.poison, POISON))
        # Debounced probes (at-least-once): the items the enqueues named, and any a lost reply left unnamed.
        modes.update(dict.fromkeys([*self.debounce.ids(), *self.debounce.unnamed()], AT_LEAST_ONCE))
        modes.update(dict.fromkeys([*self.handoff.ids(), *self.handoff.unnamed()], AT_LEAST_ONCE))
        sigtermed = {p.worker_id for p in self.fleet.procs if p.fate in ("sigterm", "stopped")}
        amo_killed = {i: f.worker_id for f in self.fired if f.kind == "kill_amo" for i in f.amo_running}
        return Expect(
            modes,
            self.planted.poison_reasons(),
            self.fleet.killed(),
            sigtermed,
            self.outages,
            amo_killed,
            rate_limits={plan_mod.FLOW_QUEUE: plan_mod.FLOW_RATE},
        )

    def _judge(self) -> list[Check]:
        started = time.monotonic()
        history = load(ALIAS, exclude_queues=(WEBHOOK_QUEUE,))  # the webhooks are judged by _check_webhooks
        expect = self._expect()
        checks = [*run_checks(history, expect), check_chunks(history, self.planted.chunked)]
        checks += [check_debounce(self.debounce), check_handoff(history, self.handoff, self.fleet.killed())]
        checks += [self._check_webhooks(), self._check_faults(), self._check_workers()]
        self.phase_times["check"] = time.monotonic() - started
        elapsed = time.monotonic() - self.t0
        report = Report(self, history, expect, checks, elapsed)
        for line in report.lines():
            self._write(line)
        data = report.as_dict()
        out = self.opts.json_out or self.run_dir / "result.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=2, default=str))
        self._write(f"figures written to {out}; worker logs in {self.run_dir}")
        return checks

    def _check_faults(self) -> Check:
        wanted = {"kill": self.sizes.kills, "kill_amo": self.sizes.amo_kills, "sigterm": self.sizes.sigterms,
                  "restart": self.sizes.restarts, "cut": self.sizes.cuts,
                  "kill_handoff": self.sizes.handoff_kills}  # fmt: skip
        return check_faults(self.fired, wanted)

    def _check_webhooks(self) -> Check:
        return check_webhooks(ALIAS, self.receiver.first, self.receiver.repeats, self.webhook_secret)

    def _check_workers(self) -> Check:
        return check_workers(self.crashes, self.fleet.procs, self.drained, self.burst_rounds)

    # -- cleanup ----------------------------------------------------------------------------------------------

    def _teardown(self) -> None:
        if self.fleet is not None:
            self.fleet.kill_all()
        if ALIAS in connections.settings:
            connections[ALIAS].close()
            del connections[ALIAS]
            del connections.settings[ALIAS]
        if self.proxy is not None:
            self.proxy.stop()
        if self.receiver is not None:
            self.receiver.close()
        if self.cluster is not None:
            if self.opts.keep:
                self._write(f"cluster kept: {self.cluster.conninfo(DB_NAME)} (data {self.cluster.root}); stop it with "
                            f"pg_ctl -D {self.cluster.data} stop")  # fmt: skip
            else:
                self.cluster.stop()
