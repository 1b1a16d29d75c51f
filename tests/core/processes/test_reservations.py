"""Reservation as a lock (queue_app.reservations): any Django code reserves the next item of a queue, holds it
while a block runs (its lease extended), and settles it on exit; a lease that lapsed refuses the settle.
Competing holders and a holder frozen past its lease are real `manage.py shell` processes."""

import json
import signal
import subprocess
import sys
import time

import pytest

from queue_app import engine, services
from queue_app.models import DeadLetter, ItemState, QueueItem, Reservation
from queue_app.reservations import HeldItem, InvalidReservation, LeaseLost, UnknownQueue, reserve
from tests.conftest import ROOT, child_env
from tests.support.waiting import wait_for

QUEUE = "locks"
pytestmark = pytest.mark.django_db(transaction=True)


def item(payload=None, **options) -> int:
    return engine.enqueue("app.export", payload or {}, queue=QUEUE, **options).id


def test_the_block_runs_under_the_lease_and_success_settles_done_with_the_result():
    queued = item({"n": 3})
    held = reserve(QUEUE, timeout=1, holder="exporter")
    assert isinstance(held, HeldItem) and (held.item_id, held.payload) == (queued, {"n": 3})
    with held:
        assert QueueItem.objects.get(id=queued).state == ItemState.RESERVED
        held.result = {"rows": 3}
    stored = QueueItem.objects.get(id=queued)
    assert (stored.state, stored.result, held.outcome) == (ItemState.DONE, {"rows": 3}, "done")
    assert list(Reservation.objects.filter(item_id=queued).values_list("worker_id", "outcome")) == [
        ("exporter", "done")
    ]


def test_the_lease_is_extended_while_the_block_runs():
    queued = item()
    held = reserve(QUEUE, timeout=1, lease=0.6)
    with held:
        time.sleep(1.5)  # more than two leases long
        assert not held.lost
        assert engine.rescue_expired() == (0, 0)  # nothing to rescue: the lease was extended
    assert QueueItem.objects.get(id=queued).state == ItemState.DONE


def test_an_exception_retries_while_attempts_are_left_then_dead_letters():
    queued = item(max_attempts=2)
    for expected in ("retry", "dead"):
        held = wait_for(lambda: reserve(QUEUE, timeout=0.2), timeout=60, what="the retry to come due")
        with pytest.raises(RuntimeError, match="export failed"), held:
            raise RuntimeError("export failed")
        assert held.outcome == expected
    assert DeadLetter.objects.get(item_id=queued).reason == "max attempts exhausted"
    assert "RuntimeError: export failed" in Reservation.objects.filter(item_id=queued).first().traceback


def test_nothing_to_reserve_within_the_timeout_returns_none_and_writes_nothing():
    engine.ensure_queue(QUEUE)
    started = time.monotonic()
    assert reserve(QUEUE, timeout=0.3) is None
    assert 0.3 <= time.monotonic() - started < 2
    assert not Reservation.objects.exists()


def test_an_enqueue_wakes_a_waiting_reserve_at_once(test_db_name):
    engine.ensure_queue(QUEUE)
    code = f"""
import time
from queue_app import engine
time.sleep(0.7)
engine.enqueue("app.export", {{}}, queue="{QUEUE}")
"""
    subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code], cwd=ROOT, env=child_env(test_db_name)
    )
    started = time.monotonic()
    held = reserve(QUEUE, timeout=20)
    assert held is not None and time.monotonic() - started < 10
    with held:
        pass


def test_a_cancelled_item_refuses_the_settle_with_lease_lost():
    queued = item()
    held = reserve(QUEUE, timeout=1, lease=0.6)
    lost = f"item {queued}: the lease of reservation .* was lost while the block ran"
    with pytest.raises(LeaseLost, match=lost), held:
        services.cancel_items([queued])
        time.sleep(0.5)  # the heartbeat finds out
        assert held.lost
    assert QueueItem.objects.get(id=queued).state == ItemState.CANCELLED


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), "5", True])
def test_a_timeout_that_is_not_a_positive_number_is_refused_and_nothing_written(timeout):
    item()
    with pytest.raises(InvalidReservation, match="timeout must be a number of seconds > 0"):
        reserve(QUEUE, timeout=timeout)
    assert not Reservation.objects.exists()


