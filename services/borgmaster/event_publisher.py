"""Publishes the applied log's events on Kafka ``borg.events``, in log order: the changes of the
Borgmaster's checkpoint log (Borg §3.1) as a stream.

Leader work. Events are derived from records only after those records are appended and
applied, so the topic never shows a change the log does not hold. Sends are pipelined
(enqueued in order, awaited together) and keyed by job id (machine id for machine events,
topics.py), so each job's events stay in order. The position published so far is kept in
``borg_event_cursor``; a newly elected master resumes from it using the events every
replica keeps for its recent records — at least once: consumers de-duplicate by
``log_sequence``.

With the cursor it keeps, per ``borg.events`` partition, the position after the last record
it published and that record's fingerprint (:class:`~cellpilot.platform.kafka.AppliedOffsets`).
At start and every ``log_check_interval_s`` it checks them against the broker's logs
(:class:`~cellpilot.platform.kafka.LogPositions`), traffic or not: when the topic lost what
was published (a broker that lost its log), it says so and publishes again every event it
still holds (the recent window), at least once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from cellpilot.borg.changes import change_key
from cellpilot.borg_wire import statuses
from cellpilot.platform.kafka import AppliedOffsets, LogPositions, MessageProducer, Record
from cellpilot.platform.stream_access import StreamAccess
from cellpilot_services.borgmaster.replica import Replica

log = logging.getLogger(__name__)
RECORDS_PER_BATCH = 2_000


class EventPublisher:
    def __init__(
        self,
        replica: Replica,
        engine: AsyncEngine,
        access: StreamAccess,
        topic: str,
        log_check_interval_s: float = 5.0,
    ) -> None:
        self.replica = replica
        self.engine = engine  # where the cursor is kept: the checkpoint store's database
        self.access = access
        self.topic = topic
        self.log_check_interval_s = log_check_interval_s
        self.wake = asyncio.Event()
        self.published_seq = 0
        self.republished = 0  # times the topic was found to have lost what was published
        replica.listeners.append(lambda _seq, _changes: self.wake.set())

    async def _read_cursor(self) -> tuple[int, AppliedOffsets]:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    text(
                        "SELECT published_seq, published_positions FROM borg_event_cursor WHERE name = :name"
                    ),
                    {"name": self.topic},
                )
            ).first()
        if row is None:
            return 0, AppliedOffsets()
        positions = AppliedOffsets.from_mapping(json.loads(row[1])) if row[1] else AppliedOffsets()
        return int(row[0]), positions

    async def _write_cursor(self, seq: int, published: AppliedOffsets, lower: bool = False) -> None:
        """Save the cursor and the published positions; only ``lower`` may move the cursor back."""
        keep = (
            "EXCLUDED.published_seq"
            if lower
            else "GREATEST(borg_event_cursor.published_seq, EXCLUDED.published_seq)"
        )
        async with self.engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO borg_event_cursor (name, published_seq, published_positions)"
                    " VALUES (:name, :seq, :positions)"
                    f" ON CONFLICT (name) DO UPDATE SET published_seq = {keep},"
                    " published_positions = EXCLUDED.published_positions, updated_at = now()"
                ),
                {"name": self.topic, "seq": seq, "positions": json.dumps(published.to_mapping())},
            )

    async def _start_producer(self) -> MessageProducer:
        delay = 0.5
        while True:
            # Signed as the Borgmaster (the one writer of borg.events), uncompressed as before.
            producer = MessageProducer(
                self.access, client_id=f"{self.replica.replica_id}-events", compression_type=None
            )
            try:
                await producer.start()
                return producer
            except Exception as error:
                await producer.stop()
                log.warning("Kafka not reachable; retrying", extra={"error": str(error)})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def _check_published(self, positions: LogPositions, cursor: int, published: AppliedOffsets) -> int:
        """The cursor to publish from: lowered to everything still held if the topic lost its log."""
        resets = await positions.check([published], set(published.next_offset))
        if not resets:
            return cursor
        first = self.replica.core.recent.first_seq
        self.republished += 1
        log.warning(
            "%s lost events published up to log position %d (partitions %s): publishing again the"
            " events of log positions %d-%d, the ones this replica still holds",
            self.topic, cursor, sorted(r.partition for r in resets), first, self.replica.core.recent.last_seq,
            extra={"topic": self.topic, "published_seq": cursor, "from_seq": first},
        )  # fmt: skip
        for key in list(published.next_offset):  # the whole topic is republished: start afresh
            published.reset(key, 0)
        cursor = min(cursor, first - 1)
        await self._write_cursor(cursor, published, lower=True)
        self.published_seq = cursor
        return cursor

    async def run(self) -> None:
        cursor, published = await self._read_cursor()
        producer = await self._start_producer()
        positions = LogPositions(self.access, f"{self.replica.replica_id}-events", self.log_check_interval_s)
        try:
            while True:
                if positions.due():
                    cursor = await self._check_published(positions, cursor, published)
                if cursor < self.replica.core.recent.first_seq - 1:
                    log.warning(
                        "events older than the kept window are not republished",
                        extra={"from_seq": cursor + 1, "to_seq": self.replica.core.recent.first_seq - 1},
                    )
                batch = self.replica.core.recent.since(cursor, RECORDS_PER_BATCH)
                if not batch:
                    self.wake.clear()
                    with contextlib.suppress(TimeoutError):  # wake for the next position check
                        await asyncio.wait_for(self.wake.wait(), self.log_check_interval_s)
                    continue
                pending = []
                # Set here, so what was published is known exactly (a send's metadata carries
                # its batch's first timestamp, not the record's).
                now_ms = int(time.time() * 1000)
                for _seq, changes in batch:
                    for change in changes:
                        value = statuses.change_out(change).SerializeToString()
                        key = change_key(change)
                        sent = await producer.enqueue(self.topic, key, value, timestamp_ms=now_ms)
                        pending.append((key, value, sent))
                for key, value, sent in pending:
                    metadata = await sent
                    partition, offset = metadata.partition, metadata.offset
                    published.mark(Record(self.topic, partition, offset, key, value, (), now_ms))
                cursor = batch[-1][0]
                self.published_seq = cursor
                await self._write_cursor(cursor, published)
        finally:
            await positions.stop()
            await producer.stop()
