"""The embedded broker's memory under a steady stream of usage samples, bounded and not.

Tansu 0.6 keeps every record in memory and honours no retention (cellpilot.stack.broker_retention).
A fresh broker per phase gets the demo's kind of traffic: ``MACHINES`` machines each sending one
UsageSampleBatch per ``1 / BATCHES_PER_S_PER_MACHINE`` s (``TASKS`` tasks x ``SPEEDUP`` samples,
as a Borglet at 60x event time does), for 120 wall seconds; the broker's RSS is read every
5 s and its growth is the slope of a least-squares line through the second half of the
readings (after the first rotations), in MiB per minute.

* ``pipeline.broker_rss_growth_unbounded_mib_per_min``: the baseline, as before: uncompressed
  records, no rotation.
* ``pipeline.broker_rss_growth_mib_per_min``: as ``cellpilot run`` runs it now: signed (each
  record carries its Borglet's signing certificate and signature) and gzip (MessageProducer),
  and the topic rotated every ``retention_s`` (the schedule ``cellpilot run``
  uses, with the samples topic's 10 minutes scaled down so the bound shows in a few minutes).
* ``pipeline.broker_rss_growth_ratio``: bounded / baseline.
* ``pipeline.durable_file_growth_mib_per_h``: the durable broker (SQLite engine, ``make broker``)
  under the same signed traffic, its samples topic's ``retention.ms`` ``retention_s`` and the
  engine's maintenance pass every ``maintenance_s`` (no rotation: the engine deletes): the growth
  of its files (database and write-ahead log) over the second half, in MiB per hour. The traffic
  is 5x the demo's and the retention scaled down from the samples topic's 10 minutes, so the
  file reaches the size where deleted pages are reused within the run; ``..._file_mib`` is the
  size at the end. Reported only where the durable broker is built.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
from aiokafka import AIOKafkaProducer

from bench.harness import FULL, SMOKE, Report, sized
from cellpilot.api.v1 import usage_pb2
from cellpilot.platform.kafka import MessageProducer, ensure_topics
from cellpilot.platform.stream_access import StreamAccess
from cellpilot.platform.topics import Topic
from cellpilot.security.certificates import IdentityRequest, issue_all
from cellpilot.stack import StackConfig, components
from cellpilot.stack.broker_build import FALLBACK_WARNING, durable_tansu_binary
from cellpilot.stack.broker_retention import RotationSchedule, rotate_topic
from cellpilot.stack.config import free_port, port_in_use

FIGURES = [
    "pipeline.broker_rss_growth_mib_per_min",
    "pipeline.broker_rss_growth_unbounded_mib_per_min",
    "pipeline.broker_rss_growth_ratio",
]
if durable_tansu_binary() is not None:
    FIGURES += ["pipeline.durable_file_growth_mib_per_h", "pipeline.durable_file_mib"]
MACHINES = 8
TASKS = 4
SPEEDUP = 60
BATCHES_PER_S_PER_MACHINE = 2.5  # 20 batches/s in all: 5x the demo's 4 machines at 1 batch/s
MIB = 1 << 20
BORGLET = "borglet-bench"  # a Borglet identity of the bench's own CA, for every machine


@dataclass(frozen=True)
class Size:
    seconds: float  # of traffic per phase
    every_s: float  # between RSS readings
    retention_s: int  # the samples topic is rotated this often in the bounded phase
    durable_seconds: float  # of traffic to the durable broker
    maintenance_s: int  # the durable engine's maintenance pass


SIZES = {
    FULL: Size(seconds=120.0, every_s=5.0, retention_s=30, durable_seconds=240.0, maintenance_s=10),
    SMOKE: Size(seconds=4.0, every_s=0.25, retention_s=2, durable_seconds=4.0, maintenance_s=1),
}


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


async def _phase(
    bootstrap: str,
    certs_dir: Path,
    reading: Callable[[], float],
    bounded: bool,
    size: Size,
    rotate: bool = True,
    seconds: float | None = None,
) -> tuple[float, float]:
    """Sends the traffic for ``seconds`` (``size.seconds``); returns the slope of ``reading``
    (MiB) over the second half, per minute, and the last reading."""
    seconds = size.seconds if seconds is None else seconds
    topic = Topic("usage.samples", 6, "machine id", "bench", retention_ms=size.retention_s * 1000)
    await ensure_topics(bootstrap, [topic])
    # Signed and gzipped, as every service sends.
    producer = MessageProducer(StreamAccess.service(bootstrap, certs_dir, BORGLET))
    raw = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)  # as before
    await producer.start()
    await raw.start()
    schedule = RotationSchedule.starting(time.monotonic(), [topic])
    readings: list[tuple[float, float]] = []
    start = next_reading = time.monotonic()
    sequence = 0
    try:
        while (now := time.monotonic()) - start < seconds:
            sequence += 1
            for machine in range(MACHINES):
                key, value = f"m{machine}", _batch(machine, sequence)
                if bounded:
                    await producer.send_raw(topic.name, key, value)
                else:
                    await raw.send_and_wait(topic.name, value, key=key.encode())
            if bounded and rotate and schedule.due(now):
                await rotate_topic(bootstrap, topic)
                schedule.rotated(topic, now)
            if now >= next_reading:
                readings.append((now - start, reading()))
                next_reading += size.every_s
            await asyncio.sleep(max(0.0, start + sequence / BATCHES_PER_S_PER_MACHINE - time.monotonic()))
    finally:
        await producer.stop()
        await raw.stop()
    shown = readings[:: max(1, len(readings) // 12)]
    label = "bounded" if bounded else "unbounded"
    print(f"  {label if rotate else 'durable'}: " + " ".join(f"{t:.0f}s={m:.1f}MiB" for t, m in shown))
    late = np.asarray(readings[len(readings) // 2 :])
    return float(np.polyfit(late[:, 0], late[:, 1], 1)[0]) * 60, readings[-1][1]


def _measure(data_dir: Path, bounded: bool, size: Size) -> float:
    """A fresh embedded broker (the stack's ``kafka`` component) for one phase."""
    config = StackConfig(data_dir, kafka_port=free_port())
    broker = components.broker(config)
    data_dir.mkdir(parents=True, exist_ok=True)
    issue_all(config.certs_dir, [IdentityRequest(BORGLET, ("*",))], valid_days=1)
    process = subprocess.Popen(
        broker.argv, env={**os.environ, **broker.env}, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 30
        while not port_in_use(config.host, config.kafka_port) and time.monotonic() < deadline:
            time.sleep(0.05)
        bootstrap = f"{config.host}:{config.kafka_port}"

        def rss() -> float:
            return float(psutil.Process(process.pid).memory_info().rss / MIB)

        return asyncio.run(_phase(bootstrap, config.certs_dir, rss, bounded, size))[0]
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _measure_durable_file(data_dir: Path, size: Size) -> tuple[float, float]:
    """A fresh durable broker (the stack's, without authentication: its files do not depend on
    who logs in) under the signed traffic; its files' growth in MiB per hour and final MiB."""
    config = StackConfig(data_dir, kafka_port=free_port(), broker="durable")
    broker = components.broker(config, authentication=False, maintenance_interval=f"{size.maintenance_s}s")
    config.broker_db.parent.mkdir(parents=True, exist_ok=True)
    issue_all(config.certs_dir, [IdentityRequest(BORGLET, ("*",))], valid_days=1)
    process = subprocess.Popen(
        broker.argv,
        env={**os.environ, **broker.env},
        cwd=config.data_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )

    def files() -> float:
        return sum(f.stat().st_size for f in config.broker_db.parent.iterdir() if f.is_file()) / MIB

    try:
        deadline = time.monotonic() + 30
        while not port_in_use(config.host, config.kafka_port) and time.monotonic() < deadline:
            time.sleep(0.05)
        bootstrap = f"{config.host}:{config.kafka_port}"
        phase = _phase(
            bootstrap, config.certs_dir, files, True, size, rotate=False, seconds=size.durable_seconds
        )
        per_minute, last = asyncio.run(phase)
        return per_minute * 60, last
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run(report: Report, size: str = FULL) -> None:
    params = sized(SIZES, size)
    with tempfile.TemporaryDirectory(prefix="bench-broker-memory-") as tmp:
        unbounded = _measure(Path(tmp) / "unbounded", bounded=False, size=params)
        bounded = _measure(Path(tmp) / "bounded", bounded=True, size=params)
    report("pipeline.broker_rss_growth_unbounded_mib_per_min", unbounded, "MiB/min")
    report("pipeline.broker_rss_growth_mib_per_min", bounded, "MiB/min")
    report("pipeline.broker_rss_growth_ratio", bounded / unbounded, "ratio")
    if durable_tansu_binary() is None:
        print(f"  {FALLBACK_WARNING}: no durable-broker file figures", flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="bench-broker-file-") as tmp:
        growth, final = _measure_durable_file(Path(tmp) / "durable", params)
    report("pipeline.durable_file_growth_mib_per_h", growth, "MiB/h")
    report("pipeline.durable_file_mib", final, "MiB")
