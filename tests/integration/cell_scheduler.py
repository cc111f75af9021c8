"""The cell's scheduler (Borg §3.4) for tests that run Borgmasters in this process: the scheduler
service's loop, in this process too, following the log the masters write and proposing to
whichever of them is elected — as ``cellpilot run``'s scheduler process does."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from cellpilot_services.borgmaster.settings import BorgmasterSettings
from cellpilot_services.scheduler.scheduler_service import Scheduler
from cellpilot_services.scheduler.settings import SchedulerSettings

# Quick to notice new work: tests wait on placements with deadlines, not on these.
SCHEDULER_FAST = {"tail_interval_s": 0.05, "soft_state_interval_s": 0.2, "force_pass_interval_s": 0.5}


@asynccontextmanager
async def scheduler(
    masters: Sequence[str], policy: BorgmasterSettings, index: int = 0, **overrides: Any
) -> AsyncIterator[Scheduler]:
    """A scheduler proposing to the replicas at ``masters``; ``policy``: the cell's scheduling
    policy and store (the masters' settings)."""
    values: dict[str, Any] = {
        "platform": policy.platform,
        "replica_index": index,
        "replica_id": f"scheduler-{index}",
        "port": 0,
        "metrics_port": 0,
        "borgmaster_addresses": list(masters),
        **SCHEDULER_FAST,
        **overrides,
    }
    running = Scheduler(SchedulerSettings(**values), policy)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()
