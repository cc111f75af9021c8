"""The master's side of lifetime-aware placement (LAVA §3-4): predictions for queries and drains,
and training the cell's lifetime model.

The scores of LAS and LAVA and LAVA's host states belong to the scheduler's passes (its own
process, :mod:`cellpilot_services.scheduler`); the master keeps the core's
:class:`~cellpilot.borg.lifetime_tracker.LifetimeTracker` over its own copy of the cell only to
answer ``WhyPending``/``GetLifetimes``, to plan drains in LARS order (§4.4) and to evict in that
order (the core's timer tick). ``TrainLifetimes`` replays the checkpoint log into the cell's
finished task runs, trains the model off the event loop and records it in the log (so it
survives failover).

Time is the cell's event time (:meth:`Replica.event_now_ms`), in seconds for LAVA's deadlines.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from cellpilot.borg.cell_state import CellState
from cellpilot.borg.master_core import ModelTrained
from cellpilot.borg.mutations import LifetimeModelTrained
from cellpilot.borg.task_lifetimes import (
    DEFAULT_MIN_RUNS,
    DrainPlan,
    LifetimeHistory,
    TaskLifetime,
    TooLittleHistory,
    TrainedModel,
    drain_plan,
    train_lifetime_model,
)
from cellpilot.checkpoint_store import batches_after
from cellpilot_services.borgmaster.replica import NotLeader, Replica, now_ms
from cellpilot_services.borgmaster.settings import BorgmasterSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Trained:
    trained: TrainedModel
    log_sequence: int
    model_bytes: int


class LifetimeKeeper:
    def __init__(self, replica: Replica, settings: BorgmasterSettings) -> None:
        self.replica = replica
        self.settings = settings

    @property
    def tasks_predicted(self) -> int:
        return len(self.replica.core.lifetimes.predicted)

    def drain_plan(self, state: CellState, machine_id: str) -> DrainPlan:
        tracker = self.replica.core.lifetimes_synced(now_ms())
        return drain_plan(state, [machine_id], tracker.predicted)

    def lifetime_of(self, state: CellState, job_id: str, index: int) -> TaskLifetime | None:
        tracker = self.replica.core.lifetimes_synced(now_ms())
        return tracker.lifetime_of(state, (job_id, index), self.replica.event_now_ms() / 1000.0)

    async def train(self, min_runs: int, cause_id: str) -> Trained | TooLittleHistory:
        """Trains the model on the finished runs of the log up to now and records it."""
        replica = self.replica
        if not replica.is_leader:
            raise NotLeader(replica.leader_address())
        upto = replica.state.last_sequence
        history = LifetimeHistory()
        async for records in batches_after(replica.store, 0, upto):
            await asyncio.to_thread(history.feed, records)
        outcome = await asyncio.to_thread(train_lifetime_model, history, min_runs or DEFAULT_MIN_RUNS)
        if isinstance(outcome, TooLittleHistory):
            return outcome
        text = await asyncio.to_thread(outcome.model.to_json)
        record = LifetimeModelTrained(text, outcome.runs, now_ms())
        _, seq = await replica.submit(ModelTrained(record, cause_id))
        log.info(
            "lifetime model trained",
            extra={"cause_id": cause_id, "runs": outcome.runs, "jobs": outcome.jobs, "seq": seq},
        )
        return Trained(outcome, seq, len(text))
