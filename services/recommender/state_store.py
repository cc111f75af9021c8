"""Checkpoints of the recommender workers in Redis, fenced per ``usage.histograms`` partition.

Per partition ``p`` (keys ``<prefix>:<group>:p<p>:...``):

* ``epoch``: bumped (INCR) by a worker claiming the partition; the fencing token;
* ``offsets``: the :class:`~cellpilot.platform.kafka.AppliedOffsets` of the partition's
  state (its ``usage.histograms`` partition and every ``borg.events`` partition), JSON;
* ``jobs``: a hash job id -> :class:`~cellpilot.autopilot.job_recommendations.RecommenderState` bytes.

A save writes the changed jobs and the offsets in one fenced write that first checks the
epoch (:func:`cellpilot.platform.redis_client.write_fenced`), so state and offsets move
together (a successor resumes without a gap or a double apply) and a deposed worker can
never write (docs/architecture.md rule 7).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import redis.asyncio as aioredis

from cellpilot.autopilot.job_recommendations import RecommenderState
from cellpilot.platform.kafka import AppliedOffsets
from cellpilot.platform.redis_client import FencedWrites, reply_bytes, reply_text, write_fenced


@dataclass
class PartitionCheckpoint:
    epoch: int
    offsets: AppliedOffsets
    jobs: dict[str, RecommenderState]


class StateStore:
    def __init__(self, redis: aioredis.Redis, prefix: str, group: str) -> None:
        self.redis = redis
        self.prefix = f"{prefix}:{group}"

    def _keys(self, partition: int) -> tuple[str, str, str]:
        base = f"{self.prefix}:p{partition}"
        return f"{base}:epoch", f"{base}:offsets", f"{base}:jobs"

    async def claim(self, partition: int) -> PartitionCheckpoint:
        """A new epoch for the partition and the state to resume from."""
        epoch_key, offsets_key, jobs_key = self._keys(partition)
        epoch = int(await self.redis.incr(epoch_key))
        raw_offsets = await self.redis.get(offsets_key)
        offsets = (
            AppliedOffsets.from_mapping(json.loads(reply_text(raw_offsets)))
            if raw_offsets is not None
            else AppliedOffsets()
        )
        raw_jobs = await self.redis.hgetall(jobs_key)
        jobs = {reply_text(k): RecommenderState.from_bytes(reply_bytes(v)) for k, v in raw_jobs.items()}
        return PartitionCheckpoint(epoch, offsets, jobs)

    async def save(
        self, partition: int, epoch: int, offsets: AppliedOffsets, jobs: Mapping[str, RecommenderState]
    ) -> bool:
        """Write the changed jobs and the offsets atomically; False if another epoch owns it."""
        epoch_key, offsets_key, jobs_key = self._keys(partition)
        writes = FencedWrites()
        writes.set(offsets_key, json.dumps(offsets.to_mapping()))
        for job_id, state in jobs.items():
            writes.hset(jobs_key, job_id, state.to_bytes())
        return await write_fenced(self.redis, epoch_key, str(epoch), writes)
