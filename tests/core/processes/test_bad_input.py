"""Hostile input at every entry point: each is refused with a message that says what is wrong, and nothing is
lost or half-written (every queue_app table and the admin log keep their row counts).

Entry points: engine.enqueue / enqueue_many, the django.tasks backend, `manage.py enqueue` (in process and as a
real process with non-UTF-8 argv and payload files), `manage.py spark_run`, the schedule form, the queue options
form, admin actions (forged ids, ids of rows in another state, ids that match nothing), the Spark dashboard's
trigger / cancel / re-run, and the worker (results it cannot store, BaseException from a handler). What other
files already prove is not repeated here: test_engine_enqueue.py (the engine's per-option refusals),
test_commands.py (bad --payload JSON, priority, queue, count), test_scheduling.py (basic bad cron strings, bad
time zone, unknown targets), test_spark_dashboard.py (per-field trigger errors), test_worker_supervisor.py and
test_worker_processes.py (unknown task, undecodable payload, a set as result, os._exit, segfault, SystemExit).
"""

import math
import os
import re
import sys
from io import StringIO

import pytest
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.test import override_settings
from django.utils import timezone

from queue_app import engine, services
from queue_app.engine.errors import InvalidResult
from queue_app.models import DeadLetter, ItemState, Queue, QueueItem, Reservation, Schedule
from queue_app.probes.tasks import close_log_connection
from queue_app.registry import get_task
from queue_app.spark.models import SparkRun
from queue_app.spark.runs import trigger_run
from tests.conftest import ROOT, child_env
from tests.support.admin_fixtures import (
    LONG,
    action_post,
    dead,
    detail_action_post,
    done,
    fast_password_hashing_fixture,  # noqa: F401 (autouse)
    letter_of,
    ready,
    reserved,
    state,
    url,
)
from tests.support.queue_helpers import all_rows, nested
from tests.support.schedule_forms import post_data
from tests.support.worker_helpers import run_worker
from tests.tasks import django_tasks_app

SMALL_LIMIT = {"JOBSITE": {"MAX_PAYLOAD_BYTES": 1000}}


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


# -- engine.enqueue, enqueue_many and the django.tasks backend -----------------------------------------------

DEEP = 100_000  # far past Python's recursion limit: a recursive check would crash instead of refusing

ENQUEUES = {
    "enqueue-deeper-than-the-stack": (lambda: engine.enqueue("t", nested(DEEP)), engine.InvalidEnqueue, "nested"),
    "enqueue-many-unknown-option": (lambda: engine.enqueue_many("t", [{}], priorty=1), TypeError, "priorty"),
    "enqueue-many-one-nan-among-good": (
        lambda: engine.enqueue_many("t", [{"n": 1}, {"x": math.nan}, {"n": 3}]),
        engine.InvalidEnqueue,
        "JSON cannot carry",
    ),
    "enqueue-many-one-too-deep": (
        lambda: engine.enqueue_many("t", [{"n": 1}, nested(DEEP)]),
        engine.InvalidEnqueue,
        "nested deeper than 64",
    ),
    "enqueue-many-one-over-the-limit": (
        lambda: engine.enqueue_many("t", [{"n": 1}, "x" * 2000]),
        engine.InvalidEnqueue,
        "over the limit of 1000",
    ),
    "enqueue-many-not-a-list": (lambda: engine.enqueue_many("t", 5), TypeError, "not iterable"),
    "django-task-nan": (lambda: django_tasks_app.add.enqueue(math.nan, 1), engine.InvalidEnqueue, "cannot carry"),
    "django-task-inf-kwarg": (
        lambda: django_tasks_app.add.enqueue(a=math.inf, b=1),
        engine.InvalidEnqueue,
        "cannot carry",
    ),
    "django-task-too-deep": (lambda: django_tasks_app.add.enqueue(nested(70), 1), engine.InvalidEnqueue, "nested"),
    "django-task-deeper-than-the-stack": (
        lambda: django_tasks_app.add.enqueue(nested(DEEP), 1),
        engine.InvalidEnqueue,
        "nested deeper than 64",
    ),
    "django-task-over-the-limit": (
        lambda: django_tasks_app.add.enqueue("x" * 2000, 1),
        engine.InvalidEnqueue,
        "over the limit of 1000",
    ),
    "django-task-lone-surrogate": (
        lambda: django_tasks_app.add.enqueue("\udcff", 1),
        engine.InvalidEnqueue,
        "not valid UTF-8",
    ),
    "django-task-nul": (lambda: django_tasks_app.add.enqueue("a\x00b", 1), engine.InvalidEnqueue, "NUL"),
    "django-task-object": (lambda: django_tasks_app.add.enqueue(object(), 1), TypeError, "Unsupported type"),
    "django-task-bytes": (lambda: django_tasks_app.add.enqueue(b"\xff", 1), ValueError, "Unsupported value"),
    "django-task-priority": (
        lambda: django_tasks_app.add.using(priority=500).enqueue(1, 2),
        Exception,  # django.tasks' InvalidTask
        "priority",
    ),
    "django-task-unknown-option": (
        lambda: django_tasks_app.add.using(priorty=5),
        TypeError,
        "priorty",
    ),
}


