"""One replica's link shard (Borg §3.3): poll its share of the Borglets, forward what changed.

Every replica runs one, the master and the standbys alike. Every ``poll_interval_s`` it
polls the machines of its share — a stable hash of the machine over the members the master
named in its last answer (:mod:`cellpilot.borg.link_shards`) — for the master's epoch, with
the desired sets of its own copy of the state (a standby follows the log). It keeps the digest
of the last report it forwarded per machine and sends the master only the reports whose
digest changed (or that are due a soft-state refresh), the machines that missed polls and
those that answered again (``ReportMachineChanges``; the master applies its own shard's
directly). The master's answer names the members, so the shares follow elections and
replicas coming and going; an answer for a new epoch starts every digest afresh.

A machine whose desired set changes in the log is polled at once by the shard that owns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

import grpc

from cellpilot.api.v1 import borglet_pb2, link_shard_pb2, link_shard_pb2_grpc
from cellpilot.borg.lifecycle import MachineState
from cellpilot.borg.link_shards import Membership, ReportDigest, must_forward
from cellpilot.borg_wire import borglet_polls
from cellpilot.platform.grpc_channels import open_channel
from cellpilot.platform.request_validation import InvalidField
from cellpilot.platform.store_outage import StoreUnavailable
from cellpilot_services.borgmaster.borglet_poller import YIELD_EVERY, BorgletPoller
from cellpilot_services.borgmaster.link_shard_master import ShardRegistry
from cellpilot_services.borgmaster.poll_reports import apply_reports
from cellpilot_services.borgmaster.replica import NotLeader, Replica, now_ms
from cellpilot_services.borgmaster.settings import BorgmasterSettings

log = logging.getLogger(__name__)

FORWARD_BATCH = 200  # machine reports per ReportMachineChanges call


@dataclass(frozen=True)
class ShardCycle:
    machines: int
    answered: int
    forwarded: int
    seconds: float


class LinkShard:
    def __init__(self, replica: Replica, settings: BorgmasterSettings, registry: ShardRegistry) -> None:
        self.replica = replica
        self.settings = settings
        self.registry = registry
        self.poller = BorgletPoller(replica, settings)
        self.membership: Membership | None = None  # as the master last named it (standby)
        self.epoch = 0  # the master epoch the digests are relative to
        self.digests: dict[str, ReportDigest] = {}
        self.forwarded_ms: dict[str, int] = {}
        self.last_cycle: ShardCycle | None = None
        self._share_key: tuple[int, int, str] = (0, -1, "")
        self._share: list[str] = []
        self.credentials = settings.security.channel_credentials("borgmaster")
        self.metadata = settings.security.service_metadata("borgmaster")
        self._master: tuple[str, grpc.aio.Channel] | None = None

    # ------------------------------------------------------------------ who leads, what is ours
    def _target(self) -> tuple[int, str | None] | None:
        """The master epoch to poll for and the master's address (None: we are the master)."""
        replica = self.replica
        if replica.is_leader:
            return replica.epoch, None
        leader = replica.known_leader
        address = replica.leader_address()
        if leader is None or address is None:
            return None
        return leader.token, address

    def share(self) -> list[str]:
        """The machines this shard polls now (cached until the membership or machines change)."""
        membership = self.registry.current() if self.replica.is_leader else self.membership
        if membership is None:
            return []
        machines = self.replica.state.machines
        key = (membership.version, len(machines), "/".join(membership.members))
        if key != self._share_key:
            self._share_key = key
            self._share = membership.share(self.replica.replica_id, machines)
        return self._share

    def _channel(self, address: str) -> grpc.aio.Channel:
        if self._master is None or self._master[0] != address:
            if self._master is not None:
                asyncio.get_running_loop().create_task(self._master[1].close())
            self._master = (address, open_channel(address, self.credentials))
        return self._master[1]

    # ------------------------------------------------------------------ the loop
    async def run(self, stop: asyncio.Event) -> None:
        next_full = time.monotonic()
        wake = self.poller.wake
        try:
            while not stop.is_set():
                timeout = max(next_full - time.monotonic(), 0.0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=timeout)
                wake.clear()
                try:
                    if time.monotonic() >= next_full:
                        next_full = time.monotonic() + self.settings.poll_interval_s
                        self.poller.urgent.clear()
                        self.last_cycle = await self.cycle()
                    elif self.poller.urgent:
                        urgent, self.poller.urgent = self.poller.urgent, set()
                        await self.cycle(urgent)
                except asyncio.CancelledError:
                    raise
                except (NotLeader, StoreUnavailable, grpc.aio.AioRpcError) as error:
                    log.debug("link shard cycle not applied", extra={"error": str(error)})
                except Exception:
                    log.exception("link shard cycle failed", extra={"replica_id": self.replica.replica_id})
        finally:
            await self.poller.close()
            if self._master is not None:
                await self._master[1].close()

    async def cycle(self, urgent: set[str] | None = None) -> ShardCycle | None:
        """Polls the share (or the urgent machines of it), forwards the differences."""
        started = time.monotonic()
        target = self._target()
        if target is None:
            return None
        epoch, master = target
        if epoch != self.epoch:  # a new master knows nothing of what we forwarded before
            self.epoch, self.digests, self.forwarded_ms = epoch, {}, {}
            self.membership = None
        share = self.share()
        machines = share if urgent is None else sorted(urgent.intersection(share))
        answered, again = await self.poller.poll(machines, epoch, count_misses=urgent is None)
        changed = await self._changed(answered, set(again))
        mine = set(share)
        for gone in [m for m in self.poller.missed if m not in mine]:  # moved to another shard
            del self.poller.missed[gone]
        missed = dict(self.poller.missed) if urgent is None else {}
        previous = self.last_cycle.seconds if self.last_cycle else 0.0
        resend = await self._forward(
            epoch, master, changed, missed, again, len(share), previous, urgent is None
        )
        now = now_ms()
        for response, digest in changed:
            if digest is not None:
                self.digests[response.machine_id] = digest
            self.forwarded_ms[response.machine_id] = now
        self.poller.acknowledge([r for r, _ in changed], resend)
        return ShardCycle(len(machines), len(answered), len(changed), time.monotonic() - started)

    async def _changed(
        self, answered: list[borglet_pb2.PollResponse], again: set[str]
    ) -> list[tuple[borglet_pb2.PollResponse, ReportDigest | None]]:
        state = self.replica.state
        now = now_ms()
        # With the GPA fit test on, each poll's CPU sample is what the master learns the
        # tasks' moments from (GPA §4): every report goes, and the master's work grows with
        # machines again — the price of learning from every sample.
        refresh_ms = 0 if self.settings.gpa_rho > 0 else round(self.settings.link_shard_refresh_s * 1000)
        out: list[tuple[borglet_pb2.PollResponse, ReportDigest | None]] = []
        for i, response in enumerate(answered):
            if i and i % YIELD_EVERY == 0:
                await asyncio.sleep(0)
            machine_id = response.machine_id
            try:  # the digest only: the master converts (and checks) what is forwarded
                digest = borglet_polls.digest_in(response, self.poller.acked_event.get(machine_id, 0))
            except InvalidField:
                out.append((response, None))  # the master says what is wrong with it
                continue
            machine = state.machines.get(machine_id)
            if must_forward(
                self.digests.get(machine_id),
                digest,
                answered_again=machine_id in again,
                machine_down=machine is None or machine.state is MachineState.DOWN,
                last_forward_ms=self.forwarded_ms.get(machine_id),
                now_ms=now,
                refresh_ms=refresh_ms,
            ):
                out.append((response, digest))
        return out

    async def _forward(
        self,
        epoch: int,
        master: str | None,
        changed: list[tuple[borglet_pb2.PollResponse, ReportDigest | None]],
        missed: dict[str, int],
        again: list[str],
        machines: int,
        previous_cycle_s: float,
        full_cycle: bool,
    ) -> set[str]:
        """Sends the differences to the master (or applies them, on the master); returns the
        machines to resend the desired set to."""
        responses = [r for r, _ in changed]
        if master is None:
            self.registry.heard(
                self.replica.replica_id, machines, previous_cycle_s, len(responses), full_cycle
            )
            applied = await apply_reports(self.replica, responses, missed, f"shard-{self.replica.replica_id}")
            return set(applied.resend)
        stub = link_shard_pb2_grpc.LinkShardsStub(self._channel(master))
        resend: set[str] = set()
        chunks = [responses[i : i + FORWARD_BATCH] for i in range(0, len(responses), FORWARD_BATCH)] or [[]]
        for i, chunk in enumerate(chunks):
            request = link_shard_pb2.ReportMachineChangesRequest(
                replica_id=self.replica.replica_id,
                master_epoch=epoch,
                membership_version=self.membership.version if self.membership else 0,
                changed=chunk,
                machines_polled=machines,
                previous_cycle_s=previous_cycle_s,
            )
            if i == len(chunks) - 1:  # misses once per cycle, after every report of it
                request.missed.extend(
                    link_shard_pb2.MissedPolls(machine_id=m, in_a_row=n) for m, n in sorted(missed.items())
                )
                request.answered_again.extend(again)
                request.ends_full_cycle = full_cycle
            answer = await stub.ReportMachineChanges(
                request, timeout=max(self.settings.poll_timeout_s, 5.0), metadata=self.metadata
            )
            resend.update(answer.resend_desired)
            if answer.master_epoch == epoch:
                members = tuple(answer.members)
                if self.membership is None or self.membership.version != answer.membership_version:
                    self.membership = Membership(answer.membership_version, members)
        return resend
