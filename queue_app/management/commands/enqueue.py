"""`manage.py enqueue TASK`: queue items from the command line (demos, benchmarks, scripts).

    python manage.py enqueue queue_app.echo --payload '{"hello": "world"}'
    python manage.py enqueue queue_app.noop --count 100000          # one COPY (engine.enqueue_many)
    python manage.py enqueue queue_app.sleep --payload '{"seconds": 2}' --delay 10 --dedup-key nap
    python manage.py enqueue queue_app.echo --payload-file big.json                 # or - for standard input
    python manage.py enqueue queue_app.noop --count 1000 --group-key customer-42    # fair queues: keys in turn
    python manage.py enqueue search.reindex --payload '{"doc": 7}' --debounce-key doc-7 --debounce 5
    python manage.py enqueue billing.charge --allow-unknown-task   # for workers that run other code than this one

A registered task brings its own queue, attempts and dedup window. A name no task is registered under here is
refused (exit 1, with the closest registered names): a typo would otherwise go straight to the dead letters
when a worker meets it. `--allow-unknown-task` queues it anyway, for producers whose workers load other tasks.
"""

import difflib
import json
import sys
from functools import partial
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from queue_app import engine
from queue_app.conf import queue_settings
from queue_app.engine.payload import PAYLOAD_RULE
from queue_app.registry import find_task, registered_tasks


def read_payload_file(path: str) -> str:
    """The file's text (standard input for '-'), which must be UTF-8; its size is checked by the engine."""
    try:
        raw = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as exc:
        raise CommandError(f"--payload-file {path}: {exc.strerror or exc}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CommandError(f"--payload-file {path} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None


def unknown_task_error(task: str) -> CommandError:
    """The refusal of a name no task is registered under, naming the closest registered ones."""
    close = difflib.get_close_matches(task, registered_tasks(), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else "no registered task has a similar name."
    return CommandError(
        f"no task is registered as {task!r} here; {hint} (--allow-unknown-task queues it anyway, "
        "for workers that load other tasks than this process)"
    )


class Command(BaseCommand):
    help = "Enqueue items of a task: one, or --count N of the same payload."
    # A script may enqueue often: Django's system checks (which import every admin module) run at the worker's
    # start, `check` and deploy, not at each enqueue. The task's name and payload are validated as always.
    requires_system_checks = []

    def add_arguments(self, parser):
        parser.add_argument("task", help="task name, e.g. queue_app.noop")
        source = parser.add_mutually_exclusive_group()
        source.add_argument("--payload", default=None, help="the payload, any JSON value (default: {})")
        source.add_argument(
            "--payload-file",
            default=None,
            metavar="PATH",
            help="read the JSON payload from a UTF-8 file ('-': standard input), for payloads too big for argv",
        )
        parser.add_argument("--count", type=int, default=1, help="how many items (bulk enqueue when > 1)")
        parser.add_argument("--queue", default=None, help="queue (default: the task's, else the default queue)")
        parser.add_argument("--priority", type=int, default=0, help="-100..100, higher first")
        parser.add_argument("--delay", type=float, default=None, help="seconds before the item is due")
        parser.add_argument("--dedup-key", default=None, help="enqueue at most once per key within the window")
        parser.add_argument(
            "--debounce-key",
            default=None,
            help="collapse the enqueues of this key into one item, run once the key is quiet (with --debounce)",
        )
        parser.add_argument(
            "--debounce", type=float, default=None, metavar="SECONDS", help="how long the key must be quiet"
        )
        parser.add_argument(
            "--debounce-max",
            type=float,
            default=None,
            metavar="SECONDS",
            help="run at the latest this long after the key's first enqueue, however busy it stays",
        )
        parser.add_argument("--ordering-key", default=None, help="items of one key run one at a time, in order")
        parser.add_argument(
            "--group-key",
            default=None,
            help="tenant or customer id: fair queues lease keys in turn, group limits cap each",
        )
        parser.add_argument(
            "--allow-unknown-task",
            action="store_true",
            help="queue a task no one registered in this process (its workers run other code); "
            "without it such a name is refused",
        )

    def handle(
        self,
        *args,
        task,
        payload,
        payload_file,
        count,
        queue,
        priority,
        delay,
        dedup_key,
        debounce_key,
        debounce,
        debounce_max,
        ordering_key,
        group_key,
        allow_unknown_task,
        **options,
    ):
        source = "--payload"
        if payload_file is not None:
            source, payload = "--payload-file", read_payload_file(payload_file)
        try:
            data = {} if payload is None else json.loads(payload)
        except json.JSONDecodeError as exc:
            raise CommandError(f"{source} is not valid JSON ({PAYLOAD_RULE}): {exc}; nothing was written") from None
        except RecursionError:  # json.loads recurses: text nested this deep is refused before the engine sees it
            raise CommandError(
                f"{source} is nested deeper than Python's JSON parser can read (the limit is "
                f"{queue_settings.MAX_PAYLOAD_DEPTH} levels)"
            ) from None
        if count < 1:
            raise CommandError(f"--count must be at least 1, not {count}")
        if count > 1 and dedup_key is not None:
            raise CommandError("--dedup-key enqueues one item; it cannot be combined with --count")
        debounced = {
            name: value
            for name, value in (("debounce_key", debounce_key), ("debounce", debounce), ("debounce_max", debounce_max))
            if value is not None
        }
        if count > 1 and debounced:
            raise CommandError("--debounce-key enqueues one item; it cannot be combined with --count")
        registered = find_task(task)
        # A malformed name is left to the engine, which refuses it with its own reason.
        if registered is None and not allow_unknown_task and engine.is_task_name(task):
            raise unknown_task_error(task)
        options = {
            "queue": queue,
            "priority": priority,
            "delay": delay,
            "ordering_key": ordering_key,
            "group_key": group_key,
        }
        try:
            if count > 1:
                many = registered.enqueue_many if registered else partial(engine.enqueue_many, task)
                ids = many([data] * count, **options)
            else:
                one = registered.enqueue if registered else partial(engine.enqueue, task)
                item = one(data, dedup_key=dedup_key, **debounced, **options)
        except engine.InvalidEnqueue as exc:
            raise CommandError(str(exc)) from None
        if count > 1:
            self.stdout.write(f"enqueued {len(ids)} items of {task} (ids {ids[0]}..{ids[-1]})")
        elif item.absorbed:
            self.stdout.write(
                f"debounced: item {item.id} of {task} took this payload ({item.absorbed} enqueues of key "
                f"{debounce_key!r} absorbed), due {item.run_at.isoformat()}"
            )
        elif item.duplicate:
            self.stdout.write(f"duplicate: item {item.id} of {task} already holds dedup key {dedup_key!r}")
        else:
            self.stdout.write(f"enqueued item {item.id} of {task} on queue {item.queue}")