@pytest.mark.django_db
@pytest.mark.parametrize(("call", "error", "message"), ENQUEUES.values(), ids=ENQUEUES.keys())
def test_code_enqueue_refuses_hostile_input_and_writes_nothing(call, error, message):
    ready("t.before")  # a queue that exists already must not change either
    before = all_rows()

    with override_settings(**SMALL_LIMIT), pytest.raises(error, match=message):
        call()

    assert all_rows() == before


# -- manage.py enqueue ----------------------------------------------------------------------------------------


def enqueue_command(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("enqueue", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def payload_file(tmp_path):
    """payload_file(bytes) -> the path of a file holding exactly those bytes."""

    def write(content: bytes) -> str:
        path = tmp_path / "payload.json"
        path.write_bytes(content)
        return str(path)

    return write


CLI_CASES = {
    "payload-nan": (["--payload", '{"x": NaN}'], "payload contains nan, which JSON cannot carry"),
    "payload-infinity": (["--payload", "[Infinity]"], "payload contains inf, which JSON cannot carry"),
    "payload-deeper-than-the-parser": (["--payload", "[" * DEEP + "]" * DEEP], "nested deeper than"),
    "payload-over-the-limit": (["--payload", '"' + "x" * 2000 + '"'], "over the limit of 1000"),
    # Non-UTF-8 bytes in argv reach Python as lone surrogates (surrogateescape): refused as such.
    "payload-not-utf8": (["--payload", '"\udcff"'], "payload is not valid UTF-8 text"),
    "task-not-utf8": (["--queue", "mail", "--", "t\udcff"], "task must be a non-empty UTF-8 name"),
    "queue-not-utf8": (["--queue", "m\udcff"], "queue name must match"),
    "delay-nan": (["--delay", "nan"], "delay must be a finite number >= 0, not nan"),
    "delay-inf": (["--delay", "inf"], "delay must be a finite number >= 0, not inf"),
    "delay-negative": (["--delay=-1"], "delay must be a finite number >= 0"),
    "priority-not-a-number": (["--priority", "high"], "invalid int value: 'high'"),
    "count-not-a-number": (["--count", "1e3"], "invalid int value: '1e3'"),
    "unknown-option": (["--priorty", "5"], "unrecognized arguments: --priorty"),
    "dedup-key-empty": (["--dedup-key", ""], "dedup_key must be a non-empty"),
    "ordering-key-nul": (["--ordering-key", "a\x00"], "ordering_key must be a non-empty"),
    "payload-and-payload-file": (["--payload", "{}", "--payload-file", "x"], "not allowed with argument"),
    "payload-file-missing": (["--payload-file", "/nonexistent/payload.json"], "No such file or directory"),
}


@pytest.mark.django_db
@pytest.mark.parametrize(("args", "message"), CLI_CASES.values(), ids=CLI_CASES.keys())
def test_enqueue_command_refuses_hostile_input_and_writes_nothing(args, message):
    args = args if "--" in args else [*args, "queue_app.echo"]
    before = all_rows()

    with override_settings(**SMALL_LIMIT), pytest.raises(CommandError, match=message):
        enqueue_command(*args)

    assert all_rows() == before


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"name": "caf\xe9"}', r"not UTF-8 text: invalid continuation byte at byte 13"),
        (b'{"x": NaN}', "payload contains nan"),
        (b'{"s": "' + b"x" * 2000 + b'"}', "over the limit of 1000"),
        (b"[" * DEEP + b"]" * DEEP, "nested deeper than"),
        (b"\xff\xfe{}", "not UTF-8 text"),
        (b"", "--payload-file is not valid JSON"),
    ],
    ids=["latin-1", "nan", "over-the-limit", "too-deep", "utf-16-bom", "empty"],
)
def test_enqueue_payload_file_is_checked_like_an_argument(payload_file, content, message):
    before = all_rows()

    with override_settings(**SMALL_LIMIT), pytest.raises(CommandError, match=message):
        enqueue_command("queue_app.echo", "--payload-file", payload_file(content))

    assert all_rows() == before


@pytest.mark.django_db
def test_enqueue_payload_file_queues_its_payload(payload_file):
    enqueue_command("queue_app.echo", "--payload-file", payload_file('{"name": "café"}'.encode()))

    assert QueueItem.objects.get().payload == {"name": "café"}


