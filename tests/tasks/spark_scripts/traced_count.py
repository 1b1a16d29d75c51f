"""A PySpark script that traces itself with OpenTelemetry, nothing else: its span continues the trace its launcher
names in TRACEPARENT (W3C's environment carrier), exported over OTLP/HTTP where the SDK's standard variables say
(OTEL_EXPORTER_OTLP_ENDPOINT). traced_count.py [partitions]"""

import os
import sys

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from pyspark.sql import SparkSession

if __name__ == "__main__":
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    tracer = provider.get_tracer("traced_count")
    parent = TraceContextTextMapPropagator().extract({"traceparent": os.environ.get("TRACEPARENT", "")})
    partitions = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    spark = SparkSession.builder.appName("TracedCount").getOrCreate()
    with tracer.start_as_current_span("count rows", context=parent) as span:
        rows = spark.sparkContext.parallelize(range(1000), partitions).count()
        span.set_attribute("rows", rows)
    print(f"counted {rows} rows")
    spark.stop()
    provider.shutdown()  # export the span before the driver exits
