"""Leader work: the scheduler (Borg §3.2) and the rollout of updates, committed through the log.

Every ``schedule_interval_s`` — sooner when something changed — the master first continues
rolling updates and drains (:func:`rollout_step`, :func:`drain_step`), then runs one
scheduling pass over the pending queue, high to low priority and round-robin across users
within a priority. The pass runs off the event loop (it is numpy work on the scheduling
view, Borg §3.4's cached copy); its assignments and preemptions are appended to the log
like every other mutation, and the victims go back to pending. A pass is skipped when the
log has not moved since the last one that placed nothing, except every
``force_pass_interval_s`` (reservations, which are soft state, may have freed room).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from cellpilot.borg.changes import Change
from cellpilot.borg.decisions import drain_step, rollout_step
from cellpilot_services.borgmaster.lifetime_keeper import LifetimeKeeper
from cellpilot_services.borgmaster.replica import NotLeader, Replica, now_ms
from cellpilot_services.borgmaster.settings import BorgmasterSettings

log = logging.getLogger(__name__)


@dataclass
class PassStats:
    passes: int = 0
    placed: int = 0
    preempted: int = 0
    last_pass_s: float = 0.0


class SchedulerLoop:
    def __init__(
        self, replica: Replica, settings: BorgmasterSettings, lifetimes: LifetimeKeeper | None = None
    ) -> None:
        self.replica = replica
        self.settings = settings
        self.lifetimes = lifetimes or LifetimeKeeper(replica, settings)
        self.wake = asyncio.Event()
        self.stats = PassStats()
        replica.listeners.append(self._on_applied)

    def _on_applied(self, _seq: int, changes: list[Change]) -> None:
        if self.replica.is_leader and changes:
            self.wake.set()

    async def run(self) -> None:
        idle_at_seq = -1
        restart_at = 0  # the earliest restart of a backing-off task after the last pass
        last_forced = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout=self.settings.schedule_interval_s)
            self.wake.clear()
            # Let a burst of submissions land in one pass; after a long pass, wait as long again
            # (up to schedule_interval_s): a pass holds the lock, and a stream of writes that
            # wakes the scheduler every time must still get at least half of the master's time.
            await asyncio.sleep(max(0.02, min(self.stats.last_pass_s, self.settings.schedule_interval_s)))
            async with self.replica.lock:
                if not self.replica.is_leader:
                    raise NotLeader(None)
                state = self.replica.state
                drains = drain_step(
                    state, self.settings.drain_evictions_per_pass, self.lifetimes.drain_order(state)
                )
                steps = rollout_step(state) + drains
                if steps:
                    await self.replica.commit(steps, cause_id=f"rollout-{state.last_sequence}")
                forced = time.monotonic() - last_forced >= self.settings.force_pass_interval_s
                event_now = self.replica.event_now_ms()
                # A task whose restart backoff (Borg §4) just ran out is a reason for a pass.
                restart_due = 0 < restart_at <= event_now
                if not state.pending or (
                    state.last_sequence == idle_at_seq and not forced and not restart_due
                ):
                    continue
                if forced:
                    last_forced = time.monotonic()
                started = time.monotonic()
                self.lifetimes.before_pass(state)
                plan = await asyncio.to_thread(
                    self.replica.view.plan, state, now_ms(), self.settings.max_tasks_per_pass, event_now
                )
                mutations = [*plan.mutations, *self.lifetimes.after_pass(state)]
                restart_at = state.next_restart_ms(event_now)
                self.stats.passes += 1
                self.stats.last_pass_s = time.monotonic() - started
                if mutations:
                    cause = f"schedule-pass-{self.stats.passes}"
                    await self.replica.commit(mutations, cause_id=cause)
                    self.stats.placed += plan.placed
                    self.stats.preempted += plan.preempted
                    log.info(
                        "scheduling pass",
                        extra={
                            "cause_id": cause,
                            "placed": plan.placed,
                            "preempted": plan.preempted,
                            "unschedulable": plan.unschedulable,
                            "pass_s": round(self.stats.last_pass_s, 4),
                        },
                    )
                    idle_at_seq = -1
                else:
                    idle_at_seq = state.last_sequence
