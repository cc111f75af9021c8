"""The Autopilot master's Redis state keeps its format: what a master that kept the wire messages
themselves stored (each recommender's ``Recommendation`` and ``HorizontalRecommendation`` as it
arrived on ``recommendations``) reads into the core's types, and is written back byte for byte."""

from __future__ import annotations

import uuid

import numpy as np

from cellpilot.api.v1 import job_pb2, recommendation_pb2
from cellpilot.autopilot.decisions import JobMemory, SentTarget
from cellpilot.autopilot.job_memory_codec import encode_memory
from cellpilot.autopilot.job_recommendations import (
    HistogramInput,
    RecommenderConfig,
    RecommenderState,
    apply_histograms,
)
from cellpilot.platform.redis_client import FencedWrites, connect_redis
from cellpilot.stack import StackEndpoints
from cellpilot.units import GIB
from cellpilot.usage.buckets import Resource
from cellpilot_services.autopilot import convert
from cellpilot_services.autopilot.state_store import StateStore
from cellpilot_services.recommender.convert import recommendation_set

JOB = "u/web"
W = 300_000


def _worker_output() -> recommendation_pb2.RecommendationSet:
    """A recommender worker's set after three windows, built by the worker's own code."""
    config = RecommenderConfig()
    states: dict[str, RecommenderState] = {}
    inputs = []
    for k in range(3):
        for resource, level in ((Resource.CPU, 800.0), (Resource.MEMORY, float(GIB))):
            scheme = config.for_resource(resource).scheme
            counts = np.zeros(scheme.size)
            counts[scheme.index_of(np.array([level * (1 + 0.1 * k)]))] = 10.0
            inputs.append(HistogramInput(JOB, resource, (k + 1) * W, counts, level))
    apply_histograms(config, states, inputs)
    return recommendation_set(JOB, states[JOB], 3 * W, "worker-0", config)


async def test_the_state_a_master_stored_as_wire_messages_reads_and_writes_back_the_same(
    endpoints: StackEndpoints,
) -> None:
    prefix = f"ap-format-{uuid.uuid4().hex[:8]}"
    redis = connect_redis(endpoints.redis_url)
    store = StateStore(redis, prefix, lock_key=f"{prefix}:leader")
    try:
        worker = _worker_output()
        custom = recommendation_pb2.HorizontalRecommendation(
            recommendation_id=f"{JOB}/tasks/custom:sizer/{3 * W}",
            job_id=JOB,
            recommender=job_pb2.RecommenderRef(kind=job_pb2.RECOMMENDER_KIND_CUSTOM, custom_name="sizer"),
            raw_task_count=6.5,
            window_end_ms=3 * W,
        )
        # As the master stored them before it held them as the core's types: the messages as
        # they arrived, under "<resource>|<recommender label>" and the horizontal source's label.
        # (A worker's recommendation id is "<job>/<resource>/<recommender>/<window end>".)
        old_vertical = {}
        for rec in worker.vertical:
            _, resource, recommender, _ = rec.recommendation_id.rsplit("/", 3)
            old_vertical[f"{resource}|{recommender}".encode()] = rec.SerializeToString()
        old_horizontal = {
            b"builtin": worker.horizontal[0].SerializeToString(),
            b"custom:sizer": custom.SerializeToString(),
        }
        memory = JobMemory(cpu=SentTarget(700.0, 3 * W, "key-1"))
        await redis.hset(store.candidates_key(JOB), mapping=old_vertical)
        await redis.hset(store.horizontal_key(JOB), mapping=old_horizontal)
        await redis.hset(store.memory_key, JOB, encode_memory(memory))

        inputs = await store.inputs(JOB)
        assert inputs.vertical == {c.key: c for c in convert.candidates_in(worker)}
        assert len(inputs.vertical) == len(worker.vertical) == 14
        assert inputs.horizontal["builtin"].usage_statistic == worker.horizontal[0].usage_statistic
        assert (
            inputs.horizontal["custom:sizer"].producer,
            inputs.horizontal["custom:sizer"].raw_task_count,
        ) == (
            "sizer",
            6.5,
        )
        assert await store.memory(JOB) == memory

        await redis.set(store.lock_key, "token-1")
        writes = FencedWrites()
        store.put_inputs(writes, JOB, inputs)
        store.put_memory(writes, JOB, memory)
        assert await store.commit(writes, "token-1")
        assert await redis.hgetall(store.candidates_key(JOB)) == old_vertical
        assert await redis.hgetall(store.horizontal_key(JOB)) == old_horizontal
        assert await redis.hget(store.memory_key, JOB) == encode_memory(memory)
    finally:
        keys = [k async for k in redis.scan_iter(match=f"{prefix}:*")]
        if keys:
            await redis.delete(*keys)
        await redis.aclose()
