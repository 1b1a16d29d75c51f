"""`manage.py spark_run JOB` / `spark_run --script PATH`: trigger a Spark run from the command line (through the
same trigger_run() as the dashboard and the schedules); a worker serving the `spark` queue runs it.

    python manage.py spark_run --list
    python manage.py spark_run demo_sleep --param tasks=4 --param seconds=0.5 --wait
    python manage.py spark_run file_rollup --param input_dir=/data/in --param output_dir=/data/out --timeout 600
    python manage.py spark_run --script /srv/jobs/pi.py --arg 4 --arg 100000 --wait --json
    python manage.py spark_run --cancel 12 [--wait] [--json]

Prints "run ID queued" (with --json: one JSON object at the end, {id, job, state, app_id, error, metrics, progress,
timings}; timings: seconds after queued of each step of the last attempt, see runs.TIMING_STEPS). With --wait,
follows the run until it is final, printing its state and progress (not with --json: stdout and stderr then hold
the one object and warnings only, so `--json 2>&1` parses) and then its timings, and exits non-zero unless it
succeeded. Bad parameters, or a script outside JOBSITE_SPARK_SCRIPT_ROOTS,
are reported per field and nothing is queued.

--cancel ID asks a run to stop as the admin's cancel button does (runs.cancel_run): a queued run is cancelled at
once, a started one moves to `cancelling` and its worker stops it. Exit 0 when the cancel was asked, or the run
had ended (or was being cancelled) already; 1 for an unknown id. With --json the object also says
"cancel_requested" (whether this call asked for it); with --wait it follows the run to its end.
"""

import getpass
import json
import sys
import time

from django.core.management.base import CommandError

from queue_app.management.base import JobsiteCommand, parse_params
from queue_app.spark import SparkParamError, UnknownSparkJob, all_jobs
from queue_app.spark.hooks import RunBlocked
from queue_app.spark.models import SparkRun
from queue_app.spark.protocol import COUNTED
from queue_app.spark.runs import cancel_run, timing_split, trigger_run, waiting_for
from queue_app.spark.scripts import ADHOC_JOB


