"""OpenTelemetry set-up: one tracer provider and one meter provider per service process.

Traces and metrics are exported over OTLP/gRPC when an endpoint is configured; without
one, spans are still created (so trace context propagates across gRPC and Kafka hops)
but go nowhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


@dataclass
class Telemetry:
    tracer: trace.Tracer
    meter: metrics.Meter
    tracer_provider: TracerProvider
    meter_provider: MeterProvider

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def setup_telemetry(
    service: str,
    otlp_endpoint: str | None = None,
    extra_span_processors: list[SpanProcessor] | None = None,
    extra_metric_readers: list[MetricReader] | None = None,
) -> Telemetry:
    resource = Resource.create({"service.name": service, "service.namespace": "cellpilot"})
    tracer_provider = TracerProvider(resource=resource)
    readers: list[MetricReader] = list(extra_metric_readers or [])
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        tracer_provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint, insecure=True))
        )
        readers.append(
            PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=otlp_endpoint, insecure=True))
        )
    for processor in extra_span_processors or []:
        tracer_provider.add_span_processor(processor)
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    # The global providers can be set once per process; services own their process.
    trace.set_tracer_provider(tracer_provider)
    metrics.set_meter_provider(meter_provider)
    return Telemetry(
        tracer=tracer_provider.get_tracer(f"cellpilot.{service}"),
        meter=meter_provider.get_meter(f"cellpilot.{service}"),
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
    )
