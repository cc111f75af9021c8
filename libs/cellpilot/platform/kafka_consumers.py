"""The two Kafka consumers every service uses, both checking their positions against the log.

:class:`MessageConsumer` is a consumer-group member with manual commits (at-least-once);
:class:`AssignedConsumer` reads every partition of some topics without a group, from offsets
the caller stores with its own state. Both follow a broker that lost its log
(:class:`~cellpilot.platform.kafka.LogPositions`); the assigned one also follows a topic whose
partition count changed (a topic the broker created again with its default count). Both yield
only records their :class:`~cellpilot.platform.signed_streams.RecordGate` admitted: signed by a
producer the producer table allows on the topic, and not replayed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from cellpilot.platform.abandoned_partitions import ABANDONED_AFTER_S, CHECK_EVERY_S, AbandonedPartitions
from cellpilot.platform.kafka import (
    DEFAULT_LOG_CHECK_INTERVAL_S,
    AppliedOffsets,
    LogPositions,
    Record,
    record_of,
)
from cellpilot.platform.signed_streams import RecordGate
from cellpilot.platform.stream_access import StreamAccess

log = logging.getLogger(__name__)


class _CheckedConsumer:
    """What both consumers share: batches of checked records, and positions checked against the log."""

    def __init__(
        self, access: StreamAccess, client_id: str, interval_s: float, *topics: str, **settings: Any
    ) -> None:
        """Commits only when told and starts at the earliest offset; ``settings`` add to that."""
        self._consumer = AIOKafkaConsumer(
            *topics,
            **access.client_options(),
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **settings,
        )
        self.positions = LogPositions(access, client_id, interval_s)
        self.gate = RecordGate(access, client_id)

    async def stop(self) -> None:
        await self.positions.stop()
        await self._consumer.stop()
        await self.gate.stop()

    async def batches(self, timeout_ms: int = 500, max_records: int = 500) -> AsyncIterator[list[Record]]:
        """Yields batches of admitted records (possibly empty, so the caller can notice time
        passing); the records the gate refused are gone from them."""
        while True:
            fetched = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
            yield await self.gate.admit([record_of(m) for messages in fetched.values() for m in messages])

    async def follow_log_resets(
        self, records: list[Record], fences: Sequence[AppliedOffsets], force: bool = False
    ) -> list[Record]:
        """Check the fences' positions of our partitions when due (or ``force``: at assignment);
        one whose log is gone resumes at the new log's start, where the consumer seeks, and the
        batch's records of that partition are dropped (they come again). Returns the rest."""
        if not (force or self.positions.due()):
            return records
        assigned = set(self._consumer.assignment())
        resets = await self.positions.check(fences, {(tp.topic, tp.partition) for tp in assigned})
        rewound: dict[TopicPartition, int] = {}
        for reset in resets:
            tp = TopicPartition(reset.topic, reset.partition)
            rewound[tp] = min(rewound.get(tp, reset.log_start), reset.log_start)
        for tp, offset in rewound.items():
            if tp in assigned:
                self._consumer.seek(tp, offset)
        return [r for r in records if TopicPartition(r.topic, r.partition) not in rewound]


class MessageConsumer(_CheckedConsumer):
    """A consumer-group member with manual commits (at-least-once). It also watches the
    partitions it does not own and rejoins the group when one is abandoned
    (:mod:`cellpilot.platform.abandoned_partitions`)."""

    def __init__(
        self,
        access: StreamAccess,
        topics: list[str],
        group_id: str,
        client_id: str = "cellpilot",
        log_check_interval_s: float = DEFAULT_LOG_CHECK_INTERVAL_S,
        abandoned_after_s: float = ABANDONED_AFTER_S,
    ) -> None:
        super().__init__(
            access,
            client_id,
            log_check_interval_s,
            *topics,
            group_id=group_id,
            session_timeout_ms=10000,
            heartbeat_interval_ms=1000,
        )
        self.topics = list(topics)
        self.group_id = group_id
        self.abandoned = AbandonedPartitions(abandoned_after_s)
        self.rejoins = 0  # times this member left and joined again over an abandoned partition
        self._next_look = 0.0

    async def start(self) -> None:
        await self._consumer.start()
        self._next_look = time.monotonic() + CHECK_EVERY_S

    async def batches(self, timeout_ms: int = 500, max_records: int = 500) -> AsyncIterator[list[Record]]:
        async for batch in super().batches(timeout_ms, max_records):
            if time.monotonic() >= self._next_look:
                await self.rejoin_if_abandoned()
            yield batch

    async def rejoin_if_abandoned(self) -> list[tuple[str, int]]:
        """One look at the partitions this member does not own; leaves the group and joins it
        again (as a new member) if one is abandoned. Returns the abandoned ones."""
        now = time.monotonic()
        self._next_look = now + CHECK_EVERY_S
        try:
            partitions = [
                TopicPartition(topic, p)
                for topic in self.topics
                for p in sorted(self._consumer.partitions_for_topic(topic) or ())
            ]
            ends = await self._consumer.end_offsets(partitions)
            committed = {(tp.topic, tp.partition): await self._consumer.committed(tp) for tp in partitions}
        except KafkaError as error:  # the broker is away: the next look tries again
            log.debug("could not look at the group's partitions", extra={"error": repr(error)})
            return []
        owned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        log_end = {(tp.topic, tp.partition): end for tp, end in ends.items()}
        abandoned = self.abandoned.observe(now, owned, committed, log_end)
        if abandoned:
            log.warning(
                "partitions abandoned by the group: rejoining it so that they are assigned again",
                extra={"group": self.group_id, "partitions": [f"{t}/{p}" for t, p in abandoned],
                       "after_s": self.abandoned.after_s},
            )  # fmt: skip
            self._consumer.unsubscribe()  # LeaveGroup; the next join is as a new member
            self._consumer.subscribe(self.topics)
            self.abandoned.forget()
            self.rejoins += 1
        return abandoned

    async def commit(self, records: Iterable[Record]) -> None:
        """Commit past the given (processed) records: the next offset per partition."""
        offsets: dict[TopicPartition, int] = {}
        for record in records:
            tp = TopicPartition(record.topic, record.partition)
            offsets[tp] = max(offsets.get(tp, 0), record.offset + 1)
        if offsets:
            await self._consumer.commit(offsets)

    def assignment(self) -> set[TopicPartition]:
        return set(self._consumer.assignment())

    def resume_claimed(self, records: list[Record], fences: Sequence[AppliedOffsets]) -> list[Record]:
        """Newly claimed partitions, whose positions are the ``fences``': seed the replay guard with
        what they applied last, and read again what this batch held of them (it was checked
        before the guard knew): those records are dropped here and come again."""
        self.gate.seed(fences)
        claimed = {key for fence in fences for key in fence.next_offset}
        again: dict[TopicPartition, int] = {}
        for record in records:
            if (record.topic, record.partition) in claimed:
                tp = TopicPartition(record.topic, record.partition)
                again[tp] = min(again.get(tp, record.offset), record.offset)
        for tp, offset in again.items():
            self._consumer.seek(tp, offset)
        return [r for r in records if TopicPartition(r.topic, r.partition) not in again]


