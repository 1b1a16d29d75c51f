"""`manage.py queue_chaos`: prove that nothing is lost under faults (see jobsite/chaos/).

    python manage.py queue_chaos --quick            # CI: 3,000 items, 2 kills, 1 SIGTERM, 1 restart, 1 cut
    python manage.py queue_chaos                    # 100,000 items, 8 kills, 3 SIGTERMs, 1 restart, 2 cuts
    python manage.py queue_chaos --items 20000 --workers 4 --seed 7 --json-out var/chaos.json --keep
    python manage.py queue_chaos --workflow [--quick]   # kill -9 through ~2,000 workflow steps (quick ~250)
    python manage.py queue_chaos --triggers [--quick]   # kill -9 through data-aware triggers (quick: 150 partitions)
    python manage.py queue_chaos --waits [--quick]      # kill -9 + a restart while 2,000 workflows wait (quick: 240)

Runs on a private PostgreSQL cluster it creates (and restarts), never on DATABASE_URL's server. Exits 1 when
any check fails.
"""

import random
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from jobsite.chaos.plan import FULL, QUICK
from jobsite.chaos.runner import ChaosRun, Options
from jobsite.chaos.triggers import FULL as TRIGGERS_FULL
from jobsite.chaos.triggers import QUICK as TRIGGERS_QUICK
from jobsite.chaos.triggers import TriggerChaosRun
from jobsite.chaos.waits import FULL as WAITS_FULL
from jobsite.chaos.waits import QUICK as WAITS_QUICK
from jobsite.chaos.waits import WaitChaosRun
from jobsite.chaos.workflow import FULL as WORKFLOW_FULL
from jobsite.chaos.workflow import QUICK as WORKFLOW_QUICK
from jobsite.chaos.workflow import WorkflowChaosRun


class Command(BaseCommand):
    help = "Run the queue under kill -9, SIGTERM, a database restart and connection loss; check nothing is lost."

    def add_arguments(self, parser):
        parser.add_argument("--quick", action="store_true", help="CI size: 3,000 items and one of each fault")
        parser.add_argument("--items", type=int, default=None, help="items to plant (default 100,000; quick 3,000)")
        parser.add_argument("--workers", type=int, default=None, help="worker processes kept running (default 3)")
        parser.add_argument("--seed", type=int, default=None, help="seed of the plan and fault schedule")
        parser.add_argument("--keep", action="store_true", help="keep the private cluster running afterwards")
        parser.add_argument("--json-out", type=Path, default=None, help="figures file (default: the run's dir)")
        parser.add_argument(
            "--workflow",
            action="store_true",
            help="the workflow scenario instead: kill -9 through ~2,000 workflow steps (quick: ~250)",
        )
        parser.add_argument(
            "--triggers",
            action="store_true",
            help="the data-aware trigger scenario: kill -9 while 1,500 partitions' upstreams fire consumers "
            "(quick: 150)",
        )
        parser.add_argument(
            "--waits",
            action="store_true",
            help="the workflow-waits scenario: kill -9 and one PostgreSQL restart while 2,000 workflows sleep and "
            "wait for events sent by another process (quick: 240)",
        )

    def handle(self, *args, **options):
        scenarios = (
            ("workflow", WorkflowChaosRun, WORKFLOW_QUICK, WORKFLOW_FULL),
            ("triggers", TriggerChaosRun, TRIGGERS_QUICK, TRIGGERS_FULL),
            ("waits", WaitChaosRun, WAITS_QUICK, WAITS_FULL),
        )
        for flag, run_class, quick, full in scenarios:
            if options[flag]:
                sizes = quick if options["quick"] else full
                return self._run(options, QUICK, lambda opts, write, c=run_class, s=sizes: c(opts, write, s))
        sizes = (QUICK if options["quick"] else FULL).scaled(options["items"], options["workers"])
        if sizes.items < 100:
            raise CommandError("--items must be at least 100")
        if sizes.workers < 1:
            raise CommandError("--workers must be at least 1")
        return self._run(options, sizes, ChaosRun)

    def _run(self, options, sizes, make) -> None:
        """Run the scenario `make(Options, write)` builds with the seed asked for (or a random one); exit 1 if a
        check failed."""
        seed = options["seed"] if options["seed"] is not None else random.randrange(1_000_000)

        def write(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        code = make(Options(sizes, seed, keep=options["keep"], json_out=options["json_out"]), write).run()
        if code:
            raise SystemExit(code)
