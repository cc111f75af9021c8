"""Leader work for lifetime-aware placement (LAVA §3-4): the shell around
:class:`cellpilot.borg.lifetime_tracker.LifetimeTracker`.

* Before a scheduling pass the tracker follows the cell and predicts the pending jobs
  (:meth:`LifetimeKeeper.before_pass`); after it, the LAVA host states the placements changed
  go into the same commit as the placements (:meth:`after_pass`), so the log never holds one
  without the other.
* Every ``lifetime_interval_s`` (:meth:`run`) the master repredicts its running tasks at their
  uptime (§3), moves hosts past their deadline one class up (§4.3) and logs what changed.
* Drains evict in LARS order (§4.4): longest predicted remaining lifetime first.
* ``TrainLifetimes`` replays the checkpoint log into the cell's finished task runs, trains the
  model off the event loop and records it in the log (so it survives failover).

Time is the cell's event time (:meth:`Replica.event_now_ms`), in seconds for LAVA's deadlines.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from cellpilot.borg.cell_state import CellState, TaskRecord
from cellpilot.borg.decisions import draining_machines
from cellpilot.borg.mutations import LavaHost, LavaHostsChanged, LifetimeModelTrained, Mutation
from cellpilot.borg.task_lifetimes import (
    DEFAULT_MIN_RUNS,
    DrainPlan,
    LifetimeHistory,
    TaskLifetime,
    TooLittleHistory,
    TrainedModel,
    drain_plan,
    lars_order,
    train_lifetime_model,
)
from cellpilot.schedule.lifetime_aware.lava import EMPTY
from cellpilot_services.borgmaster.checkpoint_codec import record_in
from cellpilot_services.borgmaster.replica import READ_BATCH, NotLeader, Replica, now_ms
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
        self.tracker = replica.lifetimes

    @property
    def keeps_host_states(self) -> bool:
        """LAVA's host states are logged only under the LAVA policy (LAS and LARS need predictions only)."""
        return self.settings.placement_policy == "lava"

    def _now_s(self) -> float:
        return self.replica.event_now_ms() / 1000.0

    def sync(self, state: CellState) -> None:
        """The tracker in step with the state and the view's cell (caller holds the lock)."""
        view = self.replica.view
        if view.stale:
            view.rebuild(state)
        self.tracker.sync(state, view.cell, self._now_s())

    # ------------------------------------------------------------------ scheduling passes
    def before_pass(self, state: CellState) -> None:
        self.sync(state)
        self.tracker.expect_pending(state, self.replica.view.cell, self.replica.event_now_ms())

    def after_pass(self, state: CellState) -> list[Mutation]:
        """The LAVA host states the pass's placements changed (committed with them)."""
        self.tracker.sync(state, self.replica.view.cell, self._now_s())
        change = self._host_changes(state)
        return [change] if change is not None else []

    def _host_changes(self, state: CellState) -> LavaHostsChanged | None:
        if self.keeps_host_states:
            return self.tracker.changes(state)
        if state.lava_hosts:  # left by an earlier LAVA master: no policy keeps them now
            return LavaHostsChanged(tuple(LavaHost(m, EMPTY, -1) for m in sorted(state.lava_hosts)))
        return None

    def drain_order(self, state: CellState) -> Callable[[list[TaskRecord]], list[TaskRecord]] | None:
        """LARS's eviction order (§4.4) when the cell has a lifetime model."""
        if not draining_machines(state):
            return None
        self.sync(state)
        return lars_order(self.tracker.predicted) if self.tracker.active else None

    def drain_plan(self, state: CellState, machine_id: str) -> DrainPlan:
        self.sync(state)
        return drain_plan(state, [machine_id], self.tracker.predicted)

    def lifetime_of(self, state: CellState, job_id: str, index: int) -> TaskLifetime | None:
        return self.tracker.lifetime_of(state, (job_id, index), self._now_s())

    # ------------------------------------------------------------------ timer
    async def run(self) -> None:
        """Leader work: repredictions and LAVA deadlines every ``lifetime_interval_s``."""
        while True:
            await asyncio.sleep(self.settings.lifetime_interval_s)
            async with self.replica.lock:
                if not self.replica.is_leader:
                    raise NotLeader(None)
                state = self.replica.state
                self.sync(state)
                now = self._now_s()
                self.tracker.repredict(state, now)
                self.tracker.advance(now)
                change = self._host_changes(state)
                if change is not None:
                    await self.replica.commit([change], cause_id=f"lifetimes-{state.last_sequence}")

    # ------------------------------------------------------------------ training
    async def train(self, min_runs: int, cause_id: str) -> Trained | TooLittleHistory:
        """Trains the model on the finished runs of the log up to now and records it."""
        replica = self.replica
        if not replica.is_leader:
            raise NotLeader(replica.leader_address())
        upto = replica.state.last_sequence
        history = LifetimeHistory()
        after = 0
        while after < upto:
            entries = await replica.log.read(after, upto, limit=READ_BATCH)
            if not entries:
                break
            await asyncio.to_thread(history.feed, [record_in(e.record) for e in entries])
            after = entries[-1].seq
        outcome = await asyncio.to_thread(train_lifetime_model, history, min_runs or DEFAULT_MIN_RUNS)
        if isinstance(outcome, TooLittleHistory):
            return outcome
        text = await asyncio.to_thread(outcome.model.to_json)
        record = LifetimeModelTrained(text, outcome.runs, now_ms())
        async with replica.lock:
            seq = await replica.commit([record], cause_id=cause_id)
        log.info(
            "lifetime model trained",
            extra={"cause_id": cause_id, "runs": outcome.runs, "jobs": outcome.jobs, "seq": seq},
        )
        return Trained(outcome, seq, len(text))
