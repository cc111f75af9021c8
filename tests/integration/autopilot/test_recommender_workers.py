"""Three recommender workers on the embedded stack: a kill mid-stream, a malformed record, an OOM.

Job histograms go onto a fresh ``usage.histograms`` topic in event time; midway one of
the three workers is SIGKILLed and the others take over its partitions from the Redis
checkpoints. Every window of every job must be published (no gap) with the values of a
reference computed in-process from the same windows, and each job's checkpointed state
must equal the reference exactly (the ML ensemble counts its updates: a window applied
twice would show). A malformed record goes to the dead-letter topic and the stream goes
on (a malformed ``borg.events`` record, read by every worker, is counted and skipped);
an OOM event on ``borg.events`` raises the job's memory recommendations at once.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import redis.asyncio as aioredis
from autopilot_processes import ServiceProcess, new_topics, read_all, stop_all, wait_for
from stream_writers import StreamWriter

from cellpilot.api.v1 import recommendation_pb2, resources_pb2, state_pb2, usage_pb2
from cellpilot.autopilot.job_recommendations import (
    HistogramInput,
    RecommenderState,
    apply_histograms,
)
from cellpilot.autopilot.ml_config import shipped_recommender_config
from cellpilot.platform.kafka import DEADLETTER_TOPIC
from cellpilot.platform.redis_client import reply_bytes, reply_text
from cellpilot.stack import StackEndpoints
from cellpilot.stack.config import free_port
from cellpilot.units import GIB
from cellpilot.usage.buckets import Resource

pytestmark = pytest.mark.slow  # started first (tests/conftest.py)

W = 300_000
T0 = 5_666_666 * W
JOBS = {f"svc/{i}": 0.3 + 0.4 * i for i in range(8)}
WINDOWS = 10
KILL_AFTER = 5
CONFIG = shipped_recommender_config()  # what the workers load
CODES = {Resource.CPU: resources_pb2.RESOURCE_CPU, Resource.MEMORY: resources_pb2.RESOURCE_MEMORY}


def histogram(job: str, resource: Resource, k: int) -> tuple[usage_pb2.UsageHistogram, HistogramInput]:
    """Window k of a job (a step up halfway), as the aggregator publishes it and as the core sees it."""
    scheme = CONFIG.for_resource(resource).scheme
    rng = np.random.default_rng(abs(hash((job, resource.value, k))) % 2**32)
    unit = GIB if resource is Resource.MEMORY else 1000.0  # JOBS in cores / GiB; CPU in millicores
    level = JOBS[job] * (1.6 if k >= WINDOWS // 2 else 1.0) * unit
    values = level * rng.lognormal(0.0, 0.15, 60)
    counts = np.zeros(scheme.size)
    np.add.at(counts, scheme.index_of(values), 1.0)
    nonzero = np.flatnonzero(counts)
    end = T0 + (k + 1) * W
    message = usage_pb2.UsageHistogram(
        job_id=job,
        resource=CODES[resource],  # type: ignore[arg-type]
        window_start_ms=end - W,
        window_end_ms=end,
        bucket_scheme_id=scheme.scheme_id,
        bucket_scheme_version=scheme.version,
        bucket_indices=nonzero.tolist(),
        counts=[int(c) for c in counts[nonzero]],
        peak=float(values.max()),
        mean_total_usage=float(values.mean()),
        sample_count=60,
        task_count=1,
    )
    return message, HistogramInput(job, resource, end, counts, float(values.mean()))


async def saved_states(redis: aioredis.Redis, prefix: str) -> dict[str, RecommenderState]:
    states: dict[str, RecommenderState] = {}
    for p in range(6):
        raw = await redis.hgetall(f"{prefix}:p{p}:jobs")
        states.update({reply_text(k): RecommenderState.from_bytes(reply_bytes(v)) for k, v in raw.items()})
    return states


async def test_workers_resume_after_a_kill_without_gap_or_double_apply_and_react_to_an_oom(
    endpoints: StackEndpoints,
) -> None:
    histograms_topic, recommendations_topic, events_topic = await new_topics(
        endpoints.kafka_bootstrap, ("usage.histograms", 6), ("recommendations", 6), ("borg.events", 3)
    )
    group = f"rec-{uuid.uuid4().hex[:8]}"
    prefix = f"test:recommender:{uuid.uuid4().hex[:8]}"
    env = {
        "CELLPILOT_RECOMMENDER_HISTOGRAMS_TOPIC": histograms_topic,
        "CELLPILOT_RECOMMENDER_RECOMMENDATIONS_TOPIC": recommendations_topic,
        "CELLPILOT_RECOMMENDER_EVENTS_TOPIC": events_topic,
        "CELLPILOT_RECOMMENDER_CONSUMER_GROUP": group,
        "CELLPILOT_RECOMMENDER_STATE_PREFIX": prefix,
        "CELLPILOT_RECOMMENDER_METRICS_PORT": "0",
    }
    workers = [
        ServiceProcess(
            "recommender",
            f"recommender-{i}",
            {
                **env,
                "CELLPILOT_RECOMMENDER_REPLICA_INDEX": str(i),
                "CELLPILOT_RECOMMENDER_PORT": str(free_port()),
            },
            endpoints,
        )
        for i in range(3)
    ]
    redis = aioredis.Redis.from_url(endpoints.redis_url)
    producer = StreamWriter(endpoints.kafka_bootstrap)
    await producer.start()
    reference: dict[str, RecommenderState] = {}
    expected_sets: dict[tuple[str, int], RecommenderState] = {}
    state_prefix = f"{prefix}:{group}"
    try:

        async def send_windows(first: int, last: int) -> None:
            for k in range(first, last):
                for job in JOBS:
                    for resource in (Resource.CPU, Resource.MEMORY):
                        message, item = histogram(job, resource, k)
                        await producer.send(histograms_topic, job, message)
                        apply_histograms(CONFIG, reference, [item])
                    expected_sets[(job, T0 + (k + 1) * W)] = reference[job]

        async def applied_through(k: int) -> bool:
            states = await saved_states(redis, state_prefix)
            end = T0 + (k + 1) * W
            return len(states) == len(JOBS) and all(s.complete_window_ms == end for s in states.values())

        await send_windows(0, 2)
        await producer.send_raw(histograms_topic, "svc/0", b"\xff\x00 not a histogram")
        await send_windows(2, KILL_AFTER)
        await wait_for(lambda: applied_through(KILL_AFTER - 1), 60, "the first windows applied")
        workers[0].kill()
        await send_windows(KILL_AFTER, WINDOWS)
        await wait_for(lambda: applied_through(WINDOWS - 1), 60, "every window applied after the kill")

        states = await saved_states(redis, state_prefix)
        for job, state in reference.items():
            saved = states[job]
            assert saved.cpu.equals(state.cpu), job
            assert saved.memory.equals(state.memory), job
            np.testing.assert_array_equal(saved.signal.samples, state.signal.samples)
            np.testing.assert_allclose(saved.signal.sums, state.signal.sums, rtol=1e-12)
            assert int(saved.memory.ml.updates[0]) == WINDOWS, "each window applied exactly once"

        oom_job = "svc/3"
        # Whole bytes, as the event carries them (a fractional limit would be truncated below).
        limit = float(int(np.nanmax(reference[oom_job].rows[Resource.MEMORY].value)))
        oom = state_pb2.BorgEvent(
            task=state_pb2.TaskEvent(
                job_id=oom_job,
                task_index=0,
                kind=state_pb2.TASK_EVENT_KIND_OOM,
                event_time_ms=T0 + WINDOWS * W + 1_000,
            )
        )
        oom.task.limits.memory_bytes = int(limit)
        oom.task.usage.memory_bytes = int(limit)
        # A poison record on borg.events first: every worker counts and skips it, and goes on.
        await producer.send_raw(events_topic, oom_job, b"\xff\x00 not a BorgEvent")
        await producer.send(events_topic, oom_job, oom)

        async def oom_published() -> list[recommendation_pb2.RecommendationSet]:
            records = await read_all(endpoints.kafka_bootstrap, recommendations_topic, idle_s=1.0)
            sets = [r.decode(recommendation_pb2.RecommendationSet) for r in records]
            bumped = [s for s in sets if any(v.explanation.note for v in s.vertical)]
            return sets if bumped else []

        sets = await wait_for(oom_published, 40, "a recommendation set reacting to the OOM", every_s=1.0)
        seen: dict[tuple[str, int], recommendation_pb2.RecommendationSet] = {}
        for rs in sets:
            if any(v.explanation.note for v in rs.vertical):
                memory = [v for v in rs.vertical if v.resource == resources_pb2.RESOURCE_MEMORY]
                assert rs.job_id == oom_job
                assert len(memory) == 7
                assert all(v.value >= limit * (1 + CONFIG.memory.oom_bump) - 1 for v in memory)
                continue
            key = (rs.job_id, rs.window_end_ms)
            if key in seen:  # re-published after the kill: the same content
                assert [v.value for v in seen[key].vertical] == [v.value for v in rs.vertical]
            seen[key] = rs
        assert set(seen) == set(expected_sets), "one set per job and window: none missing, none invented"
        for key, rs in seen.items():
            want = expected_sets[key]
            for v in rs.vertical:
                resource = Resource.CPU if v.resource == resources_pb2.RESOURCE_CPU else Resource.MEMORY
                column = v.recommender.kind - 2  # RecommenderKind MOVING_WINDOW_MAX = 2 .. ML = 8
                expected = want.rows[resource].value[column]
                assert v.value == round(expected), (key, v.recommendation_id)
                assert v.window_end_ms == key[1]
            assert len(rs.horizontal) == 1
            assert rs.horizontal[0].usage_statistic > 0

        letters = await read_all(endpoints.kafka_bootstrap, DEADLETTER_TOPIC, idle_s=1.0)
        ours = [r for r in letters if dict(r.headers).get("source-topic") == histograms_topic.encode()]
        assert len(ours) == 1
        assert ours[0].value == b"\xff\x00 not a histogram"
        assert b"UsageHistogram" in dict(ours[0].headers)["reason"]
        assert not [r for r in letters if dict(r.headers).get("source-topic") == events_topic.encode()]
        survivors = [w for w in workers if w.alive]
        assert survivors
        for worker in survivors:  # each reads all of borg.events, so each skipped the poison once
            assert "skipped a malformed borg.events record" in worker.log_path.read_text(), worker.name
    except BaseException:
        for worker in workers:
            print(f"--- {worker.name}\n{worker.log_tail()}")
        raise
    finally:
        await producer.stop()
        await redis.aclose()
        stop_all(workers)
