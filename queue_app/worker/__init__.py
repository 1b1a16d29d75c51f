"""run_worker's runtime: the supervisor loop (supervisor.py) and its collaborators, each the one owner of its
state: settling outcomes (settling.py), database outages (outage.py), how much work to hold (pacing.py), how to
stop (shutdown.py), the settle-and-lease call (leasing.py); the executors (pool.py) and what runs in them
(execute.py), LISTEN wake-ups (listener.py), maintenance units (maintenance.py), status output (status.py), and
the process replacement after a thread got stuck (replace.py).

    from queue_app.worker import Supervisor, WorkerOptions
    Supervisor(WorkerOptions(queues=["default"], concurrency=4)).run()
"""

from .supervisor import Supervisor, WorkerOptions

__all__ = ["Supervisor", "WorkerOptions"]
