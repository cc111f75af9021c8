"""``python -m cellpilot_services.dashboard``: the dashboard on https://127.0.0.1:8080 (see app.py)."""

from __future__ import annotations

import asyncio

from cellpilot.platform.service import run_service
from cellpilot.platform.telemetry import Telemetry
from cellpilot_services.dashboard.app import serve
from cellpilot_services.dashboard.settings import DashboardSettings


def main() -> None:
    settings = DashboardSettings.load()

    async def run(stop: asyncio.Event, telemetry: Telemetry) -> None:
        await serve(settings, stop, telemetry)

    # The dashboard serves /metrics on its own HTTP port (app.py), so no separate metrics port.
    run_service("dashboard", settings.platform, run, prometheus=True)


if __name__ == "__main__":
    main()
