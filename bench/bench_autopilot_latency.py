"""Histogram-to-actuation latency of the running Autopilot (Autopilot §3.1).

On the embedded stack, in one process: a Borgmaster replica, one recommender worker
(``services/recommender``), the elected Autopilot master and the actuator, each with its
own fresh topics and Redis prefixes, each connecting to PostgreSQL and Redis as its own
account (as on a real stack). 40 Autopiloted jobs (CPU and memory ON; at full size) get one
5-minute job histogram per resource per round, usage rising 40 % a round so every round's
recommendation moves every job's limits. Latency per job and round: the job's histograms
published on ``usage.histograms`` -> the new CPU limit in the Borgmaster's state (after
UpdateJob was applied through the recommender, the master's decision, ``actuations`` and
the actuator).

* ``pipeline.hist_to_actuation_p50_s`` / ``_p99_s``: over 40 jobs x 5 rounds of samples.
* Baseline in the same run: ``pipeline.raw_kafka_roundtrip_p50_s``, one record produced and
  consumed on the same broker (the pipeline makes three such hops, plus two gRPC calls);
  ``pipeline.hist_to_actuation_vs_kafka_roundtrip`` is the p50 ratio.

Every gRPC hop runs with mTLS and the security interceptor, as a real stack does (the
stack's certificates; the bench calls the Borgmaster as the admin user); every Kafka record is
signed by its writer and checked by its reader (the bench publishes the histograms as the
aggregator); each service reaches PostgreSQL and Redis as its own account (the database made by
the administrator, the Redis prefixes under each service's own).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from sqlalchemy import make_url

from bench.harness import FULL, SMOKE, Report, embedded_stack, sized
from cellpilot.api.v1 import borgmaster_pb2, job_pb2, resources_pb2, usage_pb2
from cellpilot.client.async_client import CellpilotClient
from cellpilot.platform.kafka import MessageProducer, ensure_topics
from cellpilot.platform.kafka_consumers import AssignedConsumer
from cellpilot.platform.postgres import apply_migrations, ensure_database
from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.stream_access import StreamAccess
from cellpilot.platform.topics import Topic
from cellpilot.security.identity import ADMIN
from cellpilot.security.tls import SecuritySettings
from cellpilot.stack import Stack
from cellpilot.units import GIB
from cellpilot.usage.buckets import Resource, default_scheme

FIGURES = [
    "pipeline.hist_to_actuation_p50_s",
    "pipeline.hist_to_actuation_p99_s",
    "pipeline.raw_kafka_roundtrip_p50_s",
    "pipeline.hist_to_actuation_vs_kafka_roundtrip",
]


@dataclass(frozen=True)
class Size:
    jobs: int
    rounds: int
    roundtrips: int  # samples of the raw Kafka round trip


SIZES = {FULL: Size(jobs=40, rounds=5, roundtrips=50), SMOKE: Size(jobs=4, rounds=2, roundtrips=5)}
WINDOW_MS = 300_000
T0_MS = 1_700_000_100_000 - (1_700_000_100_000 % WINDOW_MS)


def _histogram(job_id: str, resource: Resource, end_ms: int, usage: float) -> usage_pb2.UsageHistogram:
    """A job histogram of 300 samples at ``usage`` (millicores for CPU, bytes for memory: the
    units of the wire and of the bucket schemes)."""
    scheme = default_scheme(resource)
    scheme_id, version = scheme.key()
    index = int(np.asarray(scheme.index_of(np.array([usage])))[0])
    return usage_pb2.UsageHistogram(
        job_id=job_id,
        resource=resources_pb2.RESOURCE_CPU if resource is Resource.CPU else resources_pb2.RESOURCE_MEMORY,
        window_start_ms=end_ms - WINDOW_MS,
        window_end_ms=end_ms,
        bucket_scheme_id=scheme_id,
        bucket_scheme_version=version,
        bucket_indices=[index],
        counts=[300],
        peak=usage,
        mean_total_usage=usage,
        sample_count=300,
        task_count=1,
    )


async def _until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out waiting for an elected leader")
        await asyncio.sleep(0.05)


def _as_aggregator(stack: Stack) -> StreamAccess:
    """Writes histograms as the aggregator does (signed with its key), checks what it reads."""
    return StreamAccess.service(stack.endpoints.kafka_bootstrap, stack.config.certs_dir, "aggregator")


async def _kafka_roundtrip(stack: Stack, samples: int) -> float:
    """One signed record produced and consumed (checked) on the same broker: one hop."""
    topic = f"usage.histograms.roundtrip-{uuid.uuid4().hex[:8]}"
    await ensure_topics(stack.endpoints.kafka_bootstrap, [Topic(topic, 1, "k", "bench")])
    producer = MessageProducer(_as_aggregator(stack))
    consumer = AssignedConsumer(_as_aggregator(stack), [topic])
    await producer.start()
    await consumer.start()
    times = []
    try:
        batches = consumer.batches(timeout_ms=20)
        for i in range(samples):
            start = time.perf_counter()
            await producer.send(topic, "k", usage_pb2.UsageHistogram(job_id=f"j{i}"))
            while not await anext(batches):
                pass
            times.append(time.perf_counter() - start)
    finally:
        await producer.stop()
        await consumer.stop()
    return statistics.median(times)


async def _pipeline(stack: Stack, security: SecuritySettings, size: Size) -> list[float]:
    from cellpilot_services.actuator.actuator_service import Actuator
    from cellpilot_services.actuator.settings import ActuatorSettings
    from cellpilot_services.autopilot.autopilot_service import AutopilotMaster
    from cellpilot_services.autopilot.settings import AutopilotSettings
    from cellpilot_services.borgmaster.borgmaster_service import Borgmaster
    from cellpilot_services.borgmaster.settings import BorgmasterSettings
    from cellpilot_services.recommender.settings import RecommenderSettings
    from cellpilot_services.recommender.worker import RecommenderWorker

    endpoints = stack.endpoints  # what services read: no user, each connects as its own account
    suffix = uuid.uuid4().hex[:8]
    histograms, recommendations, actuations = (
        f"{t}.{suffix}" for t in ("usage.histograms", "recommendations", "actuations")
    )
    await ensure_topics(
        endpoints.kafka_bootstrap,
        [
            Topic(histograms, 6, "job id", "bench"),
            Topic(recommendations, 6, "job id", "bench"),
            Topic(actuations, 3, "job id", "bench"),
        ],
    )
    # The database is made and migrated by the administrator (as ``cellpilot stack up`` does).
    database = f"bench_{suffix}"
    admin_url = str(make_url(stack.admin_endpoints.postgres_url).set(database=database))
    await ensure_database(admin_url)
    await apply_migrations(admin_url)
    platform = PlatformSettings(
        kafka_bootstrap=endpoints.kafka_bootstrap,
        postgres_url=str(make_url(endpoints.postgres_url).set(database=database)),
        redis_url=endpoints.redis_url,
        certs_dir=stack.config.certs_dir,
        log_json=False,
    )
    # Each service's Redis account may touch only its own prefix (cellpilot.platform.store_accounts).
    redis_prefix = {
        service: f"cellpilot:{service}:bench-{suffix}" for service in ("recommender", "autopilot", "actuator")
    }
    bm = Borgmaster(
        BorgmasterSettings(
            platform=platform, security=security, port=0, apply_migrations=False, publish_events=False
        )
    )
    latencies: list[float] = []
    # Whatever started is stopped on the way out, in reverse order, also when a step failed.
    async with contextlib.AsyncExitStack() as running:
        await bm.start()
        running.push_async_callback(bm.stop)
        await _until(lambda: bm.replica.is_leader)
        worker = RecommenderWorker(
            RecommenderSettings(
                platform=platform,
                security=security,
                port=0,
                metrics_port=0,
                histograms_topic=histograms,
                recommendations_topic=recommendations,
                events_topic="",
                consumer_group=f"bench-{suffix}",
                state_prefix=redis_prefix["recommender"],
            )
        )
        master = AutopilotMaster(
            AutopilotSettings(
                platform=platform,
                security=security,
                metrics_port=0,
                port=0,
                borgmaster_addresses=[bm.address],
                redis_prefix=redis_prefix["autopilot"],
                recommendations_topic=recommendations,
                actuations_topic=actuations,
                hold_grace_s=600,
            )
        )
        actuator = Actuator(
            ActuatorSettings(
                platform=platform,
                security=security,
                metrics_port=0,
                port=0,
                borgmaster_addresses=[bm.address],
                redis_prefix=redis_prefix["actuator"],
                actuations_topic=actuations,
                per_job_rate_per_s=10.0,
            )
        )
        signer = security.token_signer()
        assert signer is not None, "the stack issued no token secret"
        client = CellpilotClient(
            borgmaster=[bm.address],
            credentials=security.channel_credentials(),
            token=signer.issue_for("root", capabilities=[ADMIN], ttl_s=3600),
        )
        running.push_async_callback(client.close)
        producer = MessageProducer(_as_aggregator(stack))
        await producer.start()
        running.push_async_callback(producer.stop)
        for band in (job_pb2.PRIORITY_BAND_PRODUCTION, job_pb2.PRIORITY_BAND_BATCH):
            await client.borgmaster.set_quota(
                borgmaster_pb2.SetQuotaRequest(
                    user="bench",
                    band=band,
                    limit=resources_pb2.Resources(
                        cpu_millicores=10**9, memory_bytes=1 << 50, disk_bytes=1 << 50, ports=10**6
                    ),
                )
            )
        job_ids = []
        for i in range(size.jobs):
            spec = job_pb2.JobSpec(
                name=f"job-{i}",
                user="bench",
                priority=9,
                app_class=job_pb2.APP_CLASS_LATENCY_SENSITIVE,
                task_count=1,
                task=job_pb2.TaskSpec(
                    limits=resources_pb2.Resources(cpu_millicores=100, memory_bytes=GIB // 4),
                    runtime=job_pb2.RuntimeSpec(simulated=job_pb2.SimulatedRuntime(usage_model="steady")),
                ),
            )
            spec.autopilot.cpu.mode = job_pb2.SCALING_MODE_ON
            spec.autopilot.memory.mode = job_pb2.SCALING_MODE_ON
            job_ids.append((await client.borgmaster.submit_job(spec)).job_id)
        for service in (worker, master, actuator):
            await service.start()
            running.push_async_callback(service.stop)
        await _until(lambda: master.is_leader)

        def cpu_limit(job_id: str) -> int:
            return int(bm.replica.state.jobs[job_id].spec.task.limits.cpu)

        for round_ in range(size.rounds):
            end_ms = T0_MS + (round_ + 1) * WINDOW_MS
            millicores = 200 * 1.4**round_
            before = {j: cpu_limit(j) for j in job_ids}
            sent: dict[str, float] = {}
            for job_id in job_ids:
                for resource, usage in (
                    (Resource.CPU, millicores),
                    (Resource.MEMORY, 0.5 * GIB * 1.4**round_),
                ):
                    await producer.send(histograms, job_id, _histogram(job_id, resource, end_ms, usage))
                sent[job_id] = time.perf_counter()
            deadline = time.perf_counter() + 60
            waiting = set(job_ids)
            while waiting and time.perf_counter() < deadline:
                now = time.perf_counter()
                for job_id in list(waiting):
                    if cpu_limit(job_id) != before[job_id]:
                        latencies.append(now - sent[job_id])
                        waiting.discard(job_id)
                await asyncio.sleep(0.005)
            if waiting:
                raise RuntimeError(f"round {round_}: {len(waiting)} jobs never actuated")
            await asyncio.sleep(0.5)  # let stragglers (memory-only changes) settle
    return latencies


def run(report: Report, size: str = FULL) -> None:
    params = sized(SIZES, size)
    with embedded_stack("bench-autopilot-") as (stack, _):
        roundtrip = asyncio.run(_kafka_roundtrip(stack, params.roundtrips))
        security = SecuritySettings(tls_mode="mtls", certs_dir=stack.config.certs_dir)
        latencies = asyncio.run(_pipeline(stack, security, params))
    p50 = float(np.percentile(latencies, 50))
    p99 = float(np.percentile(latencies, 99))
    where = f"{params.jobs} jobs x {params.rounds} rounds, histogram published -> UpdateJob applied"
    report("pipeline.hist_to_actuation_p50_s", p50, f"s ({where})")
    report("pipeline.hist_to_actuation_p99_s", p99, f"s ({where})")
    report("pipeline.raw_kafka_roundtrip_p50_s", roundtrip, "s (produce -> consume, one record)")
    report("pipeline.hist_to_actuation_vs_kafka_roundtrip", p50 / roundtrip, "x")
