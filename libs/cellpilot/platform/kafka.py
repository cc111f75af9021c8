"""Kafka producers and consumers that carry trace context and make delivery semantics explicit.

Delivery is **at-least-once**: a consumer commits offsets only after the records were
processed, so a crash between processing and commit redelivers them. Processing becomes
effectively-once through :class:`AppliedOffsets`: a service stores it *atomically with
its own state* (same Redis transaction or database row) and skips any record whose
offset it has already applied. Every consumer checks those positions against the broker's
logs, at assignment and periodically (:class:`LogPositions`), so a log the broker lost and
began again is applied from its start, never skipped. Trace context travels in the message
headers (W3C ``traceparent``), so one trace follows a sample from the Borglet to an actuation.

Every record a :class:`MessageProducer` writes is signed by the service that writes it, and
every consumer (:mod:`cellpilot.platform.kafka_consumers`) applies only records whose signature
and producer it has checked (:mod:`cellpilot.security.record_signing`); both take the process's
:class:`~cellpilot.platform.stream_access.StreamAccess`, which also says how they log in to the
broker.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import EllipsisType
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code
from aiokafka.protocol.metadata import MetadataRequest
from aiokafka.structs import RecordMetadata
from google.protobuf.message import DecodeError, Message
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace

from cellpilot.platform.stream_access import (
    Broker,
    StreamAccess,
    client_options,
    durability_of,
    producer_options,
)
from cellpilot.platform.topics import TOPICS, Topic

log = logging.getLogger(__name__)


def _never_create_topics_on_metadata(
    request: MetadataRequest, topics: list[str] | None = None, allow_auto_topic_creation: bool | None = False
) -> None:
    request._topics = topics
    request._allow_auto_topic_creation = allow_auto_topic_creation


# Topics are created only by ensure_topics, with their declared partition counts. aiokafka asks
# the broker to create every topic a metadata request names (and has no setting against it):
# after a broker lost its log, the first client to ask (a consumer reconnecting, a check of its
# positions) would bring a topic back with the broker's default partition count, moving keys to
# other partitions than the ones their owners (aggregators, recommender workers) are assigned.
MetadataRequest.__init__ = _never_create_topics_on_metadata  # type: ignore[method-assign,assignment]
M = TypeVar("M", bound=Message)
DEADLETTER_TOPIC = "deadletter"

Headers = list[tuple[str, bytes]]


async def ensure_topics(broker: Broker, topics: Iterable[Topic] = TOPICS) -> list[str]:
    """Create the topics that do not exist yet, with the broker's replication factor
    (:class:`~cellpilot.platform.stream_access.WriteDurability`); returns the names created."""
    admin = AIOKafkaAdminClient(**client_options(broker), request_timeout_ms=15000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [t for t in topics if t.name not in existing]
        replicas = durability_of(broker).replication_factor
        created = []
        for topic in missing:
            new = NewTopic(topic.name, topic.partitions, replicas, topic_configs=topic.configs())
            try:
                _raise_topic_errors(await admin.create_topics([new]))
                created.append(topic.name)
            except TopicAlreadyExistsError:
                pass
        return created
    finally:
        await admin.close()


def _raise_topic_errors(response: object) -> None:
    """Raise the error a CreateTopics response holds (aiokafka returns it): the topic exists, or the
    brokers could not create it (three replicas asked before three brokers registered)."""
    for entry in getattr(response, "topic_errors", ()):
        name, code = entry[0], entry[1]
        if code:
            message = entry[2] if len(entry) > 2 and entry[2] else f"cannot create topic {name}"
            raise for_code(code)(message)


LAYOUT_ATTEMPTS = 5


async def partition_counts(broker: Broker, names: Collection[str]) -> dict[str, int]:
    """How many partitions each of the (existing) topics ``names`` has now."""
    admin = AIOKafkaAdminClient(**client_options(broker), request_timeout_ms=15000)
    await admin.start()
    try:
        described = await admin.describe_topics(list(names))
    finally:
        await admin.close()
    return {str(t["topic"]): len(t["partitions"]) for t in described if not t.get("error_code")}


async def ensure_topic_layout(broker: Broker, topics: Iterable[Topic] = TOPICS) -> list[str]:
    """Every topic exists with its declared partition count, on a broker that just lost its log.

    A restarted broker knows no topic, and a client's first metadata request or record creates
    the topic it names with the broker's default partition count (4 for the embedded broker)
    before :func:`ensure_topics` can create it with its own. A wrong count breaks keyed
    partitioning (a job's histograms would reach another recommender partition than its state)
    and leaves consumers holding positions for partitions that no longer exist. So a topic
    whose count is not the declared one is deleted and created again (it holds only what was
    sent since the restart); the check repeats until the layout holds. Returns the names of
    the topics created again.
    """
    wanted = {t.name: t for t in topics}
    recreated: list[str] = []
    for _ in range(LAYOUT_ATTEMPTS):
        await ensure_topics(broker, wanted.values())
        counts = await partition_counts(broker, wanted)
        wrong = sorted(name for name, t in wanted.items() if counts.get(name, t.partitions) != t.partitions)
        if not wrong:
            return recreated
        log.warning(
            "topics created with the broker's default partition count; creating them again",
            extra={
                "topics": {
                    name: f"{counts[name]} partitions, not {wanted[name].partitions}" for name in wrong
                }
            },
        )
        admin = AIOKafkaAdminClient(**client_options(broker), request_timeout_ms=15000)
        await admin.start()
        try:
            await admin.delete_topics(wrong)
        finally:
            await admin.close()
        recreated += [name for name in wrong if name not in recreated]
    raise RuntimeError(f"topics keep another partition count than declared after {LAYOUT_ATTEMPTS} attempts")


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
    """Publishes records keyed for ordering, signed by the service, with trace context in the headers.

    Records are signed in the order they are appended to the producer's buffer (one at a time:
    appending is quick, delivery is still pipelined), so each partition sees the producer's
    sequence numbers rise (:class:`~cellpilot.security.record_signing.RecordSigner`).

    Every write waits for ``acks=all``, idempotent where the broker allows (``options``, from
    :class:`~cellpilot.platform.stream_access.WriteDurability`): every producer of the records
    that must not be lost (``actuations``, ``borg.events``, ``recommendations``) is one of these.
    """

    def __init__(
        self, access: StreamAccess, client_id: str = "cellpilot", compression_type: str | None = "gzip"
    ) -> None:
        # gzip: a usage sample batch shrinks ~3.5x, a recommendation set ~10x (the embedded
        # broker keeps every record in memory, compressed as sent).
        self.options = {
            **producer_options(access),
            "client_id": client_id,
            "linger_ms": 5,
            "compression_type": compression_type,
        }
        self._producer = AIOKafkaProducer(**self.options)
        # A session of its own per producer (None only for a benchmark's unsigned baseline).
        self._signer = access.signer.fork() if access.signer is not None else None
        self._appending = asyncio.Lock()
        self._tracer = trace.get_tracer(__name__)

    @property
    def identity(self) -> str:
        return self._signer.identity if self._signer is not None else ""

    async def start(self) -> None:
        await self._producer.start()

    async def stop(self) -> None:
        await self._producer.stop()

    async def enqueue(
        self,
        topic: str,
        key: str,
        value: bytes,
        headers: Headers | None = None,
        timestamp_ms: int | None = None,
        partition: int | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        """Sign and append one record (to the key's partition unless ``partition`` is given);
        returns the future of the broker's acknowledgement."""
        key_bytes = key.encode()
        all_headers = inject_trace_headers(headers)
        async with self._appending:
            if self._signer is not None:
                all_headers += self._signer.sign(topic, key_bytes, value)
            return await self._producer.send(
                topic,
                value,
                key=key_bytes,
                headers=all_headers,
                timestamp_ms=timestamp_ms,
                partition=partition,
            )

    async def send(self, topic: str, key: str, message: Message, headers: Headers | None = None) -> int:
        """Publish and wait for the broker's acknowledgement; returns the record's offset."""
        with self._tracer.start_as_current_span(f"{topic} publish", kind=trace.SpanKind.PRODUCER) as span:
            span.set_attribute("messaging.system", "kafka")
            span.set_attribute("messaging.destination.name", topic)
            delivered = await self.enqueue(topic, key, message.SerializeToString(), headers)
            return int((await delivered).offset)

    async def send_raw(self, topic: str, key: str, value: bytes, headers: Headers | None = None) -> None:
        await (await self.enqueue(topic, key, value, headers))


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


async def dead_letter(
    producer: MessageProducer,
    poison: PoisonRecordError,
    extra: Sequence[tuple[str, bytes]] = (),
    quiet: bool = False,
) -> None:
    """File ``poison``'s record on the dead-letter topic with where it was and why, as the
    producer's service (the one that skipped it); logged at WARNING unless ``quiet``."""
    record = poison.record
    headers: Headers = [
        ("source-topic", record.topic.encode()),
        ("source-partition", str(record.partition).encode()),
        ("source-offset", str(record.offset).encode()),
        ("reason", poison.reason.encode()[:1000]),
        *extra,
    ]
    await producer.send_raw(DEADLETTER_TOPIC, record.topic, record.value, headers)
    if not quiet:
        log.warning(
            "dead-lettered a record",
            extra={"topic": record.topic, "offset": record.offset, "reason": poison.reason},
        )


Key = tuple[str, int]  # (topic, partition)


@dataclass(frozen=True)
class RecordFingerprint:
    """What tells one record of a partition's log from another: its timestamp and a digest of
    its key and value. Stored with a position, it proves later that the log holding the
    position is still the log that was applied (a log that was lost and began again at offset
    0 holds other records at the same offsets, even once it has grown past the position)."""

    timestamp_ms: int
    digest: str

    @classmethod
    def of(cls, record: Record) -> RecordFingerprint:
        digest = hashlib.blake2b(digest_size=8)
        digest.update(record.key.encode())
        digest.update(b"\0")
        digest.update(record.value)
        return cls(int(record.timestamp_ms), digest.hexdigest())

    def encode(self) -> str:
        return f"{self.timestamp_ms}/{self.digest}"

    @classmethod
    def decode(cls, text: str | None) -> RecordFingerprint | None:
        if not text:
            return None
        timestamp, digest = text.split("/", 1)
        return cls(int(timestamp), digest)


@dataclass(frozen=True)
class LogPosition:
    """Where a consumer is in one partition: the next offset to apply and the fingerprint of
    the record before it (the last applied; None when unknown or nothing was applied)."""

    next_offset: int
    last_applied: RecordFingerprint | None = None

    def encode(self) -> str:
        """``"<next offset>"`` or ``"<next offset>@<timestamp>/<digest>"``."""
        if self.last_applied is None:
            return str(self.next_offset)
        return f"{self.next_offset}@{self.last_applied.encode()}"

    @classmethod
    def decode(cls, value: str | int) -> LogPosition:
        offset, _, fingerprint = str(value).partition("@")
        return cls(int(offset), RecordFingerprint.decode(fingerprint))


def offset_to_read(position: LogPosition, log_start: int) -> int | None:
    """The offset whose record tells whether ``position`` is still in its log: the last applied.

    None when nothing was applied yet or that record is no longer kept (below the log start:
    retention removed it; the position is then before the log start and stays).
    """
    last = position.next_offset - 1
    return last if last >= max(log_start, 0) else None


def stale_position_reason(
    position: LogPosition, log_start: int, log_end: int, read: RecordFingerprint | EllipsisType | None = ...
) -> str | None:
    """Why ``position`` no longer belongs to the partition's log, or None if it does (or cannot
    be told).

    ``log_end`` is the offset after the log's last record; ``read`` the fingerprint of the
    record at :func:`offset_to_read` (None: the log holds no record there; ``...``: not read).
    A position beyond the log end, or whose last applied record is missing or another record,
    was in a log that is gone (a broker that lost its log, a topic deleted and created again):
    the consumer must apply the new log from its beginning. A position stored without a
    fingerprint can only be checked against the log end.
    """
    if position.next_offset > log_end:
        return f"the log ends at {log_end}, before the stored position"
    if offset_to_read(position, log_start) is None or position.last_applied is None or read is ...:
        return None
    if read is None:
        return f"the last applied record (offset {position.next_offset - 1}) is not in the log"
    if read != position.last_applied:
        return f"the record at offset {position.next_offset - 1} is not the last applied one"
    return None


@dataclass(frozen=True)
class LogReset:
    """A stored position found to belong to a log that is gone; the consumer resumed at ``log_start``."""

    topic: str
    partition: int
    stored_offset: int
    log_start: int
    log_end: int
    reason: str


@dataclass
class AppliedOffsets:
    """The position (next offset to apply, last applied record) per (topic, partition): the
    idempotence fence.

    Store it atomically with the state the records change. After a crash, records
    redelivered from the last committed offset are recognised and skipped. The consumer
    checks it against the broker's log (:meth:`MessageConsumer.follow_log_resets`) so a log
    that was lost and replaced is applied again from its beginning, not skipped.
    """

    next_offset: dict[Key, int] = field(default_factory=dict)
    last_applied: dict[Key, RecordFingerprint] = field(default_factory=dict)

    def is_new(self, record: Record) -> bool:
        return record.offset >= self.next_offset.get((record.topic, record.partition), 0)

    def mark(self, record: Record) -> None:
        key = (record.topic, record.partition)
        if record.offset + 1 >= self.next_offset.get(key, 0):
            self.next_offset[key] = record.offset + 1
            self.last_applied[key] = RecordFingerprint.of(record)

    def position(self, key: Key) -> LogPosition:
        return LogPosition(self.next_offset.get(key, 0), self.last_applied.get(key))

    def reset(self, key: Key, next_offset: int) -> None:
        """Resume ``key`` at ``next_offset`` of a new log (nothing of it is applied yet)."""
        self.next_offset[key] = next_offset
        self.last_applied.pop(key, None)

    def encoded(self, key: Key) -> str:
        return self.position(key).encode()

    def to_mapping(self) -> dict[str, str]:
        return {
            f"{topic}/{partition}": self.encoded((topic, partition)) for topic, partition in self.next_offset
        }

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, str | int | bytes]) -> AppliedOffsets:
        """The inverse of :meth:`to_mapping` (a bare offset, as stored before fingerprints, too)."""
        offsets = cls()
        for name, value in mapping.items():
            topic, partition = name.rsplit("/", 1)
            text = value.decode() if isinstance(value, bytes) else value
            offsets.restore((topic, int(partition)), LogPosition.decode(text))
        return offsets

    def restore(self, key: Key, position: LogPosition) -> None:
        self.next_offset[key] = position.next_offset
        if position.last_applied is not None:
            self.last_applied[key] = position.last_applied
        else:
            self.last_applied.pop(key, None)


