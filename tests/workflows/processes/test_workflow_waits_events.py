"""Events (issue 39): `wf.wait_event(...)` waits for an event by name and key; `send_event` and `workflow
send-event` end it in the statement that stores the event (one event per wait, one wait per event), an event
sent first is kept for the lookback and claimed when the wait opens, and the timeout is a delayed item."""

import io
import json
import threading

import pytest
from django.core.management import call_command
from django.db import connection, transaction

from queue_app.models import QueueItem
from queue_app.workflows import WorkflowDefinitionError, WorkflowError, services, waits
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import Workflow, WorkflowEvent, WorkflowStep
from tests.support.waiting import wait_for
from tests.tasks import workflow_waits_tasks  # noqa: F401  (registers wf_paid)

pytestmark = pytest.mark.django_db(transaction=True)
EVENT = "partner.callback"


@pytest.fixture
def worker(waits_worker):
    return waits_worker()


def step(w: Workflow, name: str) -> WorkflowStep:
    return WorkflowStep.objects.get(workflow_id=w.id, attempt=Workflow.objects.get(id=w.id).attempt, name=name)


def states(w: Workflow) -> dict[str, str]:
    return {s["name"]: s["state"] for s in services.status(w.id)["steps"]}


def finished(w: Workflow, timeout: float = 90) -> Workflow:
    return wait_for(lambda: (x := Workflow.objects.get(id=w.id)).is_final and x, timeout, what=f"workflow {w.id}")


def waiting(w: Workflow, name: str = "paid") -> None:
    wait_for(lambda: states(w)[name] == "waiting_event", 60, what=f"step {name} to wait for its event")


@pytest.mark.slow
def test_an_event_sent_from_another_process_wakes_the_wait_and_its_payload_reaches_the_next_step(worker, manage):
    w = services.start("wf_paid", {"order": "o-1"})
    waiting(w)
    shown = manage("workflow", "status", str(w.id), "--json")
    assert {s["name"]: s["state"] for s in json.loads(shown.stdout)["steps"]}["paid"] == "waiting_event"
    out = manage("workflow", "send-event", EVENT, "--key", "o-1", "--payload", '{"amount": 120}', "--json")
    assert out.returncode == 0, out.stderr
    sent = json.loads(out.stdout)
    assert sent["matched"] is True and sent["workflow_id"] == w.id and sent["step_id"] == step(w, "paid").id
    assert finished(w).state == "succeeded"
    assert step(w, "paid").result == {"amount": 120}
    assert step(w, "use").result == {"paid": {"amount": 120}}
    assert WorkflowEvent.objects.get().step_id == step(w, "paid").id


@pytest.mark.slow
def test_an_event_sent_before_the_wait_is_kept_and_claimed_when_it_opens(worker):
    sent = waits.send_event(EVENT, "o-2", {"early": True})
    assert not sent.matched
    w = services.start("wf_paid", {"order": "o-2"})
    assert finished(w).state == "succeeded"
    assert step(w, "use").result == {"paid": {"early": True}}
    assert WorkflowEvent.objects.get(id=sent.id).step_id == step(w, "paid").id


def test_a_kept_event_past_its_lookback_is_not_matched(settings):
    settings.JOBSITE = {"WORKFLOW_EVENT_LOOKBACK": 3600}
    old = waits.send_event(EVENT, "k", {"n": 1})
    WorkflowEvent.objects.filter(id=old.id).update(expires_at=WorkflowEvent.objects.get(id=old.id).created_at)
    g = Graph("late")
    g.wait_event("paid", event=EVENT, key="k", timeout=3600)
    w = services.start_graph(g)
    assert states(w) == {"paid": "waiting_event"}
    assert WorkflowEvent.objects.get(id=old.id).step_id is None


@pytest.mark.slow
def test_an_event_sent_twice_wakes_one_wait_once_and_the_second_is_kept_for_the_next(worker):
    w = services.start("wf_paid", {"order": "o-3"})
    waiting(w)
    first = waits.send_event(EVENT, "o-3", {"n": 1})
    second = waits.send_event(EVENT, "o-3", {"n": 2})
    assert first.matched and not second.matched
    assert finished(w).state == "succeeded"
    assert step(w, "use").result == {"paid": {"n": 1}}
    assert QueueItem.objects.get(id=step(w, "paid").item_id).attempts == 0  # settled by the event, never leased
    w2 = services.start("wf_paid", {"order": "o-3"})  # the kept one is claimed by the next wait, once
    assert finished(w2).state == "succeeded"
    assert step(w2, "use").result == {"paid": {"n": 2}}
    assert dict(WorkflowEvent.objects.values_list("id", "step_id")) == {
        first.id: step(w, "paid").id,
        second.id: step(w2, "paid").id,
    }


