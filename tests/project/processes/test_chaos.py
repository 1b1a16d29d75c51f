"""queue_chaos: the quick run passes end to end (real workers, kill -9, SIGTERM, a PostgreSQL restart, a
connection cut), and its checks are able to fail: each planted breach below is caught.

The breach tests build a database state by hand (items, reservations, runs, effects, dead letters, with chosen
timestamps) and hand it to jobsite/chaos/checks.py, so what they prove is the checker, not the queue.
"""

import json
import random
from datetime import UTC, datetime, timedelta

import pytest

from jobsite.chaos import checks
from jobsite.chaos.debounce import DebounceFeed, check_chunks, check_debounce
from jobsite.chaos.handoff import HandoffFeed, check_handoff
from jobsite.chaos.history import load
from queue_app import engine
from queue_app.models import DeadLetter, ExecutionLog, ProbeEffect, QueueItem, Reservation
from tests.support.chaos_runs import _has_postgres_binaries, run_quick_chaos

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.mark.slow
@pytest.mark.skipif(not _has_postgres_binaries(), reason="no PostgreSQL server binaries for a private cluster")
def test_quick_chaos_run_passes(tmp_path):
    out = tmp_path / "chaos.json"
    result = run_quick_chaos(tmp_path, "--seed", "7", "--json-out", str(out), timeout=900)
    figures = json.loads(out.read_text())
    by_name = {c["name"]: c for c in figures["checks"]}
    assert figures["passed"] and all(c["passed"] for c in figures["checks"])
    assert figures["items"]["total"] == 3_000
    hooks = by_name["webhooks: every dead letter delivered"]["figures"]
    assert hooks["dead_letters"] >= 12 and hooks["received"] == hooks["deliveries"] == hooks["dead_letters"]
    assert "RESULT: PASS" in result.stdout
    # Every invariant the report prints, asserted from its own figures (a check missing from it fails here):
    assert set(by_name) >= {check for check, _ in EVERY_INVARIANT}, sorted(by_name)
    for check, holds in EVERY_INVARIANT:
        assert holds(by_name[check]["figures"]), (check, by_name[check])
    faults = by_name["faults fired under load"]["figures"]
    assert faults["kill"] >= 1 and faults["restart"] == 1 and faults["sigterm"] >= 1 and faults["cut"] >= 1


def _duplicates_explained(f: dict) -> bool:
    """Every run after an item's first has a reason (a killed worker's attempt, a database error in an
    outage...), and the reasons add up to the duplicates."""
    return f["unexplained"] == 0 and sum(f["explained"].values()) == f["duplicates"]


# (check name in the report, what its figures must say). Each also needs work to judge: a check over nothing
# proves nothing.
EVERY_INVARIANT = [
    # ... found hot or in the partitioned history, where the workers' archiver moved most of them during the run
    (
        "lost 0",
        lambda f: (
            f["lost"] == 0
            and f["found"] == f["planted"] == f["done"] + f["dead"]
            and f["open"] == 0
            and f["archived"] > 0
        ),
    ),
    ("stuck 0", lambda f: f["stuck"] == 0 and f["open_attempts"] == 0),
    ("runs match reservations", lambda f: f["runs"] >= 2_900),
    ("every duplicate explained", _duplicates_explained),
    ("at-most-once ran at most once", lambda f: f["ran_twice_or_more"] == 0 and f["ran_once"] > 0),
    ("transactional effects exactly once", lambda f: f["effects_not_once"] == 0 and f["done"] > 0),
    ("per-key FIFO", lambda f: f["violations"] == 0 and f["pairs"] > 0),
    ("dead letters = planted poison", lambda f: f["unexplained"] == 0 and f["poison_dead"] == f["planted"] > 0),
    ("workers behaved", lambda f: f["crashed"] == 0 and f["sigterm_exit_0"] == f["sigtermed"]),
    ("id marks bound every later row", lambda f: f["marks"] > 0 and f["rows"] >= 3_000),
    # chunked probes (at-least-once and at-most-once) ran in calls of several items; each item judged above
    ("chunked handlers ran chunks", lambda f: f["items"] > 0 and f["largest_chunk"] > 1),
    # debounced enqueues fed during the faults: each key's latest payload ran, nothing dropped, counts add up
    (
        "debounce: each key's latest payload ran",
        lambda f: f["enqueues"] == 160 and f["items"] > 4 and f["absorbed"] > 0 and f["double_ready"] == 0,
    ),
    # plain enqueues fed during the faults: some handed to the idle hand-off worker, none to a worker gone
    (
        "hand-off: handed items under the faults, never to a worker gone",
        lambda f: f["fed"] >= 60 and f["handed"] > 0 and f["to_a_worker_gone"] == 0,
    ),
]


