"""The gate every consumed record passes before a service sees it: checked, or refused and filed.

Both consumers of :mod:`cellpilot.platform.kafka_consumers` hand each batch they read to their
:class:`RecordGate` before yielding it, so no service can apply a record nobody checked. A
record the verifier refuses (:mod:`cellpilot.security.record_signing`: unsigned, badly signed,
from a producer the producer table does not allow on that topic, or replayed) is

* dropped from the batch: never applied;
* counted in ``cellpilot_records_refused_total{topic, reason}`` (every service's ``/metrics``);
* logged at WARNING with the topic, the reason and the producer it claims to be (a flood is
  logged :data:`LOG_BURST` lines per :data:`LOG_PERIOD_S`, the rest summed up in one line);
* filed on ``deadletter`` with the reason and the claimed producer, signed by the refusing
  service (a service reader; an observer with no signing key files nothing). Every reader
  that refuses a record files it: ``deadletter`` holds who refused what, and why (a reader that
  reads a topic again from its beginning, like the dashboard's history, files it again).

Checking is batched: one call per consumed batch, off the event loop for a large one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Iterable

from opentelemetry import metrics

from cellpilot.platform.kafka import (
    AppliedOffsets,
    MessageProducer,
    PoisonRecordError,
    Record,
    dead_letter,
)
from cellpilot.platform.stream_access import StreamAccess
from cellpilot.security.record_signing import Refusal, ReplayGuard

log = logging.getLogger(__name__)

# A batch this large is checked in a worker thread (each record costs one signature check).
THREAD_BATCH = 32
LOG_BURST = 20
LOG_PERIOD_S = 10.0

_refused_counter: metrics.Counter | None = None


def refused_counter() -> metrics.Counter:
    """``cellpilot.records.refused`` on the process's meter (``cellpilot_records_refused_total``)."""
    global _refused_counter
    if _refused_counter is None:
        _refused_counter = metrics.get_meter("cellpilot.streams").create_counter(
            "cellpilot.records.refused",
            unit="{record}",
            description="consumed records refused (never applied), by topic and reason",
        )
    return _refused_counter


class RecordGate:
    """Checks the batches one consumer reads; files and counts what it refuses."""

    def __init__(self, access: StreamAccess, client_id: str) -> None:
        self.access = access
        self.client_id = client_id
        self.guard = ReplayGuard()
        self.refused: Counter[tuple[str, str]] = Counter()  # (topic, reason) -> records
        self._dead_letters: MessageProducer | None = None
        self._log_window_start = 0.0
        self._logged_in_window = 0
        self._unlogged = 0

    async def admit(self, records: list[Record]) -> list[Record]:
        """The records that may be applied, in order; the others are refused (module docstring)."""
        verifier = self.access.verifier
        if not records or verifier is None:
            return records
        if len(records) >= THREAD_BATCH:
            refusals = await asyncio.to_thread(verifier.refusals, records, self.guard)
        else:
            refusals = verifier.refusals(records, self.guard)
        admitted = []
        for record, refusal in zip(records, refusals, strict=True):
            if refusal is None:
                admitted.append(record)
            else:
                await self._refuse(record, refusal)
        return admitted

    def seed(self, fences: Iterable[AppliedOffsets]) -> None:
        """Seed the replay guard with the records the fences say were applied last
        (:meth:`~cellpilot.security.record_signing.ReplayGuard.seed`)."""
        for fence in fences:
            for (topic, partition), last in fence.last_applied.items():
                self.guard.seed(topic, partition, last.timestamp_ms)

    async def _refuse(self, record: Record, refusal: Refusal) -> None:
        self.refused[(record.topic, refusal.reason)] += 1
        refused_counter().add(1, {"topic": record.topic, "reason": refusal.reason})
        self._warn(record, refusal)
        if self.access.signer is None:
            return
        try:
            producer = await self._dead_letter_producer()
            poison = PoisonRecordError(record, f"{refusal.reason}: {refusal.detail}")
            extra = [
                ("refusal", refusal.reason.encode()),
                ("claimed-producer", refusal.claimed_producer.encode()),
            ]
            await dead_letter(producer, poison, extra, quiet=True)
        except Exception as error:  # the broker is away: the record is refused all the same
            log.info("could not file a refused record on deadletter", extra={"error": repr(error)})

    def _warn(self, record: Record, refusal: Refusal) -> None:
        now = time.monotonic()
        if now - self._log_window_start >= LOG_PERIOD_S:
            if self._unlogged:
                log.warning(
                    "%d more refused records were not logged one by one (counted in /metrics)",
                    self._unlogged,
                    extra={"consumer": self.client_id, "refused_total": sum(self.refused.values())},
                )
            self._log_window_start, self._logged_in_window, self._unlogged = now, 0, 0
        if self._logged_in_window >= LOG_BURST:
            self._unlogged += 1
            return
        self._logged_in_window += 1
        log.warning(
            "refused a record of %s from %s: %s (%s)",
            record.topic,
            refusal.claimed_producer or "an unnamed producer",
            refusal.reason,
            refusal.detail,
            extra={
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "reason": refusal.reason,
                "claimed_producer": refusal.claimed_producer,
                "consumer": self.client_id,
            },
        )

    async def _dead_letter_producer(self) -> MessageProducer:
        if self._dead_letters is None:
            producer = MessageProducer(self.access, client_id=f"{self.client_id}-deadletter")
            try:
                await producer.start()
            except Exception:
                with contextlib.suppress(Exception):
                    await producer.stop()
                raise
            self._dead_letters = producer
        return self._dead_letters

    async def stop(self) -> None:
        if self._dead_letters is not None:
            with contextlib.suppress(Exception):
                await self._dead_letters.stop()
            self._dead_letters = None
