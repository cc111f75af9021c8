"""Builders for the Autopilot master and actuator integration tests on the embedded stack.

A Borgmaster replica and (optionally) a Borglet fleet run in-process; Autopilot master
replicas run in-process or as ``python -m cellpilot_services.autopilot`` processes (so one
can be SIGKILLed); every test gets its own topics and Redis key prefixes. Event time is
the recommendations' ``window_end_ms``: a test steps it by 5-minute windows as fast as the
services keep up.

Security is on, as in a real cell: the services read the stack's certificates from
``CELLPILOT_CERTS_DIR`` (exported by tests/integration/conftest.py) and talk mTLS; tests
call as a user (``api_client``; the admin ``root`` by default) through :mod:`stack_security`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from cell_scheduler import scheduler
from stack_security import ADMIN_USER, client_options
from stream_writers import StreamWriter, observer

from cellpilot.api.v1 import (
    actuation_pb2,
    borgmaster_pb2,
    job_pb2,
    recommendation_pb2,
    resources_pb2,
    state_pb2,
)
from cellpilot.client.async_client import CellpilotClient
from cellpilot.platform.kafka import Record, ensure_topics
from cellpilot.platform.kafka_consumers import MessageConsumer
from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.topics import Topic
from cellpilot.stack import StackEndpoints
from cellpilot.stack.config import free_port
from cellpilot_services.actuator.actuator_service import Actuator
from cellpilot_services.actuator.settings import ActuatorSettings
from cellpilot_services.autopilot.autopilot_service import AutopilotMaster
from cellpilot_services.autopilot.settings import AutopilotSettings
from cellpilot_services.borgmaster.borgmaster_service import Borgmaster
from cellpilot_services.borgmaster.settings import BorgmasterSettings

T = TypeVar("T")
GIB = 1 << 30
WINDOW_MS = 300_000
T0_MS = 1_700_000_000_000 - (1_700_000_000_000 % WINDOW_MS)
LOG_DIR = Path(__file__).resolve().parents[3] / "test-artifacts" / "autopilot-master-logs"
BORGMASTER_FAST = {
    "lease_s": 1.5,
    "renew_interval_s": 0.4,
    "election_interval_s": 0.25,
    "tail_interval_s": 0.1,
    "schedule_interval_s": 0.1,
    "poll_interval_s": 0.3,
    "poll_timeout_s": 0.5,
}
KIND = job_pb2.RecommenderKind


async def eventually(check: Callable[[], Awaitable[T | None]], within: float = 15.0, what: str = "") -> T:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what or check}")
        await asyncio.sleep(0.05)


class Scenario:
    """One test's names: topics, Redis prefixes, user."""

    def __init__(self, endpoints: StackEndpoints) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.endpoints = endpoints
        self.user = f"ap{suffix[:6]}"
        self.recommendations = f"recommendations.{suffix}"
        self.actuations = f"actuations.{suffix}"
        self.autopilot_prefix = f"test:{suffix}:autopilot"
        self.actuator_prefix = f"test:{suffix}:actuator"

    async def create_topics(self) -> None:
        await ensure_topics(
            self.endpoints.kafka_bootstrap,
            [Topic(self.recommendations, 3, "job id", "test"), Topic(self.actuations, 3, "job id", "test")],
        )

    def platform(self, database_url: str = "") -> PlatformSettings:
        e = self.endpoints
        return PlatformSettings(
            kafka_bootstrap=e.kafka_bootstrap,
            postgres_url=database_url or e.postgres_url,
            redis_url=e.redis_url,
            log_json=False,
        )

    def autopilot_settings(
        self, borgmaster: list[str], index: int = 0, **overrides: Any
    ) -> AutopilotSettings:
        values: dict[str, Any] = {
            "platform": self.platform(),
            "replica_index": index,
            "port": 0,
            "borgmaster_addresses": borgmaster,
            "redis_prefix": self.autopilot_prefix,
            "recommendations_topic": self.recommendations,
            "actuations_topic": self.actuations,
            "lock_ttl_s": 1.5,
            "renew_interval_s": 0.3,
            "hold_scan_interval_s": 0.3,
            "hold_grace_s": 600.0,
            **overrides,
        }
        return AutopilotSettings(**values)

    def actuator_settings(self, borgmaster: list[str], **overrides: Any) -> ActuatorSettings:
        values: dict[str, Any] = {
            "platform": self.platform(),
            "port": 0,
            "borgmaster_addresses": borgmaster,
            "redis_prefix": self.actuator_prefix,
            "actuations_topic": self.actuations,
            "per_job_rate_per_s": 50.0,
            "per_job_burst": 10.0,
            "initial_backoff_s": 0.1,
            "call_budget_s": 2.0,
            **overrides,
        }
        return ActuatorSettings(**values)


