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
from dataclasses import dataclass

import grpc

from cellpilot.api.v1 import borglet_pb2, borglet_pb2_grpc
from cellpilot.borg.changes import Change, MachineChange, TaskChange
from cellpilot.borg.mutations import Mutation
from cellpilot.borg.poll_diff import desired_tasks, diff_report, machines_down
from cellpilot.schedule import Resources
from cellpilot_services.borgmaster import convert
from cellpilot_services.borgmaster.replica import NotLeader, Replica, now_ms
from cellpilot_services.borgmaster.settings import BorgmasterSettings

log = logging.getLogger(__name__)

_LOGGED_MISSES = frozenset({0, 1, 4, 9, 99})  # failed polls in a row already counted, when logged


@dataclass(frozen=True)
class CycleStats:
    machines: int
    answered: int
    mutations: int
    duplicates: int
    seconds: float


class BorgletPoller:
    def __init__(self, replica: Replica, settings: BorgmasterSettings) -> None:
        self.replica = replica
        self.settings = settings
        self.channels: dict[str, grpc.aio.Channel] = {}
        # The master calls Borglets as itself: its certificate (mTLS) or a service token.
        self.credentials = settings.security.channel_credentials("borgmaster")
        self.metadata = settings.security.service_metadata("borgmaster")
        self.missed: dict[str, int] = {}
        self.reported_version: dict[str, int] = {}
        self.acked_event: dict[str, int] = {}
        self.resend: set[str] = set()
        self.urgent: set[str] = set()
        self.wake = asyncio.Event()
        self.last_cycle: CycleStats | None = None
        self.policy = settings.restart_policy
        replica.listeners.append(self._on_applied)

    def _on_applied(self, _seq: int, changes: list[Change]) -> None:
        if not self.replica.is_leader:
            return
        for change in changes:
            if (isinstance(change, TaskChange) and change.machine_id) or isinstance(change, MachineChange):
                self.urgent.add(change.machine_id)
        if self.urgent:
            self.wake.set()

    def _stub(self, address: str) -> borglet_pb2_grpc.BorgletStub:
        channel = self.channels.get(address)
        if channel is None:
            channel = self.channels[address] = (
                grpc.aio.insecure_channel(address)
                if self.credentials is None
                else grpc.aio.secure_channel(address, self.credentials)
            )
        return borglet_pb2_grpc.BorgletStub(channel)

    async def close(self) -> None:
        for channel in self.channels.values():
            with contextlib.suppress(Exception):
                await channel.close()
        self.channels.clear()

    async def run(self) -> None:
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

    def _request(self, machine_id: str) -> tuple[str, borglet_pb2.PollRequest] | None:
        state = self.replica.state
        machine = state.machines.get(machine_id)
        if machine is None:
            return None
        request = borglet_pb2.PollRequest(
            machine_id=machine_id,
            master_replica_id=self.replica.replica_id,
            master_epoch=self.replica.epoch,
            event_time_ms=now_ms(),
            ack_event_sequence=self.acked_event.get(machine_id, 0),
        )
        if self.reported_version.get(machine_id) != machine.desired_version or machine_id in self.resend:
            request.desired.CopyFrom(
                convert.desired_out(machine.desired_version, desired_tasks(state, machine_id))
            )
        return machine.spec.borglet_address, request

    async def cycle(self, machine_ids: list[str], count_misses: bool = True) -> CycleStats:
        """Polls the machines concurrently, then diffs and commits their reports at once."""
        started = time.monotonic()
        gate = asyncio.Semaphore(self.settings.poll_concurrency)
        requests = {m: req for m in machine_ids if (req := self._request(m)) is not None}

        async def poll(address: str, request: borglet_pb2.PollRequest) -> borglet_pb2.PollResponse | None:
            async with gate:
                try:
                    return await self._stub(address).Poll(
                        request, timeout=self.settings.poll_timeout_s, metadata=self.metadata
                    )
                except grpc.aio.AioRpcError as error:
                    if error.code() == grpc.StatusCode.FAILED_PRECONDITION:
                        log.warning(
                            "a Borglet refused our epoch",
                            extra={"machine_id": request.machine_id, "error": error.details()},
                        )
                    elif count_misses and self.missed.get(request.machine_id, 0) in _LOGGED_MISSES:
                        # The first failed poll of a run, and a few after it: a machine heading
                        # for DOWN says why (Borg §3.3).
                        log.warning(
                            "poll failed",
                            extra={
                                "machine_id": request.machine_id,
                                "missed_before": self.missed.get(request.machine_id, 0),
                                "code": error.code().name,
                                "error": error.details(),
                            },
                        )
                    return None

        ids = list(requests)
        responses = await asyncio.gather(*(poll(*requests[m]) for m in ids))
        answered = [(m, r) for m, r in zip(ids, responses, strict=True) if r is not None]
        for m, r in zip(ids, responses, strict=True):
            if r is None and count_misses:
                self.missed[m] = self.missed.get(m, 0) + 1
            elif r is not None:
                self.missed.pop(m, None)
        mutations: list[Mutation] = []
        duplicates = 0
        async with self.replica.lock:
            if not self.replica.is_leader:
                raise NotLeader(None)
            state = self.replica.state
            diffs = []
            for machine_id, response in answered:
                try:
                    report = convert.report_in(response)
                except convert.InvalidField as error:
                    log.warning(
                        "malformed poll response", extra={"machine_id": machine_id, "error": str(error)}
                    )
                    continue
                diff = diff_report(state, report, self.settings.max_task_failures, self.policy)
                diffs.append((machine_id, response, diff))
                mutations += diff.mutations
                duplicates += len(diff.duplicates)
                if diff.duplicates:
                    self.resend.add(machine_id)
                    log.info(
                        "duplicates on a returning machine; telling it to kill them",
                        extra={"machine_id": machine_id, "duplicates": len(diff.duplicates)},
                    )
                else:
                    self.resend.discard(machine_id)
            if count_misses:
                mutations += machines_down(state, self.missed, self.settings.missed_polls_down)
            if mutations:
                event_time = max((r.event_time_ms for _, r in answered), default=0) or now_ms()
                await self.replica.commit(
                    mutations, cause_id=f"poll-{int(started * 1000)}", event_time_ms=event_time
                )
            usage: dict[tuple[str, int], Resources] = {}
            cpu_samples = []
            for machine_id, response, diff in diffs:
                self.reported_version[machine_id] = response.desired_version
                if response.events:
                    self.acked_event[machine_id] = max(e.sequence for e in response.events)
                soft = self.replica.soft
                # A report of a new event-second is a fresh CPU demand sample of the machine
                # and its tasks (GPA §4: cellpilot.schedule.cpu_demand); a repeat is not.
                machine = state.machines.get(machine_id)
                fresh = response.event_time_ms // 1000 > soft.last_contact_ms.get(machine_id, 0) // 1000
                if fresh and machine is not None:
                    cpu_samples.append((diff.cpu_demand, machine.spec.capacity.cpu))
                soft.last_contact_ms[machine_id] = response.event_time_ms
                soft.latest_event_ms = max(soft.latest_event_ms, response.event_time_ms)
                soft.machine_usage[machine_id] = convert.resources_in(response.usage, "poll.usage")
                soft.cached_packages[machine_id] = tuple(response.cached_package_ids)
                soft.task_usage.update(diff.usage)
                soft.task_ready.update(diff.ready)
                usage.update(diff.usage)
            self.replica.view.update_usage(usage, now_ms())
            self.replica.view.observe_cpu(cpu_samples)
        stats = CycleStats(len(ids), len(answered), len(mutations), duplicates, time.monotonic() - started)
        if count_misses:
            log.debug("poll cycle", extra=vars(stats))
        return stats
