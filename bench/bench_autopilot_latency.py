"""Histogram-to-actuation latency of the running Autopilot (Autopilot §3.1).

On the embedded stack, in one process: a Borgmaster replica, one recommender worker
(``services/recommender``), the elected Autopilot master and the actuator, each with its
own fresh topics and Redis prefixes. ``JOBS`` Autopiloted jobs (CPU and memory ON) get one
5-minute job histogram per resource per round, usage rising 40 % a round so every round's
recommendation moves every job's limits. Latency per job and round: the job's histograms
published on ``usage.histograms`` -> the new CPU limit in the Borgmaster's state (after
UpdateJob was applied through the recommender, the master's decision, ``actuations`` and
the actuator).

* ``pipeline.hist_to_actuation_p50_s`` / ``_p99_s``: over ``JOBS x ROUNDS`` samples.
* Baseline in the same run: ``pipeline.raw_kafka_roundtrip_p50_s``, one record produced and
  consumed on the same broker (the pipeline makes three such hops, plus two gRPC calls);
  ``pipeline.hist_to_actuation_vs_kafka_roundtrip`` is the p50 ratio.

Every gRPC hop runs with mTLS and the security interceptor, as a real stack does (the
stack's certificates; the bench calls the Borgmaster as the admin user).
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
from sqlalchemy import make_url

from bench.harness import Report
from cellpilot.api.v1 import borgmaster_pb2, job_pb2, resources_pb2, usage_pb2
from cellpilot.client.async_client import CellpilotClient
from cellpilot.platform.kafka import MessageProducer, ensure_topics
from cellpilot.platform.kafka_consumers import AssignedConsumer
from cellpilot.platform.postgres import apply_migrations, ensure_database
from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.topics import Topic
from cellpilot.security.identity import ADMIN
from cellpilot.security.tls import SecuritySettings
from cellpilot.stack import Stack, StackConfig, StackEndpoints
from cellpilot.usage.buckets import Resource, default_scheme

FIGURES = [
    "pipeline.hist_to_actuation_p50_s",
    "pipeline.hist_to_actuation_p99_s",
    "pipeline.raw_kafka_roundtrip_p50_s",
    "pipeline.hist_to_actuation_vs_kafka_roundtrip",
]
JOBS = 40
ROUNDS = 5
WINDOW_MS = 300_000
GIB = 1 << 30
T0_MS = 1_700_000_100_000 - (1_700_000_100_000 % WINDOW_MS)


def _histogram(job_id: str, resource: Resource, end_ms: int, usage: float) -> usage_pb2.UsageHistogram:
    """A job histogram of 300 samples at ``usage`` (cores for CPU, bytes for memory)."""
    scheme = default_scheme(resource)
    scheme_id, version = scheme.key()
    index = int(np.asarray(scheme.index_of(np.array([usage])))[0])
    wire = usage * 1000 if resource is Resource.CPU else usage
    return usage_pb2.UsageHistogram(
        job_id=job_id,
        resource=resources_pb2.RESOURCE_CPU if resource is Resource.CPU else resources_pb2.RESOURCE_MEMORY,
        window_start_ms=end_ms - WINDOW_MS,
        window_end_ms=end_ms,
        bucket_scheme_id=scheme_id,
        bucket_scheme_version=version,
        bucket_indices=[index],
        counts=[300],
        peak=wire,
        mean_total_usage=wire,
        sample_count=300,
        task_count=1,
    )


async def _until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out waiting for an elected leader")
        await asyncio.sleep(0.05)


async def _kafka_roundtrip(endpoints: StackEndpoints, samples: int = 50) -> float:
    topic = f"bench.roundtrip.{uuid.uuid4().hex[:8]}"
    await ensure_topics(endpoints.kafka_bootstrap, [Topic(topic, 1, "k", "bench")])
    producer = MessageProducer(endpoints.kafka_bootstrap)
    consumer = AssignedConsumer(endpoints.kafka_bootstrap, [topic])
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


async def _pipeline(endpoints: StackEndpoints, security: SecuritySettings) -> list[float]:
    from cellpilot_services.actuator.actuator_service import Actuator
    from cellpilot_services.actuator.settings import ActuatorSettings
    from cellpilot_services.autopilot.autopilot_service import AutopilotMaster
    from cellpilot_services.autopilot.settings import AutopilotSettings
    from cellpilot_services.borgmaster.borgmaster_service import Borgmaster
    from cellpilot_services.borgmaster.settings import BorgmasterSettings
    from cellpilot_services.recommender.settings import RecommenderSettings
    from cellpilot_services.recommender.worker import RecommenderWorker

    suffix = uuid.uuid4().hex[:8]
    histograms, recommendations, actuations = (f"{t}.{suffix}" for t in ("hist", "recs", "acts"))
    await ensure_topics(
        endpoints.kafka_bootstrap,
        [
            Topic(histograms, 6, "job id", "bench"),
            Topic(recommendations, 6, "job id", "bench"),
            Topic(actuations, 3, "job id", "bench"),
        ],
    )
    url = str(make_url(endpoints.postgres_url).set(database=f"bench_{suffix}"))
    await ensure_database(url)
    await apply_migrations(url)
    platform = PlatformSettings(
        kafka_bootstrap=endpoints.kafka_bootstrap,
        postgres_url=url,
        redis_url=endpoints.redis_url,
        log_json=False,
    )
    bm = Borgmaster(
        BorgmasterSettings(
            platform=platform, security=security, port=0, apply_migrations=False, publish_events=False
        )
    )
    await bm.start()
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
            state_prefix=f"bench:{suffix}:recommender",
        )
    )
    master = AutopilotMaster(
        AutopilotSettings(
            platform=platform,
            security=security,
            metrics_port=0,
            port=0,
            borgmaster_addresses=[bm.address],
            redis_prefix=f"bench:{suffix}:autopilot",
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
            redis_prefix=f"bench:{suffix}:actuator",
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
    producer = MessageProducer(endpoints.kafka_bootstrap)
    latencies: list[float] = []
    try:
        await producer.start()
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
        for i in range(JOBS):
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
        await worker.start()
        await master.start()
        await actuator.start()
        await _until(lambda: master.is_leader)

        def cpu_limit(job_id: str) -> int:
            return int(bm.replica.state.jobs[job_id].spec.task.limits.cpu)

        for round_ in range(ROUNDS):
            end_ms = T0_MS + (round_ + 1) * WINDOW_MS
            cores = 0.2 * 1.4**round_
            before = {j: cpu_limit(j) for j in job_ids}
            sent: dict[str, float] = {}
            for job_id in job_ids:
                for resource, usage in ((Resource.CPU, cores), (Resource.MEMORY, 0.5 * GIB * 1.4**round_)):
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
    finally:
        await producer.stop()
        await actuator.stop()
        await master.stop()
        await worker.stop()
        await client.close()
        await bm.stop()
    return latencies


def run(report: Report) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-autopilot-") as tmp:
        stack = Stack(StackConfig(Path(tmp) / "stack"))
        endpoints = stack.up()
        try:
            roundtrip = asyncio.run(_kafka_roundtrip(endpoints))
            security = SecuritySettings(tls_mode="mtls", certs_dir=stack.config.certs_dir)
            latencies = asyncio.run(_pipeline(endpoints, security))
        finally:
            stack.down()
    p50 = float(np.percentile(latencies, 50))
    p99 = float(np.percentile(latencies, 99))
    where = f"{JOBS} jobs x {ROUNDS} rounds, histogram published -> UpdateJob applied"
    report("pipeline.hist_to_actuation_p50_s", p50, f"s ({where})")
    report("pipeline.hist_to_actuation_p99_s", p99, f"s ({where})")
    report("pipeline.raw_kafka_roundtrip_p50_s", roundtrip, "s (produce -> consume, one record)")
    report("pipeline.hist_to_actuation_vs_kafka_roundtrip", p50 / roundtrip, "x")
