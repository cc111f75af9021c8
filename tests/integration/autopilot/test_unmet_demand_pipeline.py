"""Unmet CPU demand end to end: a Borglet machine with too little CPU for its tasks -> usage samples
(every sample carries its unmet demand) -> the aggregator -> job histograms on Kafka and in
PostgreSQL -> the Monitoring API (job histograms and a task's usage windows).

One 2-core machine runs a latency-sensitive job whose demand of 3 cores is shared by its two
ready tasks (1-core limits) and a batch task wanting 1.5 cores (a 1-core limit). The machine
serves the LS tasks up to their limits first and has nothing left for batch (Borg §6.2), so per
full window: the LS job used 2 cores and left 1 unmet, the batch job used none and left 1.5.
"""

from __future__ import annotations

import uuid
from contextlib import AsyncExitStack

import pytest
from autopilot_processes import read_all, wait_for
from stack_security import service_channel, user_channel

from cellpilot.api.v1 import (
    borglet_pb2,
    borglet_pb2_grpc,
    job_pb2,
    monitoring_pb2,
    monitoring_pb2_grpc,
    resources_pb2,
    usage_pb2,
)
from cellpilot.platform.kafka import ensure_topics
from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.topics import Topic
from cellpilot.stack import StackEndpoints

GIB = 1 << 30
PARTITIONS = 2
QUIET = {"cpu_noise": 0.0, "memory_noise": 0.0}


def _task(
    job_id: str, index: int, app_class: int, runtime: job_pb2.SimulatedRuntime
) -> borglet_pb2.TaskAssignment:
    return borglet_pb2.TaskAssignment(
        job_id=job_id,
        task_index=index,
        incarnation=1,
        priority=9 if app_class == job_pb2.APP_CLASS_LATENCY_SENSITIVE else 2,
        app_class=app_class,  # type: ignore[arg-type]
        spec_version=1,
        spec=job_pb2.TaskSpec(
            limits=resources_pb2.Resources(cpu_millicores=1000, memory_bytes=GIB),
            runtime=job_pb2.RuntimeSpec(simulated=runtime),
        ),
    )