# -- the checker can fail ------------------------------------------------------------------------------------

TASKS = {
    checks.AT_LEAST_ONCE: "queue_app.probe",
    checks.AT_MOST_ONCE: "queue_app.probe_at_most_once",
    checks.TRANSACTIONAL: "queue_app.probe_transactional",
}


class Scene:
    """A hand-made end state: items and what happened to them, on a clock of our own (seconds after T0)."""

    def __init__(self) -> None:
        self.modes: dict[int, str] = {}
        self.poison: dict[int, tuple[str, ...]] = {}
        self.killed: dict[str, datetime] = {}
        self.amo_killed: dict[int, str] = {}

    def item(self, mode: str, key: str | None = None) -> int:
        item_id = engine.enqueue(TASKS[mode], {}, queue="chaos", ordering_key=key).id
        self.modes[item_id] = mode
        return item_id

    def attempt(self, item_id: int, worker: str, at: float, outcome: str, *, ran: bool = True, took: float = 1.0):
        """One reservation of `item_id` from `at` to `at + took`, ending `outcome`, with a run at `at + 0.1`."""
        attempt = Reservation.objects.filter(item_id=item_id).count() + 1
        res = Reservation.objects.create(
            item_id=item_id, attempt=attempt, worker_id=worker, reserved_at=T0 + timedelta(seconds=at),
            lease_expires_at=T0 + timedelta(seconds=at + 20), heartbeat_at=T0 + timedelta(seconds=at),
            finished_at=T0 + timedelta(seconds=at + took), outcome=outcome,
        )  # fmt: skip
        if ran:
            self.run(item_id, res.id, worker, at + 0.1)
        state = {"done": "done", "dead": "dead"}.get(outcome, "ready")
        QueueItem.objects.filter(id=item_id).update(state=state, reservation_id=res.id, attempts=attempt)
        return res

    def run(self, item_id: int, reservation_id: int, worker: str, at: float) -> None:
        res = Reservation.objects.get(id=reservation_id)
        ExecutionLog.objects.create(
            item_id=item_id, reservation_id=reservation_id, attempt=res.attempt, task=TASKS[self.modes[item_id]],
            delivery=self.modes[item_id], pid=1, worker_id=worker, executed_at=T0 + timedelta(seconds=at),
        )  # fmt: skip

    def effect(self, item_id: int, applied: int = 1) -> None:
        ProbeEffect.objects.update_or_create(key=str(item_id), defaults={"applied": applied})

    def judge(self) -> dict[str, checks.Check]:
        expect = checks.Expect(self.modes, self.poison, self.killed, amo_killed=self.amo_killed)
        return {c.name: c for c in checks.run_checks(load("default"), expect)}


