"""Replacing the worker's process when a handler thread is stuck past its hard timeout (a thread cannot be
stopped: only ending its process ends it, with its connection, its transaction and its row locks).

The supervisor decides (settling.py), stops leasing, hands back what it holds and has not started, lets the rest
of its in-flight work settle, then returns REPLACE from Supervisor.run(); `run_worker` then calls
replace_process(): the same command with the same arguments in the same process id (os.execv), so a plain
`run_worker` recovers on its own. Should the exec fail, the worker exits with REPLACE (75, EX_TEMPFAIL), the code a
process supervisor should restart on (`manage.py up` restarts a worker whatever its exit code).

The old and new process of one worker share the pid; the new one's worker id is new unless --worker-id fixed it,
and it says which worker it replaces. Its --max-items count goes on from the old one's.
"""

import json
import logging
import os
import signal
import sys
from typing import NoReturn

from django.db import connections

logger = logging.getLogger("jobsite.worker")

REPLACE = 75  # Supervisor.run()'s result: replace this process; run_worker's exit code if the exec fails
REPLACES_ENV = "JOBSITE_WORKER_REPLACES"  # to the new process: {"worker_id": ..., "taken": ...}
# Blocked across the exec (a blocked signal stays pending through it) and unblocked by the new process once its
# handlers are in place (Supervisor.run): a SIGTERM sent while it starts up stops it gracefully, not by default.
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def replaced() -> dict:
    """What the process this one replaced handed over ({} when it replaced none); read once, then forgotten,
    so that a child or a later process does not take it for its own."""
    handed = os.environ.pop(REPLACES_ENV, None)
    if not handed:
        return {}
    try:
        found = json.loads(handed)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def replace_process(worker_id: str, taken: int) -> NoReturn:
    """Exec this same command line again (interpreter options included). The database sockets of this process
    (libpq opens them close-on-exec) close with it; the server rolls back what a stuck handler's transaction
    held."""
    logger.warning(
        "replacing the worker process now: the same command again in pid %d (a handler thread was stuck past its "
        "hard timeout)",
        os.getpid(),
    )
    connections.close_all()
    os.environ[REPLACES_ENV] = json.dumps({"worker_id": worker_id, "taken": taken})
    argv = [sys.executable, *sys.orig_argv[1:]]
    logging.shutdown()  # flush every handler: exec discards what they buffer
    sys.stdout.flush()
    sys.stderr.flush()
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        os.execv(sys.executable, argv)
    except OSError as exc:
        print(f"could not replace the worker process ({exc}); exiting with code {REPLACE}", file=sys.stderr)
    os._exit(REPLACE)
