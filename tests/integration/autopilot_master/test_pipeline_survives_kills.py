"""The whole Autopilot pipeline as real processes, with a crash of each stage in turn.

Samples -> 2 aggregators -> usage.histograms -> 3 recommender workers -> recommendations
-> 2 Autopilot masters (Redis lock, fencing token) -> actuations -> actuator -> Borgmaster.
The test publishes every sample itself, deterministically (whole 5-minute windows of usage
that ramps up, so every window moves the recommendations and limits go up), on topics,
consumer groups, Redis prefixes and a database of its own. Mid-stream it SIGKILLs one
recommender worker, then the Autopilot leader, then an aggregator, and checks that:

* the pipeline goes on: recommendations for every job for windows sent after each kill;
  the new leader actuates;
* no histogram window is lost or double counted: every job window is on ``usage.histograms``
  with the counts of a brute-force sum of the samples sent (a copy re-sent by the outbox
  after a crash must be identical), PostgreSQL holds exactly one row per job window, and
  each recommender applied each window exactly once (its ML ensemble counts updates);
* exactly one master actuates at any time: each fencing token belongs to one replica,
  tokens never go back on any ``actuations`` partition, the actuations the Borgmaster
  applied carry non-decreasing tokens in its log order, and a decision of the deposed
  leader arriving late is refused (FENCED, counted by the actuator).
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from typing import Any

import asyncpg
import numpy as np
import pytest
import redis.asyncio as aioredis
from aiokafka.partitioner import DefaultPartitioner
from autopilot_master_harness import (
    AutopilotProcess,
    Publisher,
    Scenario,
    TopicReader,
    actuator,
    api_client,
    borgmaster,
    eventually,
    grant,
    job_spec,
    job_status,
)
from autopilot_processes import ServiceProcess, new_topics

from cellpilot.api.v1 import actuation_pb2, job_pb2, recommendation_pb2, resources_pb2, usage_pb2
from cellpilot.autopilot.job_recommendations import RecommenderState
from cellpilot.platform.leadership import Leadership
from cellpilot.platform.postgres import asyncpg_dsn
from cellpilot.platform.redis_client import reply_bytes, reply_text
from cellpilot.stack import StackEndpoints
from cellpilot.usage.buckets import CPU_SCHEME, MEMORY_SCHEME

pytestmark = pytest.mark.slow  # started first (tests/conftest.py)

ON = job_pb2.SCALING_MODE_ON
APPLIED = actuation_pb2.ACTUATION_OUTCOME_APPLIED
FENCED = actuation_pb2.ACTUATION_OUTCOME_FENCED
CPU, MEMORY = resources_pb2.RESOURCE_CPU, resources_pb2.RESOURCE_MEMORY
W = 300_000  # Autopilot §3.2.1: 5-minute windows
T0 = 5_777_777 * W  # an event time on the window grid
MIB = 1 << 20
SAMPLE_PARTITIONS = 4
HISTOGRAM_PARTITIONS = 3  # one per recommender worker
JOBS_PER_PARTITION = 2
TASKS = 2
SAMPLE_EVERY_S = 30
LAST_WINDOW = 15  # windows 0..14 close; window 15 (the last sent) stays open


def spread(prefix: str, count: int, per_partition: int, partitions: int) -> list[str]:
    """Names whose Kafka key partitions cover every partition ``per_partition`` times."""
    partitioner = DefaultPartitioner()
    every = list(range(partitions))
    taken: dict[int, list[str]] = defaultdict(list)
    for i in range(10_000):
        name = f"{prefix}{i}"
        slot = int(partitioner(name.encode(), every, every))
        if len(taken[slot]) < per_partition:
            taken[slot].append(name)
        if sum(len(v) for v in taken.values()) == count:
            return [name for slot in every for name in taken[slot]]
    raise AssertionError("no spread of names found")


class Workload:
    """Deterministic usage of every task, one UsageSampleBatch per machine and window."""

    def __init__(self, job_ids: list[str], machines: list[str]) -> None:
        self.job_ids = job_ids
        self.machines = machines
        self.placement = {
            (job, task): machines[(j * TASKS + task) % len(machines)]
            for j, job in enumerate(job_ids)
            for task in range(TASKS)
        }

    def usage(self, job: str, task: int, window: int, second: int) -> tuple[float, int]:
        j = self.job_ids.index(job)
        cpu = (300.0 + 60.0 * j) * 1.12**window * (1.0 + 0.04 * ((second // 30 + 3 * task) % 6))
        memory = int((256 + 32 * j) * MIB * 1.06**window) + (16 * task + second // 30) * MIB
        return cpu, memory

    def batch(self, machine: str, window: int) -> usage_pb2.UsageSampleBatch:
        message = usage_pb2.UsageSampleBatch(machine_id=machine, batch_sequence=window + 1)
        for second in range(0, W // 1000, SAMPLE_EVERY_S):
            for (job, task), where in self.placement.items():
                if where == machine:
                    cpu, memory = self.usage(job, task, window, second)
                    message.samples.add(
                        job_id=job,
                        task_index=task,
                        incarnation=1,
                        event_time_ms=T0 + window * W + second * 1000,
                        cpu_millicores=cpu,
                        memory_bytes=memory,
                    )
        return message

    def expected(self, windows: int) -> dict[tuple[str, int, int], tuple[np.ndarray, int]]:
        """(job, resource, window start) -> (counts per bucket, samples), by brute force."""
        out: dict[tuple[str, int, int], tuple[np.ndarray, int]] = {}
        for job in self.job_ids:
            for k in range(windows):
                cpu_counts = np.zeros(CPU_SCHEME.size)
                memory_counts = np.zeros(MEMORY_SCHEME.size)
                samples = 0
                for task in range(TASKS):
                    peak = 0
                    for second in range(0, W // 1000, SAMPLE_EVERY_S):
                        cpu, memory = self.usage(job, task, k, second)
                        cpu_counts[CPU_SCHEME.index_of(cpu)] += 1
                        peak = max(peak, memory)
                        samples += 1
                    memory_counts[MEMORY_SCHEME.index_of(peak)] += 1
                start = T0 + k * W
                out[(job, CPU, start)] = (cpu_counts, samples)
                out[(job, MEMORY, start)] = (memory_counts, samples)
        return out


def dense(message: usage_pb2.UsageHistogram) -> np.ndarray:
    out = np.zeros(CPU_SCHEME.size if message.resource == CPU else MEMORY_SCHEME.size)
    out[np.asarray(message.bucket_indices, dtype=np.intp)] = list(message.counts)
    return out


def owned_partitions(process: ServiceProcess) -> int:
    """Partitions a recommender worker holds now, from its log (claims minus revocations)."""
    text = process.log_path.read_text(errors="replace")
    return text.count("partition claimed") - text.count("partition revoked")


async def test_pipeline_survives_a_worker_a_leader_and_an_aggregator_kill(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    scenario = Scenario(endpoints)
    await scenario.create_topics()
    bootstrap = endpoints.kafka_bootstrap
    samples_topic, histograms_topic = await new_topics(
        bootstrap, ("usage.samples", SAMPLE_PARTITIONS), ("usage.histograms", HISTOGRAM_PARTITIONS)
    )
    suffix = uuid.uuid4().hex[:8]
    recommender_group, state_prefix = f"rec-{suffix}", f"test:{suffix}:recommender"
    machines = spread(f"m{suffix[:4]}-", SAMPLE_PARTITIONS, 1, SAMPLE_PARTITIONS)
    # Job ids are "<user>/<name>": spread them over the histogram partitions, i.e. the workers.
    job_ids = spread(
        f"{scenario.user}/svc",
        JOBS_PER_PARTITION * HISTOGRAM_PARTITIONS,
        JOBS_PER_PARTITION,
        HISTOGRAM_PARTITIONS,
    )
    workload = Workload(job_ids, machines)

    redis = aioredis.Redis.from_url(endpoints.redis_url)
    db = await asyncpg.connect(asyncpg_dsn(fresh_database_url))
    processes: list[ServiceProcess] = []
    masters: list[AutopilotProcess] = []
    try:
        async with borgmaster(fresh_database_url, scenario) as bm:
            client = api_client([bm.address])
            await grant(client, scenario.user)
            for job_id in job_ids:
                name = job_id.split("/", 1)[1]
                await client.borgmaster.submit_job(job_spec(name, scenario.user, cpu_mode=ON, memory_mode=ON))

            aggregator_env = {
                "CELLPILOT_POSTGRES_URL": fresh_database_url,
                "CELLPILOT_AGGREGATOR_APPLY_MIGRATIONS": "false",
                "CELLPILOT_AGGREGATOR_SAMPLES_TOPIC": samples_topic,
                "CELLPILOT_AGGREGATOR_SAMPLE_PARTITIONS": str(SAMPLE_PARTITIONS),
                "CELLPILOT_AGGREGATOR_HISTOGRAMS_TOPIC": histograms_topic,
                "CELLPILOT_AGGREGATOR_CONSUMER_GROUP": f"agg-{suffix}",
                "CELLPILOT_AGGREGATOR_OUT_OF_ORDERNESS_MS": "0",
                "CELLPILOT_AGGREGATOR_GRACE_MS": "15000",
                # Never idle during the test: a window closes by the watermark only.
                "CELLPILOT_AGGREGATOR_IDLE_AFTER_S": "600",
                "CELLPILOT_AGGREGATOR_CHECKPOINT_INTERVAL_S": "60",  # open windows lost in the crash
                "CELLPILOT_AGGREGATOR_JOB_STAGE_INTERVAL_S": "0.3",
                "CELLPILOT_AGGREGATOR_METRICS_PORT": "0",
            }
            aggregators = [
                ServiceProcess(
                    "aggregator",
                    f"kills-aggregator-{i}",
                    {
                        **aggregator_env,
                        "CELLPILOT_AGGREGATOR_REPLICA_INDEX": str(i),
                        "CELLPILOT_AGGREGATOR_PORT": "0",
                    },
                    endpoints,
                )
                for i in range(2)
            ]
            recommender_env = {
                "CELLPILOT_RECOMMENDER_HISTOGRAMS_TOPIC": histograms_topic,
                "CELLPILOT_RECOMMENDER_HISTOGRAM_PARTITIONS": str(HISTOGRAM_PARTITIONS),
                "CELLPILOT_RECOMMENDER_EVENTS_TOPIC": "",
                "CELLPILOT_RECOMMENDER_RECOMMENDATIONS_TOPIC": scenario.recommendations,
                "CELLPILOT_RECOMMENDER_CONSUMER_GROUP": recommender_group,
                "CELLPILOT_RECOMMENDER_STATE_PREFIX": state_prefix,
                "CELLPILOT_RECOMMENDER_POLL_TIMEOUT_MS": "100",
                "CELLPILOT_RECOMMENDER_METRICS_PORT": "0",
            }
            workers = [
                ServiceProcess(
                    "recommender",
                    f"kills-recommender-{i}",
                    {
                        **recommender_env,
                        "CELLPILOT_RECOMMENDER_REPLICA_INDEX": str(i),
                        "CELLPILOT_RECOMMENDER_PORT": "0",
                    },
                    endpoints,
                )
                for i in range(3)
            ]
            processes = [*aggregators, *workers]
            masters = [AutopilotProcess(scenario, [bm.address], i) for i in range(2)]
            by_id = {m.replica_id: m for m in masters}

            async def leader() -> Leadership | None:
                raw = await redis.get(f"{scenario.autopilot_prefix}:leader")
                return None if raw is None else Leadership.parse(raw)

            async with (
                actuator(scenario.actuator_settings([bm.address])) as act,
                Publisher(scenario) as publish,
                TopicReader(bootstrap, histograms_topic, usage_pb2.UsageHistogram) as histograms,
                TopicReader(
                    bootstrap, scenario.recommendations, recommendation_pb2.RecommendationSet
                ) as recs,
                TopicReader(bootstrap, scenario.actuations, actuation_pb2.Actuation) as actuations,
            ):

                async def send(*windows: int) -> None:
                    for k in windows:
                        for machine in machines:
                            await publish.producer.send(samples_topic, machine, workload.batch(machine, k))

                async def recommended_through(k: int) -> bool:
                    """Every job has a recommendation set for window k (or a later one)."""
                    latest: dict[str, int] = {}
                    for rs in list(recs.messages):
                        latest[rs.job_id] = max(latest.get(rs.job_id, 0), rs.window_end_ms)
                    return all(latest.get(job, 0) >= T0 + (k + 1) * W for job in job_ids)

                async def applied_with(token: int) -> actuation_pb2.ActuationResult | None:
                    for a in list(actuations.messages):
                        if a.fencing_token == token:
                            result = await act.results.result(a.idempotency_key)
                            if result is not None and result.outcome == APPLIED:
                                return result
                    return None

                async def aggregators_own_partitions() -> bool:
                    rows = await db.fetch(
                        "SELECT owner FROM aggregator_partitions WHERE topic = $1 AND owner <> ''",
                        samples_topic,
                    )
                    return len(rows) == SAMPLE_PARTITIONS and len({r["owner"] for r in rows}) == 2

                # Timeouts are generous: they bound recovery on a loaded CI machine, they are not targets.
                # Every replica up and sharing the work before the stream starts.
                await eventually(aggregators_own_partitions, 120, "both aggregators owning partitions")
                await eventually(
                    lambda: _true(all(owned_partitions(w) >= 1 for w in workers)),
                    60,
                    "each recommender worker owning a partition",
                )
                first = await eventually(leader, 60, "an elected Autopilot master")

                await send(0, 1, 2, 3)
                await eventually(lambda: recommended_through(2), 90, "the first recommendations")
                await eventually(lambda: applied_with(first.token), 60, "the first leader's actuation")

                # 1. A recommender worker dies with histograms in flight.
                await send(4, 5)
                workers[0].kill()
                await send(6, 7)
                await eventually(lambda: recommended_through(6), 90, "recommendations after the worker kill")

                # 2. The Autopilot leader dies mid-stream; the other replica takes over.
                await send(8)
                by_id[first.holder].kill()
                await send(9, 10)
                second = await eventually(
                    lambda: _newer(leader, first.token), 60, "the other Autopilot master elected"
                )
                assert second.holder != first.holder
                await eventually(lambda: recommended_through(9), 60, "recommendations after the leader kill")
                await eventually(lambda: applied_with(second.token), 60, "the new leader's actuation")
                # A decision of the deposed leader arriving late is refused.
                old = next(a for a in actuations.messages if a.fencing_token == first.token)
                stale = actuation_pb2.Actuation()
                stale.CopyFrom(old)
                stale.idempotency_key = f"{old.job_id}/{first.token}/late"
                stale.cpu_limit_millicores = 1
                stale.based_on_spec_version = 0
                await publish.actuation(stale)
                late = await eventually(
                    lambda: act.results.result(stale.idempotency_key), 20, "the stale actuation settled"
                )
                assert late.outcome == FENCED

                # 3. An aggregator dies with open windows only in its memory.
                await send(11, 12)
                aggregators[0].kill()
                await send(13, 14, LAST_WINDOW)
                expected = workload.expected(LAST_WINDOW)

                async def histograms_complete() -> bool:
                    have = {(h.job_id, h.resource, h.window_start_ms) for h in list(histograms.messages)}
                    return set(expected) <= have

                await eventually(histograms_complete, 120, "every job window on usage.histograms")
                await eventually(
                    lambda: recommended_through(LAST_WINDOW - 1),
                    90,
                    "recommendations after the aggregator kill",
                )

                async def applied_after_aggregator_kill() -> bool:
                    """An actuation decided on window 13 or 14 (sent after the kill) applied."""
                    for a in list(actuations.messages):
                        if a.event_time_ms > T0 + 13 * W:
                            result = await act.results.result(a.idempotency_key)
                            if result is not None and result.outcome == APPLIED:
                                return True
                    return False

                await eventually(applied_after_aggregator_kill, 120, "actuations after the aggregator kill")

                # -- no window lost or double counted -----------------------------------
                seen: dict[tuple[str, int, int], np.ndarray] = {}
                for h in histograms.messages:
                    key = (h.job_id, h.resource, h.window_start_ms)
                    hist = dense(h)
                    if key in seen:  # an outbox row re-sent after the crash: the same histogram
                        np.testing.assert_array_equal(seen[key], hist, err_msg=str(key))
                    seen[key] = hist
                    want, samples = expected[key]
                    np.testing.assert_array_equal(hist, want, err_msg=str(key))
                    assert h.sample_count == samples, key
                    assert h.task_count == TASKS, key
                    assert h.window_end_ms - h.window_start_ms == W
                assert set(seen) == set(expected), "every job window published, none invented"
                rows = await db.fetch(
                    "SELECT job_id, resource, window_start_ms, published FROM usage_job_histograms"
                )
                assert len(rows) == len(expected), "one stored row per job window"
                assert all(r["published"] for r in rows)

                states = await _saved_states(redis, f"{state_prefix}:{recommender_group}")
                assert set(states) == set(job_ids)
                for job, state in states.items():
                    assert state.complete_window_ms == T0 + LAST_WINDOW * W, job
                    assert int(state.memory.ml.updates[0]) == LAST_WINDOW, f"{job}: each window applied once"
                    assert int(state.cpu.ml.updates[0]) == LAST_WINDOW, job
                windows_of: dict[str, set[int]] = defaultdict(set)
                for rs in recs.messages:
                    windows_of[rs.job_id].add(rs.window_end_ms)
                for job in job_ids:  # no window without a recommendation, whichever worker made it
                    assert windows_of[job] == {T0 + (k + 1) * W for k in range(LAST_WINDOW)}, job

                # -- exactly one master actuates at any time ---------------------------
                published = [
                    (r, a)
                    for r, a in zip(actuations.records, actuations.messages, strict=True)
                    if a.idempotency_key != stale.idempotency_key
                ]
                holder_of: dict[int, set[str]] = defaultdict(set)
                for _, a in published:
                    holder_of[a.fencing_token].add(a.leader_id)
                assert all(len(h) == 1 for h in holder_of.values()), holder_of
                assert holder_of[first.token] == {first.holder}
                assert holder_of[second.token] == {second.holder}
                by_partition: dict[int, list[int]] = defaultdict(list)
                for record, a in sorted(published, key=lambda p: (p[0].partition, p[0].offset)):
                    by_partition[record.partition].append(a.fencing_token)
                for partition, tokens in by_partition.items():
                    assert tokens == sorted(tokens), f"tokens went back on actuations/{partition}: {tokens}"

                async def all_settled() -> dict[str, actuation_pb2.ActuationResult] | None:
                    results = {}
                    for a in list(actuations.messages):
                        result = await act.results.result(a.idempotency_key)
                        if result is None:
                            return None
                        results[a.idempotency_key] = result
                    return results

                results = await eventually(all_settled, 30, "every actuation settled")
                token_of = {a.idempotency_key: a.fencing_token for a in actuations.messages}
                applied = sorted(
                    (r for r in results.values() if r.outcome == APPLIED), key=lambda r: r.log_sequence
                )
                applied_tokens = [token_of[r.idempotency_key] for r in applied]
                assert applied_tokens == sorted(applied_tokens), (
                    f"applied out of token order: {applied_tokens}"
                )
                assert {first.token, second.token} <= set(applied_tokens)
                fenced = [r for r in results.values() if r.outcome == FENCED]
                assert act.outcomes["fenced"] == len(fenced) >= 1
                assert all(token_of[r.idempotency_key] < max(applied_tokens) for r in fenced)
                for job in job_ids:
                    assert (await job_status(client, job)).spec.task.limits.cpu_millicores > 1
            await client.close()
    except BaseException:
        for process in processes:
            print(f"--- {process.name}\n{process.log_tail()}")
        for master in masters:
            print(f"--- {master.replica_id}: {master.log_path}")
        raise
    finally:
        for process in processes:
            process.stop()
        for master in masters:
            master.stop()
        await db.close()
        await redis.aclose()


async def _true(value: bool) -> bool:
    return value


async def _newer(leader: Any, token: int) -> Leadership | None:
    current: Leadership | None = await leader()
    return current if current is not None and current.token > token else None


async def _saved_states(redis: aioredis.Redis, prefix: str) -> dict[str, RecommenderState]:
    states: dict[str, RecommenderState] = {}
    for p in range(HISTOGRAM_PARTITIONS):
        raw = await redis.hgetall(f"{prefix}:p{p}:jobs")
        states.update({reply_text(k): RecommenderState.from_bytes(reply_bytes(v)) for k, v in raw.items()})
    return states
