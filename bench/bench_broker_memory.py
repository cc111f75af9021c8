"""The embedded broker's memory under a steady stream of usage samples, bounded and not.

Tansu 0.6 keeps every record in memory and honours no retention (cellpilot.stack.broker_retention).
A fresh broker per phase gets the demo's kind of traffic: ``MACHINES`` machines each sending one
UsageSampleBatch per ``1 / BATCHES_PER_S_PER_MACHINE`` s (``TASKS`` tasks x ``SPEEDUP`` samples,
as a Borglet at 60x event time does), for ``SECONDS`` wall seconds; the broker's RSS is read every
``EVERY_S`` s and its growth is the slope of a least-squares line through the second half of the
readings (after the first rotations), in MiB per minute.

* ``pipeline.broker_rss_growth_unbounded_mib_per_min``: the baseline, as before: uncompressed
  records, no rotation.
* ``pipeline.broker_rss_growth_mib_per_min``: as ``cellpilot run`` runs it now: gzip
  (MessageProducer) and the topic rotated every ``RETENTION_S`` (the schedule ``cellpilot run``
  uses, with the samples topic's 10 minutes scaled down so the bound shows in a few minutes).
* ``pipeline.broker_rss_growth_ratio``: bounded / baseline.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
from aiokafka import AIOKafkaProducer

from bench.harness import Report
from cellpilot.api.v1 import usage_pb2
from cellpilot.platform.kafka import MessageProducer, ensure_topics
from cellpilot.platform.topics import Topic
from cellpilot.stack import StackConfig, components
from cellpilot.stack.broker_retention import RotationSchedule, rotate_topic
from cellpilot.stack.config import free_port, port_in_use

FIGURES = [
    "pipeline.broker_rss_growth_mib_per_min",
    "pipeline.broker_rss_growth_unbounded_mib_per_min",
    "pipeline.broker_rss_growth_ratio",
]
MACHINES = 8
TASKS = 4
SPEEDUP = 60
BATCHES_PER_S_PER_MACHINE = 2.5  # 20 batches/s in all: 5x the demo's 4 machines at 1 batch/s
SECONDS = 120
EVERY_S = 5.0
RETENTION_S = 30
MIB = 1 << 20


def _batch(machine: int, sequence: int) -> bytes:
    batch = usage_pb2.UsageSampleBatch(machine_id=f"m{machine}", batch_sequence=sequence)
    for task in range(TASKS):
        for second in range(SPEEDUP):
            batch.samples.add(
                job_id=f"demo/job-{(machine + task) % 5}",
                task_index=task,
                incarnation=1,
                event_time_ms=1_795_000_000_000 + (sequence * SPEEDUP + second) * 1000,
                cpu_millicores=400.0 + (second * 37 + task * 11) % 120,
                memory_bytes=(300 << 20) + second * 4096,
                cpu_throttled=second % 9 == 0,
            )
    return batch.SerializeToString()


async def _phase(bootstrap: str, pid: int, bounded: bool) -> float:
    topic = Topic("usage.samples", 6, "machine id", "bench", retention_ms=RETENTION_S * 1000)
    await ensure_topics(bootstrap, [topic])
    producer = MessageProducer(bootstrap)  # gzip, as every service sends
    raw = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)  # as before
    await producer.start()
    await raw.start()
    schedule = RotationSchedule.starting(time.monotonic(), [topic])
    readings: list[tuple[float, float]] = []
    start = next_reading = time.monotonic()
    sequence = 0
    try:
        while (now := time.monotonic()) - start < SECONDS:
            sequence += 1
            for machine in range(MACHINES):
                key, value = f"m{machine}", _batch(machine, sequence)
                if bounded:
                    await producer.send_raw(topic.name, key, value)
                else:
                    await raw.send_and_wait(topic.name, value, key=key.encode())
            if bounded and schedule.due(now):
                await rotate_topic(bootstrap, topic)
                schedule.rotated(topic, now)
            if now >= next_reading:
                readings.append((now - start, psutil.Process(pid).memory_info().rss / MIB))
                next_reading += EVERY_S
            await asyncio.sleep(max(0.0, start + sequence / BATCHES_PER_S_PER_MACHINE - time.monotonic()))
    finally:
        await producer.stop()
        await raw.stop()
    shown = readings[:: max(1, len(readings) // 12)]
    print(
        f"  {'bounded' if bounded else 'unbounded'}: RSS "
        + " ".join(f"{t:.0f}s={m:.0f}MiB" for t, m in shown)
    )
    late = np.asarray(readings[len(readings) // 2 :])
    return float(np.polyfit(late[:, 0], late[:, 1], 1)[0]) * 60


def _measure(data_dir: Path, bounded: bool) -> float:
    """A fresh embedded broker (the stack's ``kafka`` component) for one phase."""
    config = StackConfig(data_dir, kafka_port=free_port())
    broker = components.broker(config)
    data_dir.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        broker.argv, env={**os.environ, **broker.env}, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 30
        while not port_in_use(config.host, config.kafka_port) and time.monotonic() < deadline:
            time.sleep(0.05)
        return asyncio.run(_phase(f"{config.host}:{config.kafka_port}", process.pid, bounded))
    finally:
        process.terminate()
        process.wait(20)


def run(report: Report) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-broker-memory-") as tmp:
        unbounded = _measure(Path(tmp) / "unbounded", bounded=False)
        bounded = _measure(Path(tmp) / "bounded", bounded=True)
    report("pipeline.broker_rss_growth_unbounded_mib_per_min", unbounded, "MiB/min")
    report("pipeline.broker_rss_growth_mib_per_min", bounded, "MiB/min")
    report("pipeline.broker_rss_growth_ratio", bounded / unbounded, "ratio")
