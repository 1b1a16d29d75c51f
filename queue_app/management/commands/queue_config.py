"""`manage.py queue_config QUEUE`: create a queue or change its flow control, through the same service functions
as the admin's queue form (services.configure_queue -> set_queue_options).

    python manage.py queue_config partner-api --rate-limit 100/1m       # at most 100 starts a minute, all workers
    python manage.py queue_config imports --group-concurrency 2         # at most 2 items per group key in flight
    python manage.py queue_config imports --concurrency 20 --json
    python manage.py queue_config partner-api --rate-limit none         # lift the limit
    python manage.py queue_config tenants --fair --group-weight big-customer=3 --group-weight trial=0.5
    python manage.py queue_config tenants --group-weight trial=none --no-fair   # weight 1 again; keys not in turn
    python manage.py queue_config reports --aging 0.5        # a due item gains half a priority point a second
    python manage.py queue_config reports --aging none       # no aging

Without options it shows the queue (creating it with the defaults if it does not exist). `--group-weight KEY=W`
(repeatable) sets one key's turns per round and keeps the other keys' weights; `KEY=none` drops it (weight 1).
Bad input (a zero or negative limit, a period of 0, a malformed rate or weight) is refused with the reason, exit
status 1, nothing written.
"""

import argparse
import json as _json

from django.core.management.base import CommandError

from queue_app import services
from queue_app.engine.enqueue import is_group_key
from queue_app.flow import NO_LIMIT, format_rate, parse_rate
from queue_app.management.base import JobsiteCommand
from queue_app.models import Queue

from ...engine.alias import atomic


def _limit(flag: str, value: str) -> int | None:
    """An integer limit from the command line; `none` or `off` lifts it (range checked by the services)."""
    if value.strip().lower() in NO_LIMIT:
        return None
    try:
        return int(value)
    except ValueError:
        raise CommandError(f"{flag} must be an integer (or none to lift the limit), not {value!r}") from None


def _weights(queue: str, given: list[str]) -> dict[str, float] | None:
    """The queue's group weights with `--group-weight KEY=W` applied in order (W none or off drops KEY); None when
    none is left. Read under the queue's row lock, which the caller's transaction holds until the write."""
    current = Queue.objects.select_for_update().filter(name=queue).values_list("group_weights", flat=True).first()
    weights = dict(current or {})
    for text in given:
        key, equals, value = text.rpartition("=")
        if not equals or not is_group_key(key):
            raise CommandError(f"--group-weight is KEY=WEIGHT with KEY a group key, e.g. big-customer=3, not {text!r}")
        if value.strip().lower() in NO_LIMIT:
            weights.pop(key, None)
            continue
        try:
            weight = float(value) if "." in value or "e" in value.lower() else int(value)
        except ValueError:
            weight = None
        if not services.is_group_weight(weight):
            raise CommandError(
                f"--group-weight {key}: the weight must be a number above 0 and at most {services.MAX_GROUP_WEIGHT}"
                f" (or none to drop the key), not {value!r}"
            )
        weights[key] = weight
    return weights or None


def queue_config(queue: Queue) -> dict:
    return {
        "queue": queue.name,
        "paused": queue.paused,
        "concurrency_limit": queue.concurrency_limit,
        "rate_limit": format_rate(queue.rate_limit, queue.rate_period),
        "rate_limit_count": queue.rate_limit,
        "rate_period_seconds": queue.rate_period,
        "group_concurrency": queue.group_concurrency,
        "fair": queue.fair or queue.group_concurrency is not None,  # a group limit leases keys in turn too
        "group_weights": queue.group_weights or {},
        "lease_timeout": queue.lease_timeout,
        "max_attempts": queue.max_attempts,
        "aging_rate": queue.aging_rate,
    }


