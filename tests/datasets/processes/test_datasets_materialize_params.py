"""`dataset materialize` of the demo's datasets (issue 50): a producer gets its parameters from the partition,
the dataset's declared `params` and `--param NAME=VALUE` (the later winning), and a task declared with
`@job(produces=...)` is a producer like a Spark job. One real worker on the default queue (the producer task and
the checks); the Spark runs are only queued (no worker serves the spark queue: no JVM)."""

import datetime as dt
import json
import os

import pytest
from django.core.exceptions import ImproperlyConfigured

from queue_app.datasets import DatasetError, dataset
from queue_app.datasets.declarations import _code
from queue_app.datasets.locations import ROOTS_ENV
from queue_app.datasets.models import Materialization
from queue_app.datasets.producer_params import params_of, parse_pairs, producer_params
from queue_app.models import QueueItem
from queue_app.registry import ChunkPolicy, job
from queue_app.spark.models import SparkRun

DAY = "2026-11-30"


def _cli(manage):
    return lambda *args: manage("dataset", "materialize", *args)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_demos_datasets_materialize_from_the_cli_with_derived_and_given_params(manage, worker, tmp_path,
                                                                                  monkeypatch):  # fmt: skip
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path))  # this process and (through child_env) the children
    root = os.path.realpath(tmp_path)
    materialize = _cli(manage)

    # demo.rollup before its input exists: the derived input_dir is checked by the job; nothing queued
    early = materialize("demo.rollup", "--partition", DAY)
    assert early.returncode == 1 and f"demo_pipeline/input/{DAY} does not exist" in early.stderr
    assert "nothing queued" in early.stderr and not SparkRun.objects.exists()

    # demo.events: its producer is the task demo.write_events; the item's success records the partition
    worker("mp1", "--queues", "default", "--concurrency", "2", "--pool", "thread")
    done = materialize("demo.events", "--partition", DAY, "--wait", "--timeout", "90", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["state"], result["runs"], result["partitions"]) == ("succeeded", [], [DAY])
    (item,) = QueueItem.objects.filter(id__in=result["items"])
    assert item.task == "demo.write_events"
    reason = "manage.py dataset materialize"
    assert item.payload == {"dataset": "demo.events", "partition": DAY, "params": {}, "reason": reason}
    (made,) = Materialization.objects.filter(dataset="demo.events", partition=DAY)
    assert (made.source, made.item_id, made.files, made.rows, made.checks) == ("item", item.id, 5, 10_000, "passed")
    assert made.metadata == {"task": "demo.write_events", "params": {}}
    # the text output says what --json says: the list's checks, queue_stats' in flight
    listed = manage("dataset", "list").stdout.splitlines()
    assert [line for line in listed if line.startswith("demo.events ")][0].endswith("checks passed")
    assert "in_flight" in manage("queue_stats").stdout.splitlines()[0]

    # demo.rollup: the partition, the declaration's input_dir and output_dir, then --param over them
    queued = materialize("demo.rollup", "--partition", DAY, "--param", "keys=region", "--json")
    assert queued.returncode == 0, queued.stderr
    assert queued.stderr == ""  # --json: no INFO line ("spark run N queued") to mix into a 2>&1 capture
    (run,) = SparkRun.objects.filter(id__in=json.loads(queued.stdout)["runs"])
    wanted = {
        "day": DAY,
        "input_dir": f"{root}/demo_pipeline/input/{DAY}",
        "output_dir": f"{root}/demo_pipeline/rollup",
        "keys": "region",
    }
    assert {k: run.params[k] for k in wanted} == wanted and run.job == "demo_rollup"
    elsewhere = str(tmp_path / "elsewhere")
    again = materialize("demo.rollup", "--partition", DAY, "--param", f"output_dir={elsewhere}", "--json")
    (other,) = SparkRun.objects.filter(id__in=json.loads(again.stdout)["runs"])
    assert other.params["output_dir"] == elsewhere and other.params["input_dir"] == wanted["input_dir"]

    # bad --param: a clear error, nothing queued
    runs = SparkRun.objects.count()
    last = QueueItem.objects.order_by("-id").values_list("id", flat=True).first()  # done items leave (archive)
    for args, message in [
        (("--param", "input_dir"), "--param takes NAME=VALUE, not 'input_dir'"),
        (("--param", "=x"), "--param takes NAME=VALUE"),
        (("--param", "keys=a", "--param", "keys=b"), "--param keys is given twice"),
        (("--param", "nosuch=1"), "nosuch: unknown parameter"),
        (("--param", "format=xml"), "format:"),
    ]:
        bad = materialize("demo.rollup", "--partition", DAY, *args)
        assert bad.returncode == 1 and message in bad.stderr, (args, bad.stderr)
        assert "nothing" in bad.stderr
    assert SparkRun.objects.count() == runs and not QueueItem.objects.filter(id__gt=last).exists()