async def test_unmet_demand_flows_from_the_borglet_to_histograms_and_the_monitoring_api(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    from cellpilot_services.aggregator.aggregator_service import Aggregator
    from cellpilot_services.aggregator.settings import AggregatorSettings
    from cellpilot_services.borglet.borglet_service import Borglet
    from cellpilot_services.borglet.settings import BorgletSettings

    suffix = uuid.uuid4().hex[:8]
    samples, histograms = f"usage.samples.{suffix}", f"usage.histograms.{suffix}"
    await ensure_topics(
        endpoints.kafka_bootstrap,
        [Topic(samples, PARTITIONS, "machine id", "test"), Topic(histograms, PARTITIONS, "job id", "test")],
    )
    platform = PlatformSettings(
        kafka_bootstrap=endpoints.kafka_bootstrap,
        postgres_url=fresh_database_url,
        redis_url=endpoints.redis_url,
        log_json=False,
    )
    borglet = Borglet(
        BorgletSettings(
            platform=platform,
            machine_id_prefix=f"unmet-{suffix[:6]}",
            fleet_size=1,
            cgroup_root="none",
            cpu_millicores=2_000,
            memory_bytes=64 * GIB,
            speedup=300.0,  # one 5-minute window per wall second
            publish_interval_s=0.2,
        )
    )
    assert borglet.publisher is not None
    borglet.publisher.topic = samples
    aggregator = Aggregator(
        AggregatorSettings(
            platform=platform,
            port=0,
            metrics_port=0,
            apply_migrations=False,
            samples_topic=samples,
            sample_partitions=PARTITIONS,
            histograms_topic=histograms,
            consumer_group=f"aggregator-{suffix}",
            checkpoint_interval_s=1.0,
            idle_after_s=1.0,
            job_stage_interval_s=0.2,
        )
    )
    shared = job_pb2.SimulatedRuntime(
        usage_model="steady",
        params={"cpu_millicores": 0.0, "memory_bytes": 100e6, **QUIET},
        seed=5,
        demand=job_pb2.SharedDemand(usage_model="steady", params={"cpu_millicores": 3000.0, **QUIET}),
    )
    batch = job_pb2.SimulatedRuntime(usage_model="steady", params={"cpu_millicores": 1500.0, **QUIET})
    async with AsyncExitStack() as stack:
        for service in (aggregator, borglet):
            await service.start()
            stack.push_async_callback(service.stop)
        machine = borglet.profiles[0].machine_id
        channel = await stack.enter_async_context(service_channel(f"127.0.0.1:{borglet.port}", "borgmaster"))
        stub = borglet_pb2_grpc.BorgletStub(channel)
        all_started_ms = 0
        for task in (
            _task("u/front", 0, job_pb2.APP_CLASS_LATENCY_SENSITIVE, shared),
            _task("u/front", 1, job_pb2.APP_CLASS_LATENCY_SENSITIVE, shared),
            _task("u/crunch", 0, job_pb2.APP_CLASS_BATCH, batch),
        ):
            reply = await stub.StartTask(
                borglet_pb2.StartTaskRequest(master_epoch=1, machine_id=machine, task=task)
            )
            all_started_ms = max(all_started_ms, reply.task.started_ms)

        address = f"127.0.0.1:{aggregator.port}"
        monitoring = monitoring_pb2_grpc.MonitoringStub(
            await stack.enter_async_context(user_channel(address))
        )

        async def full_windows(job_id: str, tasks: int) -> list[usage_pb2.UsageHistogram]:
            reply = await monitoring.GetHistogramHistory(
                monitoring_pb2.GetHistogramHistoryRequest(job_id=job_id, resource=resources_pb2.RESOURCE_CPU)
            )
            return [
                h
                for h in reply.histograms
                if h.sample_count == 300 * tasks and h.window_start_ms >= all_started_ms
            ]

        front = await wait_for(lambda: full_windows("u/front", 2), 60, "full windows of the LS job")
        crunch = await wait_for(lambda: full_windows("u/crunch", 1), 60, "full windows of the batch job")
        for h in front:
            assert h.mean_total_usage == pytest.approx(2000.0)  # both at their 1-core limits
            assert h.mean_total_unmet == pytest.approx(1000.0)  # 1.5 cores each asked
            assert h.throttled_sample_count == h.sample_count
        for h in crunch:
            assert h.mean_total_usage == pytest.approx(0.0)  # LS first: nothing left for batch
            assert h.mean_total_unmet == pytest.approx(1500.0)
        windows = await monitoring.GetTaskUsage(
            monitoring_pb2.GetTaskUsageRequest(job_id="u/front", task_index=1)
        )
        full = [w for w in windows.windows if w.sample_count == 300 and w.window_start_ms >= all_started_ms]
        assert full
        assert all(w.cpu_unmet_mean_millicores == pytest.approx(500.0) for w in full)

    # The same on Kafka usage.histograms, and in the raw samples on usage.samples.
    decoded = [
        r.decode(usage_pb2.UsageHistogram) for r in await read_all(endpoints.kafka_bootstrap, histograms)
    ]
    published = [
        h
        for h in decoded
        if h.job_id == "u/crunch"
        and h.resource == resources_pb2.RESOURCE_CPU
        and h.sample_count == 300
        and h.window_start_ms >= all_started_ms
    ]
    assert published
    assert all(h.mean_total_unmet == pytest.approx(1500.0) for h in published)
    raw = [r.decode(usage_pb2.UsageSampleBatch) for r in await read_all(endpoints.kafka_bootstrap, samples)]
    # Once all three run (before, the first task had the machine to itself for a moment).
    front_samples = [
        s
        for b in raw
        for s in b.samples
        if s.job_id == "u/front" and s.event_time_ms >= all_started_ms + 1000
    ]
    assert front_samples
    assert all(s.cpu_unmet_millicores == pytest.approx(500.0) and s.cpu_throttled for s in front_samples)
