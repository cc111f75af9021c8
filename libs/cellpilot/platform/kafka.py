"""Kafka producers and consumers that carry trace context and make delivery semantics explicit.

Delivery is **at-least-once**: a consumer commits offsets only after the records were
processed, so a crash between processing and commit redelivers them. Processing becomes
effectively-once through :class:`AppliedOffsets`: a service stores it *atomically with
its own state* (same Redis transaction or database row) and skips any record whose
offset it has already applied. Trace context travels in the message headers
(W3C ``traceparent``), so one trace follows a sample from the Borglet to an actuation.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError
from google.protobuf.message import DecodeError, Message
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from cellpilot.platform.topics import TOPICS, Topic

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)
DEADLETTER_TOPIC = "deadletter"

Headers = list[tuple[str, bytes]]


async def ensure_topics(bootstrap: str, topics: Iterable[Topic] = TOPICS) -> list[str]:
    """Create the topics that do not exist yet; returns the names created."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [t for t in topics if t.name not in existing]
        created = []
        for topic in missing:
            try:
                await admin.create_topics([NewTopic(topic.name, topic.partitions, replication_factor=1)])
                created.append(topic.name)
            except TopicAlreadyExistsError:
                pass
        return created
    finally:
        await admin.close()


def inject_trace_headers(headers: Headers | None = None) -> Headers:
    """The current trace context as Kafka headers (appended to ``headers``)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [*(headers or []), *((key, value.encode()) for key, value in carrier.items())]


def extract_trace_context(headers: Iterable[tuple[str, bytes]]) -> otel_context.Context:
    carrier = {key: value.decode(errors="replace") for key, value in headers}
    return propagate.extract(carrier)


MAX_SPAN_LINKS = 32


def record_links(records: Iterable[Record], limit: int = MAX_SPAN_LINKS) -> list[trace.Link]:
    """Span links to the producers of consumed records (for a span that handles many at once).

    A step that folds a batch of records into one output (a window of samples, a batch of
    recommendations) cannot have every producer as its parent; it links to each distinct one
    instead, at most ``limit`` of them, so a trace viewer can walk back from the output.
    """
    links: list[trace.Link] = []
    seen: set[tuple[int, int]] = set()
    for record in records:
        context = trace.get_current_span(record.trace_context).get_span_context()
        if not context.is_valid or (context.trace_id, context.span_id) in seen:
            continue
        seen.add((context.trace_id, context.span_id))
        links.append(trace.Link(context, {"messaging.destination.name": record.topic}))
        if len(links) >= limit:
            break
    return links


class MessageProducer:
    """Publishes protobuf messages keyed for ordering, with trace context in the headers."""

    def __init__(self, bootstrap: str, client_id: str = "cellpilot") -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, client_id=client_id, acks="all", linger_ms=5
        )
        self._tracer = trace.get_tracer(__name__)

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def send(self, topic: str, key: str, message: Message, headers: Headers | None = None) -> int:
        """Publish and wait for the broker's acknowledgement; returns the record's offset."""
        with self._tracer.start_as_current_span(f"{topic} publish", kind=trace.SpanKind.PRODUCER) as span:
            span.set_attribute("messaging.system", "kafka")
            span.set_attribute("messaging.destination.name", topic)
            metadata = await self._producer.send_and_wait(
                topic, message.SerializeToString(), key=key.encode(), headers=inject_trace_headers(headers)
            )
            return int(metadata.offset)

    async def send_raw(self, topic: str, key: str, value: bytes, headers: Headers | None = None) -> None:
        await self._producer.send_and_wait(
            topic, value, key=key.encode(), headers=inject_trace_headers(headers)
        )


@dataclass(frozen=True)
class Record:
    """One consumed record, before decoding."""

    topic: str
    partition: int
    offset: int
    key: str
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    timestamp_ms: int

    @property
    def trace_context(self) -> otel_context.Context:
        return extract_trace_context(self.headers)

    def decode(self, message_type: type[M]) -> M:
        """Parse the value; raises :class:`PoisonRecordError` (never a bare DecodeError)."""
        message = message_type()
        try:
            message.ParseFromString(self.value)
        except (DecodeError, ValueError) as error:
            reason = f"not a valid {message_type.DESCRIPTOR.full_name}: {error}"
            raise PoisonRecordError(self, reason) from error
        return message


class PoisonRecordError(Exception):
    """A record that cannot be processed; it goes to the dead-letter topic and is skipped."""

    def __init__(self, record: Record, reason: str) -> None:
        super().__init__(reason)
        self.record = record
        self.reason = reason


async def dead_letter(producer: MessageProducer, poison: PoisonRecordError) -> None:
    record = poison.record
    headers: Headers = [
        ("source-topic", record.topic.encode()),
        ("source-partition", str(record.partition).encode()),
        ("source-offset", str(record.offset).encode()),
        ("reason", poison.reason.encode()[:1000]),
    ]
    await producer.send_raw(DEADLETTER_TOPIC, record.topic, record.value, headers)
    log.warning(
        "dead-lettered a record",
        extra={"topic": record.topic, "offset": record.offset, "reason": poison.reason},
    )


@dataclass
class AppliedOffsets:
    """The next offset to apply per (topic, partition): the idempotence fence.

    Store it atomically with the state the records change. After a crash, records
    redelivered from the last committed offset are recognised and skipped.
    """

    next_offset: dict[tuple[str, int], int] = field(default_factory=dict)

    def is_new(self, record: Record) -> bool:
        return record.offset >= self.next_offset.get((record.topic, record.partition), 0)

    def mark(self, record: Record) -> None:
        key = (record.topic, record.partition)
        self.next_offset[key] = max(self.next_offset.get(key, 0), record.offset + 1)

    def follow_log_resets(self, log_ends: Mapping[tuple[str, int], int]) -> list[tuple[str, int]]:
        """Forget the fence of partitions whose log now ends below it; returns them.

        A fence beyond the log end means the broker lost its log (e.g. a memory-only broker
        restarted: offsets begin again at 0); the consumer has already been reset to the
        beginning of the new log (auto_offset_reset), and without this its records, whose
        offsets are below the old fence, would be skipped as already applied.
        Limitation: a reset is noticed only while the new log is still shorter than the fence.
        """
        reset = []
        for key, end in log_ends.items():
            if self.next_offset.get(key, 0) > end:
                log.warning(
                    "log of %s/%d ends at %d, below the applied offset %d: the broker lost its log;"
                    " applying the new log from its beginning",
                    key[0], key[1], end, self.next_offset[key],
                )  # fmt: skip
                self.next_offset[key] = 0
                reset.append(key)
        return reset

    def to_mapping(self) -> dict[str, int]:
        return {f"{topic}/{partition}": offset for (topic, partition), offset in self.next_offset.items()}

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, int]) -> AppliedOffsets:
        parsed = {}
        for key, offset in mapping.items():
            topic, partition = key.rsplit("/", 1)
            parsed[(topic, int(partition))] = int(offset)
        return cls(parsed)


class MessageConsumer:
    """A consumer-group member with manual commits (at-least-once)."""

    def __init__(
        self, bootstrap: str, topics: list[str], group_id: str, client_id: str = "cellpilot"
    ) -> None:
        self._consumer = AIOKafkaConsumer(
            *topics,
            bootstrap_servers=bootstrap,
            group_id=group_id,
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=10000,
            heartbeat_interval_ms=1000,
        )

    async def start(self) -> None:
        await self._consumer.start()

    async def stop(self) -> None:
        await self._consumer.stop()

    async def batches(self, timeout_ms: int = 500, max_records: int = 500) -> AsyncIterator[list[Record]]:
        """Yields batches of records (possibly empty, so the caller can notice time passing)."""
        while True:
            fetched = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
            batch = [
                Record(
                    topic=m.topic,
                    partition=m.partition,
                    offset=m.offset,
                    key=(m.key or b"").decode(errors="replace"),
                    value=m.value or b"",
                    headers=tuple(m.headers or ()),
                    timestamp_ms=m.timestamp,
                )
                for messages in fetched.values()
                for m in messages
            ]
            yield batch

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

    def log_ends(self, records: Iterable[Record]) -> dict[tuple[str, int], int]:
        """The log end (high watermark) of each partition the records came from, when known."""
        return _log_ends(self._consumer, records)


class AssignedConsumer:
    """Reads every partition of some topics without a consumer group, from given offsets.

    For a consumer whose position is part of its own state (an :class:`AppliedOffsets`
    stored with that state, e.g. by an elected leader under its fencing token): a new
    reader starts exactly where the stored offsets say, with no group rebalance to wait
    for when the previous reader died.
    """

    def __init__(self, bootstrap: str, topics: list[str], client_id: str = "cellpilot") -> None:
        self.topics = topics
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=None,
            client_id=client_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )

    async def start(self, offsets: AppliedOffsets | None = None) -> None:
        """Assign all partitions; each starts at ``offsets``' next offset (else the earliest)."""
        await self._consumer.start()
        partitions: list[TopicPartition] = []
        for topic in self.topics:
            ids = self._consumer.partitions_for_topic(topic)
            if ids is None:
                await self._consumer.topics()  # fetches the cluster's metadata
                ids = self._consumer.partitions_for_topic(topic) or set()
            partitions.extend(TopicPartition(topic, p) for p in sorted(ids))
        self._consumer.assign(partitions)
        known = offsets.next_offset if offsets is not None else {}
        for tp in partitions:
            start = known.get((tp.topic, tp.partition))
            if start is None:
                await self._consumer.seek_to_beginning(tp)
            else:
                self._consumer.seek(tp, start)

    async def stop(self) -> None:
        await self._consumer.stop()

    def log_ends(self, records: Iterable[Record] | None = None) -> dict[tuple[str, int], int]:
        """The log end (high watermark) of the records' partitions (all assigned ones if None)."""
        if records is None:
            return _log_ends(self._consumer, (Record(tp.topic, tp.partition, 0, "", b"", (), 0)
                                              for tp in self._consumer.assignment()))  # fmt: skip
        return _log_ends(self._consumer, records)

    async def batches(self, timeout_ms: int = 500, max_records: int = 500) -> AsyncIterator[list[Record]]:
        """Yields batches of records (possibly empty, so the caller can notice time passing)."""
        while True:
            fetched = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
            yield [
                Record(
                    topic=m.topic,
                    partition=m.partition,
                    offset=m.offset,
                    key=(m.key or b"").decode(errors="replace"),
                    value=m.value or b"",
                    headers=tuple(m.headers or ()),
                    timestamp_ms=m.timestamp,
                )
                for messages in fetched.values()
                for m in messages
            ]


def _log_ends(consumer: AIOKafkaConsumer, records: Iterable[Record]) -> dict[tuple[str, int], int]:
    ends: dict[tuple[str, int], int] = {}
    for key in {(r.topic, r.partition) for r in records}:
        end = consumer.highwater(TopicPartition(*key))
        if end is not None:
            ends[key] = int(end)
    return ends