@asynccontextmanager
async def borgmaster(database_url: str, scenario: Scenario, port: int = 0) -> AsyncIterator[Borgmaster]:
    settings = BorgmasterSettings(
        platform=scenario.platform(database_url),
        port=port,
        apply_migrations=False,
        publish_events=False,
        **BORGMASTER_FAST,  # type: ignore[arg-type]
    )
    master = Borgmaster(settings)
    await master.start()
    try:
        await eventually(lambda: _true(master.replica.is_leader), 15, "the Borgmaster elected")
        async with scheduler([master.address], settings):
            yield master
    finally:
        await master.stop()


async def _true(value: bool) -> bool:
    return value


@asynccontextmanager
async def autopilot(settings: AutopilotSettings) -> AsyncIterator[AutopilotMaster]:
    master = AutopilotMaster(settings)
    await master.start()
    try:
        yield master
    finally:
        await master.stop()


@asynccontextmanager
async def actuator(settings: ActuatorSettings) -> AsyncIterator[Actuator]:
    service = Actuator(settings)
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


def api_client(
    borgmaster: list[str] | None = None, autopilot: list[str] | None = None, user: str = ADMIN_USER
) -> CellpilotClient:
    """A client acting as ``user`` (mTLS with the ``client`` certificate plus a bearer token)."""
    return CellpilotClient(
        borgmaster=borgmaster or ["127.0.0.1:1"],
        autopilot=autopilot or ["127.0.0.1:1"],
        **client_options(user),
    )


async def grant(client: CellpilotClient, user: str) -> None:
    for band in (job_pb2.PRIORITY_BAND_PRODUCTION, job_pb2.PRIORITY_BAND_BATCH):
        await client.borgmaster.set_quota(
            borgmaster_pb2.SetQuotaRequest(
                user=user,
                band=band,
                limit=resources_pb2.Resources(
                    cpu_millicores=1_000_000, memory_bytes=1 << 44, disk_bytes=1 << 50, ports=100_000
                ),
            )
        )


def job_spec(
    name: str,
    user: str,
    *,
    cpu_mode: int = job_pb2.SCALING_MODE_OFF,
    memory_mode: int = job_pb2.SCALING_MODE_OFF,
    tasks: int = 1,
    cpu: int = 500,
    memory: int = GIB,
    horizontal: job_pb2.HorizontalScalingConfig | None = None,
) -> job_pb2.JobSpec:
    spec = job_pb2.JobSpec(
        name=name,
        user=user,
        priority=9,
        app_class=job_pb2.APP_CLASS_LATENCY_SENSITIVE,
        task_count=tasks,
        task=job_pb2.TaskSpec(
            limits=resources_pb2.Resources(cpu_millicores=cpu, memory_bytes=memory),
            runtime=job_pb2.RuntimeSpec(simulated=job_pb2.SimulatedRuntime(usage_model="steady")),
        ),
    )
    spec.autopilot.cpu.mode = cpu_mode  # type: ignore[assignment]
    spec.autopilot.memory.mode = memory_mode  # type: ignore[assignment]
    if horizontal is not None:
        spec.autopilot.horizontal.CopyFrom(horizontal)
    return spec


def window(i: int) -> int:
    return T0_MS + (i + 1) * WINDOW_MS


def vertical_set(job_id: str, end_ms: int, cpu: int, memory: int) -> recommendation_pb2.RecommendationSet:
    """Every built-in recommender's output, as a worker publishes it (values in the unit)."""
    rs = recommendation_pb2.RecommendationSet(job_id=job_id, window_end_ms=end_ms, producer="test")
    kinds = {
        KIND.RECOMMENDER_KIND_MOVING_WINDOW_MAX: 1.3,
        KIND.RECOMMENDER_KIND_MOVING_WINDOW_AVG: 0.7,
        KIND.RECOMMENDER_KIND_MOVING_WINDOW_P90: 0.95,
        KIND.RECOMMENDER_KIND_MOVING_WINDOW_P95: 1.0,
        KIND.RECOMMENDER_KIND_MOVING_WINDOW_P98: 1.1,
        KIND.RECOMMENDER_KIND_MOVING_WINDOW_P60_HALF_MAX: 0.8,
        KIND.RECOMMENDER_KIND_ML: 1.05,
    }
    for resource, base in ((resources_pb2.RESOURCE_CPU, cpu), (resources_pb2.RESOURCE_MEMORY, memory)):
        for kind, factor in kinds.items():
            value = int(base * factor)
            rs.vertical.add(
                recommendation_id=f"{job_id}/{resource}/{kind}/{end_ms}",
                job_id=job_id,
                resource=resource,
                recommender=job_pb2.RecommenderRef(kind=kind),
                value=value,
                raw_value=int(value / 1.1),
                margin=value - int(value / 1.1),
                explanation=recommendation_pb2.Explanation(
                    statistic=job_pb2.RecommenderKind.Name(kind),
                    clamped_by=recommendation_pb2.CLAMP_REASON_NONE,
                ),
                window_end_ms=end_ms,
            )
    return rs


