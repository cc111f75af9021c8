"""The aggregator: ``usage.samples`` -> 5-minute per-task and per-job histograms (Autopilot §3.2.1).

A loop per replica: read a batch of sample records -> convert (``convert.decode_samples``)
-> fold into the partition's event-time windows (:mod:`cellpilot.autopilot.event_windows`,
off the event loop) -> close the windows the watermark has passed -> checkpoint (windows,
offset, closed task rows; one fenced transaction) -> commit the Kafka offset. A second loop
sums job windows once every partition has closed them and publishes them
(:mod:`job_stage`). The Monitoring API answers from the same tables.

Replicas share the partitions of ``usage.samples`` through one consumer group. A crash
loses no window: the successor claims the partition (a new owner epoch), restores the
last checkpoint and re-reads from its offset, skipping what the checkpoint already holds
(:class:`~cellpilot.platform.kafka.AppliedOffsets`); nothing is counted twice because the
closed rows and the offset after them are written together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field

from opentelemetry import trace

from cellpilot.api.v1 import monitoring_pb2_grpc, usage_pb2
from cellpilot.autopilot.event_windows import ClosedWindows, PartitionWindows, WindowingConfig
from cellpilot.platform import kafka
from cellpilot.platform.grpc_server import GrpcServer, ServiceBinding
from cellpilot.platform.kafka_consumers import MessageConsumer
from cellpilot.platform.partition_owner import AssignmentChange, OwnedPartition, PartitionOwner
from cellpilot.platform.postgres import apply_migrations
from cellpilot.platform.service import run_until_stopped
from cellpilot.platform.store_outage import POSTGRES, StoreOutageInterceptor
from cellpilot.platform.stream_access import StreamAccess
from cellpilot.platform.telemetry import Telemetry
from cellpilot_services.aggregator import convert
from cellpilot_services.aggregator.history_store import FencedError, HistoryStore, PartitionProgress
from cellpilot_services.aggregator.job_stage import close_job_windows, publish_job_histograms
from cellpilot_services.aggregator.monitoring import MonitoringServicer
from cellpilot_services.aggregator.settings import AggregatorSettings

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


@dataclass(kw_only=True)
class WindowsPartition(OwnedPartition):
    """A ``usage.samples`` partition's open event-time windows, and its progress."""

    windows: PartitionWindows
    last_record_s: float
    last_checkpoint_s: float
    idle: bool = False
    invalid_samples: int = 0
    pending_rows: list[ClosedWindows] = field(default_factory=list)