class AssignedConsumer(_CheckedConsumer):
    """Reads every partition of some topics without a consumer group, from given offsets.

    For a consumer whose position is part of its own state (an :class:`AppliedOffsets`
    stored with that state, e.g. by an elected leader under its fencing token): a new
    reader starts exactly where the stored offsets say, with no group rebalance to wait
    for when the previous reader died.
    """

    def __init__(
        self,
        access: StreamAccess,
        topics: list[str],
        client_id: str = "cellpilot",
        log_check_interval_s: float = DEFAULT_LOG_CHECK_INTERVAL_S,
    ) -> None:
        self.topics = topics
        super().__init__(access, client_id, log_check_interval_s, group_id=None)

    async def start(self, offsets: AppliedOffsets | None = None) -> None:
        """Assign all partitions; each starts at ``offsets``' next offset (else the earliest).

        The positions are checked first: one whose log is gone starts at the new log's start.
        The replay guard starts from the records ``offsets`` says were applied last.
        """
        if offsets is not None:
            self.gate.seed([offsets])
        await self._consumer.start()
        partitions = await self._partitions(refresh=False)
        self._consumer.assign(partitions)
        if offsets is not None:
            await self.positions.check([offsets], {(tp.topic, tp.partition) for tp in partitions})
        known = offsets.next_offset if offsets is not None else {}
        for tp in partitions:
            start = known.get((tp.topic, tp.partition))
            if start is None:
                await self._consumer.seek_to_beginning(tp)
            else:
                self._consumer.seek(tp, start)

    async def follow_log_resets(
        self, records: list[Record], fences: Sequence[AppliedOffsets], force: bool = False
    ) -> list[Record]:
        """As for every consumer, and first: partitions that appeared since the last check are
        assigned and read from their beginning (a topic a restarted broker created again, with
        its own default partition count, keeps no record on a partition nobody reads)."""
        if force or self.positions.due():
            await self._follow_new_partitions()
        return await super().follow_log_resets(records, fences, force)

    async def _follow_new_partitions(self) -> None:
        try:
            partitions = await self._partitions(refresh=True)
        except Exception as error:  # the broker is away: checked again next time
            log.info("partition refresh failed; retrying later", extra={"error": repr(error)})
            return
        current = set(self._consumer.assignment())
        added = [tp for tp in partitions if tp not in current]
        if not added:
            return
        positions = {tp: await self._consumer.position(tp) for tp in current}
        self._consumer.assign(sorted(current | set(added)))
        for tp, offset in positions.items():
            self._consumer.seek(tp, offset)
        for tp in added:
            await self._consumer.seek_to_beginning(tp)
        log.warning(
            "new partitions of %s appeared; reading them from their beginning",
            ", ".join(sorted({tp.topic for tp in added})),
            extra={"partitions": [f"{tp.topic}/{tp.partition}" for tp in added]},
        )

    async def _partitions(self, refresh: bool) -> list[TopicPartition]:
        """Every partition of the topics, as the broker's metadata has them now."""
        if refresh:
            await self._consumer.topics()  # a metadata request: the cluster's current view
        partitions: list[TopicPartition] = []
        for topic in self.topics:
            ids = self._consumer.partitions_for_topic(topic)
            if ids is None:
                await self._consumer.topics()  # fetches the cluster's metadata
                ids = self._consumer.partitions_for_topic(topic) or set()
            partitions.extend(TopicPartition(topic, p) for p in sorted(ids))
        return partitions