def horizontal_set(job_id: str, end_ms: int, usage_millicores: float) -> recommendation_pb2.RecommendationSet:
    rs = recommendation_pb2.RecommendationSet(job_id=job_id, window_end_ms=end_ms, producer="test")
    rs.horizontal.add(
        recommendation_id=f"{job_id}/tasks/cpu/{end_ms}",
        job_id=job_id,
        recommender=job_pb2.RecommenderRef(kind=KIND.RECOMMENDER_KIND_AUTO),
        usage_statistic=usage_millicores,
        window_end_ms=end_ms,
    )
    return rs


class Publisher:
    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        # Each topic as the service the producer table allows on it.
        self.producer = StreamWriter(scenario.endpoints.kafka_bootstrap)

    async def __aenter__(self) -> Publisher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.producer.stop()

    async def recommendations(self, rs: recommendation_pb2.RecommendationSet) -> None:
        await self.producer.send(self.scenario.recommendations, rs.job_id, rs)

    async def actuation(self, actuation: actuation_pb2.Actuation) -> None:
        await self.producer.send(self.scenario.actuations, actuation.job_id, actuation)


class TopicReader:
    """Reads a topic in the background (a throw-away group), decoding every record."""

    def __init__(self, bootstrap: str, topic: str, message_type: type[Any]) -> None:
        self.consumer = MessageConsumer(
            observer(bootstrap), [topic], group_id=f"reader-{uuid.uuid4().hex[:8]}"
        )
        self.message_type = message_type
        self.messages: list[Any] = []
        self.records: list[Record] = []  # the raw records, for partition and offset order
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> TopicReader:
        await self.consumer.start()
        self._task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        async for batch in self.consumer.batches(timeout_ms=100):
            self.records.extend(batch)
            self.messages.extend(r.decode(self.message_type) for r in batch)

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
        await self.consumer.stop()

    def for_job(self, job_id: str) -> list[Any]:
        return [m for m in self.messages if m.job_id == job_id]


async def job_status(client: CellpilotClient, job_id: str, tasks: bool = False) -> state_pb2.JobStatus:
    return (await client.borgmaster.get_job(job_id, include_tasks=tasks)).job


class AutopilotProcess:
    """``python -m cellpilot_services.autopilot`` with the test's settings, killable."""

    def __init__(self, scenario: Scenario, borgmaster: list[str], index: int) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.index = index
        self.replica_id = f"autopilot-{index}"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log_path = LOG_DIR / f"autopilot-{index}-{uuid.uuid4().hex[:6]}.log"
        env = {
            **os.environ,
            **scenario.endpoints.as_env(),
            "CELLPILOT_STACK_ENV": "/nonexistent",
            "CELLPILOT_LOG_JSON": "false",
            "CELLPILOT_REPLICA_INDEX": str(index),
            "CELLPILOT_AUTOPILOT_PORT": str(self.port),
            "CELLPILOT_AUTOPILOT_METRICS_PORT": "0",
            "CELLPILOT_AUTOPILOT_BORGMASTER_ADDRESSES": ",".join(borgmaster),
            "CELLPILOT_AUTOPILOT_REDIS_PREFIX": scenario.autopilot_prefix,
            "CELLPILOT_AUTOPILOT_RECOMMENDATIONS_TOPIC": scenario.recommendations,
            "CELLPILOT_AUTOPILOT_ACTUATIONS_TOPIC": scenario.actuations,
            "CELLPILOT_AUTOPILOT_LOCK_TTL_S": "1.5",
            "CELLPILOT_AUTOPILOT_RENEW_INTERVAL_S": "0.3",
            "CELLPILOT_AUTOPILOT_HOLD_GRACE_S": "600",
        }
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cellpilot_services.autopilot"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


@asynccontextmanager
async def borglets(scenario: Scenario, masters: list[str], machines: int = 1) -> AsyncIterator[Any]:
    """An in-process Borglet fleet (simulated tasks, no samples published) for ``masters``."""
    from cellpilot_services.borglet.borglet_service import Borglet
    from cellpilot_services.borglet.settings import BorgletSettings

    agent = Borglet(
        BorgletSettings(
            platform=scenario.platform(),
            machine_id_prefix=f"m-{uuid.uuid4().hex[:6]}",
            fleet_size=machines,
            borgmaster_addresses=masters,
            publish_samples=False,
            cgroup_root="none",
            cpu_millicores=64_000,
            memory_bytes=256 * GIB,
        )
    )
    await agent.start()
    try:
        yield agent
    finally:
        await agent.stop()
