"""Metrics every service exports: the named instruments, and a Prometheus scrape endpoint.

Instruments are OpenTelemetry instruments on the service's meter (``setup_telemetry``), so
the same numbers go out over OTLP when an endpoint is set and are scraped by Prometheus
from ``/metrics`` when the service serves one (``run_service(..., metrics_port=...)``; by
convention the gRPC port + 1000, e.g. Borgmaster 7100 -> 8100). Prometheus names follow
the OpenTelemetry conversion (dots become underscores, counters get ``_total``, units a
suffix):

==================================  ===============================================
``cellpilot_recommendations_total``  recommendations emitted (rate: recommendations/s)
``cellpilot_actuations_total``       limit / task-count changes applied to the Borgmaster
``cellpilot_ooms_total``             tasks OOM-killed
``cellpilot_scheduling_latency_seconds``  submission (or requeue) to placement, histogram
``cellpilot_pending_tasks``          tasks waiting for a machine now
``cellpilot_consumer_lag``           records a consumer is behind its topic's end
``cellpilot_event_time_lag_seconds``  wall time minus the event time of the newest input
==================================  ===============================================
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics.export import MetricReader

DEFAULT_METRICS_PORT_OFFSET = 1000  # metrics port = gRPC port + this (docs: agreed service layout)

# Scheduling latency buckets, seconds: sub-millisecond passes up to minutes of waiting.
SCHEDULING_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


@dataclass(frozen=True)
class CellpilotMetrics:
    """The instruments named in the design; a service records the ones it owns."""

    recommendations: metrics.Counter
    actuations: metrics.Counter
    ooms: metrics.Counter
    scheduling_latency: metrics.Histogram
    pending_tasks: Any  # metrics._Gauge: synchronous gauge (set the current value)
    consumer_lag: Any
    event_time_lag: Any

    @classmethod
    def on(cls, meter: metrics.Meter) -> CellpilotMetrics:
        return cls(
            recommendations=meter.create_counter(
                "cellpilot.recommendations", unit="{recommendation}", description="recommendations emitted"
            ),
            actuations=meter.create_counter(
                "cellpilot.actuations", unit="{actuation}", description="changes applied to the Borgmaster"
            ),
            ooms=meter.create_counter("cellpilot.ooms", unit="{task}", description="tasks OOM-killed"),
            scheduling_latency=meter.create_histogram(
                "cellpilot.scheduling.latency",
                unit="s",
                description="time from a task becoming pending to its placement",
                explicit_bucket_boundaries_advisory=list(SCHEDULING_LATENCY_BUCKETS),
            ),
            pending_tasks=meter.create_gauge(
                "cellpilot.pending_tasks", unit="{task}", description="tasks waiting for a machine"
            ),
            consumer_lag=meter.create_gauge(
                "cellpilot.consumer.lag", unit="{record}", description="records behind the topic's end"
            ),
            event_time_lag=meter.create_gauge(
                "cellpilot.event_time.lag",
                unit="s",
                description="wall time minus the event time of the newest input processed",
            ),
        )


def prometheus_reader() -> MetricReader:
    """A metric reader that serves the meter provider's metrics to prometheus_client's registry.

    Pass it to ``setup_telemetry(extra_metric_readers=[...])``; one per process."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    return PrometheusMetricReader()


def prometheus_text() -> tuple[bytes, str]:
    """The process's metrics in the Prometheus text format, with its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


class MetricsEndpoint:
    """``GET /metrics`` on its own port, served from a daemon thread (prometheus_client)."""

    def __init__(self, port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> int:
        from prometheus_client import start_http_server

        self._server, self._thread = start_http_server(self.port, addr=self.host)
        self.port = int(self._server.server_address[1])
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def observed(read: Callable[[], float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
    """A callback for an observable instrument that reports ``read()`` when scraped: a service
    exports what it already counts without recording anything on its hot paths."""

    def observe(_: CallbackOptions) -> Iterable[Observation]:
        yield Observation(read())

    return observe
