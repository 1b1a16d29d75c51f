"""LOG_FORMAT=json (jobsite/settings.py, queue_app/logcontext.py): a real worker's every output line is one JSON
object, and the lines about an attempt (the handler's own, the worker's settle lines) carry its ids."""

import json
import logging
import socket
import urllib.error
import urllib.request

import pytest

from queue_app import engine
from queue_app.engine import tracing
from queue_app.logcontext import ContextFilter, attempt_context, bind_process, log_context
from queue_app.workflows import services as workflows
from queue_app.workflows.definition import Graph
from queue_app.workflows.models import WorkflowStep
from tests.support.waiting import wait_for
from tests.tasks import json_log_tasks  # noqa: F401  registers tests.logs_then_fails_once here (the workflow's step)

pytestmark = pytest.mark.django_db

ITEMS = 3
MISSING_RUN = 987_654


def lines_of(text: str) -> list[dict]:
    """Every line parsed as a JSON object (a line that is not one fails the test, naming it)."""
    parsed = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"line {number} is not JSON ({exc}): {line!r}") from None
        assert isinstance(record, dict), line
        parsed.append(record)
    return parsed


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_workers_output_is_json_lines_with_the_attempts_ids(worker):
    items = [engine.enqueue("tests.logs_then_fails_once", {"n": n}, queue="json_logs").id for n in range(ITEMS)]
    # The Spark run handler, for a run that does not exist: it logs so (no JVM needed) under the run's id.
    spark_item = engine.enqueue("queue_app.spark_run", {"run_id": MISSING_RUN}, queue="spark").id
    # A workflow's step: its lines also name the workflow and the step, with tracing off (the worker's lease
    # returns them when its logs are JSON).
    assert not tracing.enabled
    graph = Graph("json-logs-flow")
    graph.task("tests.logs_then_fails_once", {"n": ITEMS}, name="logged")
    workflow = workflows.start_graph(graph)
    step_item = WorkflowStep.objects.get(workflow_id=workflow.id, name="logged").item_id
    assert step_item is not None
    proc = worker(
        "json-worker",
        "--import",
        "tests.tasks.json_log_tasks",
        "--queues",
        "json_logs",
        "spark",
        "--concurrency",
        "2",
        "--burst",
        env={"LOG_FORMAT": "json", "LOG_LEVEL": "INFO"},
    )
    assert proc.wait(timeout=300) == 0, proc.log.read_text()[-3000:]
    records = lines_of(proc.log.read_text())

    assert records and all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    # the worker's id on every line of its process, its own lines and the handlers' alike
    assert {r.get("worker_id") for r in records} == {"json-worker"}
    handled = [r for r in records if r["logger"] == "tests.json_logs" and r["message"].startswith("handling")]
    failed = [r for r in records if r["logger"] == "jobsite.worker" and r["message"].startswith("attempt failed")]
    finished = [r for r in records if r["logger"] == "tests.json_logs" and r["message"].startswith("done")]
    ids = ("item_id", "task", "attempt", "queue")
    stepped = [r for r in handled if r["item_id"] == step_item]
    assert [(r["attempt"], r["workflow_id"], r["workflow_step"]) for r in stepped] == [
        (1, workflow.id, "logged"),
        (2, workflow.id, "logged"),
    ]
    handled = [r for r in handled if r["item_id"] != step_item]
    assert not any("workflow_id" in r for r in handled)  # items of no workflow name none
    failed = [r for r in failed if r["item_id"] != step_item]
    finished = [r for r in finished if r["item_id"] != step_item]
    expected = {(item, "tests.logs_then_fails_once", attempt, "json_logs") for item in items for attempt in (1, 2)}
    assert {tuple(r[k] for k in ids) for r in handled} == expected  # both attempts of each item, with its ids
    assert {tuple(r[k] for k in ids) for r in failed} == {(item, *rest) for item, *rest in expected if rest[1] == 1}
    assert {tuple(r[k] for k in ids) for r in finished} == {(i, *rest) for i, *rest in expected if rest[1] == 2}
    assert all("\nsecond line of the same record" in r["message"] for r in handled)  # one record, one line
    (launcher,) = [r for r in records if r.get("spark_run_id") is not None]
    assert launcher["logger"] == "jobsite.spark" and "does not exist" in launcher["message"]
    assert (launcher["spark_run_id"], launcher["item_id"], launcher["queue"]) == (MISSING_RUN, spark_item, "spark")
    # lines about no attempt carry none of its ids
    started = [r for r in records if r["message"].startswith("worker started")]
    assert len(started) == 1 and not set(ids) & started[0].keys()


def test_the_filter_copies_the_innermost_ids_and_an_explicit_extra_wins():
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logger = logging.getLogger("tests.json_logs.filter")
    handler = Keep()
    handler.addFilter(ContextFilter())
    logger.addHandler(handler)
    try:
        attempt = engine.enqueue("tests.logs", {}, queue="json_logs")
        (lease,) = engine.lease(["json_logs"], 1, "w")
        assert lease.item_id == attempt.id
        with log_context(spark_run_id=7), attempt_context(lease):
            logger.warning("inner")
            logger.warning("explicit", extra={"item_id": -1})
        logger.warning("outside")
    finally:
        logger.removeHandler(handler)

    inner, explicit, outside = seen
    assert (inner.item_id, inner.task, inner.attempt, inner.queue, inner.spark_run_id) == (
        lease.item_id,
        "tests.logs",
        1,
        "json_logs",
        7,
    )
    assert explicit.item_id == -1
    assert not hasattr(outside, "item_id") and not hasattr(outside, "spark_run_id")
    with pytest.raises(TypeError, match="unknown log context ids"):
        log_context(item=1)
    with pytest.raises(TypeError, match="unknown log context ids"):
        bind_process(worker=1)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_web_servers_request_and_error_lines_are_json(spawn, tmp_path):
    """runserver with LOG_FORMAT=json: its request lines (django.server) and Django's warnings (django.request,
    a 404) are JSON objects. Its banner ("Starting development server at ...") is the command's output, not a
    log line, and stays text."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "web.log"
    with log.open("w") as out:
        spawn("runserver", f"127.0.0.1:{port}", "--noreload", stdout=out, env={"LOG_FORMAT": "json"})
    wait_for(lambda: _status(port, "/healthz") is not None, timeout=120, what="the site to answer")
    assert _status(port, "/no-such-page/") == 404

    def logged() -> list[dict]:
        return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]

    wait_for(
        lambda: any("/no-such-page/" in r["message"] for r in logged() if r["logger"] == "django.server"),
        timeout=60,
        what="the 404's request line",
    )
    records = logged()
    served = [r for r in records if r["logger"] == "django.server" and "/no-such-page/" in r["message"]]
    assert served[0]["status_code"] == 404 and served[0]["level"] == "WARNING"
    assert any(r["logger"] == "django.request" and r["message"] == "Not Found: /no-such-page/" for r in records)
    text = [line for line in log.read_text().splitlines() if not line.startswith("{")]
    assert not [line for line in text if "HTTP/1.1" in line or "Not Found" in line]  # no log line left as text


def _status(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None
