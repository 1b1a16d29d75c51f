"""The runner the executor pools' tests give their children (`scripted`: the payload says what to do: exit, segfault,
sleep), a job for it, and waiting for a pool's outcomes. A `-c` child imports it too."""

import faulthandler
import os
import signal
import time

from queue_app.worker.execute import Job, Outcome
from tests.tasks import worker_tasks  # noqa: F401  (registers the tests.* tasks)


def scripted(job: Job) -> Outcome:
    """A runner for pool tests: the payload says what to do."""
    action = job.payload.get("do")
    if action == "exit":
        os._exit(3)
    if action == "segfault":
        faulthandler.disable()  # pytest's, inherited: no traceback dump on stderr
        os.kill(os.getpid(), signal.SIGSEGV)
    if action == "system_exit":
        raise SystemExit(4)
    if action == "sleep":
        time.sleep(job.payload["seconds"])
    return Outcome(job.reservation_id, "ok", {"pid": os.getpid()})


def scripted_job(reservation_id: int, **payload) -> Job:
    return Job(reservation_id, reservation_id, "q", "t", payload, 1, 1, "test")


def wait_outcomes(pool, n: int, timeout: float = 10.0) -> list[Outcome]:
    outcomes: list[Outcome] = []
    deadline = time.monotonic() + timeout
    while len(outcomes) < n and time.monotonic() < deadline:
        outcomes += pool.collect()
        time.sleep(0.01)
    return outcomes