@pytest.mark.slow
def test_a_timeout_fails_the_wait_then_a_late_event_is_kept_and_a_repair_takes_it(worker):
    w = services.start("wf_paid", {"order": "o-4", "timeout": 0.5, "policy": "fail"})
    assert finished(w).state == "failed"
    paid = step(w, "paid")
    # the stored error as the docs quote it (workflow-waits.md), the exception's class first
    assert (
        paid.state == "failed"
        and paid.error == "EventTimeout: no event 'partner.callback' with key 'o-4' came within 0.5 s"
    )
    assert step(w, "use").state == "cancelled"
    late = waits.send_event(EVENT, "o-4", {"late": True})
    assert not late.matched
    assert services.repair(w.id).attempt == 2  # the wait opens again and takes the kept event at once
    assert finished(w).state == "succeeded"
    assert step(w, "use").result == {"paid": {"late": True}}
    assert WorkflowEvent.objects.get(id=late.id).step_id == step(w, "paid").id


@pytest.mark.slow
def test_a_timeout_with_continue_goes_on_with_no_payload(worker):
    w = services.start("wf_paid", {"order": "o-5", "timeout": 0.5, "policy": "continue"})
    assert finished(w).state == "succeeded"
    assert step(w, "paid").result is None
    assert step(w, "use").result == {"paid": None}


@pytest.mark.slow
def test_an_event_sent_in_a_rolled_back_transaction_wakes_nothing(worker):
    w = services.start("wf_paid", {"order": "o-6"})
    waiting(w)
    with pytest.raises(RuntimeError), transaction.atomic():
        assert waits.send_event(EVENT, "o-6", {"n": "rolled back"}).matched
        raise RuntimeError("the caller fails")
    assert states(w)["paid"] == "waiting_event" and not WorkflowEvent.objects.exists()
    real = waits.send_event(EVENT, "o-6", {"n": "real"})  # what proves the first one woke nothing
    assert real.matched
    assert finished(w).state == "succeeded"
    assert step(w, "use").result == {"paid": {"n": "real"}}
    assert list(WorkflowEvent.objects.values_list("id", flat=True)) == [real.id]


