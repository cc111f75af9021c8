"""The aggregator and a recommender worker when the embedded broker loses its log.

The embedded broker keeps records in memory only: a restart begins every partition again
at offset 0, below the positions the services stored with their state. Each service runs
in-process against a broker of the test's own (tests/integration/own_broker.py) and must

* notice it without traffic: restarted under a running service that receives nothing, the
  broker's new log is noticed within a few position-check periods (a WARNING naming the
  topic, the stored position and the log's start and end) and the position is reset;
* apply the new log from its beginning, even when the new log grew past the stored position
  before the service looked (the service was stopped meanwhile): every record of it is
  applied, none skipped as "already applied" (the offsets alone cannot tell; the stored
  fingerprint of the last applied record can).
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import numpy as np
import pytest
from autopilot_processes import wait_for
from own_broker import OwnBroker
from stream_writers import StreamWriter

from cellpilot.api.v1 import resources_pb2, state_pb2, usage_pb2
from cellpilot.autopilot.ml_config import shipped_recommender_config
from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.topics import Topic
from cellpilot.stack import StackEndpoints
from cellpilot.units import GIB
from cellpilot.usage.buckets import Resource
from cellpilot_services.aggregator.aggregator_service import Aggregator
from cellpilot_services.aggregator.settings import AggregatorSettings
from cellpilot_services.recommender.settings import RecommenderSettings
from cellpilot_services.recommender.worker import RecommenderWorker

CHECK_S = 0.5  # the services' position-check period in these tests
NOTICED_WITHIN_S = 8 * CHECK_S + 10  # a few periods, plus a consumer group's rejoin
W = 60_000
T0 = 28_444_444 * W
CONFIG = shipped_recommender_config()  # what the workers load


def platform(endpoints: StackEndpoints, postgres_url: str = "") -> PlatformSettings:
    return PlatformSettings(
        kafka_bootstrap=endpoints.kafka_bootstrap,
        postgres_url=postgres_url or endpoints.postgres_url,
        redis_url=endpoints.redis_url,
        log_json=False,
        log_check_interval_s=CHECK_S,
    )


def noticed(caplog: pytest.LogCaptureFixture, topic: str) -> bool:
    return any(
        r.levelno == logging.WARNING
        and f"the log of {topic}/" in r.getMessage()
        and "stored position" in r.getMessage()
        for r in caplog.records
    )


def sample_batch(sequence: int) -> usage_pb2.UsageSampleBatch:
    """Ten seconds of one task's samples from machine m0, batch ``sequence`` (event time goes on)."""
    batch = usage_pb2.UsageSampleBatch(machine_id="m0", batch_sequence=sequence)
    for second in range(10):
        batch.samples.add(
            job_id="j/a",
            task_index=0,
            incarnation=1,
            event_time_ms=T0 + (sequence * 10 + second) * 1000,
            cpu_millicores=300.0 + second,
            memory_bytes=200 << 20,
        )
    return batch