DEFAULT_LOG_CHECK_INTERVAL_S = 5.0
LOG_CHECK_TIMEOUT_S = 5.0


def record_of(message: ConsumerRecord[bytes, bytes]) -> Record:
    return Record(
        topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        key=(message.key or b"").decode(errors="replace"),
        value=message.value or b"",
        headers=tuple((name, value or b"") for name, value in message.headers or ()),
        timestamp_ms=message.timestamp,
    )


class LogPositions:
    """Checks stored positions against the broker's partition logs, whether or not records arrive.

    The one implementation every consumer uses (through ``follow_log_resets``), and the
    Borgmaster's event publisher for what it published. A separate group-less reader asks
    the broker for each partition's log start and end and reads the record just before a
    position, so a check never moves the service's own consumer. A position whose log is
    gone (:func:`stale_position_reason`) is reset to the new log's start, logged at WARNING
    with the numbers, and returned. A check that cannot reach the broker changes nothing
    and is tried again at the next period.
    """

    def __init__(
        self, broker: Broker, client_id: str = "cellpilot", interval_s: float = DEFAULT_LOG_CHECK_INTERVAL_S
    ) -> None:
        self.broker = broker
        self.client_id = client_id
        self.interval_s = interval_s
        self._reader: AIOKafkaConsumer | None = None
        self._next_check = 0.0

    def due(self) -> bool:
        return time.monotonic() >= self._next_check

    async def stop(self) -> None:
        if self._reader is not None:
            await self._reader.stop()
            self._reader = None

    async def check(self, fences: Sequence[AppliedOffsets], partitions: Collection[Key]) -> list[LogReset]:
        """Check every position the fences hold for ``partitions``; reset the stale ones."""
        self._next_check = time.monotonic() + self.interval_s
        keys = sorted({key for fence in fences for key in fence.next_offset if key in partitions})
        if not keys:
            return []
        try:
            return await asyncio.wait_for(self._check(fences, keys), LOG_CHECK_TIMEOUT_S)
        except Exception as error:  # the broker is away: nothing is known, nothing changes
            log.info("log position check failed; retrying later", extra={"error": repr(error)})
            await self.stop()  # a reader left mid-request is not reused
            return []

    async def _check(self, fences: Sequence[AppliedOffsets], keys: list[Key]) -> list[LogReset]:
        reader = await self._started_reader()
        starts = {(tp.topic, tp.partition): int(o) for tp, o in (await reader.beginning_offsets(
            [TopicPartition(*key) for key in keys])).items()}  # fmt: skip
        wanted = {
            (key, offset)
            for fence in fences
            for key in keys
            if key in fence.next_offset
            and (offset := offset_to_read(fence.position(key), starts[key])) is not None
        }
        read, ends = await self._read(reader, wanted)
        resets = []
        for fence in fences:
            for key in keys:
                position = fence.position(key)
                if key not in fence.next_offset or key not in ends:
                    continue  # the log end is not known yet (no reply): checked next time
                start, end = starts[key], ends[key]
                reason = stale_position_reason(
                    position, start, end, read.get((key, position.next_offset - 1), ...)
                )
                if reason is None:
                    continue
                log.warning(
                    "the log of %s/%d is not the one applied (%s): stored position %d, log start %d,"
                    " log end %d; applying the new log from offset %d",
                    key[0], key[1], reason, position.next_offset, start, end, start,
                    extra={"topic": key[0], "partition": key[1], "stored_offset": position.next_offset,
                           "log_start": start, "log_end": end},
                )  # fmt: skip
                fence.reset(key, start)
                resets.append(LogReset(key[0], key[1], position.next_offset, start, end, reason))
        return resets

    async def _started_reader(self) -> AIOKafkaConsumer:
        if self._reader is None:
            reader = AIOKafkaConsumer(
                **client_options(self.broker),
                group_id=None,
                client_id=f"{self.client_id}-log-check",
                enable_auto_commit=False,
                auto_offset_reset="none",
                max_partition_fetch_bytes=1024,  # one record is wanted; the broker sends one batch
                fetch_max_wait_ms=100,
                request_timeout_ms=int(LOG_CHECK_TIMEOUT_S * 1000),
            )
            await reader.start()
            self._reader = reader
        return self._reader

    @staticmethod
    async def _read(
        reader: AIOKafkaConsumer, wanted: set[tuple[Key, int]]
    ) -> tuple[dict[tuple[Key, int], RecordFingerprint | None], dict[Key, int]]:
        """The fingerprint of the record at each (partition, offset) (None: the log has none there),
        and each partition's log end.

        The end is the high watermark of a fetch reply, not a ListOffsets answer (the embedded
        broker answers that with the start of the last batch plus one).
        """
        rounds: list[dict[TopicPartition, int]] = []  # one offset per partition in each
        for key, offset in sorted(wanted):
            tp = TopicPartition(*key)
            slot = next((r for r in rounds if tp not in r), None)
            if slot is None:
                rounds.append(slot := {})
            slot[tp] = offset
        read: dict[tuple[Key, int], RecordFingerprint | None] = {}
        ends: dict[Key, int] = {}
        for offsets in rounds:
            reader.assign(list(offsets))
            for tp, offset in offsets.items():
                reader.seek(tp, offset)
            waiting = set(offsets)
            try:
                while waiting:
                    fetched = await reader.getmany(*waiting, timeout_ms=100)
                    for tp in list(waiting):
                        end, messages = reader.highwater(tp), fetched.get(tp, [])
                        if end is None or (not messages and offsets[tp] < end):
                            continue  # no reply yet
                        waiting.discard(tp)
                        key = (tp.topic, tp.partition)
                        ends[key] = int(end)
                        same = bool(messages) and messages[0].offset == offsets[tp]
                        read[(key, offsets[tp])] = (
                            RecordFingerprint.of(record_of(messages[0])) if same else None
                        )
            finally:
                reader.assign([])
        return read, ends
