"""Assembles one Borgmaster replica: database, state, gRPC server, election and leader work.

:class:`Borgmaster` is usable in-process (tests start it, read ``address``, and stop it);
:func:`serve` is what ``python -m cellpilot_services.borgmaster`` runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from cellpilot.api.v1 import borgmaster_pb2_grpc, link_shard_pb2_grpc, scheduler_pb2_grpc
from cellpilot.borg.master_core import Tick
from cellpilot.checkpoint_store import PostgresCheckpointStore
from cellpilot.platform.grpc_server import GrpcServer, ServiceBinding
from cellpilot.platform.postgres import apply_migrations
from cellpilot.platform.service import run_until_stopped
from cellpilot.platform.telemetry import Telemetry
from cellpilot.security.policy import JobFacts
from cellpilot_services.borgmaster.borglet_poller import BorgletPoller
from cellpilot_services.borgmaster.event_publisher import EventPublisher
from cellpilot_services.borgmaster.lifetime_keeper import LifetimeKeeper
from cellpilot_services.borgmaster.link_shard import LinkShard
from cellpilot_services.borgmaster.link_shard_master import LinkShardsServicer, ShardRegistry
from cellpilot_services.borgmaster.master_metrics import export_master_metrics
from cellpilot_services.borgmaster.replica import LeaderWork, Replica
from cellpilot_services.borgmaster.scheduler_link import SchedulerLinkServicer
from cellpilot_services.borgmaster.servicer import BorgmasterServicer
from cellpilot_services.borgmaster.settings import BorgmasterSettings

log = logging.getLogger(__name__)
SERVICE_NAME = "cellpilot.api.v1.Borgmaster"
LINK_SHARDS_SERVICE_NAME = "cellpilot.api.v1.LinkShards"
SCHEDULER_LINK_SERVICE_NAME = "cellpilot.api.v1.SchedulerLink"


async def tick_loop(replica: Replica, interval_s: float) -> None:
    """Leader work: rolling updates and drains continue (the core's :class:`Tick`) every
    ``interval_s``, sooner after the log moved, while any job rolls or machine drains."""
    wake = asyncio.Event()
    replica.listeners.append(lambda _seq, changes: wake.set() if changes else None)
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=interval_s)
        wake.clear()
        await asyncio.sleep(0.02)  # let a burst of records land first
        state = replica.state
        if state.rolling or any(m.draining for m in state.machines.values()):
            await replica.submit(Tick(f"rollout-{state.last_sequence}"))


class Borgmaster:
    def __init__(self, settings: BorgmasterSettings, telemetry: Telemetry | None = None) -> None:
        self.settings = settings
        self.store = PostgresCheckpointStore.connect(settings.platform.postgres_url_for("borgmaster"))
        self.replica = Replica(settings, self.store, address="")
        self.lifetimes = LifetimeKeeper(self.replica, settings)
        # Link shards (Borg §3.3): every replica polls its share and the master takes the
        # differences; without them the master polls every machine itself.
        self.registry = ShardRegistry(self.replica)
        self.link_shard: LinkShard | None = None
        work: list[LeaderWork] = [
            self.replica.snapshot_loop,
            lambda: tick_loop(self.replica, settings.schedule_interval_s),
        ]
        if settings.link_shards:
            self.link_shard = LinkShard(self.replica, settings, self.registry)
            self.poller = self.link_shard.poller
        else:
            self.poller = BorgletPoller(self.replica, settings)
            work.append(self.poller.run)
        self.publisher: EventPublisher | None = None
        if settings.publish_events:
            self.publisher = EventPublisher(
                self.replica,
                self.store.engine,
                settings.stream_access(),
                settings.events_topic,
                settings.platform.log_check_interval_s,
            )
            work.append(self.publisher.run)
        self.replica.leader_work = work
        self.server = GrpcServer(
            [
                ServiceBinding(
                    SERVICE_NAME,
                    borgmaster_pb2_grpc.add_BorgmasterServicer_to_server,
                    BorgmasterServicer(self.replica, self.lifetimes),
                ),
                ServiceBinding(
                    LINK_SHARDS_SERVICE_NAME,
                    link_shard_pb2_grpc.add_LinkShardsServicer_to_server,
                    LinkShardsServicer(self.replica, self.registry),
                ),
                ServiceBinding(
                    SCHEDULER_LINK_SERVICE_NAME,
                    scheduler_pb2_grpc.add_SchedulerLinkServicer_to_server,
                    SchedulerLinkServicer(self.replica),
                ),
            ],
            address=f"{settings.listen_host}:{settings.resolved_port}",
            **settings.security.server_options("borgmaster", job_owner_lookup=self.job_facts),
        )
        if telemetry is not None:
            export_master_metrics(telemetry.meter, self.replica)
        self.address = ""
        self._stop = asyncio.Event()
        self._election: asyncio.Task[None] | None = None
        self._shard: asyncio.Task[None] | None = None

    def job_facts(self, job_id: str) -> JobFacts | None:
        """Owner and Autopilot modes of a stored job, for authorising calls on it (Borg §2.5)."""
        record = self.replica.state.job(job_id)
        return JobFacts.from_core(record.spec) if record is not None else None

    async def start(self) -> str:
        if self.settings.apply_migrations:
            await apply_migrations(self.settings.platform.postgres_url_for("borgmaster"))
        port = await self.server.start()
        self.address = f"{self.settings.advertise_host}:{port}"
        self.replica.address = self.address
        self.replica.lease.address = self.address
        await self.replica.load()
        self._election = asyncio.create_task(self.replica.run(self._stop))
        if self.link_shard is not None:
            self._shard = asyncio.create_task(self.link_shard.run(self._stop))
        log.info(
            "borgmaster replica serving",
            extra={"replica_id": self.replica.replica_id, "address": self.address},
        )
        return self.address

    async def stop(self) -> None:
        self._stop.set()
        if self._election is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._election
        if self._shard is not None:
            self._shard.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._shard
        await self.replica.shutdown()
        await self.server.stop(1.0)
        await self.store.close()


async def serve(
    settings: BorgmasterSettings, stop: asyncio.Event, telemetry: Telemetry | None = None
) -> None:
    await run_until_stopped(Borgmaster(settings, telemetry), stop)
