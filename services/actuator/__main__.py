"""``python -m cellpilot_services.actuator``: the actuator (one replica, health on 127.0.0.1:7600)."""

from __future__ import annotations

import asyncio

from cellpilot.platform.service import run_service
from cellpilot.platform.telemetry import Telemetry
from cellpilot_services.actuator.actuator_service import serve
from cellpilot_services.actuator.settings import ActuatorSettings


def main() -> None:
    settings = ActuatorSettings.load()

    async def run(stop: asyncio.Event, telemetry: Telemetry) -> None:
        await serve(settings, stop, telemetry)

    run_service("actuator", settings.platform, run, metrics_port=settings.resolved_metrics_port)


if __name__ == "__main__":
    main()
