"""The worker's stage times (queue_app/stages.py, issue 47): off by default, an off worker never calls a
recording function; on, every probe it starts is stamped from its lease to its handler's first line, and no other
item; and what the stamps show of the latency path with real worker processes: a lone item on an idle queue is
leased alone, while a burst is leased in batches."""

import signal
from collections import Counter
from types import SimpleNamespace

import pytest
from django.db import transaction

from queue_app import engine, stages
from queue_app.engine import handoff
from queue_app.models import ExecutionLog, HandoffOffer, ItemState, QueueItem
from queue_app.probes.tasks import close_log_connection
from queue_app.worker import Supervisor, WorkerOptions
from tests.support.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

PROBE = "queue_app.probe"
RECORDERS = ("leased", "submitted", "picked", "first_line", "flush")


@pytest.fixture(autouse=True)
def _stages_reset():
    yield
    close_log_connection()
    stages.configure()  # back to the settings' (off), whatever the test turned on


@pytest.fixture
def recorded(monkeypatch) -> list[str]:
    """Every call of a recording function, by name (the functions still record)."""
    calls: list[str] = []
    for name in RECORDERS:
        real = getattr(stages, name)

        def counting(*args, _name=name, _real=real, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(stages, name, counting)
    return calls


def _drain(pool: str, items: int) -> None:
    engine.enqueue_many(PROBE, [{} for _ in range(items)])
    Supervisor(WorkerOptions(pool=pool, concurrency=2, burst=True, scheduler=False)).run()
    assert QueueItem.objects.filter(state=ItemState.DONE).count() == items


def test_an_off_worker_never_calls_a_recording_function(recorded, settings):
    settings.JOBSITE = {**getattr(settings, "JOBSITE", {}), "STAGE_TIMES": None}
    _drain("thread", 5)
    assert ExecutionLog.objects.count() == 5
    assert recorded == []


def test_an_on_worker_stamps_each_item_from_its_lease_to_its_handlers_first_line(recorded, settings, tmp_path):
    path = tmp_path / "stages"
    settings.JOBSITE = {**getattr(settings, "JOBSITE", {}), "STAGE_TIMES": str(path)}
    _drain("thread", 5)
    assert {"leased", "submitted", "picked", "first_line", "flush"} <= set(recorded)
    lines = [line.split() for line in path.read_text().splitlines()]
    reservations = set(ExecutionLog.objects.values_list("reservation_id", flat=True))
    for kind in "LSPF":
        assert {int(line[1]) for line in lines if line[0] == kind} == reservations, kind
    for line in (line for line in lines if line[0] == "L"):
        woken, sent, leased = map(float, line[2:5])
        assert 0 < sent <= leased and int(line[6]) <= int(line[5]) and line[7] in ("loop", "thread", "beside")


def test_an_on_worker_stamps_the_probes_only_and_counts_every_item_a_lease_got(settings, tmp_path):
    """A split is made of the probes; the load around them is not stamped (writing out a load's stamps held the
    loop it timed). A lease's line still says how many items it got, probes or not."""
    path = tmp_path / "stages"
    settings.JOBSITE = {**getattr(settings, "JOBSITE", {}), "STAGE_TIMES": str(path)}
    with transaction.atomic():  # one due time: leased in id order, a no-op beside each probe
        for _ in range(10):
            engine.enqueue("queue_app.noop", {})
            engine.enqueue(PROBE, {})
    Supervisor(WorkerOptions(pool="thread", concurrency=2, burst=True, scheduler=False)).run()
    assert QueueItem.objects.filter(state=ItemState.DONE).count() == 20

    lines = [line.split() for line in path.read_text().splitlines()]
    probes = set(ExecutionLog.objects.values_list("reservation_id", flat=True))
    assert len(probes) == 10
    for kind in "LSPF":
        assert {int(line[1]) for line in lines if line[0] == kind} == probes, kind
    per_lease = Counter(tuple(line[2:8]) for line in lines if line[0] == "L")  # a lease's times, asked, got, path
    assert all(int(lease[4]) >= probes_in_it for lease, probes_in_it in per_lease.items())
    assert any(int(lease[4]) > probes_in_it for lease, probes_in_it in per_lease.items()), per_lease


@pytest.mark.slow
def test_a_lone_item_is_handed_off_and_a_burst_leased_in_batches(worker, tmp_path):
    """Real run_worker processes (a thread pool and a process pool): a probe enqueued on an idle queue, once the
    idle worker offers a slot, is handed to it by its enqueue (`handoff`: no lease statement); a burst of 300
    committed at once is taken by leases of many items each. Each probe is enqueued once the one before it is
    settled (done) and the worker offers again, so the queue is idle."""
    engine.ensure_queue("default")  # the first enqueue into a queue not yet created is never handed off
    handoff._offers_seen.clear()
    for pool in ("thread", "process"):
        path = tmp_path / f"stages-{pool}"
        proc = worker(f"w-{pool}", "--pool", pool, "--concurrency", "4", env={"JOBSITE_STAGE_TIMES": str(path)})
        wait_for(lambda proc=proc: "status state=running" in proc.log.read_text(), 30, what="the worker to start")
        # This process learns of the offers by its first enqueue (engine/handoff.py: OFFERS_FRESH), not asserted.
        wait_for(lambda: HandoffOffer.objects.exists(), 10, what="the idle worker's offer")
        seen = engine.enqueue(PROBE, {}).id
        wait_for(lambda seen=seen: QueueItem.objects.filter(id=seen, state=ItemState.DONE).exists(), 10, what="probe")
        lone = []
        for _ in range(3):
            # The worker offers a slot once idle (engine/handoff.py): the probe is handed over in its enqueue.
            wait_for(lambda: HandoffOffer.objects.exists(), 10, what="the idle worker's offer")
            item = engine.enqueue(PROBE, {}).id
            wait_for(
                lambda item=item: QueueItem.objects.filter(id=item, state=ItemState.DONE).exists(), 10, what="the probe"
            )
            lone.append(item)
        burst = list(engine.enqueue_many(PROBE, [{} for _ in range(300)]))
        wait_for(
            lambda burst=burst: ExecutionLog.objects.filter(item_id__in=burst).count() == len(burst), 60, what="burst"
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, proc.log.read_text()[-3000:]
        by_reservation = {int(p[1]): p for p in (line.split() for line in path.read_text().splitlines()) if p[0] == "L"}
        reservation_of = dict(ExecutionLog.objects.values_list("item_id", "reservation_id"))
        for item in lone:
            line = by_reservation[reservation_of[item]]
            assert int(line[6]) == 1 and line[7] == "handoff" and float(line[2]) > 0, (pool, line)
        got = [int(by_reservation[reservation_of[item]][6]) for item in burst]
        assert max(got) > 1 and sum(g > 1 for g in got) > len(burst) // 2, (pool, sorted(got))


def test_stamps_gathered_past_the_bound_are_written_out_of_memory(settings, tmp_path):
    path = tmp_path / "stages"
    settings.JOBSITE = {**getattr(settings, "JOBSITE", {}), "STAGE_TIMES": str(path)}
    stages.configure()
    for reservation_id in range(3):
        stages.picked(SimpleNamespace(reservation_id=reservation_id, task=PROBE))
    stages.flush(at_least=4)  # fewer than the bound: kept
    assert not path.exists()
    stages.first_line(2)
    stages.flush(at_least=4)
    assert [line.split()[:2] for line in path.read_text().splitlines()] == [
        ["P", "0"], ["P", "1"], ["P", "2"], ["F", "2"]
    ]  # fmt: skip
    stages.flush()  # nothing left in memory: nothing written twice
    assert len(path.read_text().splitlines()) == 4