@pytest.mark.django_db(transaction=True)
def test_enqueue_command_as_a_process_refuses_non_utf8_argv_and_stdin(test_db_name, tmp_path):
    """Real argv bytes (not str), and a payload on standard input: the process exits 1 with the reason on
    stderr, or 2 with argparse's usage for an unknown option, and queues nothing."""
    import subprocess

    def run(*args: bytes, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable.encode(), os.fsencode(ROOT / "manage.py"), b"enqueue", *args],
            cwd=ROOT,
            env={**child_env(test_db_name), "LC_ALL": "C.UTF-8"},
            input=stdin,
            capture_output=True,
            timeout=120,
        )

    cases = [
        (run(b"t\xff"), 1, b"task must be a non-empty UTF-8 name"),
        (run(b"queue_app.echo", b"--payload", b'"caf\xe9"'), 1, b"payload is not valid UTF-8 text"),
        (run(b"queue_app.echo", b"--payload-file", b"-", stdin=b'"caf\xe9"'), 1, b"not UTF-8 text"),
        (run(b"queue_app.echo", b"--payload-file", b"-", stdin=b"[" * DEEP), 1, b"nested deeper than"),
        (run(b"queue_app.echo", b"--bogus"), 2, b"unrecognized arguments: --bogus"),
    ]

    for result, code, message in cases:
        assert (result.returncode, message in result.stderr) == (code, True), result.stderr[-2000:]
        assert b"Traceback" not in result.stderr
    assert not QueueItem.objects.exists() and not Queue.objects.exists()
    good = run(b"queue_app.echo", b"--payload-file", b"-", stdin='{"city": "Zürich"}'.encode())
    assert good.returncode == 0, good.stderr
    assert QueueItem.objects.get().payload == {"city": "Zürich"}


HINT = r"( \(did you mean [^)]*\))?"  # closest names, when test modules registered similar ones


def registered_jobs() -> str:
    """The jobs an unknown-job message lists: every registered one, sorted (test modules register their own)."""
    from queue_app.spark.registry import all_jobs

    return ", ".join(sorted(job.name for job in all_jobs()))


# -- manage.py spark_run --------------------------------------------------------------------------------------

SPARK_CLI_CASES = {
    "unknown-job-names-the-registered": (
        ["no_such_job"],
        r"unknown Spark job 'no_such_job'( \(did you mean [^)]*\))?; registered jobs: (.*, )?demo_sleep",
    ),
    "no-job": ([], "name a Spark job"),
    "unknown-param": (["demo_sleep", "--param", "colour=red"], "colour: unknown parameter"),
    "empty-param-name": (["demo_sleep", "--param", "=3"], "--param takes NAME=VALUE"),
    "param-nan": (["demo_sleep", "--param", "seconds=nan"], "seconds: must be a finite number"),
    "param-inf": (["demo_sleep", "--param", "seconds=inf"], "seconds: must be a finite number"),
    "param-not-utf8": (["demo_sleep", "--param", "tasks=\udcff"], "tasks: must be an integer"),
    "timeout-nan": (["demo_sleep", "--timeout", "nan"], "timeout: must be > 0"),
    "timeout-negative": (["demo_sleep", "--timeout=-5"], "timeout: must be > 0"),
    "timeout-over-the-maximum": (["demo_sleep", "--timeout", "1e9"], "timeout: must be > 0 and <= 3600"),
    "unknown-option": (["demo_sleep", "--bogus"], "unrecognized arguments: --bogus"),
}


@pytest.mark.django_db
@pytest.mark.parametrize(("args", "message"), SPARK_CLI_CASES.values(), ids=SPARK_CLI_CASES.keys())
def test_spark_run_command_refuses_bad_params_and_queues_nothing(args, message):
    before = all_rows()

    with pytest.raises(CommandError, match=message):
        call_command("spark_run", *args, stdout=StringIO(), stderr=StringIO())

    assert all_rows() == before


IMPORT_CASES = {
    "dataset": ["dataset", "--import", "tests.no_such_module", "list"],
    "workflow": ["workflow", "--import", "tests.no_such_module", "list"],
    "run_worker": ["run_worker", "--burst", "--skip-checks", "--import", "tests.no_such_module"],
}


@pytest.mark.django_db
@pytest.mark.parametrize("args", IMPORT_CASES.values(), ids=IMPORT_CASES.keys())
def test_an_import_that_fails_names_the_module_and_runs_nothing(args):
    before = all_rows()

    with pytest.raises(CommandError, match=r"--import tests.no_such_module: No module named 'tests.no_such_module'"):
        call_command(*args, stdout=StringIO(), stderr=StringIO())

    assert all_rows() == before


# -- the schedule form ----------------------------------------------------------------------------------------

