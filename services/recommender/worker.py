"""A recommender worker: job histograms in, every recommender's output out (Autopilot §3.1-§3.3).

A loop per replica: read a batch of ``usage.histograms`` records (and, without waiting,
OOM events from ``borg.events``) -> convert (:mod:`convert`) -> update every applicable
recommender of each job, batched across jobs (:mod:`cellpilot.autopilot.job_recommendations`,
off the event loop) -> publish one RecommendationSet per job and window (once both
resources of the window are in; at once after an OOM) -> checkpoint the changed jobs and
the offsets in Redis (:mod:`state_store`, fenced) -> commit the Kafka offset.

Replicas share the partitions of ``usage.histograms`` through one consumer group; a job's
state lives with its partition (records are keyed by job id). A worker taking over a
partition bumps its epoch and resumes from the checkpoint, skipping records the
checkpoint already holds (:class:`~cellpilot.platform.kafka.AppliedOffsets`). Publishing
before checkpointing makes the output at-least-once with deterministic ids: a crash
between the two re-publishes the same sets, it never loses one.

OOM feedback (§3.2, Figure 9a): every worker reads all of ``borg.events`` and applies an
OOM to the job only if it owns the job's partition, fenced by the ``borg.events`` offsets
stored in that partition's checkpoint. The same stream's job events carry each job's spec:
the worker keeps the job's own horizon T and statistic S of horizontal scaling's r_S (§3.3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from dataclasses import dataclass, field

from aiokafka.partitioner import DefaultPartitioner
from opentelemetry import trace

from cellpilot.autopilot.job_recommendations import (
    HistogramInput,
    HorizontalSettings,
    OomInput,
    RecommenderState,
    apply_histograms,
    apply_horizontal_settings,
    apply_ooms,
)
from cellpilot.autopilot.ml_config import shipped_recommender_config
from cellpilot.platform import kafka
from cellpilot.platform.grpc_server import GrpcServer
from cellpilot.platform.kafka_consumers import AssignedConsumer, MessageConsumer
from cellpilot.platform.metrics import CellpilotMetrics
from cellpilot.platform.partition_owner import AssignmentChange, OwnedPartition, PartitionOwner
from cellpilot.platform.redis_client import connect_redis
from cellpilot.platform.service import run_until_stopped
from cellpilot.platform.telemetry import Telemetry
from cellpilot.recommend.unmet_demand import RaiseForUnmetDemand
from cellpilot_services.recommender import convert
from cellpilot_services.recommender.settings import RecommenderSettings
from cellpilot_services.recommender.state_store import StateStore

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)


@dataclass(kw_only=True)
class JobsPartition(OwnedPartition):
    """A ``usage.histograms`` partition's jobs, and what changed in them since the checkpoint."""

    jobs: dict[str, RecommenderState]
    changed: set[str] = field(default_factory=set)  # jobs whose state changed since the checkpoint
    oom_jobs: set[str] = field(default_factory=set)  # jobs bumped by an OOM since then
    ready: list[tuple[str, int, RecommenderState]] = field(default_factory=list)  # sets to publish


@dataclass
class StepOutput:
    published: int = 0
    poison: list[kafka.PoisonRecordError] = field(default_factory=list)