@pytest.fixture
def scene(db) -> Scene:
    """A clean run: an at-least-once item re-run after its worker was killed, an at-most-once and a
    transactional item run once, two items of one ordering key in order, and one poison item dead-lettered."""
    s = Scene()
    s.killed = {"killed-w": T0 + timedelta(seconds=5)}  # while it held the first attempt below
    alo = s.item(checks.AT_LEAST_ONCE)
    s.attempt(alo, "killed-w", 0, "expired", took=20)
    s.attempt(alo, "w2", 25, "done")
    s.attempt(s.item(checks.AT_MOST_ONCE), "w2", 1, "done")
    tx = s.item(checks.TRANSACTIONAL)
    s.attempt(tx, "w2", 2, "done")
    s.effect(tx)
    first, second = s.item(checks.AT_LEAST_ONCE, key="k"), s.item(checks.AT_LEAST_ONCE, key="k")
    s.attempt(first, "w2", 3, "done")
    s.attempt(second, "w2", 5, "done")
    poison = engine.enqueue("chaos.no_such_task", {}, queue="chaos", max_attempts=1).id
    s.modes[poison], s.poison[poison] = checks.POISON, ("unknown task: chaos.no_such_task",)
    res = Reservation.objects.create(
        item_id=poison, attempt=1, worker_id="w2", reserved_at=T0, lease_expires_at=T0, heartbeat_at=T0,
        finished_at=T0, outcome="dead",
    )  # fmt: skip
    QueueItem.objects.filter(id=poison).update(state="dead", reservation_id=res.id)
    DeadLetter.objects.create(item_id=poison, reason="unknown task: chaos.no_such_task", died_at=T0)
    return s


def failed(results: dict[str, checks.Check]) -> set[str]:
    return {name for name, check in results.items() if not check.passed}


def test_a_clean_end_state_passes_every_check(scene):
    results = scene.judge()
    assert failed(results) == set(), {n: c.problems for n, c in results.items()}
    assert results["every duplicate explained"].figures["explained"] == {"killed": 1}


def test_a_second_run_of_an_at_most_once_item_is_caught(scene):
    item = scene.item(checks.AT_MOST_ONCE)
    res = scene.attempt(item, "w3", 30, "done")
    scene.run(item, res.id, "w3", 30.5)  # ran twice under one reservation, nobody killed
    assert failed(scene.judge()) == {
        "at-most-once ran at most once",
        "every duplicate explained",
        "runs match reservations",
    }


def test_a_duplicate_after_a_live_workers_expired_lease_is_unexplained(scene):
    item = scene.item(checks.AT_LEAST_ONCE)
    scene.attempt(item, "alive-w", 30, "expired", took=20)  # not in the killed list
    scene.attempt(item, "w3", 55, "done")
    results = scene.judge()
    assert failed(results) == {"every duplicate explained"}
    assert "ended 'expired'" in results["every duplicate explained"].problems[0]


def test_a_fifo_violation_is_caught(scene):
    first, second = scene.item(checks.TRANSACTIONAL, key="k2"), scene.item(checks.TRANSACTIONAL, key="k2")
    scene.attempt(first, "w3", 40, "done", took=5)  # ends at 45
    scene.attempt(second, "w4", 42, "done")  # runs at 42.1: while the first was still out
    scene.effect(first)
    scene.effect(second)
    results = scene.judge()
    assert failed(results) == {"per-key FIFO"}
    assert f"item {second} ran" in results["per-key FIFO"].problems[0]


def test_a_lost_item_is_caught(scene):
    never_ran = scene.item(checks.AT_LEAST_ONCE)
    scene.attempt(never_ran, "w3", 30, "done", ran=False)  # done, but its handler never ran
    still_ready = scene.item(checks.TRANSACTIONAL)  # never delivered at all
    results = scene.judge()
    assert failed(results) == {"lost 0", "stuck 0"}
    assert results["lost 0"].figures["lost"] == 2
    assert results["stuck 0"].problems == [f"item {still_ready} still ready"]


def test_a_vanished_item_is_caught(scene):
    item = scene.item(checks.AT_LEAST_ONCE)
    QueueItem.objects.filter(id=item).delete()
    assert failed(scene.judge()) == {"lost 0"}