INVALID_CRON = "is not a valid cron expression; use five fields"
BAD_CRONS = {
    "nickname": ("@reboot", INVALID_CRON),
    "step-zero": ("*/0 * * * *", INVALID_CRON),
    "range-past-59": ("1-100 * * * *", INVALID_CRON),
    "arabic-digit": ("٥ * * * *", INVALID_CRON),
    "nul": ("* * * * *\x00", "Null characters are not allowed"),
    "huge": ("1," * 3000 + "2 * * * *", "at most 100 characters"),
    "never-fires": ("0 0 30 2 *", "that matches at least one date"),
    "weekday-8": ("* * * * 8", INVALID_CRON),
    "sixth-weekday": ("0 0 * * 5#6", INVALID_CRON),
    "jenkins-hash": ("H * * * *", INVALID_CRON),
    "year-field": ("0 0 * * * 2030", INVALID_CRON),
}


@pytest.mark.django_db
@pytest.mark.parametrize(("cron", "message"), BAD_CRONS.values(), ids=BAD_CRONS.keys())
def test_schedule_add_refuses_a_bad_cron_string_and_saves_nothing(admin_client, cron, message):
    before = all_rows()

    response = admin_client.post(url("schedule", "add"), post_data(cron=cron))

    assert response.status_code == 200
    assert message in " ".join(response.context["adminform"].form.errors["cron"])
    assert all_rows() == before


BAD_PAYLOADS = {
    "nan": ('{"x": NaN}', "payload contains nan, which JSON cannot carry"),
    "infinity": ("[Infinity]", "payload contains inf"),
    "deeper-than-the-parser": ("[" * DEEP + "]" * DEEP, "payload nested deeper than 64 levels"),
    "too-deep": ("[" * 70 + "]" * 70, "payload nested deeper than 64 levels"),
    "lone-surrogate": ('"\\udcff"', "payload is not valid UTF-8 text"),
    "over-the-limit": ('"' + "x" * 2000 + '"', "over the limit of 1000"),
    "nul": ('"a\\u0000b"', "payload contains a NUL character"),
    "not-json": ("{nope", "Enter a valid JSON"),
}


@pytest.mark.django_db
@pytest.mark.parametrize(("payload", "message"), BAD_PAYLOADS.values(), ids=BAD_PAYLOADS.keys())
def test_schedule_add_refuses_a_payload_the_queue_cannot_store(admin_client, payload, message):
    """Saved, such a payload would fail every fire (or, before this was checked, crash the page with a 500)."""
    before = all_rows()

    with override_settings(**SMALL_LIMIT):
        response = admin_client.post(url("schedule", "add"), post_data(payload=payload))

    assert response.status_code == 200
    assert message in " ".join(response.context["adminform"].form.errors["payload"])
    assert all_rows() == before


@pytest.mark.django_db
def test_schedule_add_refuses_a_negative_dedup_window(admin_client):
    before = all_rows()

    response = admin_client.post(url("schedule", "add"), post_data(dedup_window="-5"))

    assert response.status_code == 200
    assert "seconds >= 0" in response.context["adminform"].form.errors["dedup_window"][0]
    assert all_rows() == before


# -- the queue options form -----------------------------------------------------------------------------------

GOOD_OPTIONS = {"concurrency_limit": "", "lease_timeout": "30.0", "max_attempts": "5", "retention": "7 00:00:00"}
BAD_OPTIONS = {
    "lease-zero": ("lease_timeout", "0", "finite number of seconds > 0"),
    "lease-negative": ("lease_timeout", "-5", "finite number of seconds > 0"),
    "lease-nan": ("lease_timeout", "nan", "Enter a number"),
    "lease-inf": ("lease_timeout", "inf", "Enter a number"),
    "attempts-zero": ("max_attempts", "0", "an integer >= 1"),
    "attempts-negative": ("max_attempts", "-1", "an integer >= 1"),
    "attempts-garbage": ("max_attempts", "two", "an integer >= 1"),
    "limit-zero": ("concurrency_limit", "0", "pause the queue to stop it"),
    "retention-negative": ("retention", "-1 00:00:00", 'as days hh:mm:ss ("7 00:00:00" is a week), not -1 00:00:00'),
    "retention-garbage": ("retention", "forever", "Enter a valid duration"),
}


@pytest.mark.django_db
@pytest.mark.parametrize(("field", "value", "message"), BAD_OPTIONS.values(), ids=BAD_OPTIONS.keys())
def test_queue_options_form_refuses_values_a_queue_cannot_run_with(admin_client, field, value, message):
    ready(queue="mail")
    before = all_rows()
    stored = Queue.objects.values().get(name="mail")

    response = admin_client.post(url("queue", "change", "mail"), {**GOOD_OPTIONS, field: value, "_save": "Save"})

    assert response.status_code == 200
    errors = " ".join(response.context["adminform"].form.errors[field])
    assert message in errors
    assert "datetime" not in errors and "timedelta" not in errors  # the user's units, not Python's
    assert Queue.objects.values().get(name="mail") == stored
    assert all_rows() == before


