"""``python -m cellpilot_services.borgmaster``: one Borgmaster replica.

Settings come from ``CELLPILOT_BORGMASTER_*`` environment variables (see ``settings.py``);
``cellpilot run`` starts three replicas (``CELLPILOT_REPLICA_INDEX`` 0, 1, 2) listening on
127.0.0.1:7100, 7101 and 7102; one of them is elected master.
"""

from __future__ import annotations

import asyncio

from pydantic import ValidationError

from cellpilot.platform.service import run_service
from cellpilot.platform.telemetry import Telemetry
from cellpilot_services.borgmaster.borgmaster_service import serve
from cellpilot_services.borgmaster.settings import BorgmasterSettings


def main() -> None:
    try:
        settings = BorgmasterSettings.load()
    except ValidationError as error:  # one line naming each bad setting, no traceback
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
        raise SystemExit(f"invalid Borgmaster settings: {problems}") from None

    async def run(stop: asyncio.Event, telemetry: Telemetry) -> None:
        await serve(settings, stop, telemetry)

    run_service("borgmaster", settings.platform, run)


if __name__ == "__main__":
    main()
