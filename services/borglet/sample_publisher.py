"""Publishes usage samples on Kafka ``usage.samples``: one UsageSampleBatch per machine per flush.

The tick loop hands over samples as array chunks; every ``interval_s`` of wall time the
publisher turns everything buffered into batches (key = machine id, so one machine's
samples stay in order) and sends them concurrently. When the event clock is sped up a
batch simply holds several event-seconds of samples, so publishing keeps up with the
speed-up at a constant message rate. Trace context travels in the record headers (the
platform producer injects the flush span's context).

Delivery is at-least-once: batches that fail to send are kept (with their sequence numbers,
so consumers drop a batch they already have) and retried at the next flush. The buffer is
bounded; beyond it the oldest samples are dropped with a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
from opentelemetry import trace

from cellpilot.api.v1 import usage_pb2
from cellpilot.platform.kafka import MessageProducer
from cellpilot_services.borglet.convert import SampleChunk, sample_batches

log = logging.getLogger(__name__)

TOPIC = "usage.samples"


class SamplePublisher:
    def __init__(
        self,
        producer_factory: Callable[[], MessageProducer],
        machine_ids: Sequence[str],
        first_sequence: int,
        interval_s: float = 1.0,
        max_samples_per_batch: int = 20_000,
        max_buffered_samples: int = 5_000_000,
        topic: str = TOPIC,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self._producer_factory = producer_factory
        self._producer: MessageProducer | None = None
        self.machine_ids = list(machine_ids)
        self.next_sequence = dict.fromkeys(self.machine_ids, first_sequence)
        self.interval_s = interval_s
        self.max_samples_per_batch = max_samples_per_batch
        self.max_buffered_samples = max_buffered_samples
        self.topic = topic
        self._tracer = tracer or trace.get_tracer(__name__)
        self._chunks: deque[tuple[SampleChunk, int]] = deque()
        self._buffered = 0
        self._unsent: list[tuple[str, usage_pb2.UsageSampleBatch]] = []
        self.dropped_samples = 0
        self.published_batches = 0
        self.published_samples = 0

    def add(self, chunk: SampleChunk) -> None:
        count = int(np.count_nonzero(chunk.result.sampled))
        if count == 0:
            return
        self._chunks.append((chunk, count))
        self._buffered += count
        while self._buffered > self.max_buffered_samples and len(self._chunks) > 1:
            _, dropped = self._chunks.popleft()
            self._buffered -= dropped
            self.dropped_samples += dropped
            log.warning("sample buffer full: dropped the oldest samples", extra={"dropped": dropped})

    async def run(self, stop: asyncio.Event) -> None:
        """Connect (retrying until Kafka answers), then flush every interval until ``stop``."""
        delay = 0.5
        while not stop.is_set() and self._producer is None:
            producer = self._producer_factory()
            try:
                await producer.start()
                self._producer = producer
            except Exception as error:
                log.warning("Kafka not reachable; retrying", extra={"error": str(error)})
                with contextlib.suppress(Exception):
                    await producer.stop()
                await _wait(stop, delay)
                delay = min(delay * 2, 10.0)
        while not stop.is_set():
            await _wait(stop, self.interval_s)
            await self.flush()

    async def close(self) -> None:
        """Flush what is left, then disconnect."""
        if self._producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.flush(), timeout=10)
            await self._producer.stop()
            self._producer = None

    async def flush(self) -> int:
        """Send everything buffered; returns the number of batches sent."""
        if self._producer is None:
            return 0
        chunks = [chunk for chunk, _ in self._chunks]
        self._chunks.clear()
        self._buffered = 0
        # Building protobufs for many samples is CPU work: off the event loop, so polls interleave.
        built = await asyncio.to_thread(
            sample_batches, chunks, self.machine_ids, self.next_sequence, self.max_samples_per_batch
        )
        batches = self._unsent + built
        self._unsent = []
        if not batches:
            return 0
        producer = self._producer
        with self._tracer.start_as_current_span("borglet publish usage samples") as span:
            span.set_attribute("cellpilot.batches", len(batches))
            results = await asyncio.gather(
                *(producer.send(self.topic, machine_id, batch) for machine_id, batch in batches),
                return_exceptions=True,
            )
        sent = 0
        for (machine_id, batch), result in zip(batches, results, strict=True):
            if isinstance(result, BaseException):
                self._unsent.append((machine_id, batch))
            else:
                sent += 1
                self.published_samples += len(batch.samples)
        self.published_batches += sent
        if self._unsent:
            log.warning("some sample batches were not sent; retrying", extra={"unsent": len(self._unsent)})
        return sent


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
