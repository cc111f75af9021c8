"""The common way a service process runs: settings, logging, telemetry, and a clean SIGTERM.

A service's ``__main__`` is one call::

    def main() -> None:
        service_main(BorgmasterSettings, serve)

``serve(settings, stop, telemetry)`` receives an :class:`asyncio.Event` that is set on
SIGTERM/SIGINT; it should stop accepting work, finish what is in flight and return. A service
assembled as one object with ``start``/``stop`` serves with :func:`run_until_stopped`.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from cellpilot.platform.logging_setup import setup_logging
from cellpilot.platform.metrics import MetricsEndpoint, prometheus_reader
from cellpilot.platform.settings import PlatformSettings, ServiceSettings
from cellpilot.platform.telemetry import Telemetry, setup_telemetry

log = logging.getLogger(__name__)

ServeFn = Callable[[asyncio.Event, Telemetry], Awaitable[None]]
SettingsT = TypeVar("SettingsT", bound=ServiceSettings)


class StartStop(Protocol):
    """A service assembled as one object: ``start`` brings it up, ``stop`` takes it down."""

    async def start(self) -> object: ...

    async def stop(self) -> None: ...


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


def service_main(
    settings_class: type[SettingsT],
    serve: Callable[[SettingsT, asyncio.Event, Telemetry], Awaitable[None]],
    prometheus: bool = False,
) -> None:
    """A service process: its settings built once (a bad one ends it with one line naming it),
    then :func:`run_service` under the service's name, serving ``/metrics`` where its settings
    say (``metrics_port_to_serve``)."""
    settings = settings_class.load_or_exit()

    async def run(stop: asyncio.Event, telemetry: Telemetry) -> None:
        await serve(settings, stop, telemetry)

    run_service(
        settings.service_name,
        settings.platform,
        run,
        metrics_port=settings.metrics_port_to_serve(),
        prometheus=prometheus,
    )


async def run_until_stopped(service: StartStop, stop: asyncio.Event) -> None:
    """Start ``service``, wait for ``stop``, then stop it (also when the wait is cancelled)."""
    await service.start()
    try:
        await stop.wait()
    finally:
        await service.stop()