@pytest.mark.django_db
def test_queue_options_form_lets_the_browser_send_only_what_it_accepts(admin_client):
    """The number inputs' min is the minimum the form enforces: the browser cannot send a 0 it will refuse."""
    ready(queue="mail")

    page = admin_client.get(url("queue", "change", "mail")).content.decode()

    for field in ("max_attempts", "concurrency_limit"):
        (tag,) = re.findall(rf'<input[^>]*name="{field}"[^>]*>', page)
        assert 'type="number"' in tag and 'min="1"' in tag, tag
    response = admin_client.post(url("queue", "change", "mail"), {**GOOD_OPTIONS, "max_attempts": "1"})
    assert response.status_code == 302
    assert Queue.objects.get(name="mail").max_attempts == 1


@pytest.mark.django_db
def test_set_queue_options_service_refuses_every_bad_value_at_once():
    ready(queue="mail")
    stored = Queue.objects.values().get(name="mail")

    with pytest.raises(ValueError, match=r"lease_timeout must be .*; max_attempts must be an integer >= 1, not 0"):
        services.set_queue_options("mail", lease_timeout=math.nan, max_attempts=0)

    assert Queue.objects.values().get(name="mail") == stored


# -- admin actions: forged ids, ids of rows in another state, ids that match nothing ------------------------

FORGED_IDS = {"letters": "abc", "empty": "", "float": "1e5", "markup": "<script>", "sql": "1); DROP TABLE x; --"}
INTEGER_ID_ACTIONS = [("queueitem", "requeue"), ("deadletter", "requeue"), ("schedule", "run_now")]


@pytest.mark.django_db
@pytest.mark.parametrize("forged", FORGED_IDS.values(), ids=FORGED_IDS.keys())
@pytest.mark.parametrize(("model", "action"), INTEGER_ID_ACTIONS, ids=[m for m, _ in INTEGER_ID_ACTIONS])
def test_an_action_on_a_forged_id_is_refused_with_a_message_and_changes_nothing(admin_client, model, action, forged):
    item_id = dead()
    before = all_rows()

    response = admin_client.post(url(model), action_post(action, item_id, forged))

    assert response.status_code == 302
    (message,) = messages_of(response)
    assert message.startswith("Not ") and repr(forged) in message and message.endswith("Nothing was changed.")
    assert state(item_id) == "dead"
    assert all_rows() == before


@pytest.mark.django_db
def test_a_detail_page_action_on_a_forged_id_is_refused(admin_client):
    item_id = dead()
    before = all_rows()

    response = admin_client.post(
        url("queueitem", "change", item_id), {**detail_action_post("requeue", item_id), "_selected_action": "x1"}
    )

    assert response.status_code == 302
    assert messages_of(response) == ["Not queue item ids: 'x1'. Nothing was changed."]
    assert all_rows() == before


@pytest.mark.django_db
def test_spark_cancel_action_on_a_forged_id_is_refused(admin_client):
    run = trigger_run("demo_sleep", {}, trigger="orm")
    before = all_rows()

    response = admin_client.post(url("sparkrun"), action_post("cancel_runs", run.id, "abc"))

    assert messages_of(response) == ["Not spark run ids: 'abc'. Nothing was changed."]
    assert SparkRun.objects.get(id=run.id).state == "queued"
    assert all_rows() == before


OTHER_STATES = {
    # (model, action, how the row is made, message, state afterwards)
    "requeue-a-done-item": (
        "queueitem",
        "requeue",
        done,
        "Requeued 0 of 1 selected queue item; the other 1 were not dead or cancelled and were left alone: {id}.",
        "done",
    ),
    "requeue-a-reserved-item": (
        "queueitem",
        "requeue",
        reserved,
        "Requeued 0 of 1 selected queue item; the other 1 were not dead or cancelled and were left alone: {id}.",
        "reserved",
    ),
    "cancel-a-done-item": (
        "queueitem",
        "cancel",
        done,
        "Cancelled 0 of 1 selected queue item; the other 1 were not ready or reserved and were left alone: {id}.",
        "done",
    ),
    "cancel-a-dead-item": (
        "queueitem",
        "cancel",
        dead,
        "Cancelled 0 of 1 selected queue item; the other 1 were not ready or reserved and were left alone: {id}.",
        "dead",
    ),
    "retry-now-a-done-item": (
        "queueitem",
        "retry_now",
        done,
        "Made 0 of 1 selected queue item due now; the other 1 were not ready and waiting for their run time or "
        "backoff and were left alone: {id}.",
        "done",
    ),
    "retry-now-a-due-item": (
        "queueitem",
        "retry_now",
        ready,
        "Made 0 of 1 selected queue item due now; the other 1 were not ready and waiting for their run time or "
        "backoff and were left alone: {id}.",
        "ready",
    ),
}


