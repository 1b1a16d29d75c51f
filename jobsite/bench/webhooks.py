"""The webhooks' benchmark (`manage.py webhook_bench`): real `run_worker` processes deliver to a loopback
receiver in this process that answers 200 at once.

- throughput: N events published in one transaction to one endpoint while the workers idle; deliveries per
  second from the commit to the last request received;
- latency: one event at a time on the idle queue, from the publish_event call (it commits) to the request's
  arrival at the receiver (the wake-up by NOTIFY, one lease, signing, one HTTP round trip), p50 and p99.
"""

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django.conf import settings
from django.core.management import call_command
from django.db import connections, transaction
from django.test.utils import override_settings

from queue_app.webhooks import publish_event
from queue_app.webhooks import services as webhooks

from .context import BenchContext, django_child_env, manage_args, spawn, stop
from .report import percentile


@dataclass(frozen=True)
class WebhookSizes:
    events: int
    latency_samples: int
    workers: int
    concurrency: int


QUICK = WebhookSizes(events=1_000, latency_samples=40, workers=2, concurrency=16)
FULL = WebhookSizes(events=10_000, latency_samples=300, workers=2, concurrency=32)


class Receiver:
    """Answers 200 at once. `arrivals[webhook-id]` = time.monotonic() of its first arrival, `first[webhook-id]` =
    (headers, body) of that request, `repeats[webhook-id]` = how many more times it came (a redelivery)."""

    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}
        self.first: dict[str, tuple[dict[str, str], bytes]] = {}
        self.repeats: dict[str, int] = {}
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: a worker thread reuses its connection

            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                webhook_id = self.headers.get("webhook-id", "")
                with receiver.lock:
                    if webhook_id in receiver.arrivals:
                        receiver.repeats[webhook_id] = receiver.repeats.get(webhook_id, 0) + 1
                    else:
                        receiver.arrivals[webhook_id] = time.monotonic()
                        receiver.first[webhook_id] = (dict(self.headers.items()), body)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def count(self) -> int:
        with self.lock:
            return len(self.arrivals)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _worker_running(pid: int) -> bool:
    with connections["default"].cursor() as cur:
        cur.execute("SELECT count(*) FROM queue_app_worker WHERE state = 'running' AND pid = %s", [pid])
        return cur.fetchone()[0] > 0


def _wait(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.002)
    return False


def run(ctx: BenchContext, sizes: WebhookSizes, write) -> dict[str, float]:
    """Measure on a fresh scratch database (this process's default connection is pointed at it)."""
    db = ctx.fresh_database("webhooks")
    connections["default"].close()
    connections["default"].settings_dict["NAME"] = db
    call_command("migrate", verbosity=0, interactive=False)
    receiver = Receiver()
    env = django_child_env(db, JOBSITE_WEBHOOKS_ALLOW_PRIVATE="1")
    procs = []
    try:
        with override_settings(JOBSITE={**settings.JOBSITE, "WEBHOOKS_ALLOW_PRIVATE": True}):
            webhooks.create_endpoint(receiver.url, ["test"])
        for n in range(sizes.workers):
            args = manage_args(
                "run_worker",
                "--queues",
                "webhooks",
                "--pool",
                "thread",
                "--concurrency",
                str(sizes.concurrency),
                "--no-scheduler",
                "--worker-id",
                f"webhook-bench-{n}",
            )
            procs.append(spawn(args, env=env, log=ctx.log_path(f"webhook-worker-{n}")))
        for proc in procs:
            if not _wait(lambda p=proc: p.poll() is None and _worker_running(p.pid), 30):
                raise RuntimeError("a bench worker did not start; see its log under var/bench")
        write(f"workers: {sizes.workers} x thread pool of {sizes.concurrency}; receiver {receiver.url}")

        # Throughput.
        with transaction.atomic():
            for n in range(sizes.events):
                publish_event("test", {"n": n})
        started = time.monotonic()
        if not _wait(lambda: receiver.count() >= sizes.events, 600):
            raise RuntimeError(f"only {receiver.count()} of {sizes.events} deliveries arrived")
        took = max(receiver.arrivals.values()) - started
        per_s = sizes.events / took
        write(f"throughput: {sizes.events} deliveries in {took:.2f} s = {per_s:,.0f} deliveries/s")

        # Latency on the idle queue.
        time.sleep(1.0)
        latencies = []
        for n in range(sizes.latency_samples):
            sent = time.monotonic()
            (delivery,) = publish_event("test", {"latency": n})  # committed on return (autocommit)
            if not _wait(lambda d=delivery: d.webhook_id in receiver.arrivals, 30):
                raise RuntimeError(f"delivery {delivery.webhook_id} did not arrive within 30 s")
            latencies.append((receiver.arrivals[delivery.webhook_id] - sent) * 1000)
            time.sleep(0.05)
        p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
        write(f"latency event -> delivery (idle queue, {len(latencies)} samples): p50 {p50:.1f} ms, p99 {p99:.1f} ms")
        return {"deliveries_per_s": per_s, "latency_p50_ms": p50, "latency_p99_ms": p99}
    finally:
        stop(procs)
        receiver.close()
        connections["default"].close()
        ctx.drop_databases()