class RecommenderWorker:
    def __init__(self, settings: RecommenderSettings, telemetry: Telemetry | None = None) -> None:
        self.settings = settings
        self.replica_id = settings.resolved_replica_id
        self.config = shipped_recommender_config(
            settings.ml_config or None,
            unmet_demand=RaiseForUnmetDemand() if settings.raise_cpu_for_unmet_demand else None,
        )
        self.metrics = CellpilotMetrics.on(telemetry.meter) if telemetry is not None else None
        self.redis = connect_redis(settings.platform.redis_url_for("recommender"))
        self.store = StateStore(self.redis, settings.state_prefix, settings.consumer_group)
        self.access = settings.stream_access()
        self.producer = kafka.MessageProducer(self.access, client_id=self.replica_id)
        self.consumer = MessageConsumer(
            self.access,
            [settings.histograms_topic],
            group_id=settings.consumer_group,
            client_id=self.replica_id,
            log_check_interval_s=settings.platform.log_check_interval_s,
        )
        self.owner = PartitionOwner(self.consumer, settings.histograms_topic, self.replica_id, self._claim)
        self.owned = self.owner.owned
        self.events: AssignedConsumer | None = None
        self.server = GrpcServer(
            [],
            address=f"{settings.listen_host}:{settings.resolved_port}",
            **settings.security.server_options("recommender"),
        )
        # Malformed borg.events records skipped: every worker reads that stream, so none of
        # them dead-letters it (that would file each poison record once per worker).
        self.skipped_events = 0
        self.partitions = settings.histogram_partitions
        self._partitioner = DefaultPartitioner()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> int:
        await self.producer.start()
        await self.consumer.start()
        self.port = await self.server.start()
        self._task = asyncio.create_task(self._run())
        log.info("recommender worker serving", extra={"replica": self.replica_id, "port": self.port})
        return self.port

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, timeout=15)
        await self.server.stop(1.0)
        if self.events is not None:
            await self.events.stop()
        await self.consumer.stop()
        await self.producer.stop()
        await self.redis.aclose()

    def partition_of(self, job_id: str) -> int:
        every = list(range(self.partitions))
        return int(self._partitioner(job_id.encode(), every, every))

    # -- the loop ----------------------------------------------------------------------

    async def _run(self) -> None:
        settings = self.settings
        await self.owner.run(
            self._consume,
            self._stop,
            timeout_ms=settings.poll_timeout_ms,
            max_records=settings.max_poll_records,
        )

    async def _claim(self, partition: int) -> JobsPartition:
        checkpoint = await self.store.claim(partition)
        return JobsPartition(partition, checkpoint.epoch, checkpoint.offsets, jobs=checkpoint.jobs)

    async def _consume(self, records: list[kafka.Record], change: AssignmentChange) -> None:
        if change.changed:
            await self._restart_events()
        events = await self._poll_events()
        if self.events is not None:
            # Every owned partition's borg.events positions are checked too, like its
            # usage.histograms one: at a claim, then periodically (a broker that lost its log).
            events = await self.events.follow_log_resets(
                events, self.owner.fences(), force=bool(change.claimed)
            )
        await self._step(records, events)

    async def _restart_events(self) -> None:
        """Read ``borg.events`` from the oldest position any owned partition still needs."""
        if not self.settings.events_topic:
            return
        if self.events is not None:
            await self.events.stop()
            self.events = None
        if not self.owned:
            return
        events_topic = self.settings.events_topic
        starts: dict[tuple[str, int], int] = {}
        positions = [o.fence.next_offset for o in self.owned.values()]
        keys = {k for p in positions for k in p if k[0] == events_topic}
        for key in keys:
            # A partition with no position for this events partition needs it from the start.
            starts[key] = min(p.get(key, 0) for p in positions)
        self.events = AssignedConsumer(
            self.access,
            [events_topic],
            client_id=f"{self.replica_id}-events",
            log_check_interval_s=self.settings.platform.log_check_interval_s,
        )
        # Starts where the oldest position needs; the positions themselves (with their
        # fingerprints) are checked by follow_log_resets right after a claim.
        await self.events.start(kafka.AppliedOffsets(starts))

    async def _poll_events(self) -> list[kafka.Record]:
        if self.events is None:
            return []
        return await anext(self.events.batches(timeout_ms=1, max_records=self.settings.max_poll_records))

    async def _step(self, records: list[kafka.Record], events: list[kafka.Record]) -> None:
        by_partition: dict[int, list[kafka.Record]] = defaultdict(list)
        for record in records:
            if record.partition in self.owned:
                by_partition[record.partition].append(record)
        if not by_partition and not events:
            return
        # Linked to the histogram records it folds in; the recommendations it publishes are its
        # children (their headers carry this span), so a trace walks window -> recommendation.
        links = kafka.record_links([*records, *events])
        with tracer.start_as_current_span("recommend", links=links) as span:
            span.set_attribute("cellpilot.records", len(records))
            span.set_attribute("cellpilot.events", len(events))
            out = await asyncio.to_thread(self._apply, by_partition, events)
            for error in out.poison:
                await kafka.dead_letter(self.producer, error)
            await self._publish_and_checkpoint()

    def _apply(self, by_partition: dict[int, list[kafka.Record]], events: list[kafka.Record]) -> StepOutput:
        """Convert and fold records into the owned partitions' recommender states (a worker thread)."""
        out = StepOutput()
        for partition, records in by_partition.items():
            owned = self.owned[partition]
            inputs: list[HistogramInput] = []
            for record in records:
                if not owned.fence.is_new(record):
                    continue  # already in the checkpoint we resumed from
                owned.fence.mark(record)
                owned.dirty = True
                try:
                    inputs.append(convert.histogram_in(record, self.config))
                except kafka.PoisonRecordError as error:
                    out.poison.append(error)
            result = apply_histograms(self.config, owned.jobs, inputs)
            owned.changed |= result.changed
            owned.ready.extend(result.ready)
        ooms: dict[int, list[OomInput]] = defaultdict(list)
        horizons: dict[int, dict[str, HorizontalSettings]] = defaultdict(dict)
        for record in events:
            try:
                oom = convert.oom_in(record)
                settings = convert.horizontal_settings_in(record, self.config) if oom is None else None
            except kafka.PoisonRecordError as error:  # the Borgmaster's stream: every worker reads it
                self.skipped_events += 1
                log.warning(
                    "skipped a malformed borg.events record",
                    extra={"reason": error.reason, "skipped_total": self.skipped_events},
                )
                oom, settings = None, None
            job_id = oom.job_id if oom is not None else settings[0] if settings is not None else None
            target = self.partition_of(job_id) if job_id is not None else -1
            for owned in self.owned.values():
                if not owned.fence.is_new(record):
                    continue
                owned.fence.mark(record)
                owned.dirty = True
                if oom is not None and owned.partition == target:
                    ooms[target].append(oom)
                if settings is not None and owned.partition == target:
                    horizons[target][settings[0]] = settings[1]
        for partition, by_job in horizons.items():
            owned = self.owned[partition]
            owned.changed |= apply_horizontal_settings(self.config, owned.jobs, by_job)
        for partition, items in ooms.items():
            owned = self.owned[partition]
            bumped = apply_ooms(self.config, owned.jobs, items)
            owned.changed |= bumped
            for job_id in bumped:
                owned.oom_jobs.add(job_id)
        return out

    async def _publish_and_checkpoint(self) -> None:
        for owned in list(self.owned.values()):
            if not owned.dirty:
                continue
            per_job: dict[str, list[tuple[int, RecommenderState]]] = defaultdict(list)
            for job_id, end, state in owned.ready:
                per_job[job_id].append((end, state))
            for job_id in sorted(owned.oom_jobs):
                state = owned.jobs[job_id]
                per_job[job_id].append((max(row.time_ms for row in state.rows.values()), state))
            if per_job:
                await asyncio.gather(*(self._send_in_order(job_id, sets) for job_id, sets in per_job.items()))
                if self.metrics is not None:
                    self.metrics.recommendations.add(sum(len(sets) for sets in per_job.values()))
            changed = {job_id: owned.jobs[job_id] for job_id in owned.changed}
            saved = await self.store.save(owned.partition, owned.epoch, owned.fence, changed)
            if not self.owner.keep(owned, saved):
                continue
            owned.changed.clear()
            owned.oom_jobs.clear()
            owned.ready.clear()
            owned.dirty = False
            await self.owner.commit(owned)

    async def _send_in_order(self, job_id: str, sets: list[tuple[int, RecommenderState]]) -> None:
        """One job's sets one after the other, so they stay in order on its partition."""
        for end, state in sets:
            message = convert.recommendation_set(job_id, state, end, self.replica_id, self.config)
            await self.producer.send(self.settings.recommendations_topic, job_id, message)


async def serve(
    settings: RecommenderSettings, stop: asyncio.Event, telemetry: Telemetry | None = None
) -> None:
    await run_until_stopped(RecommenderWorker(settings, telemetry), stop)