@pytest.mark.django_db
@pytest.mark.parametrize(("model", "action", "make", "message", "after"), OTHER_STATES.values(), ids=OTHER_STATES)
def test_an_action_on_a_row_in_another_state_says_so_and_leaves_it(admin_client, model, action, make, message, after):
    item_id = make()
    rows = all_rows()

    response = admin_client.post(url(model), action_post(action, item_id))

    assert messages_of(response) == [message.format(id=item_id)]  # it names the row it left alone
    assert state(item_id) == after
    assert all_rows() == rows  # nothing changed, so nothing logged either


@pytest.mark.django_db
def test_cancel_of_a_reserved_item_ends_its_attempt_and_its_late_settle_is_stale(admin_client):
    """What the service says for a reserved item: cancelled, its open reservation closed as cancelled; the
    worker that still holds it cannot settle it afterwards."""
    item_id = ready(priority=100)
    (held,) = engine.lease(["mail"], 1, "worker-1", lease_timeout=LONG)

    response = admin_client.post(url("queueitem"), action_post("cancel", item_id))

    assert messages_of(response) == ["Cancelled 1 queue item."]
    assert state(item_id) == "cancelled"
    assert Reservation.objects.get(id=held.reservation_id).outcome == "cancelled"
    with pytest.raises(engine.StaleReservation):
        engine.complete(held, {"late": True})
    assert QueueItem.objects.get(id=item_id).result is None


@pytest.mark.django_db
def test_requeue_of_a_dead_letter_already_requeued_changes_nothing(admin_client):
    item_id = dead()
    letter = letter_of(item_id)
    services.requeue_dead_letters([letter.pk], actor="someone")
    rows = all_rows()

    response = admin_client.post(url("deadletter"), action_post("requeue", letter.pk))

    assert messages_of(response) == [
        "Requeued the items of 0 of 1 selected dead letter; the other 1 were not open (not requeued yet) and were "
        f"left alone: {letter.pk}."
    ]
    letter.refresh_from_db()
    assert letter.requeued_by == "someone"
    assert all_rows() == rows  # nothing changed, nothing logged


@pytest.mark.django_db
def test_pause_of_a_paused_queue_and_resume_of_a_running_one_change_nothing(admin_client):
    ready(queue="mail")
    ready(queue="billing")
    services.pause_queue("mail")

    paused = admin_client.post(url("queue"), action_post("pause", "mail"))
    resumed = admin_client.post(url("queue"), action_post("resume", "billing"))

    assert messages_of(paused) == [
        "Paused 0 of 1 selected queue; the other 1 were not running and were left alone: mail."
    ]
    assert messages_of(resumed)[-1] == (
        "Resumed 0 of 1 selected queue; the other 1 were not paused and were left alone: billing."
    )
    assert dict(Queue.objects.values_list("name", "paused")) == {"mail": True, "billing": False}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("model", "action", "forged"),
    [
        ("queueitem", "requeue", "999999"),
        ("queueitem", "cancel", "99999999999999999999"),  # past bigint
        ("deadletter", "requeue", "-1"),
        ("queue", "pause", "no-such-queue"),
        ("schedule", "run_now", "424242"),
        ("sparkrun", "cancel_runs", "31337"),
    ],
)
def test_an_action_on_ids_that_match_nothing_says_so(admin_client, model, action, forged):
    before = all_rows()

    response = admin_client.post(url(model), action_post(action, forged))

    (message,) = messages_of(response)
    assert "0 of 1 selected" in message and "1 matched no" in message and "deleted, or outside" in message
    assert message.endswith(f": {forged}.")  # named
    assert all_rows() == before


@pytest.mark.django_db
def test_an_id_outside_the_change_lists_filter_is_not_touched(admin_client):
    """The action runs on the rows the change list shows: a dead item of another queue posted along is left."""
    mine, theirs = dead(queue="mail"), dead(queue="billing")

    response = admin_client.post(url("queueitem") + "?queue__name__exact=mail", action_post("requeue", mine, theirs))

    assert (state(mine), state(theirs)) == ("ready", "dead")
    assert messages_of(response) == [
        f"Requeued 1 of 2 selected queue items; 1 matched no queue item (deleted, or outside the current filter): "
        f"{theirs}."
    ]


# -- the Spark dashboard --------------------------------------------------------------------------------------


