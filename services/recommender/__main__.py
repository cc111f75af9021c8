"""``python -m cellpilot_services.recommender``: one recommender worker replica.

Settings come from ``CELLPILOT_RECOMMENDER_*`` environment variables (see ``settings.py``);
``cellpilot run`` starts three replicas in one consumer group; replica ``i`` serves gRPC
health on 127.0.0.1:750i.
"""

from __future__ import annotations

import asyncio

from cellpilot.platform.service import run_service
from cellpilot.platform.telemetry import Telemetry
from cellpilot_services.recommender.settings import RecommenderSettings
from cellpilot_services.recommender.worker import serve


def main() -> None:
    settings = RecommenderSettings.load()

    async def run(stop: asyncio.Event, telemetry: Telemetry) -> None:
        await serve(settings, stop, telemetry)

    run_service("recommender", settings.platform, run, metrics_port=settings.resolved_metrics_port)


if __name__ == "__main__":
    main()
