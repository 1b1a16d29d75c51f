"""The dataset checks tests' one allowed dataset root (`root` fixture), a Spark run's reservation context, and a
workflow step parked on a failed check."""

import pytest

from queue_app.datasets.declarations import _code
from queue_app.datasets.locations import ROOTS_ENV
from queue_app.datasets.quality import _checks
from queue_app.datasets.services import record_materialization
from queue_app.registry import Context, Delivery
from queue_app.reservations import reserve
from queue_app.spark.registry import _jobs
from queue_app.spark.runs import QUEUE
from queue_app.spark.scripts import ROOTS_ENV as SCRIPT_ROOTS_ENV
from queue_app.spark.scripts import register_script
from queue_app.workflows import Graph
from queue_app.workflows import services as workflows
from tests.support.paths import SPARK_SCRIPTS
from tests.tasks import datasets_checked

SCRIPTS = SPARK_SCRIPTS


DAY = {"name": "day", "type": "date", "required": True}


@pytest.fixture
def root(tmp_path, monkeypatch):
    """The one allowed dataset root; the datasets, checks and jobs a test declares are forgotten after it."""
    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv(ROOTS_ENV, str(data))
    datasets, checks, jobs = set(_code.entries()), list(_checks), set(_jobs.entries())
    yield data
    for name in set(_code.entries()) - datasets:
        _code.unregister(name)
    for name in set(_jobs.entries()) - jobs:
        _jobs.unregister(name)
    _checks[:] = checks


def spark_ctx(run_id):
    """A real reservation of the Spark run's item, as a worker's lease gives it (not settled here)."""
    held = reserve(QUEUE, timeout=5, lease=60)
    assert held is not None and held.payload == {"run_id": run_id}
    return ctx_of(held)


def ctx_of(held) -> Context:
    """The Context a worker would give the Spark task's handler for the reservation `held`."""
    return Context(
        item_id=held.item_id,
        reservation_id=held.reservation_id,
        attempt=held.attempt,
        max_attempts=held.max_attempts,
        task="queue_app.spark_run",
        queue=QUEUE,
        delivery=Delivery.AT_LEAST_ONCE,
        worker_id="test",
    )


def park_a_step(root, monkeypatch):
    """A workflow whose Spark step reads dsc_daily[2026-11-26], whose partition has a BAD marker in its files
    and a materialization whose checks are still to run: (the workflow, the materialization, the step's status,
    the partition's folder)."""
    monkeypatch.setenv(SCRIPT_ROOTS_ENV, str(SCRIPTS))
    datasets_checked.declare()
    register_script("dsc_reader", path=str(SCRIPTS / "pi.py"), params=[DAY], consumes={"dsc_daily": "day"})
    graph = Graph("dsc_flow")
    graph.spark("dsc_reader", {"day": "2026-11-26"}, name="read")
    flow = workflows.start_graph(graph)
    day = root / "dsc/day=2026-11-26"
    day.mkdir(parents=True)
    (day / "BAD").write_text("x")
    m = record_materialization(datasets_checked.DATASET, "2026-11-26", rows=50)  # its checks still to run
    [step] = workflows.status(flow.id)["steps"]
    return flow, m, step, day