def test_a_transactional_effect_applied_twice_is_caught(scene):
    item = scene.item(checks.TRANSACTIONAL)
    scene.attempt(item, "w3", 30, "done")
    scene.effect(item, applied=2)
    assert failed(scene.judge()) == {"transactional effects exactly once"}


def test_a_dead_letter_that_was_not_planted_is_caught(scene):
    item = scene.item(checks.AT_LEAST_ONCE)
    scene.attempt(item, "w3", 30, "dead")
    DeadLetter.objects.create(item_id=item, reason="max attempts exhausted", died_at=T0)
    assert failed(scene.judge()) == {"dead letters = planted poison", "lost 0"}


def test_poison_that_did_not_die_is_caught(scene):
    QueueItem.objects.filter(id__in=list(scene.poison)).update(state="done")
    DeadLetter.objects.filter(item_id__in=list(scene.poison)).delete()
    assert "dead letters = planted poison" in failed(scene.judge())


def test_an_at_most_once_item_done_but_never_run_by_a_live_worker_is_lost(scene):
    item = scene.item(checks.AT_MOST_ONCE)
    scene.attempt(item, "killed-w", 30, "done", ran=False)  # settled long after its kill: not the kill's doing
    results = scene.judge()
    assert failed(results) == {"lost 0"}
    assert f"at-most-once item {item} ended done after 0 runs" in results["lost 0"].problems[0]


def _killed_mid_run(scene, *, ends: str, letter: str | None) -> int:
    """An at-most-once item whose worker was killed (at 5 s) while its handler ran (it started at 3 s)."""
    item = scene.item(checks.AT_MOST_ONCE)
    scene.attempt(item, "killed-w", 3, "expired" if ends == "dead" else "done", took=20)
    QueueItem.objects.filter(id=item).update(state=ends)
    if letter:
        DeadLetter.objects.create(item_id=item, reason=letter, died_at=T0)
    scene.amo_killed[item] = "killed-w"
    return item


def test_an_at_most_once_item_killed_mid_run_is_a_casualty_when_its_dead_letter_says_so(scene):
    _killed_mid_run(scene, ends="dead", letter=checks.AMO_STOPPED)
    results = scene.judge()
    assert not failed(results)
    assert results["at-most-once killed mid-run: dead letter says so"].figures["dead_saying_so"] == 1


def test_an_at_most_once_item_killed_mid_run_and_reported_done_is_caught(scene):
    item = _killed_mid_run(scene, ends="done", letter=None)
    results = scene.judge()
    assert "at-most-once killed mid-run: dead letter says so" in failed(results)
    assert (
        f"item {item} killed mid-run in killed-w: done"
        in results["at-most-once killed mid-run: dead letter says so"].problems[0]
    )


def test_a_rate_window_over_its_limit_is_caught(scene):
    items = [scene.item(checks.AT_LEAST_ONCE) for _ in range(3)]
    for n, item in enumerate(items):
        scene.attempt(item, "w3", 70 + n, "done")  # three leases in the window from T0 + 60 s (the scene's: before)
    expect = checks.Expect(scene.modes, scene.poison, scene.killed, rate_limits={"chaos": (2, 60)})

    (rate,) = [c for c in checks.run_checks(load("default"), expect) if c.name == "rate limits held"]

    assert not rate.passed and rate.figures["most_in_a_window"] == 7
    assert rate.problems == [
        f"queue chaos: 7 leases in the 60 s window from {int(T0.timestamp())} (limit 2)",
        f"queue chaos: 3 leases in the 60 s window from {int(T0.timestamp()) + 60} (limit 2)",
    ]
    assert checks.check_rate_limits(load("default"), checks.Expect({}, {}, {}, rate_limits={"chaos": (7, 60)})).passed


