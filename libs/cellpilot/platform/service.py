"""The common way a service process runs: settings, logging, telemetry, and a clean SIGTERM.

A service entry point looks like::

    def main() -> None:
        settings = MySettings()
        run_service("borgmaster", settings.platform, lambda stop: serve(settings, stop))

``serve`` receives an :class:`asyncio.Event` that is set on SIGTERM/SIGINT; it should stop
accepting work, finish what is in flight and return.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

from cellpilot.platform.logging_setup import setup_logging
from cellpilot.platform.metrics import MetricsEndpoint, prometheus_reader
from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.telemetry import Telemetry, setup_telemetry

log = logging.getLogger(__name__)

ServeFn = Callable[[asyncio.Event, Telemetry], Awaitable[None]]


async def _run(
    name: str, platform: PlatformSettings, serve: ServeFn, metrics_port: int | None, prometheus: bool
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    endpoint = MetricsEndpoint(metrics_port) if metrics_port is not None else None
    readers = [prometheus_reader()] if endpoint is not None or prometheus else []
    telemetry = setup_telemetry(name, platform.otlp_endpoint, extra_metric_readers=readers)
    if endpoint is not None:
        try:
            port = endpoint.start()
            log.info("metrics endpoint listening", extra={"port": port})
        except OSError as error:  # a busy port must not keep the service from running
            log.warning("metrics endpoint not started", extra={"port": metrics_port, "error": str(error)})
            endpoint = None
    log.info("service starting", extra={"service_name": name})
    try:
        await serve(stop, telemetry)
    finally:
        telemetry.shutdown()
        if endpoint is not None:
            endpoint.stop()
        log.info("service stopped", extra={"service_name": name})


def run_service(
    name: str,
    platform: PlatformSettings,
    serve: ServeFn,
    metrics_port: int | None = None,
    prometheus: bool = False,
) -> None:
    """Run ``serve`` until SIGTERM; with ``metrics_port`` also serve Prometheus ``/metrics`` there
    (by convention the gRPC port + 1000, :mod:`cellpilot.platform.metrics`). ``prometheus`` alone
    registers the metrics with prometheus_client for a service that serves ``/metrics`` itself."""
    setup_logging(name, platform.log_level, platform.log_json)
    asyncio.run(_run(name, platform, serve, metrics_port, prometheus))
