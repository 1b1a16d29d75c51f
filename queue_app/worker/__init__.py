"""run_worker's runtime: the supervisor loop (supervisor.py), the executors (pool.py) and what runs in them
(execute.py), LISTEN wake-ups (listener.py), maintenance units (maintenance.py), status output (status.py), and
the process replacement after a thread got stuck (replace.py).

    from queue_app.worker import Supervisor, WorkerOptions
    Supervisor(WorkerOptions(queues=["default"], concurrency=4)).run()
"""

from .supervisor import Supervisor, WorkerOptions

__all__ = ["Supervisor", "WorkerOptions"]
