"""Leader work: poll every registered Borglet (Borg §3.3) and commit what their reports imply.

Every ``poll_interval_s`` the master polls all machines concurrently, each call carrying
its epoch (a Borglet refuses a lower one) and, when it changed since the version the
Borglet last reported, the machine's desired task set — which also tells a returning
machine to kill its duplicates. The reports are diffed against the state
(:mod:`cellpilot.borg.poll_diff`), the resulting transitions are committed through the
log in one append, and machines that missed ``missed_polls_down`` polls in a row are
marked down so their tasks are rescheduled. Machines whose desired set just changed
(a scheduling pass, a kill, an update) are polled at once instead of waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from cellpilot.api.v1 import borglet_pb2
from cellpilot.borg.changes import Change, MachineChange, TaskChange
from cellpilot.borg.poll_diff import desired_tasks
from cellpilot.borg_wire import borglet_polls
from cellpilot_services.borgmaster.borglet_fanout import BorgletFanout, PollFailure
from cellpilot_services.borgmaster.poll_reports import apply_reports
from cellpilot_services.borgmaster.replica import Replica, now_ms
from cellpilot_services.borgmaster.settings import BorgmasterSettings

log = logging.getLogger(__name__)

# Machines handled between two yields of the event loop while building polls or reading their
# reports: a 10 000-machine cell's CPU work is cut into slices, so the lease keeps being renewed.
YIELD_EVERY = 100
_LOGGED_MISSES = frozenset({0, 1, 4, 9, 99})  # failed polls in a row already counted, when logged


@dataclass(frozen=True)
class CycleStats:
    machines: int
    answered: int
    mutations: int
    duplicates: int
    seconds: float


class BorgletPoller:
    """Polls machines and keeps what each poll needs: the desired-set version each Borglet
    reported, the events acknowledged, the machines to resend the set to, missed polls.

    The master's own work without link shards (:meth:`run`: every machine every
    ``poll_interval_s``), and the polling half of every replica's link shard
    (:mod:`link_shard`), which uses :meth:`poll` and :meth:`acknowledge` only.
    """

    def __init__(self, replica: Replica, settings: BorgmasterSettings) -> None:
        self.replica = replica
        self.settings = settings
        self.fanout = BorgletFanout(settings)
        self.missed: dict[str, int] = {}
        self.reported_version: dict[str, int] = {}
        self.acked_event: dict[str, int] = {}
        self.resend: set[str] = set()
        self.urgent: set[str] = set()
        self._desired_sets: dict[str, borglet_pb2.DesiredTasks] = {}
        self.wake = asyncio.Event()
        self.last_cycle: CycleStats | None = None
        replica.listeners.append(self._on_applied)

    def _on_applied(self, _seq: int, changes: list[Change]) -> None:
        """A desired set changed: poll that machine at once (on any replica: a standby's
        link shard sees the change when it applies the log)."""
        if not self.replica.is_leader and not self.settings.link_shards:
            return
        for change in changes:
            if (isinstance(change, TaskChange) and change.machine_id) or isinstance(change, MachineChange):
                self.urgent.add(change.machine_id)
        if self.urgent:
            self.wake.set()

    async def close(self) -> None:
        await self.fanout.close()

    async def run(self) -> None:
        """Leader work without link shards: every machine every ``poll_interval_s``."""
        next_full = time.monotonic()
        try:
            while True:
                timeout = max(next_full - time.monotonic(), 0.0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), timeout=timeout)
                self.wake.clear()
                if time.monotonic() >= next_full:
                    next_full = time.monotonic() + self.settings.poll_interval_s
                    self.urgent.clear()
                    self.last_cycle = await self.cycle(sorted(self.replica.state.machines))
                elif self.urgent:
                    machines, self.urgent = sorted(self.urgent), set()
                    await self.cycle(machines, count_misses=False)
        finally:
            await self.close()

    def _request(self, machine_id: str, epoch: int) -> tuple[str, borglet_pb2.PollRequest] | None:
        state = self.replica.state
        machine = state.machines.get(machine_id)
        if machine is None:
            return None
        request = borglet_pb2.PollRequest(
            machine_id=machine_id,
            master_replica_id=self.replica.replica_id,
            master_epoch=epoch,
            event_time_ms=now_ms(),
            ack_event_sequence=self.acked_event.get(machine_id, 0),
        )
        reported = self.reported_version.get(machine_id)
        # Never an older set than the Borglet applied (a standby's copy of the state may lag).
        if reported is None or reported < machine.desired_version or machine_id in self.resend:
            request.desired.CopyFrom(self._desired(machine_id, machine.desired_version))
        return machine.spec.borglet_address, request

    def _desired(self, machine_id: str, version: int) -> borglet_pb2.DesiredTasks:
        """The machine's desired set at ``version`` (the log position of its last change, so
        one version is one set): built once, then reused until the Borglet reports it applied."""
        cached = self._desired_sets.get(machine_id)
        if cached is None or cached.version != version:
            cached = borglet_polls.desired_out(version, desired_tasks(self.replica.state, machine_id))
            self._desired_sets[machine_id] = cached
        return cached

    async def poll(
        self, machine_ids: list[str], epoch: int, count_misses: bool = True
    ) -> tuple[list[borglet_pb2.PollResponse], list[str]]:
        """Polls the machines concurrently (for the master of ``epoch``); returns the reports
        and the machines that answered after missing polls. Counts the misses."""
        requests: dict[str, tuple[str, borglet_pb2.PollRequest]] = {}
        for i, machine_id in enumerate(machine_ids):
            if i and i % YIELD_EVERY == 0:
                await asyncio.sleep(0)  # a large share must not hold the loop (the lease renews on it)
            request = self._request(machine_id, epoch)
            if request is not None:
                requests[machine_id] = request
        outcomes = await self.fanout.poll(requests)
        answered: list[borglet_pb2.PollResponse] = []
        again: list[str] = []
        for machine_id in requests:
            outcome = outcomes[machine_id]
            if isinstance(outcome, PollFailure):
                self._failed(machine_id, outcome, count_misses)
                continue
            answered.append(outcome)
            if self.missed.pop(machine_id, None) is not None:
                again.append(machine_id)
        return answered, again

    def _failed(self, machine_id: str, failure: PollFailure, count_misses: bool) -> None:
        if failure.code == "FAILED_PRECONDITION":
            log.warning(
                "a Borglet refused our epoch", extra={"machine_id": machine_id, "error": failure.message}
            )
        elif count_misses and self.missed.get(machine_id, 0) in _LOGGED_MISSES:
            # The first failed poll of a run, and a few after it: a machine heading for DOWN
            # says why (Borg §3.3).
            log.warning(
                "poll failed",
                extra={
                    "machine_id": machine_id,
                    "missed_before": self.missed.get(machine_id, 0),
                    "code": failure.code,
                    "error": failure.message,
                },
            )
        if count_misses:
            self.missed[machine_id] = self.missed.get(machine_id, 0) + 1

    def acknowledge(self, responses: list[borglet_pb2.PollResponse], resend: AbstractSet[str]) -> None:
        """The master has recorded these reports: remember the desired-set version each
        Borglet applied and the events it may forget; resend the set to machines running
        duplicates."""
        for response in responses:
            self.reported_version[response.machine_id] = response.desired_version
            if response.events:
                self.acked_event[response.machine_id] = max(e.sequence for e in response.events)
            if response.machine_id in resend:
                self.resend.add(response.machine_id)
            else:
                self.resend.discard(response.machine_id)

    async def cycle(self, machine_ids: list[str], count_misses: bool = True) -> CycleStats:
        """Polls the machines concurrently, then diffs and commits their reports at once."""
        started = time.monotonic()
        answered, _ = await self.poll(machine_ids, self.replica.epoch, count_misses)
        applied = await apply_reports(
            self.replica, answered, self.missed if count_misses else None, f"poll-{int(started * 1000)}"
        )
        self.acknowledge([r for r in answered if r.machine_id in applied.applied], applied.resend)
        stats = CycleStats(
            len(machine_ids), len(answered), applied.mutations, applied.duplicates, time.monotonic() - started
        )
        if count_misses:
            log.debug("poll cycle", extra=vars(stats))
        return stats
