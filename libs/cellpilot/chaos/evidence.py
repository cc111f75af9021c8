"""What the stores of a chaos run hold: the Borgmaster's checkpoint log, the aggregator's tables,
the recommenders' and Autopilot's state in Redis, and the consumers' log lines.

The checkpoint log (Borg §3.1) is the ground truth for what was applied: every actuation the
Borgmaster applied is a ``job_updated`` record carrying the Autopilot master's fencing token and
the actuation's idempotency key as its request id; every machine marked DOWN is a
``machine_state_changed`` record. Reads here open a connection per call, so they work across a
restart of PostgreSQL or Redis (the caller retries while the store is away).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import asyncpg

from cellpilot.api.v1 import checkpoint_pb2, machine_pb2
from cellpilot.autopilot.job_recommendations import RecommenderState
from cellpilot.chaos.forger import FORGED_JOB
from cellpilot.platform import redis_keys
from cellpilot.platform.leadership import Leadership
from cellpilot.platform.postgres import asyncpg_dsn
from cellpilot.platform.redis_client import connect_redis, reply_bytes, reply_text
from cellpilot.platform.topics import TOPICS
from cellpilot.stack import StackEndpoints

CONNECT_TIMEOUT_S = 5.0
CPU, MEMORY = 1, 2  # cellpilot.api.v1.Resource, as usage_job_histograms stores it
RESET_MESSAGE = "is not the one applied"


AUTOPILOT_PREFIX = redis_keys.AUTOPILOT_PREFIX
ACTUATOR_PREFIX = redis_keys.ACTUATOR_PREFIX
# The recommenders' consumer group is the one committing on usage.histograms (topics.py).
RECOMMENDER_GROUP = next(t.committing_groups[0] for t in TOPICS if t.name == "usage.histograms")
RECOMMENDER_STATE = f"{redis_keys.RECOMMENDER_PREFIX}:{RECOMMENDER_GROUP}"
HISTOGRAM_PARTITIONS = next(t.partitions for t in TOPICS if t.name == "usage.histograms")


@dataclass(frozen=True)
class LoggedActuation:
    """A ``job_updated`` checkpoint record with a fencing token: an actuation the Borgmaster applied."""

    seq: int
    appended_at: float  # wall-clock seconds (PostgreSQL's now() at the append)
    job_id: str
    fencing_token: int
    request_id: str


@dataclass(frozen=True)
class MachineMarkedDown:
    seq: int
    appended_at: float
    machine_id: str
    detail: str


@dataclass(frozen=True)
class LoggedLogReset:
    """A consumer's WARNING that the broker's log of a partition is not the one it applied."""

    service_log: str
    at: float  # wall-clock seconds
    topic: str
    partition: int
    stored_offset: int
    log_end: int


@dataclass
class StoreEvidence:
    actuations: list[LoggedActuation] = field(default_factory=list)
    machines_down: list[MachineMarkedDown] = field(default_factory=list)
    # (job, resource) -> window ends of the job histograms the aggregator published
    published_windows: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    # (job, resource) -> (windows the recommender applied, end of the newest applied)
    recommender_windows: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    closed_through_ms: int | None = None  # every job window ending at or before it is summed
    aggregated_samples: int = 0  # samples in the closed task windows ending by closed_through_ms
    accepted_samples: int = 0
    late_samples: int = 0
    duplicate_batches: int = 0
    autopilot_fencing_counter: int = 0  # the INCR counter behind every Autopilot master's token
    actuator_highest_token: int = 0
    actuator_replays: int = 0  # redelivered actuations the actuator settled as no-ops
    forged_job_windows: int = 0  # the aggregator's task and job windows of the forger's job
    forged_job_candidates: int = 0  # Autopilot's recommendation candidates for the forger's job


async def _connect(endpoints: StackEndpoints) -> asyncpg.Connection:
    return await asyncpg.connect(asyncpg_dsn(endpoints.postgres_url), timeout=CONNECT_TIMEOUT_S)


async def borgmaster_master(endpoints: StackEndpoints) -> tuple[int, int]:
    """The replica index of the Borgmaster master holding the lease now, and its epoch."""
    conn = await _connect(endpoints)
    try:
        row = await conn.fetchrow(
            "SELECT holder, epoch FROM leader_lease WHERE name = 'borgmaster' AND expires_at > now()"
        )
    finally:
        await conn.close()
    if row is None:
        raise LookupError("no Borgmaster master holds the lease")
    return int(str(row["holder"]).rsplit("-", 1)[1]), int(row["epoch"])


async def autopilot_master(endpoints: StackEndpoints) -> Leadership:
    redis = connect_redis(endpoints.redis_url)
    try:
        raw = await redis.get(f"{AUTOPILOT_PREFIX}:leader")
    finally:
        await redis.aclose()
    if raw is None:
        raise LookupError("no Autopilot master holds the lock")
    return Leadership.parse(reply_text(raw))


def replica_of(replica_id: str) -> int:
    return int(replica_id.rsplit("-", 1)[1])


async def logged_actuations(endpoints: StackEndpoints, after_seq: int = 0) -> list[LoggedActuation]:
    """Every actuation the Borgmaster applied after log position ``after_seq``, in log order."""
    conn = await _connect(endpoints)
    try:
        rows = await conn.fetch(
            "SELECT seq, record, extract(epoch FROM appended_at) AS at FROM checkpoint_log"
            " WHERE kind = 'job_updated' AND seq > $1 ORDER BY seq",
            after_seq,
        )
    finally:
        await conn.close()
    out = []
    for row in rows:
        record = checkpoint_pb2.CheckpointRecord.FromString(row["record"])
        update = record.job_updated
        if update.fencing_token > 0:
            out.append(
                LoggedActuation(
                    int(row["seq"]), float(row["at"]), update.job_id, update.fencing_token, record.request_id
                )
            )
    return out


async def machines_marked_down(endpoints: StackEndpoints) -> list[MachineMarkedDown]:
    conn = await _connect(endpoints)
    try:
        rows = await conn.fetch(
            "SELECT seq, record, extract(epoch FROM appended_at) AS at FROM checkpoint_log"
            " WHERE kind = 'machine_state_changed' ORDER BY seq"
        )
    finally:
        await conn.close()
    down = []
    for row in rows:
        change = checkpoint_pb2.CheckpointRecord.FromString(row["record"]).machine_state_changed
        if change.state == machine_pb2.MACHINE_STATE_DOWN:
            down.append(
                MachineMarkedDown(int(row["seq"]), float(row["at"]), change.machine_id, change.detail)
            )
    return down


async def _aggregator_tables(endpoints: StackEndpoints, evidence: StoreEvidence) -> None:
    conn = await _connect(endpoints)
    try:
        evidence.closed_through_ms = await conn.fetchval(
            "SELECT closed_through_ms FROM aggregator_progress WHERE name = 'jobs'"
        )
        for row in await conn.fetch(
            "SELECT job_id, resource, array_agg(window_end_ms ORDER BY window_end_ms) AS ends"
            " FROM usage_job_histograms WHERE published GROUP BY job_id, resource"
        ):
            evidence.published_windows[(str(row["job_id"]), int(row["resource"]))] = [
                int(e) for e in row["ends"]
            ]
        totals = await conn.fetchrow(
            "SELECT coalesce(sum(accepted_samples), 0) AS accepted, coalesce(sum(late_samples), 0) AS late,"
            " coalesce(sum(duplicate_batches), 0) AS duplicates FROM aggregator_partitions"
            " WHERE topic = 'usage.samples'"
        )
        evidence.accepted_samples = int(totals["accepted"])
        evidence.late_samples = int(totals["late"])
        evidence.duplicate_batches = int(totals["duplicates"])
        evidence.forged_job_windows = int(
            await conn.fetchval(
                "SELECT (SELECT count(*) FROM usage_task_windows WHERE job_id = $1)"
                " + (SELECT count(*) FROM usage_job_histograms WHERE job_id = $1)",
                FORGED_JOB,
            )
        )
        if evidence.closed_through_ms is not None:
            evidence.aggregated_samples = int(
                await conn.fetchval(
                    "SELECT coalesce(sum(sample_count), 0) FROM usage_task_windows WHERE window_end_ms <= $1",
                    evidence.closed_through_ms,
                )
            )
    finally:
        await conn.close()


async def _redis_state(endpoints: StackEndpoints, evidence: StoreEvidence) -> None:
    redis = connect_redis(endpoints.redis_url)
    try:
        for partition in range(HISTOGRAM_PARTITIONS):
            for job_id, raw in (await redis.hgetall(f"{RECOMMENDER_STATE}:p{partition}:jobs")).items():
                state = RecommenderState.from_bytes(reply_bytes(raw))
                job = reply_text(job_id)
                for resource, candidates in ((CPU, state.cpu), (MEMORY, state.memory)):
                    evidence.recommender_windows[(job, resource)] = (
                        int(candidates.ml.updates[0]),
                        int(candidates.last_end_ms[0]),
                    )
        evidence.autopilot_fencing_counter = int(await redis.get(f"{AUTOPILOT_PREFIX}:fencing") or 0)
        evidence.actuator_highest_token = int(await redis.get(f"{ACTUATOR_PREFIX}:highest_token") or 0)
        evidence.forged_job_candidates = int(await redis.hlen(f"{AUTOPILOT_PREFIX}:cand:{FORGED_JOB}"))
        replays = await redis.hgetall(f"{ACTUATOR_PREFIX}:replays")
        evidence.actuator_replays = sum(int(reply_text(v)) for v in replays.values())
    finally:
        await redis.aclose()


async def read_stores(endpoints: StackEndpoints) -> StoreEvidence:
    evidence = StoreEvidence(
        actuations=await logged_actuations(endpoints), machines_down=await machines_marked_down(endpoints)
    )
    await _aggregator_tables(endpoints, evidence)
    await _redis_state(endpoints, evidence)
    return evidence


def logged_log_resets(paths: list[Path]) -> list[LoggedLogReset]:
    """Every "the log of ... is not the one applied" WARNING in the services' JSON logs."""
    resets = []
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            if RESET_MESSAGE not in line or not line.startswith("{"):
                continue
            try:
                entry = json.loads(line)
                at = datetime.strptime(entry["ts"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=None)
                resets.append(
                    LoggedLogReset(
                        path.stem,
                        (at - datetime(1970, 1, 1)).total_seconds(),
                        str(entry["topic"]),
                        int(entry["partition"]),
                        int(entry["stored_offset"]),
                        int(entry["log_end"]),
                    )
                )
            except (KeyError, ValueError):
                continue
    return sorted(resets, key=lambda r: r.at)
