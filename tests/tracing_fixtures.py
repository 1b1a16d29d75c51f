"""Tracing fixtures of tests/test_tracing*.py (imported by them, never from conftest.py): a real OTLP/HTTP receiver
on loopback (jobsite/bench/otlp_receiver.py) and this process's tracing turned on towards it for one test."""

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.django import DjangoInstrumentor

from jobsite.bench.otlp_receiver import Receiver
from queue_app.engine import tracing


@pytest.fixture(scope="session", name="receiver")
def receiver_fixture():
    rec = Receiver()
    yield rec
    tracing.shutdown()  # the export thread ends with the session's receiver
    rec.stop()


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