class Aggregator:
    def __init__(
        self,
        settings: AggregatorSettings,
        telemetry: Telemetry | None = None,
        access: StreamAccess | None = None,
    ) -> None:
        self.settings = settings
        # The service's own stream access (given here only by a benchmark's unsigned baseline).
        self.access = access or settings.stream_access()
        self.telemetry = telemetry
        self.replica_id = settings.resolved_replica_id
        self.config = WindowingConfig(settings.window_ms, settings.out_of_orderness_ms, settings.grace_ms)
        self.store: HistoryStore | None = None
        self.consumer: MessageConsumer | None = None
        self.producer: kafka.MessageProducer | None = None
        self.server: GrpcServer | None = None
        self.owner: PartitionOwner[WindowsPartition] | None = None
        self.port = 0
        self._stop = asyncio.Event()
        self._job_trigger = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        # The latest "aggregate samples" spans: the published job windows link back to them
        # (a window sums many samples from many batches; the trace is joined by links).
        self.recent_aggregate_spans: deque[trace.Link] = deque(maxlen=kafka.MAX_SPAN_LINKS)

    @property
    def owned(self) -> dict[int, WindowsPartition]:
        return self.owner.owned if self.owner is not None else {}

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> int:
        platform = self.settings.platform
        if self.settings.apply_migrations:
            await apply_migrations(platform.postgres_url_for("aggregator"))
        self.store = await HistoryStore.connect(platform.postgres_url_for("aggregator"))
        await self.store.ensure_partitions(self.settings.samples_topic, self.settings.sample_partitions)
        self.producer = kafka.MessageProducer(self.access, client_id=self.replica_id)
        await self.producer.start()
        self.consumer = MessageConsumer(
            self.access,
            [self.settings.samples_topic],
            group_id=self.settings.consumer_group,
            client_id=self.replica_id,
            log_check_interval_s=platform.log_check_interval_s,
        )
        await self.consumer.start()
        self.owner = PartitionOwner(self.consumer, self.settings.samples_topic, self.replica_id, self._claim)
        self.server = GrpcServer(
            [
                ServiceBinding(
                    "cellpilot.api.v1.Monitoring",
                    monitoring_pb2_grpc.add_MonitoringServicer_to_server,
                    MonitoringServicer(self.store),
                )
            ],
            address=f"{self.settings.listen_host}:{self.settings.resolved_port}",
            **self.settings.security.server_options(
                "aggregator", extra_interceptors=[StoreOutageInterceptor(POSTGRES)]
            ),
        )
        self.port = await self.server.start()
        self._tasks = [
            asyncio.create_task(self._consume_loop()),
            asyncio.create_task(self._job_loop()),
        ]
        log.info("aggregator serving", extra={"replica": self.replica_id, "port": self.port})
        return self.port

    async def stop(self) -> None:
        self._stop.set()
        self._job_trigger.set()
        for task in self._tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, timeout=15)
        if self.server is not None:
            await self.server.stop(1.0)
        # A clean stop checkpoints what it owns, so a successor re-reads little.
        for owned in list(self.owned.values()):
            with contextlib.suppress(Exception):
                await self._checkpoint(owned, force=True)
        if self.consumer is not None:
            await self.consumer.stop()
        if self.producer is not None:
            await self.producer.stop()
        if self.store is not None:
            await self.store.close()

    # -- consuming ---------------------------------------------------------------------

    async def _consume_loop(self) -> None:
        assert self.owner is not None
        await self.owner.run(
            self._step, self._stop, timeout_ms=200, max_records=self.settings.max_poll_records
        )

    async def _step(self, records: list[kafka.Record], change: AssignmentChange) -> None:
        by_partition: dict[int, list[kafka.Record]] = defaultdict(list)
        for record in records:
            by_partition[record.partition].append(record)
        for partition, part in by_partition.items():
            owned = self.owned.get(partition)
            if owned is None:
                continue  # revoked meanwhile: the new owner re-reads it from its checkpoint
            if owned.idle and not await self._reactivate(owned):
                continue
            with tracer.start_as_current_span("aggregate samples", links=kafka.record_links(part)) as span:
                self.recent_aggregate_spans.append(trace.Link(span.get_span_context()))
                span.set_attribute("messaging.kafka.partition", partition)
                span.set_attribute("cellpilot.records", len(part))
                poison = await asyncio.to_thread(self._apply, owned, part)
            for error in poison:
                assert self.producer is not None
                await kafka.dead_letter(self.producer, error)
        await self._checkpoint_due()

    async def _reactivate(self, owned: WindowsPartition) -> bool:
        """An idle partition has input again: active in the database before it is applied.

        Job windows summed while it was idle are closed for it (their samples count late).
        False if another replica has taken the partition over.
        """
        assert self.store is not None
        try:
            jobs_closed = await self.store.reactivate(
                self.settings.samples_topic, owned.partition, owned.epoch
            )
        except FencedError:
            assert self.owner is not None
            return self.owner.keep(owned, saved=False)
        if jobs_closed is not None:
            closed = owned.windows.close_through(jobs_closed)
            if len(closed):
                owned.pending_rows.append(closed)
        owned.idle = False
        return True

    def _apply(self, owned: WindowsPartition, records: list[kafka.Record]) -> list[kafka.PoisonRecordError]:
        """Fold records into the partition's windows (runs in a worker thread)."""
        poison: list[kafka.PoisonRecordError] = []
        windows = owned.windows
        for record in records:
            if not owned.fence.is_new(record):
                continue  # already in the checkpoint we resumed from
            try:
                batch = record.decode(usage_pb2.UsageSampleBatch)
                if batch.machine_id != record.key:
                    # The key is the machine the writer was checked against (its certificate
                    # names the machines it may write for): a batch for another is refused.
                    reason = f"a batch for machine {batch.machine_id!r} under the key {record.key!r}"
                    raise kafka.PoisonRecordError(record, reason)
            except kafka.PoisonRecordError as error:
                poison.append(error)
                owned.fence.mark(record)
                continue
            if batch.batch_sequence == 0 or windows.accept_batch(batch.machine_id, batch.batch_sequence):
                decoded = convert.decode_samples(batch, windows.tasks)
                windows.add(decoded.chunk)
                owned.invalid_samples += decoded.invalid
            owned.fence.mark(record)
            owned.dirty = True
        if records:
            owned.last_record_s = time.monotonic()
            owned.idle = False
        return poison

    async def _claim(self, partition: int) -> WindowsPartition:
        """The partition under a new epoch, its windows restored from the last checkpoint."""
        assert self.store is not None
        claim = await self.store.claim(self.settings.samples_topic, partition, self.replica_id)
        if claim.checkpoint is not None:
            windows = await asyncio.to_thread(
                PartitionWindows.from_bytes,
                claim.checkpoint,
                self.config,
                self.settings.fold_every_samples,
            )
        else:
            windows = PartitionWindows(self.config, self.settings.fold_every_samples)
        fence = kafka.AppliedOffsets()
        fence.restore(
            (self.settings.samples_topic, partition),
            kafka.LogPosition(claim.next_offset, kafka.RecordFingerprint.decode(claim.last_applied)),
        )
        now = time.monotonic()
        owned = WindowsPartition(
            partition, claim.epoch, fence, windows=windows, last_record_s=now, last_checkpoint_s=now
        )
        if claim.jobs_closed_through_ms is not None:
            closed = windows.close_through(claim.jobs_closed_through_ms)
            if len(closed):
                owned.pending_rows.append(closed)
        return owned

    async def _checkpoint_due(self) -> None:
        now = time.monotonic()
        for owned in list(self.owned.values()):
            closed = owned.windows.close_ready()
            if len(closed):
                owned.pending_rows.append(closed)
            became_idle = False
            if not owned.idle and now - owned.last_record_s >= self.settings.idle_after_s:
                flushed = owned.windows.flush()
                if len(flushed):
                    owned.pending_rows.append(flushed)
                owned.idle = became_idle = True
                owned.dirty = True
            due = now - owned.last_checkpoint_s >= self.settings.checkpoint_interval_s
            # Closed windows and a partition going idle are saved at once: the job stage
            # waits for both (an idle partition is no longer waited for).
            if owned.pending_rows or became_idle or (owned.dirty and due):
                await self._checkpoint(owned)

    async def _checkpoint(self, owned: WindowsPartition, force: bool = False) -> None:
        assert self.store is not None
        assert self.owner is not None
        topic = self.settings.samples_topic
        pending = owned.pending_rows
        rows = await asyncio.to_thread(
            lambda: [r for closed in pending for r in convert.task_window_rows(closed, owned.partition)]
        )
        checkpoint = await asyncio.to_thread(owned.windows.to_bytes)
        position = owned.fence.position((topic, owned.partition))
        next_offset = position.next_offset
        windows = owned.windows
        progress = PartitionProgress(
            next_offset=next_offset,
            last_applied=position.last_applied.encode() if position.last_applied else None,
            closed_through_ms=windows.closed_through_ms,
            watermark_ms=windows.watermark_ms,
            idle=owned.idle,
            accepted_samples=windows.accepted_samples,
            late_samples=windows.late_samples,
            duplicate_batches=windows.duplicate_batches,
        )
        with tracer.start_as_current_span("checkpoint partition") as span:
            span.set_attribute("messaging.kafka.partition", owned.partition)
            span.set_attribute("cellpilot.closed_rows", len(rows))
            saved = await self.store.save(topic, owned.partition, owned.epoch, checkpoint, progress, rows)
        if not self.owner.keep(owned, saved):
            return
        owned.pending_rows = []
        owned.dirty = False
        owned.last_checkpoint_s = time.monotonic()
        if rows:
            self._job_trigger.set()
        if not force:
            await self.owner.commit(owned)

    # -- job windows -------------------------------------------------------------------

    async def _job_loop(self) -> None:
        assert self.store is not None
        assert self.producer is not None
        settings = self.settings
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._job_trigger.wait(), timeout=settings.job_stage_interval_s)
            self._job_trigger.clear()
            if self._stop.is_set():
                return
            try:
                while await close_job_windows(
                    self.store, settings.samples_topic, settings.sample_partitions, settings.window_ms
                ):
                    pass
                with tracer.start_as_current_span(
                    "publish job histograms", links=list(self.recent_aggregate_spans)
                ) as span:
                    published = 0
                    while True:
                        sent = await publish_job_histograms(
                            self.store, self.producer, settings.histograms_topic, settings.publish_batch
                        )
                        published += sent
                        if sent < settings.publish_batch:
                            break
                    span.set_attribute("cellpilot.histograms", published)
            except Exception:
                log.exception("job window stage failed; retrying")


async def serve(
    settings: AggregatorSettings, stop: asyncio.Event, telemetry: Telemetry | None = None
) -> None:
    await run_until_stopped(Aggregator(settings, telemetry), stop)
