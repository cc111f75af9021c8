"""What went over the broker during a chaos run, as an independent reader saw it.

The :class:`StreamObserver` reads every partition of ``usage.samples``, ``usage.histograms``,
``recommendations`` and ``actuations`` from the beginning, with no consumer group (nothing it
does moves a service's position), through the same :class:`AssignedConsumer` the services
use: when the broker loses its log (a restart), its positions are found stale within a second
and it reads the new log from its start. Each partition's logs are numbered (generation 0, 1,
...) so that a record lost with a log can be told from one of the log that replaced it.

It keeps, in a :class:`StreamLedger` (plain data, checked by :mod:`cellpilot.chaos.invariants`):
every sample batch (its machine and sequence, and how many samples per window end), a digest of
each job window's histogram and of each recommendation set, every actuation's fencing token, and
every record a service refused and filed on ``deadletter`` (topic, reason, a digest of its value).
Like the services, it reads only records whose signature it has checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from cellpilot.api.v1 import actuation_pb2, recommendation_pb2, usage_pb2
from cellpilot.platform.kafka import DEADLETTER_TOPIC, AppliedOffsets, PoisonRecordError, Record
from cellpilot.platform.kafka_consumers import AssignedConsumer
from cellpilot.platform.stream_access import StreamAccess

log = logging.getLogger(__name__)

SAMPLES, HISTOGRAMS, RECOMMENDATIONS, ACTUATIONS = (
    "usage.samples",
    "usage.histograms",
    "recommendations",
    "actuations",
)
OBSERVED_TOPICS = [SAMPLES, HISTOGRAMS, RECOMMENDATIONS, ACTUATIONS, DEADLETTER_TOPIC]
WINDOW_MS = 300_000  # Autopilot §3.2.1: the aggregator's 5-minute windows
LOG_CHECK_INTERVAL_S = 1.0


@dataclass(frozen=True)
class SampleBatchSeen:
    """One ``UsageSampleBatch`` record: where it was, whose, and its samples per window end."""

    generation: int
    partition: int
    offset: int
    machine_id: str
    sequence: int
    samples_by_window_end: dict[int, int]

    @property
    def samples(self) -> int:
        return sum(self.samples_by_window_end.values())


@dataclass(frozen=True)
class ActuationSeen:
    generation: int
    partition: int
    offset: int
    job_id: str
    fencing_token: int
    leader_id: str
    idempotency_key: str


@dataclass(frozen=True)
class LogResetSeen:
    """The observer found the log of ``topic/partition`` replaced: generation ``generation``
    begins (``seen_at``: wall-clock seconds)."""

    seen_at: float
    topic: str
    partition: int
    generation: int
    records_read_from_old_log: int


@dataclass(frozen=True)
class RefusalSeen:
    """A record a service refused, as filed on ``deadletter``."""

    topic: str
    reason: str  # the refusal code (cellpilot.security.record_signing), "" for an undecodable record
    value_digest: str
    claimed_producer: str
    refused_by: str  # the service that filed it


@dataclass
class StreamLedger:
    samples: list[SampleBatchSeen] = field(default_factory=list)
    # (job, resource, window start) -> digests of the histograms published for it
    histograms: dict[tuple[str, int, int], set[str]] = field(default_factory=lambda: defaultdict(set))
    histogram_records: int = 0
    # (job, window end) -> digests of the recommendation sets (OOM reactions and producer left out)
    recommendation_sets: dict[tuple[str, int], set[str]] = field(default_factory=lambda: defaultdict(set))
    recommendation_records: int = 0
    actuations: list[ActuationSeen] = field(default_factory=list)
    resets: list[LogResetSeen] = field(default_factory=list)
    refusals: list[RefusalSeen] = field(default_factory=list)
    undecodable: int = 0


def value_digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


_digest = value_digest


def samples_by_window_end(event_times_ms: list[int], window_ms: int = WINDOW_MS) -> dict[int, int]:
    """How many of the event times fall in each window, keyed by the window's end."""
    if not event_times_ms:
        return {}
    ends, counts = np.unique(
        (np.asarray(event_times_ms, dtype=np.int64) // window_ms + 1) * window_ms, return_counts=True
    )
    return {int(end): int(count) for end, count in zip(ends, counts, strict=True)}


def take_record(ledger: StreamLedger, record: Record, generation: int) -> None:
    """File one record of an observed topic in the ledger."""
    if record.topic == SAMPLES:
        batch = record.decode(usage_pb2.UsageSampleBatch)
        times = [sample.event_time_ms for sample in batch.samples]
        ledger.samples.append(
            SampleBatchSeen(
                generation,
                record.partition,
                record.offset,
                batch.machine_id,
                batch.batch_sequence,
                samples_by_window_end(times),
            )
        )
    elif record.topic == HISTOGRAMS:
        histogram = record.decode(usage_pb2.UsageHistogram)
        ledger.histogram_records += 1
        key = (histogram.job_id, int(histogram.resource), histogram.window_start_ms)
        ledger.histograms[key].add(_digest(record.value))
    elif record.topic == RECOMMENDATIONS:
        sets = record.decode(recommendation_pb2.RecommendationSet)
        ledger.recommendation_records += 1
        if any("OOM" in r.explanation.note for r in sets.vertical):
            return  # a reaction to an OOM: published at once, beside the window's own set
        sets.ClearField("producer")  # whichever worker made it
        ledger.recommendation_sets[(sets.job_id, sets.window_end_ms)].add(
            _digest(sets.SerializeToString(deterministic=True))
        )
    elif record.topic == DEADLETTER_TOPIC:
        headers = {name: value.decode(errors="replace") for name, value in record.headers}
        ledger.refusals.append(
            RefusalSeen(
                headers.get("source-topic", record.key),
                headers.get("refusal", ""),
                value_digest(record.value),
                headers.get("claimed-producer", ""),
                headers.get("cp-producer", ""),
            )
        )
    elif record.topic == ACTUATIONS:
        actuation = record.decode(actuation_pb2.Actuation)
        ledger.actuations.append(
            ActuationSeen(
                generation,
                record.partition,
                record.offset,
                actuation.job_id,
                actuation.fencing_token,
                actuation.leader_id,
                actuation.idempotency_key,
            )
        )


class StreamObserver:
    """Follows the observed topics into a :class:`StreamLedger` until stopped."""

    def __init__(self, access: StreamAccess) -> None:
        self.access = access
        self.ledger = StreamLedger()
        self.fence = AppliedOffsets()
        self.generation: dict[tuple[str, int], int] = defaultdict(int)
        self.read_in_generation: dict[tuple[str, int], int] = defaultdict(int)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        consumer = AssignedConsumer(
            self.access,
            OBSERVED_TOPICS,
            client_id="chaos-observer",
            log_check_interval_s=LOG_CHECK_INTERVAL_S,
        )
        await consumer.start()  # every partition from its beginning
        self._task = asyncio.create_task(self._follow(consumer))

    async def stop(self) -> StreamLedger:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self._task, 30)
        return self.ledger

    async def _follow(self, consumer: AssignedConsumer) -> None:
        try:
            async for batch in consumer.batches(timeout_ms=200, max_records=5_000):
                if self._stop.is_set():
                    return
                before = dict(self.fence.next_offset)
                batch = await consumer.follow_log_resets(batch, [self.fence])
                self._note_resets(before)
                for record in batch:
                    if not self.fence.is_new(record):
                        continue  # read again before the check found the log replaced
                    self.fence.mark(record)
                    key = (record.topic, record.partition)
                    self.read_in_generation[key] += 1
                    try:
                        take_record(self.ledger, record, self.generation[key])
                    except PoisonRecordError:
                        self.ledger.undecodable += 1
        finally:
            await consumer.stop()

    def _note_resets(self, before: dict[tuple[str, int], int]) -> None:
        for key, offset in before.items():
            if self.fence.next_offset.get(key, 0) < offset:
                self.generation[key] += 1
                self.ledger.resets.append(
                    LogResetSeen(
                        time.time(), key[0], key[1], self.generation[key], self.read_in_generation[key]
                    )
                )
                self.read_in_generation[key] = 0
