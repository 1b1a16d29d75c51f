"""`manage.py webhooks`: webhook endpoints and deliveries from the command line.

    python manage.py webhooks add https://example.com/hooks --event item.dead_lettered --event queue.paused [--ordered]
    python manage.py webhooks list [--json]
    python manage.py webhooks test ID
    python manage.py webhooks deliveries [--endpoint ID] [--json]     # tab-separated under a header, or JSON

`add` prints the endpoint's id and its secret, once: the secret is never shown again (rotate it in the admin).
"""

import json

from django.core.management.base import CommandError

from queue_app.management.base import JobsiteCommand
from queue_app.webhooks import services
from queue_app.webhooks.events import EVENT_TYPES
from queue_app.webhooks.models import WebhookDelivery, WebhookEndpoint

DELIVERIES_SHOWN = 100
DELIVERY_COLUMNS = ("id", "endpoint", "event_type", "webhook_id", "state", "attempts", "last_status_code")


def _endpoint_row(endpoint: WebhookEndpoint) -> dict:
    return {
        "id": endpoint.id,
        "url": endpoint.url,
        "event_types": endpoint.event_types,
        "enabled": endpoint.enabled,
        "ordered": endpoint.ordered,
        "rate_limit": endpoint.rate_limit,
        "item_event_queues": endpoint.item_event_queues,
        "description": endpoint.description,
        "failing_since": endpoint.failing_since.isoformat() if endpoint.failing_since else None,
        "disabled_reason": endpoint.disabled_reason,
    }


class Command(JobsiteCommand):
    help = "Manage webhook endpoints (add, list, test) and list deliveries."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True, metavar="{add,list,test,deliveries}")
        add = sub.add_parser("add", help="add an endpoint; prints its id and secret (once)")
        add.add_argument("url")
        add.add_argument(
            "--event",
            dest="events",
            action="append",
            required=True,
            metavar="TYPE",
            help=f"event type to receive (repeatable): {', '.join(EVENT_TYPES)}",
        )
        add.add_argument("--ordered", action="store_true", help="deliver one at a time, in publish order")
        add.add_argument("--description", default="")
        add.add_argument("--rate-limit", type=float, default=None, help="most requests per second")
        add.add_argument(
            "--item-events-queue",
            dest="queues",
            action="append",
            default=[],
            metavar="QUEUE",
            help="queue whose items raise item.done / item.failed for this endpoint (repeatable)",
        )
        listing = sub.add_parser("list", help="list endpoints")
        listing.add_argument("--json", action="store_true")
        test = sub.add_parser("test", help="send a test event to an endpoint")
        test.add_argument("id", type=int)
        deliveries = sub.add_parser("deliveries", help=f"list the latest {DELIVERIES_SHOWN} deliveries")
        deliveries.add_argument("--endpoint", type=int, default=None, metavar="ID")
        deliveries.add_argument("--json", action="store_true")

    def handle(self, *args, action, **options):
        getattr(self, f"_{action}")(**options)

    def _add(self, *, url, events, ordered, description, rate_limit, queues, **options):
        try:
            created = services.create_endpoint(
                url,
                events,
                ordered=ordered,
                description=description,
                rate_limit=rate_limit,
                item_event_queues=queues,
            )
        except services.EndpointInvalid as exc:
            raise CommandError("; ".join(f"{field}: {message}" for field, message in exc.errors.items())) from None
        self.stdout.write(f"id: {created.endpoint.id}")
        self.stdout.write(f"secret: {created.secret}")
        self.stdout.write("Keep the secret now: it is not shown again.")

    def _list(self, *, json: bool, **options):
        rows = [_endpoint_row(e) for e in WebhookEndpoint.objects.order_by("id")]
        if json:
            self.stdout.write(_dumps(rows))
            return
        self.stdout.write("id\tstate\turl\tevent_types")
        for row in rows:
            state = "enabled" if row["enabled"] else "disabled"
            flags = " ordered" if row["ordered"] else ""
            self.stdout.write(f"{row['id']}\t{state}{flags}\t{row['url']}\t{','.join(row['event_types'])}")

    def _test(self, *, id: int, **options):
        endpoint = WebhookEndpoint.objects.filter(id=id).first()
        if endpoint is None:
            raise CommandError(f"no webhook endpoint {id}")
        if not endpoint.enabled:
            raise CommandError(f"endpoint {id} is disabled: enable it first")
        (delivery,) = services.send_test_event([id])
        self.stdout.write(f"queued test event {delivery.webhook_id} (delivery {delivery.id}) to {endpoint.url}")

    def _deliveries(self, *, endpoint, json: bool, **options):
        if endpoint is not None and not WebhookEndpoint.objects.filter(id=endpoint).exists():
            raise CommandError(f"no webhook endpoint {endpoint}")
        deliveries = WebhookDelivery.objects.order_by("-id")
        if endpoint is not None:
            deliveries = deliveries.filter(endpoint_id=endpoint)
        deliveries = list(deliveries[:DELIVERIES_SHOWN])
        states = services.delivery_states(deliveries)
        rows = [
            {
                "id": d.id,
                "endpoint": d.endpoint_id,
                "event_type": d.event_type,
                "webhook_id": d.webhook_id,
                "state": states[d.id],
                "attempts": d.attempt_count,
                "last_status_code": d.last_status_code,
                "created_at": d.created_at.isoformat(),
            }
            for d in deliveries
        ]
        if json:
            self.stdout.write(_dumps(rows))
            return
        # Tab-separated under a header naming the columns as --json names its fields.
        self.stdout.write("\t".join(DELIVERY_COLUMNS))
        for r in rows:
            self.stdout.write(
                f"{r['id']}\t{r['endpoint']}\t{r['event_type']}\t{r['webhook_id']}\t{r['state']}\t"
                f"{r['attempts']}\t{r['last_status_code'] if r['last_status_code'] is not None else '-'}"
            )


def _dumps(rows: list[dict]) -> str:
    return json.dumps(rows, indent=2)