def test_bad_lease_queue_names_and_holders_are_refused_and_nothing_written():
    item()
    with pytest.raises(InvalidReservation, match="lease must be"):
        reserve(QUEUE, lease=0)
    with pytest.raises(InvalidReservation, match="queue name must match"):
        reserve("no spaces; DROP TABLE")
    with pytest.raises(InvalidReservation, match="holder must be"):
        reserve(QUEUE, holder="")
    with pytest.raises(UnknownQueue, match="no queue named 'nowhere'"):
        reserve("nowhere", timeout=0.1)
    assert not Reservation.objects.exists()
    assert QueueItem.objects.get().state == ItemState.READY


# -- real processes ---------------------------------------------------------------------------------------------

HOLDER = """
import json, os, sys, time
from queue_app.reservations import reserve
taken = []
while (held := reserve("{queue}", timeout=1.5, holder=f"holder-{{os.getpid()}}")) is not None:
    with held:
        time.sleep(0.01)
        held.result = {{"by": os.getpid()}}
    taken.append(held.item_id)
print(json.dumps(taken))
"""


@pytest.mark.slow
def test_two_processes_competing_for_the_same_items_each_take_each_item_once(test_db_name):
    ids = engine.enqueue_many("app.export", [{}] * 120, queue=QUEUE)
    code = HOLDER.format(queue=QUEUE)
    procs = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code],
            cwd=ROOT,
            env=child_env(test_db_name),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    taken = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        taken.append(json.loads(out.strip().splitlines()[-1]))
    assert all(taken), "both holders took items"
    assert sorted(taken[0] + taken[1]) == sorted(ids)  # every item once, none by both
    assert QueueItem.objects.filter(id__in=ids, state=ItemState.DONE).count() == len(ids)
    assert Reservation.objects.filter(item_id__in=ids).count() == len(ids)  # no second attempt anywhere


FROZEN = """
import sys, time
from pathlib import Path
from queue_app.reservations import LeaseLost, reserve
held = reserve("{queue}", timeout=5, lease=1.0, holder="frozen")
try:
    with held:
        Path("{ready}").write_text(str(held.item_id))
        time.sleep(1.0)  # frozen (SIGSTOP) in here, past its lease
        held.result = {{"by": "frozen"}}
except LeaseLost as exc:
    print("LeaseLost:", exc)
    sys.exit(3)
"""


@pytest.mark.slow
def test_a_holder_whose_lease_lapses_mid_block_cannot_settle_and_the_item_goes_to_another(tmp_path, test_db_name):
    queued = item()
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", FROZEN.format(queue=QUEUE, ready=ready)],
        cwd=ROOT,
        env=child_env(test_db_name),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(ready.exists, timeout=60, what="the holder to enter its block")
        proc.send_signal(signal.SIGSTOP)
        time.sleep(1.5)  # its lease (1 s) lapses; its heartbeat thread is frozen too
        assert engine.rescue_expired() == (1, 0)
        other = reserve(QUEUE, timeout=1, holder="second")
        assert other is not None and other.item_id == queued
        with other:
            other.result = {"by": "second"}
    finally:
        proc.send_signal(signal.SIGCONT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 3, out
    assert f"item {queued}: the lease of reservation" in out and "nothing was settled" in out
    stored = QueueItem.objects.get(id=queued)
    assert (stored.state, stored.result) == (ItemState.DONE, {"by": "second"})
    outcomes = list(Reservation.objects.filter(item_id=queued).order_by("id").values_list("worker_id", "outcome"))
    assert outcomes == [("frozen", "expired"), ("second", "done")]
