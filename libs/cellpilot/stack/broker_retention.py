"""Retention for the in-memory embedded broker, which keeps every record in memory and honours none.

(The durable embedded broker enforces ``retention.ms`` itself, as Kafka does: the supervisor
rotates topics only on the in-memory one; :mod:`cellpilot.platform.topics`.)

Tansu 0.6 stores the ``retention.ms`` / ``retention.bytes`` configs a topic is created with
(DescribeConfigs shows them) but never deletes a record by them; it answers DeleteRecords by
dropping the connection (not implemented) and has no broker option for retention. Its memory
grows with every record it is sent. Deleting a topic is the one thing that frees it, so
``cellpilot run`` rotates every topic that has a retention (:mod:`cellpilot.platform.topics`)
once that long has passed since it was created: deleted and created again, empty.

A rotation first drains: it notes the log's end and waits (at most :data:`DRAIN_LIMIT_S`, while
the supervisor goes on watching its processes) until every consumer group that commits its
position on the topic has committed up to that end. Only the records that arrive while the
topic is deleted, or that a group still had not applied when the wait ran out, are lost; the
rotation counts them per group and reports them in its log line, never silently. Consumers
whose position lives with their own state (the Autopilot master on ``recommendations``) are not
visible to the broker: for them the line says so. Every consumer notices the new log
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

from cellpilot.platform.kafka import ensure_topic_layout
from cellpilot.platform.stream_access import Broker, client_options
from cellpilot.platform.topics import TOPICS, Topic

RETRY_AFTER_S = 60.0  # a rotation that failed (the broker away) is tried again this much later
DRAIN_LIMIT_S = 60.0  # the longest a rotation waits for the consumer groups to catch up


@dataclass(frozen=True)
class Drain:
    """A due rotation waiting for the consumer groups to apply the log up to ``ends``."""

    started_at: float
    ends: dict[TopicPartition, int]


@dataclass
class RotationSchedule:
    """When each topic with a retention is rotated next (monotonic seconds)."""

    topics: dict[str, Topic]
    due_at: dict[str, float] = field(default_factory=dict)
    draining: dict[str, Drain] = field(default_factory=dict)

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
        self.draining.pop(topic.name, None)

    def failed(self, topic: Topic, now: float) -> None:
        self.due_at[topic.name] = now + RETRY_AFTER_S
        self.draining.pop(topic.name, None)


async def log_end_of(broker: Broker, topic: Topic) -> dict[TopicPartition, int]:
    """Each partition's log end, from the high watermark of a fetch reply (the embedded
    broker's ListOffsets answer is the start of the last batch plus one, not the end)."""
    reader = AIOKafkaConsumer(
        **client_options(broker),
        enable_auto_commit=False,
        max_partition_fetch_bytes=1024,  # only the reply's high watermark is wanted
        fetch_max_wait_ms=100,
    )
    await reader.start()
    try:
        partitions = [TopicPartition(topic.name, p) for p in range(topic.partitions)]
        reader.assign(partitions)
        for tp in partitions:
            reader.seek(tp, 0)
        deadline = asyncio.get_running_loop().time() + 15.0
        while any(reader.highwater(tp) is None for tp in partitions):
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"no fetch reply for {topic.name} within 15 s")
            await reader.getmany(timeout_ms=200)
        return {tp: int(reader.highwater(tp) or 0) for tp in partitions}
    finally:
        await reader.stop()


async def committed_positions(broker: Broker, topic: Topic) -> dict[str, dict[TopicPartition, int]]:
    """The committed next offset per partition of ``topic`` of each group that commits on it
    (:attr:`Topic.committing_groups`; a group with nothing committed yet is at 0)."""
    positions: dict[str, dict[TopicPartition, int]] = {}
    partitions = [TopicPartition(topic.name, p) for p in range(topic.partitions)]
    for group in topic.committing_groups:
        # The admin client's group calls do not speak the embedded broker's protocol versions;
        # a group-less member of the group asks for its committed offsets (OffsetFetch).
        reader = AIOKafkaConsumer(**client_options(broker), group_id=group, enable_auto_commit=False)
        await reader.start()
        try:
            positions[group] = {tp: int(await reader.committed(tp) or 0) for tp in partitions}
        finally:
            await reader.stop()
    return positions


def unapplied(ends: dict[TopicPartition, int], committed: dict[TopicPartition, int]) -> int:
    """Records a group has not applied yet: the log end less its committed position, summed."""
    return sum(max(0, end - committed.get(tp, 0)) for tp, end in ends.items())


async def drained(broker: Broker, topic: Topic, ends: dict[TopicPartition, int]) -> bool:
    """Whether every group that commits on ``topic`` has committed up to ``ends``."""
    return all(unapplied(ends, c) == 0 for c in (await committed_positions(broker, topic)).values())


@dataclass(frozen=True)
class Rotation:
    """What one rotation dropped: every record the topic held, and per consumer group the ones
    it had not applied (those are lost to it)."""

    held: int
    unapplied_by_group: dict[str, int]

    def describe(self) -> str:
        if not self.unapplied_by_group:
            return (
                f"{self.held} records freed; no consumer group commits on it "
                "(its consumers keep their positions with their own state)"
            )
        lost = ", ".join(f"{group} {n}" for group, n in sorted(self.unapplied_by_group.items()))
        return f"{self.held} records freed; not yet applied, so lost: {lost}"


async def rotate_topic(broker: Broker, topic: Topic) -> Rotation:
    """Delete ``topic`` and create it again empty; what it held and what each group lost."""
    groups = await committed_positions(broker, topic)
    ends = await log_end_of(broker, topic)
    admin = AIOKafkaAdminClient(**client_options(broker), request_timeout_ms=15000)
    await admin.start()
    try:
        await admin.delete_topics([topic.name])
    finally:
        await admin.close()
    # Producers may make the broker create it again first, with its default partition count.
    await ensure_topic_layout(broker, [topic])
    return Rotation(sum(ends.values()), {group: unapplied(ends, c) for group, c in groups.items()})


def rotate_due(broker: Broker, schedule: RotationSchedule, now: float) -> list[str]:
    """Drain, then rotate, every topic that is due; one line per rotation for the supervisor's log.

    Never blocks for the drain: a due topic's log end is noted, and each later call checks
    whether the groups caught up (or :data:`DRAIN_LIMIT_S` passed) before rotating.
    """
    lines = []
    for topic in schedule.due(now):
        try:
            drain = schedule.draining.get(topic.name)
            if drain is None:
                schedule.draining[topic.name] = Drain(now, asyncio.run(log_end_of(broker, topic)))
                continue
            if now - drain.started_at < DRAIN_LIMIT_S and not asyncio.run(drained(broker, topic, drain.ends)):
                continue
            rotation = asyncio.run(rotate_topic(broker, topic))
        except Exception as error:
            schedule.failed(topic, now)
            lines.append(
                f"kafka: rotating {topic.name} failed ({error!r}); trying again in {RETRY_AFTER_S:.0f} s"
            )
            continue
        schedule.rotated(topic, now)
        minutes = (topic.retention_ms or 0) / 60_000
        lines.append(
            f"kafka: {topic.name} rotated after {minutes:.0f} min ({rotation.describe()}): "
            "the in-memory broker honours no retention"
        )
    return lines