def spark_url(view: str, *args) -> str:
    return url("sparkrun", view, *args)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("post", "message"),
    [
        ({"job": "no_such_job"}, "unknown Spark job 'no_such_job'"),
        ({}, "unknown Spark job ''"),
        ({"job": "<script>alert(1)</script>"}, "unknown Spark job '<script>alert(1)</script>'"),
    ],
    ids=["unknown", "missing", "markup"],
)
def test_trigger_of_an_unknown_job_is_a_400_with_the_registered_jobs(admin_client, post, message):
    before = all_rows()

    response = admin_client.post(spark_url("trigger"), post)

    assert response.status_code == 400
    jobs = f"registered jobs: {registered_jobs()}"
    [shown] = messages_of(response)
    assert re.fullmatch(rf"Nothing was queued: {re.escape(message)}{HINT}; {re.escape(jobs)}\.", shown), shown
    assert all_rows() == before


BAD_TRIGGERS = {
    "tasks-nan": ({"demo_sleep-tasks": "nan"}, "tasks"),
    "tasks-huge": ({"demo_sleep-tasks": "1" * 400}, "tasks"),
    "seconds-inf": ({"demo_sleep-seconds": "inf"}, "seconds"),
    "seconds-negative": ({"demo_sleep-seconds": "-1"}, "seconds"),
    "timeout-zero": ({"demo_sleep-timeout": "0"}, "timeout"),
    "timeout-over-the-maximum": ({"demo_sleep-timeout": "86400"}, "timeout"),
    "timeout-nan": ({"demo_sleep-timeout": "NaN"}, "timeout"),
}


@pytest.mark.django_db
@pytest.mark.parametrize(("fields", "field"), BAD_TRIGGERS.values(), ids=BAD_TRIGGERS.keys())
def test_trigger_with_bad_params_is_a_400_naming_the_field(admin_client, fields, field):
    before = all_rows()

    response = admin_client.post(spark_url("trigger"), {"job": "demo_sleep", **fields})

    assert response.status_code == 400
    form = next(f["form"] for f in response.context["job_forms"] if f["job"].name == "demo_sleep")
    assert list(form.errors) == [field]
    assert all_rows() == before


@pytest.mark.django_db
@pytest.mark.parametrize("final", ["succeeded", "failed", "cancelled", "timed_out"])
def test_cancel_of_a_finished_run_says_there_is_nothing_to_cancel(admin_client, final):
    run = trigger_run("demo_sleep", {}, trigger="orm")
    SparkRun.objects.filter(id=run.id).update(state=final, finished_at=timezone.now())
    before = all_rows()

    response = admin_client.post(spark_url("cancel", run.id))

    assert response.status_code == 302
    assert messages_of(response) == [f"Run #{run.id} is {final}: nothing to cancel."]
    assert SparkRun.objects.get(id=run.id).state == final
    assert all_rows() == before


@pytest.mark.django_db
def test_cancel_action_on_finished_runs_leaves_them(admin_client):
    run = trigger_run("demo_sleep", {}, trigger="orm")
    SparkRun.objects.filter(id=run.id).update(state="succeeded", finished_at=timezone.now())

    response = admin_client.post(url("sparkrun"), action_post("cancel_runs", run.id))

    assert messages_of(response) == [
        "Asked 0 of 1 selected spark run to stop; the other 1 were not queued, starting or running and were left "
        f"alone: {run.id}."
    ]
    assert SparkRun.objects.get(id=run.id).state == "succeeded"


@pytest.mark.django_db
def test_unknown_runs_are_404_on_every_run_url(admin_client):
    before = all_rows()

    responses = [
        admin_client.post(spark_url("cancel", 424242)),
        admin_client.post(spark_url("rerun", 424242)),
        admin_client.get(spark_url("live", 424242)),
        admin_client.get(spark_url("change", 424242)),
        admin_client.get(spark_url("change", "abc")),
    ]

    assert [r.status_code for r in responses] == [404] * 5
    assert all_rows() == before


@pytest.mark.django_db
def test_rerun_of_a_run_whose_job_is_gone_says_why_and_queues_nothing(admin_client):
    run = trigger_run("demo_sleep", {}, trigger="orm")
    SparkRun.objects.filter(id=run.id).update(job="retired_job", state="failed", finished_at=timezone.now())
    before = all_rows()

    response = admin_client.post(spark_url("rerun", run.id))

    assert response.status_code == 302
    [shown] = messages_of(response)
    expected = rf"Cannot re-run #{run.id}: unknown Spark job 'retired_job'{HINT}; registered jobs: "
    assert re.fullmatch(expected + re.escape(registered_jobs()), shown), shown
    assert all_rows() == before


@pytest.mark.django_db
def test_list_live_ignores_ids_that_are_not_numbers(admin_client):
    run = trigger_run("demo_sleep", {}, trigger="orm")

    response = admin_client.get(spark_url("list_live") + f"?ids={run.id},abc,-3,,99999999999999999999,<b>")

    assert response.status_code == 200
    assert list(response.json()) == [str(run.id)]


