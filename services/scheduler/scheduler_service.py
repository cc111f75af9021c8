"""The scheduler process (Borg §3.4): a cached copy of the cell, passes on it, proposals to the master.

It repeatedly: reads the checkpoint log's new records into its copy (the same store and code a
standby replica follows, :class:`~cellpilot.borg.scheduler_copy.SchedulerCopy`); takes the
master's soft state every ``soft_state_interval_s``; runs a scheduling pass off the event loop
when the log moved (or a restart backoff ran out, or every ``force_pass_interval_s``); sends the
placements to the elected master in ``proposal_max`` batches, each stamped with the log position
and the master's epoch it was computed at; reads the log up to the master's answer and puts back
what the master refused, which the next pass reconsiders.

The master never waits for a pass, and nothing the scheduler holds is durable: killed at any
moment, it loses at most the proposal in flight — committed or not, the log says which, and a
restarted scheduler starts from the log. A second scheduler started by mistake is harmless: the
master refuses whatever either proposes from a view the other made stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

import grpc

from cellpilot.api.v1 import borgmaster_pb2, borgmaster_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from cellpilot.borg.lifetime_tracker import LifetimeTracker
from cellpilot.borg.proposals import PlacementProposal
from cellpilot.borg.records import TaskKey
from cellpilot.borg.scheduler_copy import SchedulerCopy
from cellpilot.borg.scheduling_view import Plan
from cellpilot.borg_wire.proposals import proposal_out, soft_state_in
from cellpilot.checkpoint_store import PostgresCheckpointStore
from cellpilot.checkpoint_store.store import READ_BATCH
from cellpilot.platform.error_reasons import LEADER_METADATA_KEY
from cellpilot.platform.grpc_channels import ChannelPool
from cellpilot.platform.grpc_server import GrpcServer
from cellpilot.platform.service import run_until_stopped
from cellpilot.platform.store_outage import describe
from cellpilot.platform.telemetry import Telemetry
from cellpilot_services.borgmaster.settings import BorgmasterSettings
from cellpilot_services.scheduler.scheduler_metrics import export_scheduler_metrics
from cellpilot_services.scheduler.settings import SchedulerSettings

log = logging.getLogger(__name__)
IDENTITY = "scheduler"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Master:
    address: str
    epoch: int


@dataclass
class SchedulerStats:
    passes: int = 0
    pass_s_total: float = 0.0
    last_pass_s: float = 0.0
    proposed: int = 0  # placements sent
    accepted: int = 0
    stale: int = 0
    preempted: int = 0
    records_applied: int = 0


class MasterGone(Exception):  # noqa: N818 - a routing result
    """The master we addressed is no longer the master (or unreachable)."""


class Scheduler:
    def __init__(
        self, settings: SchedulerSettings, policy: BorgmasterSettings, telemetry: Telemetry | None = None
    ) -> None:
        self.settings = settings
        self.scheduler_id = settings.resolved_replica_id
        self.store = PostgresCheckpointStore.connect(
            settings.platform.postgres_url_for(IDENTITY), pool_size=2
        )
        lifetimes = LifetimeTracker()
        self.copy = SchedulerCopy(
            self.scheduler_id, policy.scheduling_view(lifetimes), lifetimes, policy.keeps_lava_host_states
        )
        self.lifetime_interval_s = policy.lifetime_interval_s
        self.channels = ChannelPool(settings.security.channel_credentials(IDENTITY))
        self.metadata = settings.security.service_metadata(IDENTITY)
        self.master: Master | None = None
        self.stats = SchedulerStats()
        self.server = GrpcServer(
            [],
            address=f"{settings.listen_host}:{settings.resolved_port}",
            **settings.security.server_options(IDENTITY),
        )
        if telemetry is not None:
            export_scheduler_metrics(telemetry.meter, self)
        self._stop = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> str:
        port = await self.server.start()
        snapshot = await self.store.latest_snapshot()
        if snapshot is not None:
            self.copy.load(snapshot.state, snapshot.sequence)
        else:
            self.copy.view.rebuild(self.copy.state)
        await self.catch_up()
        log.info(
            "scheduler serving",
            extra={"scheduler_id": self.scheduler_id, "port": port, "seq": self.copy.state.last_sequence},
        )
        self._loop = asyncio.create_task(self.run(self._stop))
        return f"{self.settings.listen_host}:{port}"

    async def stop(self) -> None:
        self._stop.set()
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
        await self.channels.close()
        await self.server.stop(1.0)
        await self.store.close()

    # ------------------------------------------------------------------ the loop
    async def run(self, stop: asyncio.Event) -> None:
        """Passes and proposals, pipelined: while the master judges one proposal, the next pass is
        planned on the copy (the tasks in flight left out), so neither waits for the other."""
        idle_at_seq = -1
        restart_at = 0  # the earliest restart of a backing-off task after the last pass
        last_forced = last_soft = last_lifetimes = 0.0
        delay = self.settings.tail_interval_s
        flight: InFlight | None = None
        try:
            while not stop.is_set():
                try:
                    await self.catch_up()
                    master = self.master or await self.find_master()
                    if master is None:
                        await self._settle(flight)
                        flight = None
                        await self._wait(stop, 0.2)
                        continue
                    now = time.monotonic()
                    if now - last_soft >= self.settings.soft_state_interval_s:
                        await self.take_soft_state(master)
                        last_soft = now
                    if now - last_lifetimes >= self.lifetime_interval_s:
                        last_lifetimes = now
                        tick = self.copy.lifetimes_tick(now_ms(), master.epoch)
                        if tick is not None:
                            await self._settle(flight)
                            flight = None
                            await self.propose(master, tick, Plan((), 0, 0, 0, frozenset()))
                    state = self.copy.state
                    forced = now - last_forced >= self.settings.force_pass_interval_s
                    event_now = self.copy.event_now_ms(now_ms())
                    restart_due = 0 < restart_at <= event_now
                    if not state.pending or (
                        state.last_sequence == idle_at_seq and not forced and not restart_due
                    ):
                        if flight is not None:  # its verdict moves the log: the next pass at once
                            await self._settle(flight)
                            flight = None
                            continue
                        await self._wait(stop, self.settings.tail_interval_s)
                        continue
                    if forced:
                        last_forced = now
                    planned_at = state.last_sequence
                    started = time.monotonic()
                    proposal, plan = await asyncio.to_thread(
                        self.copy.plan,
                        now_ms(),
                        master.epoch,
                        self.settings.max_tasks_per_pass,
                        flight.keys if flight is not None else frozenset(),
                    )
                    restart_at = state.next_restart_ms(event_now)
                    self.stats.passes += 1
                    self.stats.last_pass_s = time.monotonic() - started
                    self.stats.pass_s_total += self.stats.last_pass_s
                    answered = flight is not None
                    try:
                        await self._settle(flight)
                    except BaseException:
                        self.copy.reconcile(plan)  # planned but never sent: its bindings go
                        raise
                    finally:
                        flight = None
                    if proposal is None:
                        # Idle until the log moves, unless a verdict just put refused tasks back.
                        idle_at_seq = -1 if answered else planned_at
                        continue
                    idle_at_seq = -1
                    flight = InFlight.launch(self, master, proposal, plan)
                    delay = self.settings.tail_interval_s
                except asyncio.CancelledError:
                    raise
                except MasterGone as error:
                    log.info("the master changed; finding it again", extra={"reason": str(error)})
                    self.master = None
                    await self._abandon(flight)
                    flight = None
                except Exception as error:
                    log.warning("scheduler loop error; retrying", extra={"error": describe(error)})
                    self.master = None
                    await self._abandon(flight)
                    flight = None
                    await self._wait(stop, delay)
                    delay = min(delay * 2, 5.0)
        finally:
            if flight is not None:
                flight.sending.cancel()

    async def _settle(self, flight: InFlight | None) -> None:
        """Waits for the master's verdict on ``flight`` (its errors, e.g. MasterGone, raised);
        then the log up to it is read and the copy reconciled with what the master committed."""
        if flight is None:
            return
        try:
            await flight.sending
        finally:
            # Whatever was committed is in the log; whatever was not goes back to pending.
            with contextlib.suppress(Exception):
                await self.catch_up(at_least=flight.committed_to)
            self.copy.reconcile(flight.plan)

    async def _abandon(self, flight: InFlight | None) -> None:
        """``flight`` settled after a failure: its own error is already being handled."""
        with contextlib.suppress(Exception):
            await self._settle(flight)

    @staticmethod
    async def _wait(stop: asyncio.Event, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=seconds)

    # ------------------------------------------------------------------ following the log
    async def catch_up(self, at_least: int = 0) -> int:
        """Reads the log's new records into the copy (at least up to ``at_least``: a position the
        master answered after committing, so it is in the store)."""
        applied = 0
        while True:
            records = await self.store.read(self.copy.state.last_sequence, limit=READ_BATCH)
            if records:
                self.copy.apply(records)
                applied += len(records)
            if len(records) < READ_BATCH and (self.copy.state.last_sequence >= at_least or not records):
                break
        self.stats.records_applied += applied
        return applied

    # ------------------------------------------------------------------ the master
    async def find_master(self) -> Master | None:
        """The elected master, as the replicas name it (GetLeader), or None during an election."""
        for address in self.settings.borgmaster_addresses:
            stub = borgmaster_pb2_grpc.BorgmasterStub(self.channels.channel(address))
            try:
                who = await stub.GetLeader(
                    borgmaster_pb2.GetLeaderRequest(), timeout=2.0, metadata=self.metadata
                )
            except grpc.aio.AioRpcError:
                continue
            if who.HasField("leader") and who.leader.address:
                self.master = Master(who.leader.address, who.leader.epoch)
                log.info(
                    "following the master", extra={"address": self.master.address, "epoch": self.master.epoch}
                )
                return self.master
        return None

    def _link(self, master: Master) -> scheduler_pb2_grpc.SchedulerLinkStub:
        return scheduler_pb2_grpc.SchedulerLinkStub(self.channels.channel(master.address))

    async def _call(self, call: object) -> object:
        try:
            return await call  # type: ignore[misc]
        except grpc.aio.AioRpcError as error:
            if error.code() in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE):
                leader = dict(error.trailing_metadata() or ()).get(LEADER_METADATA_KEY, "")
                raise MasterGone(
                    f"{error.code().name}: {error.details()} (leader {leader or 'unknown'})"
                ) from error
            raise

    async def take_soft_state(self, master: Master) -> None:
        request = scheduler_pb2.GetSoftStateRequest(
            scheduler_id=self.scheduler_id,
            master_epoch=master.epoch,
            since_version=self.copy.feed_since(master.epoch),
        )
        response = await self._call(
            self._link(master).GetSoftState(
                request, timeout=self.settings.call_timeout_s, metadata=self.metadata
            )
        )
        assert isinstance(response, scheduler_pb2.GetSoftStateResponse)
        if response.master_epoch != master.epoch:
            raise MasterGone(f"the master's epoch is {response.master_epoch}, not {master.epoch}")
        self.copy.take_soft(master.epoch, response.version, response.event_time_ms, soft_state_in(response))

    async def propose(self, master: Master, proposal: PlacementProposal, plan: Plan) -> None:
        """Sends the proposal and waits for the master's verdict (:meth:`_settle`)."""
        await self._settle(InFlight.launch(self, master, proposal, plan))

    async def send(self, master: Master, proposal: PlacementProposal, flight: InFlight) -> None:
        """Sends the proposal in ``proposal_max`` batches, noting in ``flight`` how far the log
        holds what the master committed."""
        placements = proposal.placements
        size = self.settings.proposal_max
        batches = [placements[i : i + size] for i in range(0, len(placements), size)] or [()]
        for i, batch in enumerate(batches):
            part = PlacementProposal(
                proposal.scheduler_id,
                proposal.epoch,
                proposal.based_on_seq,
                batch,
                proposal.lava_hosts if i == 0 else None,
            )
            response = await self._call(
                self._link(master).ProposePlacements(
                    proposal_out(part), timeout=self.settings.call_timeout_s, metadata=self.metadata
                )
            )
            assert isinstance(response, scheduler_pb2.ProposePlacementsResponse)
            self.stats.proposed += len(batch)
            self.stats.accepted += response.accepted
            self.stats.stale += len(response.refused)
            self.stats.preempted += response.preempted
            flight.committed_to = max(flight.committed_to, response.log_sequence)
            if response.master_epoch != master.epoch:
                raise MasterGone(f"the master's epoch is {response.master_epoch}, not {master.epoch}")


@dataclass
class InFlight:
    """A proposal the master is judging, sent by a task of its own while the next pass plans."""

    plan: Plan
    keys: frozenset[TaskKey]
    sending: asyncio.Task[None] = field(init=False)
    committed_to: int = 0  # the log position of the master's last answer

    @classmethod
    def launch(
        cls, scheduler: Scheduler, master: Master, proposal: PlacementProposal, plan: Plan
    ) -> InFlight:
        flight = cls(plan, frozenset(SchedulerCopy.placed_by(plan)))
        flight.sending = asyncio.create_task(scheduler.send(master, proposal, flight))
        return flight


async def serve(settings: SchedulerSettings, stop: asyncio.Event, telemetry: Telemetry | None = None) -> None:
    policy = BorgmasterSettings.load()
    await run_until_stopped(Scheduler(settings, policy, telemetry), stop)