def os_user() -> str:
    """Who runs this command, for the run's `requested_by` ('' when the system cannot say)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def run_summary(run: SparkRun) -> dict:
    """The run as `--json` prints it."""
    p = run.progress or {}
    return {
        "id": run.id,
        "job": run.job,
        "state": run.state,
        "app_id": run.app_id or None,
        "error": run.error or None,
        "metrics": run.metrics or {},
        "progress": {kind: {"done": p.get(f"{kind}_done", 0), "total": p.get(f"{kind}_total", 0)} for kind in COUNTED},
        # Seconds after the run was queued at which each step of its last attempt happened (runs.TIMING_STEPS).
        "timings": {step["step"]: step["after"] for step in timing_split(run)},
    }


def timing_line(run: SparkRun) -> str:
    """`timings: leased +0.31 s, child launched +0.52 s, ...` (seconds after queued), '' before an attempt ended."""
    steps = timing_split(run)[1:]
    return ("timings: " + ", ".join(f"{s['label']} +{s['after']:.2f} s" for s in steps)) if steps else ""


def progress_line(run: SparkRun) -> str:
    p = run.progress or {}
    parts = [f"run {run.id} {run.state}"]
    if (ahead := waiting_for(run)) is not None:
        parts.append(f"waiting for run {ahead.id} (the job's concurrency limit)")
    if run.attempt > 1:
        parts.append(f"attempt {run.attempt}")
    for kind in ("jobs", "stages", "tasks"):
        if p.get(f"{kind}_total"):
            parts.append(f"{kind} {p.get(f'{kind}_done', 0)}/{p[f'{kind}_total']}")
    return "  ".join(parts)


class Command(JobsiteCommand):
    help = "Trigger a Spark run; --wait follows it to the end; --cancel ID stops one; --list shows the jobs."
    # A client of the queue: the system checks (among them a `java -version`, a JVM start) are the worker's and the
    # web server's to run, not a cost of every trigger.
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("job", nargs="?", help="registered Spark job, e.g. demo_sleep")
        parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a job parameter")
        parser.add_argument("--script", metavar="PATH", help="run this PySpark script (under an allowed root)")
        parser.add_argument("--arg", action="append", default=[], metavar="VALUE", help="an argument of --script")
        parser.add_argument("--timeout", type=float, default=None, help="seconds before the run is stopped")
        parser.add_argument("--wait", action="store_true", help="follow the run until it ends")
        parser.add_argument("--json", dest="as_json", action="store_true", help="print one JSON object at the end")
        parser.add_argument("--poll", type=float, default=0.2, help="seconds between looks at the run (--wait)")
        parser.add_argument("--list", dest="list_only", action="store_true", help="list the jobs and their parameters")
        parser.add_argument("--cancel", type=int, metavar="ID", help="ask run ID to stop (as the admin's cancel)")

    def handle(self, *args, job, param, script, arg, timeout, wait, as_json, poll, list_only, cancel, **options):
        if list_only:
            self.list_jobs()
            return
        if cancel is not None:
            if job or param or script is not None or arg or timeout is not None:
                raise CommandError("--cancel ID takes no job, --param, --script, --arg or --timeout")
            self.cancel(cancel, wait=wait, as_json=as_json, poll=poll)
            return
        if script is not None:
            if job or param:
                raise CommandError(
                    "--script runs a script by path: give its arguments with --arg, not a job or --param"
                )
            job, params = ADHOC_JOB, {"path": script, "args": json.dumps(arg)}
        elif arg:
            raise CommandError("--arg goes with --script; a registered job takes --param NAME=VALUE")
        elif not job:
            raise CommandError("name a Spark job (see --list) or give --script PATH")
        else:
            params = parse_params(param)
        try:
            run = trigger_run(job, params, trigger="cli", requested_by=os_user(), timeout=timeout)
        except UnknownSparkJob as exc:
            raise CommandError(str(exc)) from None
        except RunBlocked as exc:  # an input failed its blocking checks, or they still run
            raise CommandError(f"{exc.errors['blocked']}; nothing was queued") from None
        except SparkParamError as exc:
            lines = "\n".join(f"  {name}: {message}" for name, message in exc.errors.items())
            what = f"script {script}" if script is not None else job
            raise CommandError(f"invalid parameters for {what}; nothing was queued:\n{lines}") from None
        if wait:  # the first line it prints says the run is queued
            run = self.follow(run.id, poll, None if as_json else self.stdout)
        elif not as_json:
            self.stdout.write(progress_line(run))
        if as_json:
            self.stdout.write(json.dumps(run_summary(run), default=str))
        if wait and run.state != "succeeded":
            if as_json:
                sys.exit(1)
            raise CommandError(f"run {run.id} ended {run.state}" + (f": {run.error}" if run.error else ""))

    def cancel(self, run_id: int, *, wait: bool, as_json: bool, poll: float) -> None:
        user = os_user()
        asked = cancel_run(run_id, actor=f"{user} from the CLI" if user else "the CLI")
        run = SparkRun.objects.filter(id=run_id).first()
        if run is None:
            if as_json:
                self.stdout.write(json.dumps({"id": run_id, "error": f"no Spark run {run_id}"}))
                sys.exit(1)
            raise CommandError(f"no Spark run {run_id}")
        if wait:
            run = self.follow(run.id, poll, None if as_json else self.stdout)
        elif not as_json:
            said = "cancel requested" if asked else "nothing to cancel"
            self.stdout.write(f"{progress_line(run)}  ({said})")
        if as_json:
            self.stdout.write(json.dumps({**run_summary(run), "cancel_requested": asked}, default=str))

    def list_jobs(self) -> None:
        for spark_job in all_jobs():
            self.stdout.write(self.style.MIGRATE_HEADING(spark_job.name) + f"  {spark_job.description}")
            for p in spark_job.params:
                what = p.type + (f" of {', '.join(p.choices)}" if p.choices else "")
                bounds = "".join(
                    f" {sign}{value:g}" for sign, value in ((">=", p.min), ("<=", p.max)) if value is not None
                )
                need = "required" if p.required else f"default {json.dumps(p.default)}"
                self.stdout.write(f"  --param {p.name}=…  {what}{bounds}, {need}" + (f"  {p.help}" if p.help else ""))

    def follow(self, run_id: int, poll: float, out) -> SparkRun:
        """Wait for the run's end, writing each new progress line to `out` (None: silent, for --json)."""
        last = ""
        while True:
            run = SparkRun.objects.get(id=run_id)
            line = progress_line(run)
            if line != last and out is not None:
                out.write(line)
                last = line
            if run.is_final:
                break
            time.sleep(poll)
        if run.metrics and out is self.stdout:
            out.write(json.dumps(run.metrics, default=str))
        if (line := timing_line(run)) and out is self.stdout:
            out.write(line)
        return run
