"""`manage.py dataset`: the declared datasets, their materializations and freshness; observe data written outside.

    python manage.py dataset list [--json]
    python manage.py dataset show NAME [--partition P] [--json]
    python manage.py dataset observe NAME [--partition P] [--json]
    python manage.py dataset lineage NAME [--depth N] [--json]
    python manage.py dataset materialize NAME [--partition P | --from D --to D] [--param K=V ...] [--missing-only]
                                         [--wait] [--json]
    python manage.py dataset override NAME [--partition P] --comment TEXT [--user NAME] [--json]
    python manage.py dataset partitions add|remove NAME KEY [KEY ...] [--dimension D] [--json]
    python manage.py dataset partitions list NAME [--dimension D] [--history] [--json]

A multi-dimension dataset's partition is its canonical key, one key per dimension in the order declared
(`--partition '2026-11-30|eu'`); `materialize --from '2026-11-01|eu' --to '2026-11-30|eu'` runs over the time
dimension with the others fixed, or `*` for every key of one (`--partition '2026-11-30|*'` too).

`list --json` prints [{"name", "partitioning", "last_materialized", "freshness", "checks"}]; `show --json` prints
{"name", "location", "partitioning", "producers", "consumers", "freshness", "materializations": [{"partition", "at",
"rows", "bytes", "files", "run_id", "step_id", "checks"}]} newest first; `observe --json` prints the recorded
materialization; `lineage --json` prints {"dataset", "upstream": [names], "downstream": [names], "jobs": [names]}
(datasets/lineage.py); `materialize --json` prints {"dataset", "partitions", "runs", "items", "state"}, plus
"dimensions": [names] for a multi-dimension dataset (with --wait, exit status 0 only when every run or item
succeeded and its materializations' blocking checks passed); its `--param NAME=VALUE` (repeatable) win over the
dataset's declared params and the partition (datasets/producer_params.py); a malformed one is an error and nothing
is queued.
`override` makes the partition's latest materialization, whose blocking checks
failed, usable (datasets/checks_run.override_failed_checks), as the Django user `--user NAME` or else the one
named as the OS login, who must hold jobsite_datasets.override_dataset_check; `--json` prints {"dataset", "partition",
"id", "checks"}. A user without the permission, no such user, or nothing failed to override: exit status 1 and
nothing written. `partitions` adds and removes the keys of the dynamic partition set NAME's dataset is partitioned
by (NAME may also be `set:SETNAME`; `--dimension` when it has several): `--json` prints {"set", "added" or
"removed": [keys]} or, for `list`, {"set", "keys": [{"key", "added_at", "added_by", "removed_at",
"removed_by"}]} (removed keys with `--history`); a removal refused (a key not in the set, a run of one open)
removes nothing. An unknown dataset, a partition that does not fit its partitioning, nothing to observe or no
producer is an error message and exit status 1, and nothing is written.
"""

import getpass
import json

from django.core.exceptions import PermissionDenied
from django.core.management.base import CommandError
from django.utils import timezone

from queue_app.datasets import DatasetError, declared_datasets, dynamic, get_dataset
from queue_app.datasets import materialize as backfill
from queue_app.datasets import services as datasets
from queue_app.datasets.checks_run import latest, override_failed_checks
from queue_app.datasets.lineage import LineageGraph
from queue_app.datasets.producer_params import parse_pairs
from queue_app.datasets.spark_runs import users
from queue_app.datasets.status import check_results, detail, history, summaries
from queue_app.datasets.sync import sync_datasets
from queue_app.management.base import JobsiteCommand, acting_user, add_import_argument, import_modules
from queue_app.spark.models import SparkTrigger


