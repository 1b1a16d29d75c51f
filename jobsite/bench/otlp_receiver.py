"""A real OTLP/HTTP trace receiver on loopback, for queue_bench's tracing figures and the tracing tests: an
http.server that decodes each POST to /v1/traces with opentelemetry-proto's ExportTraceServiceRequest and keeps the
spans, flattened."""

import gzip
import http.server
import threading
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


def _value(any_value: Any) -> Any:
    which = any_value.WhichOneof("value")
    return None if which is None else getattr(any_value, which)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: str
    service: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    status_code: int = 0
    links: list[tuple[str, str]] = field(default_factory=list)  # (trace id, span id) of each linked span


class Receiver:
    """`url` is the OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT); `spans()` what arrived so far (`keep=False`:
    only `count()`, for the bench's many spans)."""

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self._count = 0
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 — http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver._take(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def _take(self, request: ExportTraceServiceRequest) -> None:
        if not self.keep:
            n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
            with self._lock:
                self._count += n
            return
        found = []
        for resource_spans in request.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    found.append(
                        Span(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            kind=KINDS.get(s.kind, str(s.kind)),
                            service=service,
                            attributes=_attributes(s.attributes),
                            events=[(e.name, _attributes(e.attributes)) for e in s.events],
                            status_code=s.status.code,
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                        )
                    )
        with self._lock:
            self._spans.extend(found)
            self._count += len(found)

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)

    def count(self) -> int:
        with self._lock:
            return self._count

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
