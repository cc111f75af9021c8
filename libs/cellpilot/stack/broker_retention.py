"""Retention for the embedded broker, which keeps every record in memory and honours none.

Tansu 0.6 stores the ``retention.ms`` / ``retention.bytes`` configs a topic is created with
(DescribeConfigs shows them) but never deletes a record by them; it answers DeleteRecords by
dropping the connection (not implemented) and has no broker option for retention. Its memory
grows with every record it is sent. Deleting a topic is the one thing that frees it, so
``cellpilot run`` rotates every topic that has a retention (:mod:`cellpilot.platform.topics`)
once that long has passed since it was created: deleted and created again, empty. What
consumers had not yet applied is lost (the last seconds of usage samples, a window or a
recommendation in flight); every consumer notices the new log
(:class:`cellpilot.platform.kafka.LogPositions`) and applies it from its start. Topics kept
without a retention (``borg.events``, ``actuations``, ``deadletter``) are small and never
rotated. A real Kafka broker (compose) enforces ``retention.ms`` itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from cellpilot.platform.kafka import ensure_topics
from cellpilot.platform.topics import TOPICS, Topic

RETRY_AFTER_S = 60.0  # a rotation that failed (the broker away) is tried again this much later


@dataclass
class RotationSchedule:
    """When each topic with a retention is rotated next (monotonic seconds)."""

    topics: dict[str, Topic]
    due_at: dict[str, float] = field(default_factory=dict)

    @classmethod
    def starting(cls, now: float, topics: Iterable[Topic] = TOPICS) -> RotationSchedule:
        """A schedule for a broker whose topics were all (re)created at ``now``."""
        kept = {t.name: t for t in topics if t.retention_ms is not None}
        return cls(kept, {name: now + t.retention_ms / 1000 for name, t in kept.items()})  # type: ignore[operator]

    def due(self, now: float) -> list[Topic]:
        return [self.topics[name] for name, at in sorted(self.due_at.items()) if now >= at]

    def rotated(self, topic: Topic, now: float) -> None:
        assert topic.retention_ms is not None
        self.due_at[topic.name] = now + topic.retention_ms / 1000

    def failed(self, topic: Topic, now: float) -> None:
        self.due_at[topic.name] = now + RETRY_AFTER_S


async def rotate_topic(bootstrap: str, topic: Topic) -> int:
    """Delete ``topic`` and create it again empty; returns how many records it held."""
    reader = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await reader.start()
    try:
        partitions = [TopicPartition(topic.name, p) for p in range(topic.partitions)]
        held = sum((await reader.end_offsets(partitions)).values())
    finally:
        await reader.stop()
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    await admin.start()
    try:
        await admin.delete_topics([topic.name])
    finally:
        await admin.close()
    await ensure_topics(bootstrap, [topic])
    return int(held)


def rotate_due(bootstrap: str, schedule: RotationSchedule, now: float) -> list[str]:
    """Rotate every topic that is due; one line per topic for the supervisor's log."""
    lines = []
    for topic in schedule.due(now):
        try:
            held = asyncio.run(rotate_topic(bootstrap, topic))
        except Exception as error:
            schedule.failed(topic, now)
            lines.append(
                f"kafka: rotating {topic.name} failed ({error!r}); trying again in {RETRY_AFTER_S:.0f} s"
            )
            continue
        schedule.rotated(topic, now)
        minutes = (topic.retention_ms or 0) / 60_000
        lines.append(
            f"kafka: {topic.name} rotated after {minutes:.0f} min (about {held} records dropped): "
            "the embedded broker keeps records in memory and honours no retention"
        )
    return lines