@pytest.mark.django_db
def test_a_declarations_params_are_checked_when_declared_and_derived_per_partition(tmp_path, monkeypatch):
    monkeypatch.setenv(ROOTS_ENV, str(tmp_path))
    for bad, message in [
        ({"x": "{day}"}, "unknown placeholder {day}"),
        ({"x": 3}, "a template is a string"),
        ({"x": "{partition"}, "'x':"),
        (["x"], "a mapping of parameter names"),
    ]:
        with pytest.raises(ValueError, match=message):
            params_of(bad)
        with pytest.raises(DatasetError, match="dataset 'mp_bad': params"):
            dataset("mp_bad", location="mp/{partition}", partitioning="daily", params=bad)
    assert _code.get("mp_bad") is None
    with pytest.raises(ValueError, match="--param takes NAME=VALUE"):
        parse_pairs(["a=1", "b"])
    assert parse_pairs(["a=1", "b=x=y", "c="]) == {"a": "1", "b": "x=y", "c": ""}

    made = dataset("mp_fn", location="mp/{partition}", partitioning="daily", params=lambda key: {"when": key * 2})
    templated = dataset(
        "mp_tpl", location="mp/t/{partition}", partitioning="daily", params={"at": "{location}", "r": "{root}/x"}
    )
    try:
        assert producer_params(made, "2026-01-01", "day", {"x": "1"}) == {
            "day": "2026-01-01",
            "when": "2026-01-012026-01-01",
            "x": "1",
        }
        root = os.path.realpath(tmp_path)
        assert producer_params(templated, "2026-01-02", None, {"r": "mine"}) == {
            "at": f"{root}/mp/t/2026-01-02",
            "r": "mine",
        }
        assert dt.date.fromisoformat(producer_params(templated, "2026-01-02", "day")["day"]) == dt.date(2026, 1, 2)
    finally:
        for name in ("mp_fn", "mp_tpl"):
            _code.unregister(name)


def test_a_producer_task_declares_datasets_by_name_and_is_never_chunked():
    with pytest.raises(TypeError, match="produces names datasets"):
        job("tests.mp_bad", produces=[""])
    with pytest.raises(ImproperlyConfigured, match="a chunked task cannot produce datasets"):
        job("tests.mp_chunked", produces="demo.events", chunk=ChunkPolicy(size=10, timeout=1))


@pytest.mark.django_db(transaction=True)
def test_a_transactional_producer_records_with_its_settle_and_nothing_written_fails_the_attempt(tmp_path, monkeypatch):
    """In process (worker/execute.py): the record commits with the item's done settle; a producer that wrote
    nothing at the location fails its attempt, and neither the record nor the settle is kept."""
    from queue_app import engine
    from queue_app.datasets.materialize import materialize
    from queue_app.registry import _tasks
    from queue_app.worker.execute import Job, run_job

    monkeypatch.setenv(ROOTS_ENV, str(tmp_path))
    dataset("mp_tx", location="mp_tx/{partition}", partitioning="daily", params={"folder": "{location}"})

    @job("tests.mp_tx", delivery="transactional", produces=["mp_tx"])
    def build(payload, ctx):
        if payload["partition"] == "2026-01-01":
            os.makedirs(payload["params"]["folder"])
            with open(os.path.join(payload["params"]["folder"], "part-0.csv"), "w") as f:
                f.write("a\n1\n")
        return {"rows": 1}

    def run_one():
        (held,) = engine.lease(None, 1, "test")
        return held, run_job(Job(held.reservation_id, held.item_id, held.queue, held.task, held.payload,
                                 held.attempt, held.max_attempts, "test"))  # fmt: skip

    try:
        queued = materialize("mp_tx", partition="2026-01-01", params={"extra": "x"})
        held, outcome = run_one()
        assert outcome.status == "settled" and queued["items"] == [held.item_id]
        assert QueueItem.objects.get(id=held.item_id).state == "done"
        (made,) = Materialization.objects.filter(dataset="mp_tx")
        assert (made.partition, made.item_id, made.files, made.rows) == ("2026-01-01", held.item_id, 1, 1)
        assert made.metadata["params"] == {"folder": f"{os.path.realpath(tmp_path)}/mp_tx/2026-01-01", "extra": "x"}

        materialize("mp_tx", partition="2026-01-02")
        held, outcome = run_one()
        assert outcome.status == "failed" and "wrote nothing at" in outcome.error
        assert QueueItem.objects.get(id=held.item_id).state == "reserved"  # the supervisor settles the failure
        assert Materialization.objects.filter(dataset="mp_tx").count() == 1
    finally:
        _tasks.unregister("tests.mp_tx")
        _code.unregister("mp_tx")
