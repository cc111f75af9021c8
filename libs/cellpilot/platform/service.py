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
from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.telemetry import Telemetry, setup_telemetry

log = logging.getLogger(__name__)

ServeFn = Callable[[asyncio.Event, Telemetry], Awaitable[None]]


async def _run(name: str, platform: PlatformSettings, serve: ServeFn) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    telemetry = setup_telemetry(name, platform.otlp_endpoint)
    log.info("service starting", extra={"service_name": name})
    try:
        await serve(stop, telemetry)
    finally:
        telemetry.shutdown()
        log.info("service stopped", extra={"service_name": name})


def run_service(name: str, platform: PlatformSettings, serve: ServeFn) -> None:
    setup_logging(name, platform.log_level, platform.log_json)
    asyncio.run(_run(name, platform, serve))
