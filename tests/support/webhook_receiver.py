"""A real HTTP receiver on loopback for the webhook tests: a threaded server that records every request and
answers with what the test scripted (a status, a delay, or a dropped connection)."""

import queue
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    server: ThreadingHTTPServer
    requests: list[Received] = field(default_factory=list)
    # Scripted answers, used in turn; when empty: `default` status at once.
    answers: "queue.Queue[tuple[int, float]]" = field(default_factory=queue.Queue)
    default: int = 200
    arrived: threading.Condition = field(default_factory=threading.Condition)
    release: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/hook"

    def answer(self, status: int, *, delay: float = 0.0, times: int = 1) -> None:
        for _ in range(times):
            self.answers.put((status, delay))

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self.arrived:
            while len(self.requests) < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the receiver got {len(self.requests)} requests, expected {count}")
                self.arrived.wait(left)
            return list(self.requests)


def start_receiver() -> Receiver:
    receiver: Receiver

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length)
            with receiver.arrived:
                receiver.requests.append(
                    Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time())
                )
                receiver.arrived.notify_all()
            try:
                status, delay = receiver.answers.get_nowait()
            except queue.Empty:
                status, delay = receiver.default, 0.0
            if delay < 0:  # hold the request until the test releases it (a worker killed mid-delivery)
                receiver.release.wait(60)
            elif delay:
                time.sleep(delay)
            payload = b"received " + b"x" * 5000 if status >= 500 else b"ok"
            try:
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("location", "http://169.254.169.254/latest/meta-data/")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except OSError:
                pass  # the client gave up (timeout) first

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver = Receiver(server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return receiver