# -- the worker -----------------------------------------------------------------------------------------------


@pytest.fixture
def _probe_log_closed():
    yield
    close_log_connection()  # else the test database cannot be dropped at the end


BAD_RESULTS = {
    "object": ({"kind": "object"}, "result is not JSON-serializable: Object of type object"),
    "nan": ({"kind": "nan"}, "result contains nan, which JSON cannot carry"),
    "too-deep": ({"kind": "deep"}, "result nested deeper than 64 levels"),
    "over-the-limit": ({"kind": "huge", "bytes": 1000}, "result is 1003 bytes, over the limit of 1000"),
    "nul": ({"kind": "nul"}, "result contains a NUL character"),
}


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("_probe_log_closed")
@pytest.mark.parametrize(("payload", "reason"), BAD_RESULTS.values(), ids=BAD_RESULTS.keys())
def test_a_result_the_queue_cannot_store_fails_the_attempt_and_the_worker_carries_on(payload, reason):
    bad = get_task("tests.bad_result").enqueue(payload).id
    fine = get_task("queue_app.echo").enqueue({"after": "the bad one"}).id

    with override_settings(**SMALL_LIMIT):
        supervisor = run_worker(concurrency=1)

    item = QueueItem.objects.get(id=bad)
    assert item.state == ItemState.DEAD and item.result is None
    assert item.error.startswith("ResultNotJSON: the handler's result cannot be stored: ") and reason in item.error
    assert DeadLetter.objects.get(item_id=bad).reason == "max attempts exhausted"
    assert list(Reservation.objects.filter(item_id=bad).values_list("outcome", flat=True)) == ["dead"]
    assert QueueItem.objects.get(id=fine).result == {"after": "the bad one"}
    assert not QueueItem.objects.filter(state=ItemState.RESERVED).exists()
    assert supervisor.stats.dead == 1


@pytest.mark.django_db
def test_complete_with_a_result_that_is_not_json_raises_invalid_result_and_writes_nothing():
    item_id = ready(priority=100)
    (held,) = engine.lease(["mail"], 1, "worker-1", lease_timeout=LONG)
    rows = all_rows()

    for result in ({1, 2}, {"x": math.nan}, object()):
        with pytest.raises(InvalidResult, match="result"):
            engine.complete(held, result)

    assert isinstance(InvalidResult("x"), engine.InvalidEnqueue)  # callers catching the old name still do
    assert state(item_id) == "reserved"
    assert Reservation.objects.get(id=held.reservation_id).outcome is None
    assert all_rows() == rows


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("_probe_log_closed")
def test_keyboard_interrupt_from_a_handler_fails_its_attempt_in_the_thread_pool():
    crash = get_task("tests.crash").enqueue({"how": "keyboard_interrupt"}).id
    fine = get_task("queue_app.echo").enqueue({"still": "running"}).id

    run_worker(concurrency=1)

    item = QueueItem.objects.get(id=crash)
    assert item.state == ItemState.DEAD
    assert item.error == "KeyboardInterrupt: raised by the handler"
    assert "Traceback (most recent call last)" in Reservation.objects.get(item_id=crash).traceback
    assert QueueItem.objects.get(id=fine).state == ItemState.DONE


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_keyboard_interrupt_from_a_handler_fails_its_attempt_in_a_worker_process(manage):
    """In the process pool a BaseException is reported by the handler's child (class, message, traceback), which
    then exits; the supervisor records it and carries on (os._exit is proved in test_worker_processes.py)."""
    crash = get_task("tests.crash").enqueue({"how": "keyboard_interrupt"}).id
    fine = get_task("queue_app.echo").enqueue({"still": "running"}).id

    result = manage("run_worker", "--burst", "--concurrency", "1", "--import", "tests.tasks.worker_tasks")

    assert result.returncode == 0, result.stderr[-3000:]
    item = QueueItem.objects.get(id=crash)
    assert item.state == ItemState.DEAD and item.error == "KeyboardInterrupt: raised by the handler"
    assert QueueItem.objects.get(id=fine).state == ItemState.DONE
    assert not QueueItem.objects.filter(state=ItemState.RESERVED).exists()


@pytest.mark.django_db
def test_schedules_survive_hostile_rows_on_their_pages(admin_client):
    """A schedule row edited behind the form's back (a cron croniter refuses) still renders its pages."""
    schedule = Schedule.objects.create(name="broken", cron="not a cron", target="queue_app.noop")

    assert admin_client.get(url("schedule")).status_code == 200
    page = admin_client.get(url("schedule", "change", schedule.pk))
    assert page.status_code == 200
    assert "cannot compute fire times" in page.content.decode()
