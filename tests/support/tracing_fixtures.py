"""Tracing fixtures of tests/test_tracing*.py (imported by them, never from conftest.py): a real OTLP/HTTP receiver
on loopback (jobsite/bench/otlp_receiver.py) and this process's tracing turned on towards it for one test."""

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.django import DjangoInstrumentor

from jobsite.bench.otlp_receiver import Receiver
from queue_app.engine import tracing

_shared: Receiver | None = None  # the process's one receiver, whichever module asked first


@pytest.fixture(scope="session", name="receiver")
def receiver_fixture():
    """One receiver for the whole process: each module that imports this fixture gets a session fixture of its
    own, and the SDK's provider is global (configured once, towards the first receiver), so a second receiver
    would never see a span (a workflow test after the tracing tests waited for one in vain)."""
    global _shared
    if _shared is None:
        _shared = Receiver()
    yield _shared
    if _shared is not None:  # the first of these fixtures to end stops it, at the session's end
        tracing.shutdown()  # the export thread ends with the session's receiver
        _shared.stop()
        _shared = None


@pytest.fixture(name="traced")
def traced_fixture(receiver):
    """Tracing on in this process, exporting to the receiver (once per process: the SDK's provider is global);
    off again after the test, Django's instrumentation removed."""
    was = tracing.enabled
    if tracing._provider is None:
        tracing.configure(OTLPSpanExporter(endpoint=f"{receiver.url}/v1/traces"), service_name="jobsite-test")
    else:  # configured by an earlier test of this process: the same exporter, on again
        tracing.enabled = True
        tracing._instrument_django()
    yield receiver
    tracing.flush()
    tracing.enabled = was
    DjangoInstrumentor().uninstrument()


def otel_env(receiver: Receiver, **extra: str) -> dict[str, str]:
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "jobsite-worker",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        **extra,
    }