def test_a_row_stamped_after_an_id_mark_with_an_id_at_or_below_it_is_caught(scene):
    from queue_app.models import IdMark

    assert scene.judge()["id marks bound every later row"].passed  # no marks: nothing to judge, nothing broken
    newest_res = Reservation.objects.order_by("-id").first()
    # A mark said to be taken 10 s into the scene, holding ids handed out after it: the retry at 25 s, and every
    # item (stamped now, long after T0).
    IdMark.objects.create(
        taken_at=T0 + timedelta(seconds=10), item_id=QueueItem.objects.order_by("-id").first().id,
        reservation_id=newest_res.id,
    )  # fmt: skip
    check = scene.judge()["id marks bound every later row"]
    assert not check.passed and check.figures["marks"] == 1
    # The scene's six items, and the one attempt made after the mark (the at-least-once item's retry at 25 s).
    assert QueueItem.objects.count() == 6 and len(check.problems) == 7
    retry = Reservation.objects.get(reserved_at=T0 + timedelta(seconds=25))
    assert [p.split(" stamped")[0] for p in check.problems if p.startswith("reservation ")] == [
        f"reservation {retry.id}"
    ]


def test_a_debounced_key_whose_latest_payload_did_not_run_is_caught(db):
    """Three debounced enqueues of one key collapse into one item; done with the latest payload it passes, with an
    older payload (the latest lost) or left ready it fails."""
    feed = DebounceFeed(keys=1, per_key=3, using="default", rng=random.Random(1))
    feed.finish()
    (item_id,) = feed.ids()
    QueueItem.objects.filter(id=item_id).update(state="done")
    passed = check_debounce(feed)
    assert passed.passed, passed.problems
    assert passed.figures["items"] == 1 and passed.figures["absorbed"] == 2
    QueueItem.objects.filter(id=item_id).update(payload={"debounce": "debounce-0", "seq": 1})
    assert not check_debounce(feed).passed
    QueueItem.objects.filter(id=item_id).update(payload={"debounce": "debounce-0", "seq": 2}, state="ready")
    assert not check_debounce(feed).passed


def test_an_item_handed_to_a_worker_after_its_kill_is_caught(db):
    """Two fed items reserved by their own enqueues for worker w-h: one before w-h was killed, one after. The
    first passes (handed to a live worker, re-run after its death); the second is a hand-off to a worker gone.
    Without any item reserved by its enqueue, the path was not exercised: that fails too."""
    feed = HandoffFeed(total=2, using="default")
    feed.finish()
    before, after = sorted(feed.ids())
    for item_id, at in ((before, 0), (after, 10)):
        QueueItem.objects.filter(id=item_id).update(created_at=T0 + timedelta(seconds=at), state="done")
        Reservation.objects.create(
            item_id=item_id, attempt=1, worker_id="w-h", reserved_at=T0 + timedelta(seconds=at),
            lease_expires_at=T0 + timedelta(seconds=at + 20), heartbeat_at=T0, finished_at=T0, outcome="done",
        )  # fmt: skip
    killed = {"w-h": T0 + timedelta(seconds=5)}
    caught = check_handoff(load("default"), feed, killed)
    assert not caught.passed and caught.figures["to_a_worker_gone"] == 1 and f"item {after}" in caught.problems[0]
    assert check_handoff(load("default"), feed, {"w-h": T0 + timedelta(seconds=30)}).passed
    Reservation.objects.update(reserved_at=T0 + timedelta(seconds=1))  # neither written by its enqueue
    unexercised = check_handoff(load("default"), feed, {})
    assert not unexercised.passed and unexercised.figures["handed"] == 0


def test_chunked_items_each_run_alone_are_caught(scene):
    """check_chunks fails when no handler call of the chunked items took more than one of them."""
    items = [scene.item(checks.AT_LEAST_ONCE) for _ in range(2)]
    for n, item in enumerate(items):
        scene.attempt(item, "w2", 40 + n, "done")  # runs at different moments: two calls of one item
    assert not check_chunks(load("default"), items).passed
    ExecutionLog.objects.filter(item_id__in=items).update(executed_at=T0)  # one call of both
    assert check_chunks(load("default"), items).passed
