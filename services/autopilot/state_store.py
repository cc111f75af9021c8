"""What the Autopilot master keeps in Redis, so every replica can answer reads and a newly
elected leader continues where the last one stopped.

Keys (``<p>`` is the configured prefix):

* ``<p>:cand:<job>``: hash ``<resource>|<recommender label>`` -> latest ``Recommendation``;
* ``<p>:horiz:<job>``: hash ``builtin`` or ``custom:<name>`` -> latest ``HorizontalRecommendation``
  (the fields the master reads: id, job, recommender, r_S or n_r, window end);
* ``<p>:view``: hash job -> the latest ``JobRecommendations`` (what Get/List answer);
* ``<p>:memory``: hash job -> the decision memory (:mod:`cellpilot.autopilot.job_memory_codec`);
* ``<p>:recommenders``: hash name -> ``RecommenderInfo`` of a registered custom recommender;
* ``<p>:offsets``: hash ``<topic>/<partition>`` -> position in ``recommendations``: the next
  offset to apply and the last applied record's fingerprint (``LogPosition.encode``).

The master holds them as the core's types — a job's recommender outputs as a
:class:`~cellpilot.autopilot.job_inputs.JobInputs`, its memory as a
:class:`~cellpilot.autopilot.decisions.JobMemory` — converted here, on the way in and out, by
``convert`` (docs/architecture.md rule 2). The view stays the API's message: it is what every
replica answers with.

Every write of the leader goes through one Lua script that first checks the lock still
holds the leader's token, and applies the whole batch (state and consumed offsets)
atomically: a deposed leader's writes are refused, and after a crash the offsets say
exactly which records the stored state already includes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

import redis.asyncio as aioredis
from google.protobuf.message import Message

from cellpilot.api.v1 import autopilot_pb2, recommendation_pb2
from cellpilot.autopilot.decisions import JobMemory
from cellpilot.autopilot.job_inputs import JobInputs
from cellpilot.autopilot.job_memory_codec import decode_memory, encode_memory
from cellpilot.platform.kafka import AppliedOffsets
from cellpilot.platform.redis_client import FencedWrites, reply_bytes, reply_text, write_fenced
from cellpilot_services.autopilot import convert

M = TypeVar("M", bound=Message)


def _parsed(kind: type[M], raw: bytes | str) -> M:
    """The ``kind`` message a Redis reply holds (its serialised bytes)."""
    message = kind()
    message.ParseFromString(reply_bytes(raw))
    return message


class StateStore:
    def __init__(self, redis: aioredis.Redis, prefix: str, lock_key: str) -> None:
        self.redis = redis
        self.prefix = prefix
        self.lock_key = lock_key
        self.view_key = f"{prefix}:view"
        self.memory_key = f"{prefix}:memory"
        self.recommenders_key = f"{prefix}:recommenders"
        self.offsets_key = f"{prefix}:offsets"

    def candidates_key(self, job_id: str) -> str:
        return f"{self.prefix}:cand:{job_id}"

    def horizontal_key(self, job_id: str) -> str:
        return f"{self.prefix}:horiz:{job_id}"

    # ------------------------------------------------------------------ writes
    async def commit(self, writes: FencedWrites, lock_value: str, chunk: int = 2_000) -> bool:
        """Apply ``writes`` if the lock still holds ``lock_value``; False = we are deposed.

        Large batches go in chunks (each fenced); the offsets should be the last chunk's.
        """
        return await write_fenced(self.redis, self.lock_key, lock_value, writes, chunk)

    def put_inputs(self, writes: FencedWrites, job_id: str, inputs: JobInputs) -> None:
        """Store (replace) the outputs in ``inputs``, each under its key."""
        for key, candidate in inputs.vertical.items():
            writes.hset(
                self.candidates_key(job_id), key, convert.candidate_out(candidate).SerializeToString()
            )
        for label, signal in inputs.horizontal.items():
            message = convert.horizontal_input_out(signal, job_id)
            writes.hset(self.horizontal_key(job_id), label, message.SerializeToString())

    def put_memory(self, writes: FencedWrites, job_id: str, memory: JobMemory) -> None:
        writes.hset(self.memory_key, job_id, encode_memory(memory))

    def put_offsets(self, writes: FencedWrites, offsets: AppliedOffsets) -> None:
        for name, position in offsets.to_mapping().items():
            writes.hset(self.offsets_key, name, position.encode())

    # ------------------------------------------------------------------ reads
    async def offsets(self) -> AppliedOffsets:
        raw = await self.redis.hgetall(self.offsets_key)
        return AppliedOffsets.from_mapping({reply_text(k): reply_text(v) for k, v in raw.items()})

    async def memory(self, job_id: str) -> JobMemory | None:
        raw = await self.redis.hget(self.memory_key, job_id)
        return None if raw is None else decode_memory(reply_bytes(raw))

    async def _hash_values(self, key: str, kind: type[M]) -> list[M]:
        """The messages of a hash, in the order of their fields."""
        raw = await self.redis.hgetall(key)
        return [_parsed(kind, value) for _, value in sorted(raw.items())]

    async def inputs(self, job_id: str) -> JobInputs:
        """The stored outputs of the job's recommenders (what the core cannot use is left out)."""
        vertical = await self._hash_values(self.candidates_key(job_id), recommendation_pb2.Recommendation)
        horizontal = await self._hash_values(
            self.horizontal_key(job_id), recommendation_pb2.HorizontalRecommendation
        )
        return JobInputs.of(
            (c for c in map(convert.candidate_in, vertical) if c is not None),
            (h for h in map(convert.horizontal_input_in, horizontal) if h is not None),
        )

    async def has_candidates(self, job_id: str) -> bool:
        return bool(await self.redis.exists(self.candidates_key(job_id), self.horizontal_key(job_id)))

    async def view(self, job_id: str) -> autopilot_pb2.JobRecommendations | None:
        raw = await self.redis.hget(self.view_key, job_id)
        return None if raw is None else _parsed(autopilot_pb2.JobRecommendations, raw)

    async def view_ids(self) -> list[str]:
        return sorted(reply_text(k) for k in await self.redis.hkeys(self.view_key))

    async def views(self, job_ids: Iterable[str]) -> list[autopilot_pb2.JobRecommendations]:
        ids = list(job_ids)
        if not ids:
            return []
        replies = await self.redis.hmget(self.view_key, ids)
        return [_parsed(autopilot_pb2.JobRecommendations, raw) for raw in replies if raw is not None]

    async def recommenders(self) -> dict[str, autopilot_pb2.RecommenderInfo]:
        raw = await self.redis.hgetall(self.recommenders_key)
        return {
            reply_text(name): _parsed(autopilot_pb2.RecommenderInfo, value) for name, value in raw.items()
        }
