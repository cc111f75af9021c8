"""``python -m cellpilot_services.aggregator``: one aggregator replica.

Settings come from ``CELLPILOT_AGGREGATOR_*`` environment variables (see ``settings.py``);
``cellpilot run`` starts two replicas sharing the ``usage.samples`` partitions; replica
``i`` serves the Monitoring API on 127.0.0.1:730i.
"""

from __future__ import annotations

import asyncio

from cellpilot.platform.service import run_service
from cellpilot.platform.telemetry import Telemetry
from cellpilot_services.aggregator.aggregator_service import serve
from cellpilot_services.aggregator.settings import AggregatorSettings


def main() -> None:
    settings = AggregatorSettings.load()

    async def run(stop: asyncio.Event, telemetry: Telemetry) -> None:
        await serve(settings, stop, telemetry)

    run_service("aggregator", settings.platform, run, metrics_port=settings.resolved_metrics_port)


if __name__ == "__main__":
    main()
