"""The aggregator's PostgreSQL tables (``infra/migrations/0010_autopilot_usage_history.sql``).

Partition checkpoints are fenced (docs/architecture.md rule 7): a replica that takes a
``usage.samples`` partition bumps its ``owner_epoch``, and every later checkpoint of it is
written only while the epoch is still the one claimed, in the same transaction as the
windows it closes. So a deposed owner can never write, and a window's task rows are
written exactly once with the offset that follows them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg

from cellpilot.platform.postgres import (
    CONNECT_TIMEOUT_S,
    STATEMENT_TIMEOUT_S,
    asyncpg_dsn,
    init_asyncpg_connection,
)
from cellpilot_services.aggregator.convert import (
    JOB_HISTOGRAM_COLUMNS,
    JOB_HISTOGRAM_TYPES,
    TASK_WINDOW_COLUMNS,
    TASK_WINDOW_TYPES,
)


class FencedError(Exception):
    """A partition write by an owner whose epoch was superseded."""


JOB_STAGE_LOCK = 0x41675374  # advisory lock: one replica sums job windows at a time
OUTBOX_LOCK = 0x4167504F  # and one publishes them


def _unnest_insert(table: str, columns: Sequence[str], types: Sequence[str]) -> str:
    params = ", ".join(f"${i + 1}::{t}[]" for i, t in enumerate(types))
    return f"INSERT INTO {table} ({', '.join(columns)}) SELECT * FROM unnest({params}) ON CONFLICT DO NOTHING"


_INSERT_TASK_WINDOWS = _unnest_insert("usage_task_windows", TASK_WINDOW_COLUMNS, TASK_WINDOW_TYPES)
_INSERT_JOB_HISTOGRAMS = _unnest_insert("usage_job_histograms", JOB_HISTOGRAM_COLUMNS, JOB_HISTOGRAM_TYPES)


@dataclass(frozen=True)
class WindowPage:
    """A page of one job's or task's windows a Monitoring read asks for: starting at or after
    ``start_ms``, ending by ``end_ms`` (0: any end), after the window starting at ``after_ms``
    (the page token's), at most ``size`` of them."""

    start_ms: int
    end_ms: int
    after_ms: int
    size: int

    def arguments(self) -> tuple[int, int, int, int]:
        """$3 to $6 of :data:`_PAGE_OF_WINDOWS`: one window more than the page holds is read, to
        tell whether another page follows."""
        return (self.start_ms, self.end_ms, self.after_ms, self.size + 1)


_PAGE_OF_WINDOWS = (
    "window_start_ms >= $3 AND ($4 = 0 OR window_end_ms <= $4) AND window_start_ms > $5"
    " ORDER BY window_start_ms LIMIT $6"
)


def _columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    return [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


@dataclass(frozen=True)
class Claim:
    epoch: int
    checkpoint: bytes | None
    next_offset: int
    last_applied: str | None  # fingerprint of the record at next_offset - 1 (RecordFingerprint)
    jobs_closed_through_ms: int | None  # job windows already summed (possibly without us)


_LOCK_JOB_PROGRESS = "SELECT closed_through_ms FROM aggregator_progress WHERE name = 'jobs' FOR SHARE"


@dataclass(frozen=True)
class PartitionProgress:
    """What a checkpoint says about a partition besides its bytes."""

    next_offset: int
    last_applied: str | None
    closed_through_ms: int | None
    watermark_ms: int | None
    idle: bool
    accepted_samples: int
    late_samples: int
    duplicate_batches: int


class HistoryStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @classmethod
    async def connect(cls, url: str, max_size: int = 4) -> HistoryStore:
        pool = await asyncpg.create_pool(
            asyncpg_dsn(url),
            min_size=1,
            max_size=max_size,
            timeout=CONNECT_TIMEOUT_S,
            command_timeout=STATEMENT_TIMEOUT_S,
            init=init_asyncpg_connection,
        )
        return cls(pool)

    async def close(self) -> None:
        await self.pool.close()

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[asyncpg.Connection]:
        async with self.pool.acquire() as conn, conn.transaction():
            yield conn

    # -- partitions --------------------------------------------------------------------

    async def ensure_partitions(self, topic: str, count: int) -> None:
        async with self.pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO aggregator_partitions (topic, partition)"
                " SELECT $1, p FROM generate_series(0, $2 - 1) AS p ON CONFLICT DO NOTHING",
                topic,
                count,
            )
            await conn.execute(
                "INSERT INTO aggregator_progress (name, closed_through_ms) VALUES ('jobs', NULL)"
                " ON CONFLICT DO NOTHING"
            )

    async def claim(self, topic: str, partition: int, owner: str) -> Claim:
        """Take over a partition: a new epoch, and the last checkpoint to resume from.

        The partition becomes active (no longer idle) in a transaction that share-locks the
        job progress row the job stage updates, so the job stage either sees it active or
        has finished summing; the claimer closes what was summed (``jobs_closed_through_ms``).
        """
        async with self.pool.acquire() as conn, conn.transaction():
            jobs_closed = await conn.fetchval(_LOCK_JOB_PROGRESS)
            row = await conn.fetchrow(
                "INSERT INTO aggregator_partitions AS p (topic, partition, owner, owner_epoch)"
                " VALUES ($1, $2, $3, 1)"
                " ON CONFLICT (topic, partition) DO UPDATE"
                " SET owner = $3, owner_epoch = p.owner_epoch + 1, idle = false, updated_at = now()"
                " RETURNING owner_epoch, checkpoint, next_offset, last_applied",
                topic,
                partition,
                owner,
            )
        assert row is not None
        checkpoint = row["checkpoint"]
        return Claim(
            int(row["owner_epoch"]),
            bytes(checkpoint) if checkpoint else None,
            int(row["next_offset"]),
            row["last_applied"],
            None if jobs_closed is None else int(jobs_closed),
        )

    async def reactivate(self, topic: str, partition: int, epoch: int) -> int | None:
        """An idle partition received input: mark it active, serialised with the job stage.

        Returns how far job windows are already summed (windows up to there are closed for
        this partition: their samples are late), or raises :class:`FencedError` if the
        partition was taken over.
        """
        async with self.pool.acquire() as conn, conn.transaction():
            jobs_closed = await conn.fetchval(_LOCK_JOB_PROGRESS)
            updated = await conn.fetchval(
                "UPDATE aggregator_partitions SET idle = false, updated_at = now()"
                " WHERE topic = $1 AND partition = $2 AND owner_epoch = $3 RETURNING owner_epoch",
                topic,
                partition,
                epoch,
            )
        if updated is None:
            raise FencedError(f"{topic}/{partition} is owned by a newer epoch than {epoch}")
        return None if jobs_closed is None else int(jobs_closed)

    async def save(
        self,
        topic: str,
        partition: int,
        epoch: int,
        checkpoint: bytes,
        progress: PartitionProgress,
        closed_rows: Sequence[tuple[Any, ...]],
    ) -> bool:
        """Write the checkpoint and the windows it closed, atomically; False if fenced off."""
        async with self.pool.acquire() as conn, conn.transaction():
            jobs_closed = await conn.fetchval(
                "SELECT closed_through_ms FROM aggregator_progress WHERE name = 'jobs'"
            )
            late = sum(1 for row in closed_rows if row[3] <= jobs_closed) if jobs_closed is not None else 0
            updated = await conn.fetchval(
                "UPDATE aggregator_partitions SET checkpoint = $4, next_offset = $5, closed_through_ms = $6,"
                " watermark_ms = $7, idle = $8, accepted_samples = $9, late_samples = $10,"
                " duplicate_batches = $11, late_task_windows = late_task_windows + $12, last_applied = $13,"
                " updated_at = now()"
                " WHERE topic = $1 AND partition = $2 AND owner_epoch = $3 RETURNING owner_epoch",
                topic,
                partition,
                epoch,
                checkpoint,
                progress.next_offset,
                progress.closed_through_ms,
                progress.watermark_ms,
                progress.idle,
                progress.accepted_samples,
                progress.late_samples,
                progress.duplicate_batches,
                late,
                progress.last_applied,
            )
            if updated is None:
                return False
            if closed_rows:
                await conn.execute(_INSERT_TASK_WINDOWS, *_columns(closed_rows, len(TASK_WINDOW_COLUMNS)))
        return True

    async def partitions(self, topic: str) -> list[asyncpg.Record]:
        async with self.pool.acquire() as conn:
            return list(
                await conn.fetch(
                    "SELECT partition, owner, owner_epoch, next_offset, closed_through_ms, watermark_ms,"
                    " idle, accepted_samples, late_samples, duplicate_batches, late_task_windows"
                    " FROM aggregator_partitions WHERE topic = $1 ORDER BY partition",
                    topic,
                )
            )

    # -- job windows -------------------------------------------------------------------

    async def insert_job_histograms(self, conn: asyncpg.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        if rows:
            await conn.execute(_INSERT_JOB_HISTOGRAMS, *_columns(rows, len(JOB_HISTOGRAM_COLUMNS)))

    # -- monitoring reads --------------------------------------------------------------

    async def job_histograms(self, job_id: str, resource: int, page: WindowPage) -> list[asyncpg.Record]:
        """The job's histograms of ``page``, and the first of the next page if there is one."""
        async with self.pool.acquire() as conn:
            return list(
                await conn.fetch(
                    "SELECT * FROM usage_job_histograms"
                    f" WHERE job_id = $1 AND resource = $2 AND {_PAGE_OF_WINDOWS}",
                    job_id,
                    resource,
                    *page.arguments(),
                )
            )

    async def task_windows(
        self, job_id: str, task_index: int, page: WindowPage
    ) -> list[list[asyncpg.Record]]:
        """The task's windows of ``page``, and the first of the next page if there is one, each
        as its rows (one per source partition)."""
        async with self.pool.acquire() as conn:
            rows = await conn.fetch(
                "WITH w AS (SELECT DISTINCT window_start_ms FROM usage_task_windows"
                f" WHERE job_id = $1 AND task_index = $2 AND {_PAGE_OF_WINDOWS})"
                " SELECT t.* FROM usage_task_windows t JOIN w USING (window_start_ms)"
                " WHERE t.job_id = $1 AND t.task_index = $2 ORDER BY t.window_start_ms, t.source_partition",
                job_id,
                task_index,
                *page.arguments(),
            )
        grouped: list[list[asyncpg.Record]] = []
        for row in rows:
            if grouped and grouped[-1][0]["window_start_ms"] == row["window_start_ms"]:
                grouped[-1].append(row)
            else:
                grouped.append([row])
        return grouped
