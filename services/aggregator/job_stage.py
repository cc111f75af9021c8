"""Per-job windows s[t] across partitions, and their publication on ``usage.histograms``.

A job's tasks run on machines whose samples land in different ``usage.samples``
partitions, owned by different aggregator replicas. A job window is summed once *every*
partition has closed it (or has been idle long enough not to be waited for): any replica
may do it, under a PostgreSQL advisory lock, reading the closed task windows, summing
them (:func:`cellpilot.autopilot.job_windows.sum_jobs`, off the event loop) and inserting
the job rows in one transaction that also advances the job progress.

Publication is an outbox: unpublished job rows are sent in window order (each job's
records one after the other, so they stay in order on its partition) and marked published
in the same transaction. A crash between the two re-sends them; recommenders apply a
window once (they keep the last window end applied per job and resource).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from cellpilot.autopilot.job_windows import sum_jobs
from cellpilot.platform.kafka import MessageProducer
from cellpilot_services.aggregator import convert
from cellpilot_services.aggregator.history_store import JOB_STAGE_LOCK, OUTBOX_LOCK, HistoryStore

log = logging.getLogger(__name__)

MAX_WINDOWS_PER_STEP = 24


def jobs_closable_through(partitions: Sequence[Any], expected: int) -> int | None:
    """The end up to which every partition has closed its windows (idle ones aside)."""
    if len(partitions) < expected:
        return None
    active = [p for p in partitions if not p["idle"]]
    if not active:
        ends = [p["closed_through_ms"] for p in partitions if p["closed_through_ms"] is not None]
        return max(ends) if ends else None
    if any(p["closed_through_ms"] is None for p in active):
        return None
    return int(min(p["closed_through_ms"] for p in active))


def _sum_rows(rows: Sequence[Any], window_ms: int) -> list[tuple[Any, ...]]:
    windows, job_of_task, job_ids = convert.stored_task_windows(rows, window_ms)
    return convert.job_histogram_rows(sum_jobs(windows, job_of_task), job_ids)


async def close_job_windows(store: HistoryStore, topic: str, partitions: int, window_ms: int) -> int:
    """Sum the job windows every partition has closed; returns the job rows written."""
    written = 0
    async with store.transaction() as conn:
        if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", JOB_STAGE_LOCK):
            return 0
        progress = await conn.fetchval(
            "SELECT closed_through_ms FROM aggregator_progress WHERE name = 'jobs' FOR UPDATE"
        )
        rows = await conn.fetch(
            "SELECT partition, closed_through_ms, idle FROM aggregator_partitions WHERE topic = $1", topic
        )
        target = jobs_closable_through(rows, partitions)
        if target is None or (progress is not None and target <= progress):
            return 0
        if progress is not None:
            target = min(target, progress + MAX_WINDOWS_PER_STEP * window_ms)
        task_rows = await conn.fetch(
            "SELECT job_id, task_index, window_start_ms, cpu_histogram, sample_count, throttled_count,"
            " cpu_sum_millicores, cpu_max_millicores, memory_sum_bytes, memory_max_bytes,"
            " cpu_unmet_sum_millicores FROM usage_task_windows WHERE window_end_ms <= $1"
            " AND ($2::bigint IS NULL OR window_end_ms > $2)",
            target,
            progress,
        )
        if task_rows:
            job_rows = await asyncio.to_thread(_sum_rows, task_rows, window_ms)
            await store.insert_job_histograms(conn, job_rows)
            written = len(job_rows)
        await conn.execute(
            "UPDATE aggregator_progress SET closed_through_ms = $1, updated_at = now() WHERE name = 'jobs'",
            target,
        )
    if written:
        log.info("job windows summed", extra={"through_ms": target, "rows": written})
    return written


async def publish_job_histograms(
    store: HistoryStore, producer: MessageProducer, topic: str, limit: int
) -> int:
    """Send unpublished job histograms in window order; returns how many were sent."""
    async with store.transaction() as conn:
        if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", OUTBOX_LOCK):
            return 0
        rows = await conn.fetch(
            "SELECT * FROM usage_job_histograms WHERE NOT published"
            " ORDER BY window_end_ms, job_id, resource LIMIT $1",
            limit,
        )
        if not rows:
            return 0
        by_job: dict[str, list[Any]] = defaultdict(list)
        for row in rows:
            by_job[row["job_id"]].append(row)

        async def send_in_order(job_id: str, job_rows: list[Any]) -> None:
            for row in job_rows:
                await producer.send(topic, job_id, convert.job_histogram_message(row))

        await asyncio.gather(*(send_in_order(job_id, job_rows) for job_id, job_rows in by_job.items()))
        await conn.execute(
            "UPDATE usage_job_histograms h SET published = true"
            " FROM unnest($1::text[], $2::smallint[], $3::bigint[]) AS k(job_id, resource, window_start_ms)"
            " WHERE h.job_id = k.job_id AND h.resource = k.resource"
            " AND h.window_start_ms = k.window_start_ms",
            [r["job_id"] for r in rows],
            [r["resource"] for r in rows],
            [r["window_start_ms"] for r in rows],
        )
    return len(rows)