def test_concurrent_events_each_end_one_wait_and_each_wait_takes_one():
    g = Graph("three waits")
    for i in range(3):
        g.wait_event(f"w{i}", event=EVENT, key="same", timeout=3600)
    w = services.start_graph(g)
    n = 6
    barrier = threading.Barrier(n)
    sent: list[waits.SentEvent] = []

    def sender(i: int) -> None:
        try:
            barrier.wait(30)
            sent.append(waits.send_event(EVENT, "same", {"i": i}))
        finally:
            connection.close()

    threads = [threading.Thread(target=sender, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(sent) == n
    matched = [s for s in sent if s.matched]
    assert len(matched) == 3 and len({s.step_id for s in matched}) == 3
    assert Workflow.objects.get(id=w.id).state == "succeeded"
    claimed = dict(WorkflowEvent.objects.filter(step_id__isnull=False).values_list("step_id", "payload"))
    assert claimed == dict(WorkflowStep.objects.filter(workflow_id=w.id).values_list("id", "result"))
    assert WorkflowEvent.objects.filter(step_id__isnull=True).count() == n - 3


def one_wait(key: str) -> Workflow:
    g = Graph(f"wait for {key}")
    g.wait_event("paid", event=EVENT, key=key, timeout=3600)
    return services.start_graph(g)


def test_an_event_id_sent_twice_is_one_event_and_the_duplicate_ends_no_later_wait():
    """A sender's retry with the same id (code, then the CLI) is a duplicate: it is not kept for the lookback,
    so the next workflow waiting on that name and key is not ended by it."""
    first = waits.send_event(EVENT, "dup", {"n": 1}, id="partner-msg-1")  # nobody waits yet: kept
    again = waits.send_event(EVENT, "dup", {"n": 2}, id="partner-msg-1")
    assert (first.duplicate, first.sent_id, again.duplicate, again.id, again.matched) == (
        False,
        "partner-msg-1",
        True,
        None,
        False,
    )
    out = io.StringIO()
    call_command("workflow", "send-event", EVENT, "--key", "dup", "--id", "partner-msg-1", stdout=out)
    assert "was sent before: a duplicate, nothing sent" in out.getvalue()
    out = io.StringIO()
    call_command("workflow", "send-event", EVENT, "--key", "dup", "--id", "partner-msg-1", "--json", stdout=out)
    assert json.loads(out.getvalue()) | {"name": None} == {
        "id": None,
        "name": None,
        "key": "dup",
        "matched": False,
        "step_id": None,
        "workflow_id": None,
        "sent_id": "partner-msg-1",
        "duplicate": True,
    }
    assert list(WorkflowEvent.objects.values_list("payload", flat=True)) == [{"n": 1}]
    w1, w2 = one_wait("dup"), one_wait("dup")
    assert step(w1, "paid").result == {"n": 1} and states(w1) == {"paid": "succeeded"}
    assert states(w2) == {"paid": "waiting_event"}  # no duplicate kept to end it
    with pytest.raises(WorkflowError, match="bad event id"):
        waits.send_event(EVENT, "dup", id="x" * 193)


def test_two_concurrent_sends_of_one_id_store_one_event_the_second_waiting_for_the_first():
    """The race forced: the first send's transaction stays open (its id claimed, its event stored, a wait ended)
    until the second is seen waiting on the claim's unique key; the second then finds it and is the duplicate."""
    w1 = one_wait("race")
    first_stored, let_go = threading.Event(), threading.Event()
    sent: dict[str, waits.SentEvent] = {}

    def first() -> None:
        try:
            with transaction.atomic():
                sent["first"] = waits.send_event(EVENT, "race", {"n": 1}, id="race-1")
                first_stored.set()
                let_go.wait(60)
        finally:
            connection.close()

    def second() -> None:
        try:
            sent["second"] = waits.send_event(EVENT, "race", {"n": 2}, id="race-1")
        finally:
            connection.close()

    a = threading.Thread(target=first)
    a.start()
    assert first_stored.wait(30)
    b = threading.Thread(target=second)
    b.start()
    with connection.cursor() as cur:

        def second_waits() -> bool:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
                " AND query LIKE '%%queue_app_receivedwebhook%%'"
            )
            return cur.fetchone()[0] == 1

        wait_for(second_waits, 30, what="the second send to wait on the first's claim")
    let_go.set()
    a.join(30)
    b.join(30)
    assert sent["first"].matched and not sent["first"].duplicate
    assert sent["second"].duplicate and not sent["second"].matched
    assert list(WorkflowEvent.objects.values_list("payload", flat=True)) == [{"n": 1}]
    assert step(w1, "paid").result == {"n": 1}
    assert states(one_wait("race")) == {"paid": "waiting_event"}


def test_cancel_ends_a_wait_and_its_event_is_then_kept():
    g = Graph("cancelled wait")
    g.wait_event("paid", event=EVENT, key="c", timeout=3600)
    w = services.start_graph(g)
    assert states(w) == {"paid": "waiting_event"}
    assert services.cancel(w.id, actor="test")
    assert Workflow.objects.get(id=w.id).state == "cancelled" and step(w, "paid").state == "cancelled"
    assert not waits.send_event(EVENT, "c").matched


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("x" * 201, "k", None), "bad event name"),
        ((EVENT, "k" * 201, None), "bad event key"),
        ((EVENT, "", None), "bad event key"),
        ((EVENT, "k", {"x": object()}), "not JSON|JSON"),
        ((EVENT, "k", float("nan")), "nan, which JSON cannot carry"),
    ],
)
def test_a_bad_event_is_refused_and_writes_nothing(args, message):
    with pytest.raises(WorkflowError, match=message):
        waits.send_event(*args)
    assert not WorkflowEvent.objects.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("send-event", EVENT, "--key", "k", "--payload", "{bad"),
            "--payload is not valid JSON (a payload is any JSON value",
        ),
        (("send-event", EVENT, "--key", "k" * 201), "bad event key"),
        (("send-event", "n" * 201, "--key", "k"), "bad event name"),
    ],
)
def test_cli_bad_event_is_an_error_exit_1_and_nothing_written(manage, args, message):
    out = manage("workflow", *args)
    assert out.returncode == 1 and message in out.stderr and "nothing was written" in out.stderr
    assert not WorkflowEvent.objects.exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"timeout": 0}, "timeout must be"),
        ({"timeout": -1}, "timeout must be"),
        ({"on_timeout": "retry"}, "on_timeout must be"),
        ({"key": "{missing}"}, "no parameter"),
        ({"key": "k" * 201}, "bad event key"),
        ({"event": "e" * 201}, "bad event name"),
    ],
)
def test_a_bad_wait_is_refused_before_anything_is_written(kwargs, message):
    g = Graph("bad")
    with pytest.raises(WorkflowDefinitionError, match=message):
        g.wait_event("paid", **({"event": EVENT, "key": "k", "timeout": 10} | kwargs))
    assert not Workflow.objects.exists()
