"""Assembles one Autopilot master replica: Redis, Kafka, gRPC server, election, leader work.

:class:`AutopilotMaster` is usable in-process (tests start it, read ``address``, stop it);
:func:`serve` is what ``python -m cellpilot_services.autopilot`` runs. Every replica
serves the API; the one holding the Redis lock also runs the :class:`DecisionLoop`,
which ends (and is restarted by the next election) the moment the lock is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import redis.exceptions

from cellpilot.api.v1 import autopilot_pb2_grpc
from cellpilot.client.async_client import CellpilotClient
from cellpilot.client.failover import RetryPolicy
from cellpilot.platform.grpc_server import GrpcServer, ServiceBinding
from cellpilot.platform.kafka import MessageProducer, ensure_topics
from cellpilot.platform.metrics import CellpilotMetrics
from cellpilot.platform.redis_client import connect_redis
from cellpilot.platform.service import run_until_stopped
from cellpilot.platform.store_outage import REDIS, StoreOutageInterceptor
from cellpilot.platform.telemetry import Telemetry
from cellpilot.platform.topics import TOPICS, Topic
from cellpilot_services.autopilot.decision_loop import DecisionLoop, TermEnded
from cellpilot_services.autopilot.leader_lock import RedisLeaseStore, leader_lock
from cellpilot_services.autopilot.replica import AutopilotReplica
from cellpilot_services.autopilot.servicer import AutopilotServicer
from cellpilot_services.autopilot.settings import AutopilotSettings
from cellpilot_services.autopilot.state_store import StateStore

log = logging.getLogger(__name__)
SERVICE_NAME = "cellpilot.api.v1.Autopilot"
BORGMASTER_POLICY = RetryPolicy(budget_s=10.0, call_timeout_s=5.0)


def topics_for(*names: str) -> list[Topic]:
    known = {t.name: t for t in TOPICS}
    return [known.get(n) or Topic(n, 3, "job id", "autopilot") for n in names]


class AutopilotMaster:
    def __init__(self, settings: AutopilotSettings, metrics: CellpilotMetrics | None = None) -> None:
        self.settings = settings
        self.replica_id = settings.resolved_replica_id
        self.redis = connect_redis(settings.platform.redis_url_for("autopilot"))
        leases = RedisLeaseStore(
            self.redis, settings.redis_prefix, settings.min_token_replicas, settings.token_replica_timeout_s
        )
        self.lock = leader_lock(leases, self.replica_id, "", settings.lock_ttl_s)
        self.store = StateStore(self.redis, settings.redis_prefix, leases.lock_key)
        self.client = CellpilotClient(
            borgmaster=settings.borgmaster_addresses,
            policy=BORGMASTER_POLICY,
            **settings.security.client_options("autopilot"),
        )
        self.access = settings.stream_access()
        self.producer = MessageProducer(self.access, client_id=self.replica_id)
        replica = AutopilotReplica(
            settings, self.store, self.lock, self.client.borgmaster, self.producer, self.access
        )
        self.loop = DecisionLoop(replica, metrics)
        self.servicer = AutopilotServicer(replica)
        self.server = GrpcServer(
            [ServiceBinding(SERVICE_NAME, autopilot_pb2_grpc.add_AutopilotServicer_to_server, self.servicer)],
            address=f"{settings.listen_host}:{settings.resolved_port}",
            **settings.security.server_options(
                "autopilot",
                recommender_owner_lookup=self.servicer.recommender_owner,
                extra_interceptors=[StoreOutageInterceptor(REDIS)],
            ),
        )
        self.address = ""
        self._stop = asyncio.Event()
        self._election: asyncio.Task[None] | None = None
        self._work: asyncio.Task[TermEnded] | None = None

    @property
    def is_leader(self) -> bool:
        return self.lock.holds()

    async def start(self) -> str:
        await ensure_topics(
            self.access,
            topics_for(self.settings.recommendations_topic, self.settings.actuations_topic),
        )
        await self.producer.start()
        await self.servicer.refresh_owners()
        port = await self.server.start()
        self.address = f"{self.settings.advertise_host}:{port}"
        self.lock.address = self.address
        self._election = asyncio.create_task(self._elect())
        log.info("autopilot replica serving", extra={"replica_id": self.replica_id, "address": self.address})
        return self.address

    async def _stop_work(self) -> None:
        if self._work is not None:
            self._work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._work
            self._work = None

    async def _elect(self) -> None:
        while not self._stop.is_set():
            try:
                await self.servicer.refresh_owners()  # who may publish for which recommender
                if self.lock.held is not None:
                    if not await self.lock.renew():
                        log.warning(
                            "lost the Autopilot lock; stepping down", extra={"replica_id": self.replica_id}
                        )
                        await self._stop_work()
                else:
                    leadership = await self.lock.try_acquire()
                    if leadership is not None:
                        log.info(
                            "elected Autopilot master",
                            extra={"replica_id": self.replica_id, "token": leadership.token},
                        )
            except (redis.exceptions.RedisError, OSError) as error:
                log.warning("election step failed", extra={"error": str(error)})
                if not self.lock.holds():
                    self.lock.step_down()
                    await self._stop_work()
            if self.lock.held is not None and (self._work is None or self._work.done()):
                self._report_finished_work()
                leadership = self.lock.held
                self._work = asyncio.create_task(self.loop.run(leadership))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.settings.renew_interval_s)

    def _report_finished_work(self) -> None:
        if self._work is None or not self._work.done() or self._work.cancelled():
            return
        error = self._work.exception()
        if error is not None:
            log.error("decision loop failed; restarting it", exc_info=error)
            return
        log.warning("decision loop stopped: %s", self._work.result().reason)
        self.lock.step_down()

    async def stop(self) -> None:
        self._stop.set()
        if self._election is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._election
        await self._stop_work()
        with contextlib.suppress(redis.exceptions.RedisError, OSError):
            await self.lock.release()
        await self.server.stop(1.0)
        await self.producer.stop()
        await self.client.close()
        await self.redis.aclose()


async def serve(settings: AutopilotSettings, stop: asyncio.Event, telemetry: Telemetry | None = None) -> None:
    await run_until_stopped(
        AutopilotMaster(settings, CellpilotMetrics.on(telemetry.meter) if telemetry else None), stop
    )
