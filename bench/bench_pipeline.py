"""Sustained ingest of the monitoring pipeline: Borglet samples -> aggregator -> job histograms.

On the embedded stack: ``MACHINES`` simulated machines x ``TASKS_PER_MACHINE`` tasks, each
task sampled every second of event time (Autopilot §3.2.1's raw signal), for ``SECONDS``
of event time, published as one UsageSampleBatch per machine per 10 s (as a Borglet
does). Two aggregator replicas (``services/aggregator``, in this process) fold them into
windows, sum job windows and publish them on ``usage.histograms``. Time runs from the
first sample produced until every job window is published.

* ``pipeline.ingest_samples_per_s``: samples / that time.
* Baseline in the same run: ``pipeline.raw_kafka_samples_per_s``, the same records produced
  and consumed back by a plain consumer (no decoding): what the broker alone sustains;
  ``pipeline.ingest_vs_raw_kafka`` is the ratio.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
import uuid
from pathlib import Path

import asyncpg
from sqlalchemy import make_url

from bench.harness import Report
from cellpilot.api.v1 import usage_pb2
from cellpilot.platform.kafka import MessageProducer, ensure_topics
from cellpilot.platform.kafka_consumers import MessageConsumer
from cellpilot.platform.postgres import apply_migrations, ensure_database
from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.topics import Topic
from cellpilot.stack import Stack, StackConfig, StackEndpoints

FIGURES = [
    "pipeline.ingest_samples_per_s",
    "pipeline.raw_kafka_samples_per_s",
    "pipeline.ingest_vs_raw_kafka",
]
MACHINES = 1_000
TASKS_PER_MACHINE = 20
SECONDS = 120
CHUNK_S = 10
WINDOW_MS = 60_000
T0_MS = 28_333_334 * WINDOW_MS
PARTITIONS = 6


def _batches() -> list[tuple[str, bytes]]:
    """(machine id, encoded UsageSampleBatch) in send order: every machine's chunk, chunk by chunk."""
    out: list[tuple[str, bytes]] = []
    for chunk in range(SECONDS // CHUNK_S):
        for machine in range(MACHINES):
            message = usage_pb2.UsageSampleBatch(machine_id=f"m{machine}", batch_sequence=chunk + 1)
            for second in range(chunk * CHUNK_S, (chunk + 1) * CHUNK_S):
                for slot in range(TASKS_PER_MACHINE):
                    job = (machine * TASKS_PER_MACHINE + slot) % MACHINES  # 1 000 jobs x 20 tasks
                    message.samples.add(
                        job_id=f"job-{job}",
                        task_index=(machine * TASKS_PER_MACHINE + slot) // MACHINES,
                        incarnation=1,
                        event_time_ms=T0_MS + second * 1000,
                        cpu_millicores=100.0 + (second * 7 + slot * 13) % 900,
                        memory_bytes=(256 + slot) << 20,
                    )
            out.append((f"m{machine}", message.SerializeToString()))
    return out


async def _produce(bootstrap: str, topic: str, batches: list[tuple[str, bytes]]) -> None:
    producer = MessageProducer(bootstrap)
    await producer.start()
    try:
        window = 200
        for i in range(0, len(batches), window):
            await asyncio.gather(
                *(producer.send_raw(topic, key, value) for key, value in batches[i : i + window])
            )
    finally:
        await producer.stop()


async def _raw_kafka(endpoints: StackEndpoints, batches: list[tuple[str, bytes]]) -> float:
    topic = f"bench.raw-samples.{uuid.uuid4().hex[:8]}"
    await ensure_topics(endpoints.kafka_bootstrap, [Topic(topic, PARTITIONS, "machine id", "bench")])
    consumer = MessageConsumer(endpoints.kafka_bootstrap, [topic], group_id=f"bench-{uuid.uuid4().hex[:8]}")
    await consumer.start()
    try:
        start = time.perf_counter()
        producing = asyncio.create_task(_produce(endpoints.kafka_bootstrap, topic, batches))
        seen = 0
        async for records in consumer.batches(timeout_ms=200, max_records=2_000):
            seen += len(records)
            if seen >= len(batches):
                break
        await producing
        return SECONDS * MACHINES * TASKS_PER_MACHINE / (time.perf_counter() - start)
    finally:
        await consumer.stop()


async def _through_aggregator(endpoints: StackEndpoints, batches: list[tuple[str, bytes]]) -> float:
    from cellpilot_services.aggregator.aggregator_service import Aggregator
    from cellpilot_services.aggregator.history_store import asyncpg_dsn
    from cellpilot_services.aggregator.settings import AggregatorSettings

    suffix = uuid.uuid4().hex[:8]
    samples, histograms = f"bench.samples.{suffix}", f"bench.histograms.{suffix}"
    await ensure_topics(
        endpoints.kafka_bootstrap,
        [Topic(samples, PARTITIONS, "machine id", "bench"), Topic(histograms, 6, "job id", "bench")],
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
    replicas = [
        Aggregator(
            AggregatorSettings(
                platform=platform,
                replica_index=i,
                port=0,
                metrics_port=0,
                apply_migrations=False,
                samples_topic=samples,
                sample_partitions=PARTITIONS,
                histograms_topic=histograms,
                consumer_group=f"bench-agg-{suffix}",
                window_ms=WINDOW_MS,
                out_of_orderness_ms=0,
                grace_ms=15_000,
                idle_after_s=2.0,
            )
        )
        for i in range(2)
    ]
    for replica in replicas:
        await replica.start()
    db = await asyncpg.connect(asyncpg_dsn(url))
    expected_rows = 2 * MACHINES * (SECONDS * 1000 // WINDOW_MS)  # 1 000 jobs x 2 resources x windows
    try:
        await asyncio.sleep(4.0)  # both replicas joined the group and claimed their partitions
        start = time.perf_counter()
        await _produce(endpoints.kafka_bootstrap, samples, batches)
        while True:
            published = await db.fetchval("SELECT count(*) FROM usage_job_histograms WHERE published")
            if published >= expected_rows:
                break
            await asyncio.sleep(0.2)
        return SECONDS * MACHINES * TASKS_PER_MACHINE / (time.perf_counter() - start)
    finally:
        await db.close()
        for replica in replicas:
            await replica.stop()


def run(report: Report) -> None:
    batches = _batches()
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        stack = Stack(StackConfig(Path(tmp) / "stack"))
        endpoints = stack.up()
        try:
            raw = asyncio.run(_raw_kafka(endpoints, batches))
            ingest = asyncio.run(_through_aggregator(endpoints, batches))
        finally:
            stack.down()
    report("pipeline.raw_kafka_samples_per_s", raw, "samples/s")
    report("pipeline.ingest_samples_per_s", ingest, "samples/s")
    report("pipeline.ingest_vs_raw_kafka", ingest / raw, "ratio")