class Command(JobsiteCommand):
    help = "Create a queue or change its concurrency, rate and group limits (the admin's queue form on the CLI)."

    def add_arguments(self, parser):
        parser.add_argument("queue", help="queue name (created if it does not exist)")
        parser.add_argument("--concurrency", metavar="N", help="most items in flight at once (none: no limit)")
        parser.add_argument(
            "--rate-limit",
            metavar="N/PERIOD",
            help="most starts per period, e.g. 100/1m, 10/30s, 5000/1h (none: no limit)",
        )
        parser.add_argument(
            "--group-concurrency", metavar="K", help="most items of one group key in flight (none: no limit)"
        )
        parser.add_argument(
            "--fair",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="lease the group keys in turn (--no-fair: in priority order; a group limit keeps them in turn)",
        )
        parser.add_argument(
            "--group-weight",
            dest="group_weights",
            action="append",
            default=[],
            metavar="KEY=W",
            help="turns per round for one group key (repeatable; others keep theirs, unnamed keys 1; W none drops)",
        )
        parser.add_argument(
            "--aging",
            metavar="RATE",
            help="priority aging: points per second a due item's priority rises while it waits, or N/PERIOD "
            "(e.g. 10/1m); none: off",
        )
        parser.add_argument("--json", action="store_true", help="print the queue's settings as JSON")

    def handle(
        self,
        *args,
        queue,
        concurrency,
        rate_limit,
        group_concurrency,
        fair,
        group_weights,
        aging,
        json: bool,
        **options,
    ):
        changes: dict = {}
        if aging is not None:
            changes["aging_rate"] = _aging(aging)
        if concurrency is not None:
            changes["concurrency_limit"] = _limit("--concurrency", concurrency)
        if rate_limit is not None:
            try:
                changes["rate_limit"], changes["rate_period"] = parse_rate(rate_limit)
            except ValueError as exc:
                raise CommandError(f"--rate-limit: {exc}") from None
        if group_concurrency is not None:
            changes["group_concurrency"] = _limit("--group-concurrency", group_concurrency)
        if fair is not None:
            changes["fair"] = fair
        try:
            with atomic():
                if group_weights:
                    changes["group_weights"] = _weights(queue, group_weights)
                created, _ = services.configure_queue(queue, **changes)
        except ValueError as exc:
            raise CommandError(_flags(str(exc))) from None
        settings = queue_config(Queue.objects.get(name=queue))
        if json:
            self.stdout.write(_json.dumps({**settings, "created": created, "changed": sorted(changes)}, indent=2))
            return
        self.stdout.write(f"{'created' if created else 'queue'} {queue}: " + ", ".join(_summary(settings)))


def _aging(value: str) -> float | None:
    """Priority points per second from `--aging`: a number (per second), N/PERIOD (10/1m), or none/off."""
    text = value.strip().lower()
    if text in NO_LIMIT:
        return None
    try:
        if "/" in text:
            points, _, period = text.partition("/")
            _, seconds = parse_rate(f"1/{period}")
            return float(points) / seconds
        return float(text)
    except ValueError:
        raise CommandError(
            f"--aging must be priority points per second (0.5), or N/PERIOD (10/1m), or none; not {value!r}"
        ) from None


def _flags(message: str) -> str:
    """A service's message in the command's own words (its flags, not the model's option names)."""
    for option, flag in (
        ("concurrency_limit", "--concurrency"),
        ("group_concurrency", "--group-concurrency"),
        ("rate_limit", "--rate-limit N"),
        ("rate_period", "--rate-limit PERIOD (in seconds)"),
        ("group_weights", "--group-weight"),
        ("aging_rate", "--aging"),
    ):
        message = message.replace(option, flag)
    return message


def _summary(settings: dict) -> list[str]:
    return [
        f"concurrency {settings['concurrency_limit'] or 'unlimited'}",
        f"rate {settings['rate_limit'] or 'unlimited'}",
        f"group concurrency {settings['group_concurrency'] or 'unlimited'}",
        f"fair {'yes' if settings['fair'] else 'no'}",
        *([f"group weights {_shown_weights(settings['group_weights'])}"] if settings["group_weights"] else []),
        *([f"aging {settings['aging_rate']:g}/s"] if settings["aging_rate"] else []),
        *(["paused"] if settings["paused"] else []),
    ]


def _shown_weights(weights: dict[str, float]) -> str:
    return " ".join(f"{key}={weight:g}" for key, weight in sorted(weights.items()))