async def test_the_aggregator_applies_a_lost_log_again_and_notices_one_without_traffic(
    endpoints: StackEndpoints, fresh_database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cellpilot.platform.kafka")
    suffix = uuid.uuid4().hex[:8]
    samples, histograms = f"usage.samples.{suffix}", f"usage.histograms.{suffix}"
    topics = [Topic(samples, 1, "machine id", "test"), Topic(histograms, 1, "job id", "test")]
    async with OwnBroker(tmp_path / "broker", topics) as broker:
        own = broker.endpoints(endpoints)
        settings = AggregatorSettings(
            platform=platform(own, fresh_database_url),
            port=0,
            apply_migrations=False,
            samples_topic=samples,
            sample_partitions=1,
            histograms_topic=histograms,
            consumer_group=f"agg-{suffix}",
            window_ms=W,
            out_of_orderness_ms=0,
            grace_ms=0,
            checkpoint_interval_s=0.5,
            idle_after_s=600,
        )
        key = (samples, 0)

        async def publish(sequences: range) -> None:
            producer = StreamWriter(broker.bootstrap)
            await producer.start()
            try:
                for sequence in sequences:
                    await producer.send(samples, "m0", sample_batch(sequence))
            finally:
                await producer.stop()

        def progress(aggregator: Aggregator) -> tuple[int, int]:
            owned = aggregator.owned.get(0)
            if owned is None:
                return (-1, -1)
            return owned.fence.next_offset.get(key, 0), owned.windows.accepted_samples

        first = Aggregator(settings)
        await first.start()
        try:
            await publish(range(1, 4))
            await wait_for(lambda: _async(progress(first)[0] == 3), 30, "the first three batches applied")
            accepted_before = progress(first)[1]
        finally:
            await first.stop()  # checkpoints position 3 and the fingerprint of the batch at offset 2

        # The broker loses its log while the aggregator is away; the new log grows past 3.
        await broker.restart()
        await publish(range(4, 10))
        second = Aggregator(settings)
        await second.start()
        try:
            await wait_for(lambda: _async(progress(second)[0] == 6), 30, "the new log applied")
            assert progress(second)[1] == accepted_before + 6 * 10, "every sample of the new log counted"
            assert noticed(caplog, samples)

            # Under a running aggregator with no traffic at all: noticed and reset.
            caplog.clear()
            await broker.restart()
            await wait_for(lambda: _async(noticed(caplog, samples)), NOTICED_WITHIN_S, "the WARNING")
            await wait_for(lambda: _async(progress(second)[0] == 0), 5, "the position reset")
            await publish(range(10, 12))
            await wait_for(lambda: _async(progress(second)[0] == 2), 30, "records after the restart applied")
            assert progress(second)[1] == accepted_before + 8 * 10
        finally:
            await second.stop()


def histogram(job: str, resource: Resource, k: int) -> usage_pb2.UsageHistogram:
    """Window ``k`` of a job's usage, as the aggregator publishes it."""
    scheme = CONFIG.for_resource(resource).scheme
    values = np.full(30, 0.5 * (GIB if resource is Resource.MEMORY else 1000.0)) * (1 + 0.01 * np.arange(30))
    counts = np.zeros(scheme.size)
    np.add.at(counts, scheme.index_of(values), 1.0)
    nonzero = np.flatnonzero(counts)
    end = T0 + (k + 1) * W * 5
    return usage_pb2.UsageHistogram(
        job_id=job,
        resource=resources_pb2.RESOURCE_CPU if resource is Resource.CPU else resources_pb2.RESOURCE_MEMORY,
        window_start_ms=end - 5 * W,
        window_end_ms=end,
        bucket_scheme_id=scheme.scheme_id,
        bucket_scheme_version=scheme.version,
        bucket_indices=nonzero.tolist(),
        counts=[int(c) for c in counts[nonzero]],
        peak=float(values.max()),
        mean_total_usage=float(values.mean()),
        sample_count=30,
        task_count=1,
    )


def oom(job: str, k: int) -> state_pb2.BorgEvent:
    event = state_pb2.BorgEvent(
        task=state_pb2.TaskEvent(
            job_id=job, task_index=0, kind=state_pb2.TASK_EVENT_KIND_OOM, event_time_ms=T0 + k * 5 * W + 1_000
        )
    )
    event.task.limits.memory_bytes = 2 * GIB
    event.task.usage.memory_bytes = 2 * GIB
    return event


def job_event(job: str, k: int) -> state_pb2.BorgEvent:
    return state_pb2.BorgEvent(
        task=state_pb2.TaskEvent(
            job_id=job, task_index=0, kind=state_pb2.TASK_EVENT_KIND_RUNNING, event_time_ms=T0 + k * 1000
        )
    )


async def test_a_recommender_worker_applies_lost_histogram_and_event_logs_again_and_notices_without_traffic(
    endpoints: StackEndpoints, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="cellpilot.platform.kafka")
    suffix = uuid.uuid4().hex[:8]
    histograms, events, recommendations = (
        f"{name}.{suffix}" for name in ("usage.histograms", "borg.events", "recs")
    )
    topics = [Topic(name, 1, "job id", "test") for name in (histograms, events, recommendations)]
    job = "j/r"
    async with OwnBroker(tmp_path / "broker", topics) as broker:
        settings = RecommenderSettings(
            platform=platform(broker.endpoints(endpoints)),
            port=0,
            histograms_topic=histograms,
            histogram_partitions=1,
            events_topic=events,
            recommendations_topic=recommendations,
            consumer_group=f"rec-{suffix}",
            state_prefix=f"test:recommender:{suffix}",
        )

        async def publish(windows: range, event_list: list[state_pb2.BorgEvent]) -> None:
            producer = StreamWriter(broker.bootstrap)
            await producer.start()
            try:
                for k in windows:
                    for resource in (Resource.CPU, Resource.MEMORY):
                        await producer.send(histograms, job, histogram(job, resource, k))
                for event in event_list:
                    await producer.send(events, job, event)
            finally:
                await producer.stop()

        def state(worker: RecommenderWorker) -> tuple[int, int, int, float]:
            """(histograms position, events position, windows the ML ensemble took, pending OOMs)."""
            owned = worker.owned.get(0)
            if owned is None or job not in owned.jobs:
                return (-1, -1, -1, -1.0)
            memory = owned.jobs[job].memory
            return (
                owned.fence.next_offset.get((histograms, 0), 0),
                owned.fence.next_offset.get((events, 0), 0),
                int(memory.ml.updates[0]),
                float(memory.pending_oom_count[0]),
            )

        def oom_applied(worker: RecommenderWorker) -> bool:
            """The OOM (a 2 GiB kill of a job using ~0.5 GiB) is either still pending, or it was
            folded into a later window: the ML histories then hold samples at >= 2 GiB."""
            memory = worker.owned[0].jobs[job].memory
            above = int(CONFIG.for_resource(Resource.MEMORY).scheme.index_of(np.array([2.0 * GIB]))[0])
            return bool(memory.pending_oom_count[0] >= 1 or memory.ml.smoothed[0, :, above:].sum() > 0)

        first = RecommenderWorker(settings)
        await first.start()
        try:
            await publish(range(3), [job_event(job, i) for i in range(3)])
            await wait_for(
                lambda: _async(state(first)[:3] == (6, 3, 3)), 30, "three windows and events applied"
            )
        finally:
            await first.stop()

        # Lost while the worker is away; both new logs grow past the stored positions. The OOM
        # is the new events log's first record: skipping "already applied" offsets loses it.
        await broker.restart()
        await publish(range(3, 8), [oom(job, 3), *(job_event(job, i) for i in range(3, 8))])
        second = RecommenderWorker(settings)
        await second.start()
        try:
            await wait_for(lambda: _async(state(second)[:3] == (10, 6, 8)), 30, "the new logs applied")
            assert oom_applied(second), "the OOM at the new events log's start was applied"
            assert noticed(caplog, histograms)
            assert noticed(caplog, events)

            caplog.clear()
            await broker.restart()  # under the running worker, no traffic
            await wait_for(
                lambda: _async(noticed(caplog, histograms) and noticed(caplog, events)),
                NOTICED_WITHIN_S,
                "the WARNINGs for both topics",
            )
            await wait_for(lambda: _async(state(second)[:2] == (0, 0)), 5, "both positions reset")
            await publish(range(8, 10), [job_event(job, 9)])
            await wait_for(
                lambda: _async(state(second)[:3] == (4, 1, 10)), 30, "records after the restart applied"
            )
        finally:
            await second.stop()


async def _async(value: bool) -> bool:
    return value
