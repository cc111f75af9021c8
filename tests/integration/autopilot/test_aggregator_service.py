"""The aggregator on the embedded stack: windows vs the samples sent, late samples, a crash.

Two aggregator replicas share the partitions of a fresh samples topic. Four machines
publish UsageSampleBatch messages in event time (one-minute windows, 15 s grace); one batch
is re-sent (a producer retry), one arrives late but within the grace period, one arrives
after its window closed. Midway, one replica is SIGKILLed and the other takes over its
partitions. Every job window in PostgreSQL, on Kafka and through the Monitoring API must
equal a brute-force sum of the samples sent, minus exactly the late batch; a malformed
record goes to the dead-letter topic and the stream goes on.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import asyncpg
import grpc
import numpy as np
import pytest
from aiokafka.partitioner import DefaultPartitioner
from autopilot_processes import ServiceProcess, new_topics, read_all, stop_all, wait_for
from stack_security import user_channel
from stream_writers import StreamWriter

from cellpilot.api.v1 import monitoring_pb2, monitoring_pb2_grpc, resources_pb2, usage_pb2
from cellpilot.platform.kafka import DEADLETTER_TOPIC
from cellpilot.platform.postgres import asyncpg_dsn
from cellpilot.stack import StackEndpoints
from cellpilot.stack.config import free_port
from cellpilot.usage.buckets import CPU_SCHEME, MEMORY_SCHEME
from cellpilot.usage.histogram import SparseHistogram

pytestmark = pytest.mark.slow  # started first (tests/conftest.py)

W = 60_000
T0 = 28_333_334 * W  # an event time on the window grid
MIB = 1 << 20
PARTITIONS = 6
PLACEMENT = {("t/a", 0): "m0", ("t/a", 1): "m1", ("t/a", 2): "m2", ("t/b", 0): "m3", ("t/b", 1): "m0"}
MACHINES = sorted(set(PLACEMENT.values()))
CHUNK_S = 10
WITHIN_GRACE = ("m0", 110)  # sent after t = 130 s: [60, 120) closes at watermark 135 s
TOO_LATE = ("m1", 50)  # sent once [0, 60) has closed on m1's partition
DUPLICATE = ("m2", 20)
MALFORMED = b"\xff\x00 not a sample batch"


def usage(job: str, task: int, second: int) -> tuple[float, int]:
    cpu = 100.0 * (task + 1) + 37.0 * (second % 7) + (500.0 if job == "t/b" else 0.0)
    memory = (200 + 10 * task + second // 30) * MIB
    return cpu, memory


def batch(machine: str, start_s: int) -> usage_pb2.UsageSampleBatch:
    message = usage_pb2.UsageSampleBatch(machine_id=machine, batch_sequence=start_s // CHUNK_S + 1)
    for second in range(start_s, start_s + CHUNK_S):
        for (job, task), where in PLACEMENT.items():
            if where == machine:
                cpu, memory = usage(job, task, second)
                message.samples.add(
                    job_id=job,
                    task_index=task,
                    incarnation=1,
                    event_time_ms=T0 + second * 1000,
                    cpu_millicores=cpu,
                    memory_bytes=memory,
                    cpu_throttled=second % 5 == 0,
                )
    return message


def expected_windows() -> dict[tuple[str, int, int], dict[str, Any]]:
    """(job, resource, window start) -> counts per bucket and summaries, from the samples kept."""
    cpu_counts: dict[tuple[str, int], np.ndarray] = defaultdict(lambda: np.zeros(CPU_SCHEME.size))
    peaks: dict[tuple[str, int, int], float] = defaultdict(float)
    samples: dict[tuple[str, int], int] = defaultdict(int)
    for second in range(300):
        for (job, task), machine in PLACEMENT.items():
            if (machine, second - second % CHUNK_S) == TOO_LATE:
                continue
            start = T0 + (second * 1000 // W) * W
            cpu, memory = usage(job, task, second)
            cpu_counts[(job, start)][CPU_SCHEME.index_of(cpu)] += 1
            peaks[(job, task, start)] = max(peaks[(job, task, start)], memory)
            samples[(job, start)] += 1
    out: dict[tuple[str, int, int], dict[str, Any]] = {}
    for (job, start), counts in cpu_counts.items():
        memory_counts = np.zeros(MEMORY_SCHEME.size)
        tasks = [(t, p) for (j, t, s), p in peaks.items() if j == job and s == start]
        for _, peak in tasks:
            memory_counts[MEMORY_SCHEME.index_of(peak)] += 1
        for resource, hist in (
            (resources_pb2.RESOURCE_CPU, counts),
            (resources_pb2.RESOURCE_MEMORY, memory_counts),
        ):
            out[(job, resource, start)] = {
                "counts": hist,
                "samples": samples[(job, start)],
                "tasks": len(tasks),
            }
    return out


def dense(indices: list[int], counts: list[int], size: int) -> np.ndarray:
    out = np.zeros(size)
    out[np.asarray(indices, dtype=np.intp)] = counts
    return out


def partition_of(machine: str) -> int:
    return int(DefaultPartitioner()(machine.encode(), list(range(PARTITIONS)), list(range(PARTITIONS))))


async def test_windows_equal_the_samples_sent_through_late_data_duplicates_and_a_crash(
    endpoints: StackEndpoints, fresh_database_url: str
) -> None:
    samples_topic, histograms_topic = await new_topics(
        endpoints.kafka_bootstrap, ("usage.samples", PARTITIONS), ("usage.histograms", 6)
    )
    ports = [free_port(), free_port()]
    env = {
        "CELLPILOT_POSTGRES_URL": fresh_database_url,
        "CELLPILOT_AGGREGATOR_SAMPLES_TOPIC": samples_topic,
        "CELLPILOT_AGGREGATOR_HISTOGRAMS_TOPIC": histograms_topic,
        "CELLPILOT_AGGREGATOR_CONSUMER_GROUP": f"agg-{samples_topic}",
        "CELLPILOT_AGGREGATOR_WINDOW_MS": str(W),
        "CELLPILOT_AGGREGATOR_GRACE_MS": "15000",  # > one 10 s chunk: WITHIN_GRACE is merged
        "CELLPILOT_AGGREGATOR_OUT_OF_ORDERNESS_MS": "0",
        "CELLPILOT_AGGREGATOR_IDLE_AFTER_S": "4",
        "CELLPILOT_AGGREGATOR_CHECKPOINT_INTERVAL_S": "60",  # in-memory progress is lost in the crash
        "CELLPILOT_AGGREGATOR_METRICS_PORT": "0",
    }
    replicas = [
        ServiceProcess(
            "aggregator",
            f"aggregator-{i}",
            {**env, "CELLPILOT_AGGREGATOR_REPLICA_INDEX": str(i), "CELLPILOT_AGGREGATOR_PORT": str(ports[i])},
            endpoints,
        )
        for i in range(2)
    ]
    db = await asyncpg.connect(asyncpg_dsn(fresh_database_url))
    producer = StreamWriter(endpoints.kafka_bootstrap)
    await producer.start()
    try:

        async def owners() -> set[str] | None:
            rows = await db.fetch("SELECT owner FROM aggregator_partitions WHERE owner <> ''")
            found = {r["owner"] for r in rows}
            return found if len(rows) == PARTITIONS and len(found) == 2 else None

        await wait_for(owners, 60, "both replicas to claim partitions")

        async def send(machine: str, start_s: int) -> None:
            await producer.send(samples_topic, machine, batch(machine, start_s))

        async def send_until(stop_s: int, start_s: int) -> None:
            for start in range(start_s, stop_s, CHUNK_S):
                for machine in MACHINES:
                    if (machine, start) not in (WITHIN_GRACE, TOO_LATE):
                        await send(machine, start)

        await send_until(130, 0)
        await send(*DUPLICATE)  # a producer retry of a batch already delivered
        await send(*WITHIN_GRACE)
        late_partition = partition_of(TOO_LATE[0])

        async def closed_on_late_partition() -> bool:
            closed = await db.fetchval(
                "SELECT closed_through_ms FROM aggregator_partitions WHERE partition = $1", late_partition
            )
            return closed is not None and closed >= T0 + W

        await wait_for(closed_on_late_partition, 30, "the first window to close")
        await send(*TOO_LATE)
        await send_until(200, 130)
        await asyncio.sleep(2.0)
        replicas[0].kill()
        await producer.send_raw(samples_topic, "m3", MALFORMED)  # goes to the dead-letter topic
        await send_until(300, 200)

        expected = expected_windows()

        async def all_published() -> bool:
            published = await db.fetchval("SELECT count(*) FROM usage_job_histograms WHERE published")
            return published == len(expected)

        await wait_for(all_published, 90, "every job window summed and published", every_s=1.0)

        rows = await db.fetch("SELECT * FROM usage_job_histograms")
        assert len(rows) == len(expected)
        for row in rows:
            want = expected[(row["job_id"], row["resource"], row["window_start_ms"])]
            sparse = SparseHistogram.from_bytes(bytes(row["histogram"]))
            got = np.zeros(sparse.scheme.size)
            got[sparse.indices] = sparse.counts
            np.testing.assert_array_equal(got, want["counts"], err_msg=str(dict(row)))
            assert row["sample_count"] == want["samples"]
            assert row["task_count"] == want["tasks"]
            assert row["window_end_ms"] - row["window_start_ms"] == W

        totals = await db.fetchrow(
            "SELECT sum(late_samples) AS late, sum(duplicate_batches) AS duplicates"
            " FROM aggregator_partitions"
        )
        assert totals["late"] == CHUNK_S * sum(1 for m in PLACEMENT.values() if m == TOO_LATE[0])
        assert totals["duplicates"] == 1

        records = await read_all(endpoints.kafka_bootstrap, histograms_topic, idle_s=1.0)
        seen: dict[tuple[str, int, int], np.ndarray] = {}
        for record in records:
            message = record.decode(usage_pb2.UsageHistogram)
            assert record.key == message.job_id
            size = CPU_SCHEME.size if message.resource == resources_pb2.RESOURCE_CPU else MEMORY_SCHEME.size
            hist = dense(list(message.bucket_indices), list(message.counts), size)
            key = (message.job_id, message.resource, message.window_start_ms)
            if key in seen:  # a re-sent outbox row must be the same histogram
                np.testing.assert_array_equal(seen[key], hist)
            seen[key] = hist
        assert set(seen) == set(expected), "every job window is published, none invented"
        for key, hist in seen.items():
            np.testing.assert_array_equal(hist, expected[key]["counts"])

        letters = await read_all(endpoints.kafka_bootstrap, DEADLETTER_TOPIC, idle_s=1.0)
        ours = [r for r in letters if dict(r.headers).get("source-topic") == samples_topic.encode()]
        assert [r.value for r in ours] == [MALFORMED], "the malformed batch is dead-lettered once"

        survivor = f"127.0.0.1:{ports[1]}"
        async with user_channel(survivor, "alice") as channel:  # reads are open to any user
            stub = monitoring_pb2_grpc.MonitoringStub(channel)
            history = await stub.GetHistogramHistory(
                monitoring_pb2.GetHistogramHistoryRequest(
                    job_id="t/a", resource=resources_pb2.RESOURCE_CPU, page_size=3
                )
            )
            assert [h.window_start_ms for h in history.histograms] == [T0 + i * W for i in range(3)]
            rest = await stub.GetHistogramHistory(
                monitoring_pb2.GetHistogramHistoryRequest(
                    job_id="t/a", resource=resources_pb2.RESOURCE_CPU, page_token=history.next_page_token
                )
            )
            assert [h.window_start_ms for h in rest.histograms] == [T0 + i * W for i in range(3, 5)]
            assert not rest.next_page_token
            task = await stub.GetHistogramHistory(
                monitoring_pb2.GetHistogramHistoryRequest(
                    job_id="t/b", resource=resources_pb2.RESOURCE_MEMORY, task_index=1
                )
            )
            assert len(task.histograms) == 5
            peak = max(usage("t/b", 1, s)[1] for s in range(60))
            assert list(task.histograms[0].bucket_indices) == [int(MEMORY_SCHEME.index_of(peak))]
            windows = await stub.GetTaskUsage(monitoring_pb2.GetTaskUsageRequest(job_id="t/a", task_index=0))
            assert [w.sample_count for w in windows.windows] == [60] * 5
            first = [usage("t/a", 0, s)[0] for s in range(60)]
            assert windows.windows[0].cpu_mean_millicores == pytest.approx(np.mean(first))
            assert windows.windows[0].cpu_max_millicores == max(first)
            scheme = await stub.GetBucketScheme(
                monitoring_pb2.GetBucketSchemeRequest(
                    scheme_id=CPU_SCHEME.scheme_id, version=CPU_SCHEME.version
                )
            )
            np.testing.assert_allclose(scheme.scheme.upper_bounds, CPU_SCHEME.boundaries)
            with pytest.raises(grpc.aio.AioRpcError) as invalid:
                await stub.GetHistogramHistory(monitoring_pb2.GetHistogramHistoryRequest(job_id="t/a"))
            assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "resource" in (invalid.value.details() or "")
    except BaseException:
        for replica in replicas:
            print(f"--- {replica.name}\n{replica.log_tail()}")
        raise
    finally:
        await producer.stop()
        await db.close()
        stop_all(replicas)
