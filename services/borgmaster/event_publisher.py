"""Publishes the applied log's events on Kafka ``borg.events``, in log order (issue 7, "Events").

Leader work. Events are derived from records only after those records are appended and
applied, so the topic never shows a change the log does not hold. Sends are pipelined
(enqueued in order, awaited together) and keyed by job id (machine id for machine events,
topics.py), so each job's events stay in order. The position published so far is kept in
``borg_event_cursor``; a newly elected master resumes from it using the events every
replica keeps for its recent records — at least once: consumers de-duplicate by
``log_sequence``.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaProducer
from sqlalchemy import text

from cellpilot.borg.changes import change_key
from cellpilot.platform.kafka import inject_trace_headers
from cellpilot_services.borgmaster import convert
from cellpilot_services.borgmaster.replica import Replica

log = logging.getLogger(__name__)
RECORDS_PER_BATCH = 2_000


class EventPublisher:
    def __init__(self, replica: Replica, bootstrap: str, topic: str) -> None:
        self.replica = replica
        self.bootstrap = bootstrap
        self.topic = topic
        self.wake = asyncio.Event()
        self.published_seq = 0
        replica.listeners.append(lambda _seq, _changes: self.wake.set())

    async def _read_cursor(self) -> int:
        async with self.replica.engine.connect() as conn:
            value = await conn.scalar(
                text("SELECT published_seq FROM borg_event_cursor WHERE name = :name"), {"name": self.topic}
            )
        return int(value or 0)

    async def _write_cursor(self, seq: int) -> None:
        async with self.replica.engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO borg_event_cursor (name, published_seq) VALUES (:name, :seq)"
                    " ON CONFLICT (name) DO UPDATE SET published_seq ="
                    " GREATEST(borg_event_cursor.published_seq, EXCLUDED.published_seq), updated_at = now()"
                ),
                {"name": self.topic, "seq": seq},
            )

    async def _start_producer(self) -> AIOKafkaProducer:
        delay = 0.5
        while True:
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap,
                client_id=f"{self.replica.replica_id}-events",
                acks="all",
                linger_ms=5,
            )
            try:
                await producer.start()
                return producer
            except Exception as error:
                await producer.stop()
                log.warning("Kafka not reachable; retrying", extra={"error": str(error)})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)

    async def run(self) -> None:
        cursor = await self._read_cursor()
        producer = await self._start_producer()
        try:
            while True:
                if cursor < self.replica.recent.first_seq - 1:
                    log.warning(
                        "events older than the kept window are not republished",
                        extra={"from_seq": cursor + 1, "to_seq": self.replica.recent.first_seq - 1},
                    )
                batch = self.replica.recent.since(cursor, RECORDS_PER_BATCH)
                if not batch:
                    self.wake.clear()
                    await self.wake.wait()
                    continue
                pending = []
                headers = inject_trace_headers()
                for _seq, changes in batch:
                    for change in changes:
                        value = convert.change_out(change).SerializeToString()
                        key = change_key(change).encode()
                        pending.append(await producer.send(self.topic, value, key=key, headers=headers))
                await asyncio.gather(*pending)
                cursor = batch[-1][0]
                self.published_seq = cursor
                await self._write_cursor(cursor)
        finally:
            await producer.stop()