class Command(JobsiteCommand):
    help = "Datasets: list, show, observe, override, materialize, lineage, partitions."

    def add_arguments(self, parser):
        add_import_argument(parser, "datasets (besides every app's datasets.py)")
        sub = parser.add_subparsers(dest="action", required=True)
        listing = sub.add_parser("list", help="every declared dataset: partitioning, last materialized, freshness")
        listing.add_argument("--json", action="store_true")
        show = sub.add_parser("show", help="a dataset and its materializations, newest first")
        show.add_argument("name")
        show.add_argument("--partition", metavar="P", help="only this partition's materializations")
        show.add_argument("--limit", type=int, default=100, help="at most this many materializations (100)")
        show.add_argument("--json", action="store_true")
        observe = sub.add_parser("observe", help="record a partition written outside jobsite (files counted)")
        observe.add_argument("name")
        observe.add_argument("--partition", metavar="P", help="the partition (required for a partitioned dataset)")
        observe.add_argument("--json", action="store_true")
        lineage = sub.add_parser("lineage", help="the datasets upstream and downstream and the jobs between them")
        lineage.add_argument("name")
        lineage.add_argument(
            "--depth", type=int, default=None, metavar="N", help="at most N dataset hops each way (default: all)"
        )
        lineage.add_argument("--json", action="store_true")
        make = sub.add_parser("materialize", help="run the dataset's producer for partitions (a backfill by data)")
        make.add_argument("name")
        make.add_argument("--partition", metavar="P", help="one partition")
        make.add_argument("--from", dest="start", metavar="D", help="the first partition of a range")
        make.add_argument("--to", dest="end", metavar="D", help="the last partition of a range (included)")
        make.add_argument(
            "--param",
            dest="params",
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="a producer parameter, over the dataset's declared params and the partition; repeatable",
        )
        make.add_argument("--missing-only", action="store_true", help="only the partitions never materialized")
        make.add_argument("--wait", action="store_true", help="follow the runs; exit 0 only if every one succeeded")
        make.add_argument("--timeout", type=float, default=None, metavar="S", help="with --wait: give up after S s")
        make.add_argument("--json", action="store_true")
        override = sub.add_parser("override", help="make a partition whose blocking checks failed usable (logged)")
        override.add_argument("name")
        override.add_argument("--partition", metavar="P", help="the partition (required for a partitioned dataset)")
        override.add_argument("--comment", required=True, help="why: kept in the admin's log with the override")
        override.add_argument("--user", help="the Django user overriding (default: the one named as the OS login)")
        override.add_argument("--json", action="store_true")

        parts = sub.add_parser("partitions", help="a dynamic partition set's keys: add, remove, list")
        parts.add_argument("verb", choices=["add", "remove", "list"])
        parts.add_argument("name", help="the dataset (or set:NAME for a set by its own name)")
        parts.add_argument("keys", nargs="*", metavar="KEY")
        parts.add_argument("--dimension", help="the dynamic dimension, when the dataset has several")
        parts.add_argument("--history", action="store_true", help="list: removed keys too")
        parts.add_argument("--json", action="store_true")

    def handle(self, *args, action, imports, **options):
        import_modules(imports)
        try:
            getattr(self, f"do_{action}")(**options)
        except (DatasetError, PermissionDenied) as exc:
            raise CommandError(str(exc)) from None

    def do_list(self, *, json: bool, **_):
        sync_datasets()
        rows = summaries(list(declared_datasets().values()), timezone.now())
        if json:
            self.stdout.write(_dumps(rows))
            return
        for row in rows:
            self.stdout.write(
                f"{row['name']}  {_partitioning(row['partitioning'])}  {row['freshness']}  "
                f"last materialized {row['last_materialized'] or 'never'}  checks {row['checks']}"
            )

    def do_show(self, *, name, partition, limit, json: bool, **_):
        if limit < 1:
            raise CommandError("--limit must be at least 1")
        ds = get_dataset(name)
        key = ds.partition_key(partition) if partition is not None else None
        sync_datasets()
        jobs = users().get(ds.name, {})
        shown = detail(
            ds,
            timezone.now(),
            partition=key,
            limit=limit,
            producers=jobs.get("producers", []),
            consumers=jobs.get("consumers", []),
        )
        if json:
            self.stdout.write(_dumps(shown))
            return
        self.stdout.write(self.style.MIGRATE_HEADING(ds.name) + f"  {ds.description}")
        self.stdout.write(
            f"  location {shown['location']}, {_partitioning(shown['partitioning'])}, {shown['freshness']}"
        )
        for what in ("producers", "consumers"):
            if shown[what]:
                self.stdout.write(f"  {what}: {', '.join(shown[what])}")
        rows = history(ds, partition=key, limit=limit)  # the text also shows each check's result
        results = check_results([m.id for m in rows])
        for m, row in zip(shown["materializations"], rows, strict=False):
            figures = ", ".join(f"{k} {m[k]}" for k in ("rows", "bytes", "files") if m[k] is not None)
            self.stdout.write(f"  [{m['partition'] or '-'}] {m['at']}  {figures}  checks {m['checks']}")
            for r in results[row.id]:
                verdict = "pending" if r["passed"] is None else ("passed" if r["passed"] else "FAILED")
                said = " ".join(str(x) for x in (r["message"], r["figures"] or "") if x)
                self.stdout.write(f"      {r['check']} ({r['severity']}): {verdict} {said}".rstrip())

    def do_observe(self, *, name, partition, json: bool, **_):
        recorded = datasets.observe(name, partition)
        fields = {
            "dataset": recorded.dataset,
            "partition": recorded.partition,
            "at": recorded.at.isoformat(),
            "files": recorded.files,
            "bytes": recorded.bytes,
            "id": recorded.id,
        }
        if json:
            self.stdout.write(_dumps(fields))
        else:
            self.stdout.write(
                f"observed {recorded.dataset}[{recorded.partition or '-'}]: {recorded.files} files, "
                f"{recorded.bytes} bytes"
                if recorded.files is not None
                else f"observed {recorded.dataset}"
            )

    def do_lineage(self, *, name, depth, json: bool, **_):
        if depth is not None and depth < 1:
            raise CommandError("--depth must be at least 1")
        ds = get_dataset(name)
        seen = LineageGraph(users()).neighbourhood(ds.name, depth)
        if json:
            self.stdout.write(_dumps(seen.as_json()))
            return
        self.stdout.write(self.style.MIGRATE_HEADING(ds.name))
        for what in ("upstream", "downstream", "jobs"):
            self.stdout.write(f"  {what}: {', '.join(getattr(seen, what)) or '-'}")

    def do_materialize(self, *, name, partition, start, end, params, missing_only, wait, timeout, json: bool, **_):
        try:
            given = parse_pairs(params)
        except ValueError as exc:
            raise CommandError(f"{exc}; nothing was queued") from None
        result = backfill.materialize(
            name,
            partition=partition,
            start=start,
            end=end,
            missing_only=missing_only,
            params=given,
            requested_by="manage.py dataset materialize",
            trigger=SparkTrigger.CLI,
        )
        if wait:
            result = backfill.wait(result, timeout=timeout)
        if json:
            self.stdout.write(_dumps(result))
        else:
            started = [f"runs {', '.join(map(str, result['runs']))}"] if result["runs"] else []
            started += [f"items {', '.join(map(str, result['items']))}"] if result["items"] else []
            self.stdout.write(
                f"{result['dataset']}: {len(result['partitions'])} partitions, "
                f"{', '.join(started) or 'runs (none)'}: {result['state']}"
            )
        if wait and result["state"] not in ("succeeded", "nothing to do"):
            raise SystemExit(1)

    def do_override(self, *, name, partition, comment, user, json: bool, **_):
        ds = get_dataset(name)
        key = ds.partition_key(partition)
        by = acting_user(user, "jobsite_datasets.override_dataset_check")
        done = override_failed_checks(by, latest(ds.name, key), comment)
        fields = {"dataset": done.dataset, "partition": done.partition, "id": done.id, "checks": done.checks}
        if json:
            self.stdout.write(_dumps(fields))
        else:
            self.stdout.write(f"{done.dataset}[{done.partition or '-'}] materialization {done.id}: checks overridden")

    def do_partitions(self, *, verb, name, keys, dimension, history, json: bool, **_):
        partition_set = dynamic.set_of(name, dimension)
        if verb == "list":
            if keys:
                raise CommandError("partitions list takes no keys")
            found = dynamic.list_keys(partition_set, history=history)
            if json:
                self.stdout.write(_dumps({"set": partition_set, "keys": found}))
            for row in [] if json else found:
                removed = f"  removed {row['removed_at']} by {row['removed_by']}" if row["removed_at"] else ""
                self.stdout.write(f"{row['key']}  added {row['added_at']} by {row['added_by']}{removed}")
            return
        by = f"cli:{getpass.getuser()}"
        done = (dynamic.add_keys if verb == "add" else dynamic.remove_keys)(partition_set, keys, by=by)
        what = "added" if verb == "add" else "removed"
        if json:
            self.stdout.write(_dumps({"set": partition_set, what: done}))
        else:
            self.stdout.write(f"{partition_set}: {what} {', '.join(done) or 'nothing (all there already)'}")


def _partitioning(described) -> str:
    if isinstance(described, dict) and "static" in described:
        return "static " + ",".join(described["static"])
    if isinstance(described, dict) and "dynamic" in described:
        return f"dynamic {described['dynamic']}"
    if isinstance(described, dict) and "dimensions" in described:
        return " x ".join(f"{d['name']} ({_partitioning(d['partitioning'])})" for d in described["dimensions"])
    return described or "unpartitioned"


def _dumps(value) -> str:
    return json.dumps(value, indent=2, sort_keys=False)
