"""`manage.py run_worker`: lease items from the queue and run their handlers (see queue_app/worker/).

    python manage.py run_worker                              # every queue, one child process per CPU
    python manage.py run_worker --queues default,mail --concurrency 8
    python manage.py run_worker --pool thread --concurrency 32   # I/O-bound handlers
    python manage.py run_worker --burst                      # exit 0 once nothing is ready or in flight
    python manage.py run_worker --no-scheduler               # do not fire cron schedules from this worker

SIGTERM or SIGINT: stop leasing, let in-flight handlers finish within --grace-period, hand back the rest,
exit 0. A second signal exits at once (leases then expire and their items are delivered again).

With --pool thread, a handler stuck past its hard timeout has the worker replace its own process once the rest
of its work has settled: the same command again, by exec, in the same pid (queue_app/worker/replace.py); exit
code 75 if that exec fails.
"""

import logging
import os

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from queue_app.management.base import add_import_argument, import_modules
from queue_app.registry import publish_declarations
from queue_app.worker import Supervisor, WorkerOptions
from queue_app.worker.options import DATABASE_DOWN
from queue_app.worker.outage import boot_through_outages
from queue_app.worker.replace import REPLACE, replace_process


def _queues(values: list[str]) -> list[str] | None:
    names = [name.strip() for value in values for name in value.split(",") if name.strip()]
    if not names:
        raise CommandError("--queues needs at least one queue name, or 'all'")
    return None if "all" in names or "*" in names else names


class Command(BaseCommand):
    help = "Run a worker: lease items from the queues, run their tasks, settle them."
    requires_system_checks = []  # run in handle() once the database answers (see there)

    def add_arguments(self, parser):
        parser.add_argument("--skip-checks", action="store_true", help="skip Django's system checks")
        parser.add_argument(
            "--queues", nargs="+", default=["all"], help="queue names (space or comma separated) or 'all' (default)"
        )
        parser.add_argument(
            "--concurrency", type=int, default=os.cpu_count() or 1, help="handlers run at once (default: CPUs)"
        )
        parser.add_argument(
            "--pool",
            choices=["process", "thread"],
            default="process",
            help="process (default: a stuck handler can be killed) or thread (I/O-bound handlers; a thread past "
            "its hard timeout is abandoned, then the worker replaces its own process)",
        )
        parser.add_argument(
            "--batch", type=int, default=None, help="most items per lease (default: concurrency + prefetch)"
        )
        parser.add_argument(
            "--prefetch",
            type=int,
            default=None,
            help="items held leased beyond the running ones, ready to start as slots free up (default: "
            "concurrency); their leases are renewed like running ones",
        )
        parser.add_argument(
            "--hold",
            type=float,
            default=0.025,
            metavar="SECONDS",
            help="of a prefetch larger than --concurrency, hold at most this many seconds of work at the pace "
            "this worker keeps, so that a burst is shared with the other workers rather than queued in one "
            "worker's hand (default: 0.025; 0: always the whole prefetch)",
        )
        parser.add_argument(
            "--poll-interval", type=float, default=1.0, help="seconds between polls when no NOTIFY arrives"
        )
        parser.add_argument("--worker-id", default=None, help="default: host:pid:random")
        parser.add_argument("--burst", action="store_true", help="exit 0 once nothing is ready or in flight")
        parser.add_argument("--max-items", type=int, default=None, help="stop after taking this many items")
        parser.add_argument(
            "--grace-period", type=float, default=25.0, help="seconds in-flight work gets to finish on SIGTERM"
        )
        parser.add_argument(
            "--no-scheduler",
            dest="scheduler",
            action="store_false",
            help="do not fire due cron schedules from this worker (default: every worker may; each fire time "
            "fires once)",
        )
        add_import_argument(parser, "tasks (besides every installed app's tasks.py)")

    def handle(self, *args, **options):
        # Started while the server restarts or is not up yet, the worker waits for it (said once, with backoff)
        # instead of dying in Django's system checks, which connect (requires_system_checks is off: run here).
        # A connection lost during the checks or the publish (the server restarted between the wait and them) is
        # waited out too, and the step run again: the loop starts on a connection that works.
        if not boot_through_outages(lambda: None if options["skip_checks"] else self.check()):
            logging.getLogger("jobsite.worker").info("stopped before the database answered; nothing was taken")
            return
        import_modules(options["imports"])
        if not boot_through_outages(_publish):
            logging.getLogger("jobsite.worker").info("stopped before the database answered; nothing was taken")
            return
        worker_options = WorkerOptions(
            queues=_queues(options["queues"]),
            concurrency=options["concurrency"],
            pool=options["pool"],
            batch=options["batch"],
            prefetch=options["prefetch"],
            hold=options["hold"],
            poll_interval=options["poll_interval"],
            worker_id=options["worker_id"],
            burst=options["burst"],
            max_items=options["max_items"],
            grace_period=options["grace_period"],
            scheduler=options["scheduler"],
        )
        try:
            supervisor = Supervisor(worker_options)
            code = supervisor.run()
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        if code == REPLACE:
            replace_process(supervisor.worker_id, supervisor.taken)
        if code:
            raise SystemExit(code)


def _publish() -> None:
    """The tasks this worker declares (its --import too), for the SQL API's jobsite_enqueue. A lost connection
    goes up to boot_through_outages (waited out, published again); any other database error is said and the
    worker starts anyway."""
    try:
        publish_declarations()
    except DATABASE_DOWN:
        raise
    except DatabaseError:
        logging.getLogger(__name__).warning("could not publish the task declarations for SQL", exc_info=True)
