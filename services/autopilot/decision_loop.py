"""The elected master's work (Autopilot §3.1): read every recommender's output, decide per
job, publish actuations, persist the state — one batch of ``recommendations`` at a time.

Read -> convert -> call the core (:func:`cellpilot.autopilot.decisions.decide`) -> convert
-> write. Per batch, for every job it touches: the latest output of each recommender
(converted to the core's :class:`~cellpilot.autopilot.job_inputs.JobInputs`) replaces the
stored one of the same recommender, the job is observed at the Borgmaster (spec, limits, state),
the core decides, an ``Actuation`` carrying the lease's fencing token is published when
something is to change, and the job's view (what the API shows, dry-run jobs included) and
decision memory are stored together with the consumed offsets in one fenced Redis write.
Held jobs are also scanned periodically, so a job with no recommendation yet is released
after the hold grace period (and a dry-run one at once).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from opentelemetry import trace

from cellpilot.api.v1 import actuation_pb2, autopilot_pb2, borgmaster_pb2, recommendation_pb2, state_pb2
from cellpilot.autopilot.decisions import (
    DecisionPolicy,
    JobMemory,
    decide,
    hold_release_ready,
    idempotency_key,
    remember_sent,
)
from cellpilot.autopilot.job_inputs import JobInputs
from cellpilot.client.errors import CellpilotError, NotFoundError
from cellpilot.platform import kafka
from cellpilot.platform.kafka_consumers import AssignedConsumer
from cellpilot.platform.leadership import Leadership
from cellpilot.platform.metrics import CellpilotMetrics
from cellpilot.platform.redis_client import FencedWrites
from cellpilot.platform.request_validation import InvalidField
from cellpilot_services.autopilot import convert
from cellpilot_services.autopilot.replica import AutopilotReplica
from cellpilot_services.autopilot.settings import AutopilotSettings

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)
MAX_CONCURRENT_OBSERVATIONS = 32


@dataclass(frozen=True)
class TermEnded:
    """What the decision loop returns: our term is over (the lease is gone, or a write fenced by
    our token was refused), so this replica stops acting at once (docs/architecture.md rule 7)."""

    reason: str


FENCED_WRITE_REFUSED = TermEnded("the fenced state write was refused")


@dataclass(frozen=True)
class JobOutcome:
    job_id: str
    view: autopilot_pb2.JobRecommendations
    memory: JobMemory | None
    actuation: actuation_pb2.Actuation | None


def policy_of(settings: AutopilotSettings) -> DecisionPolicy:
    return DecisionPolicy(
        min_increase_fraction=settings.min_increase_fraction,
        min_decrease_fraction=settings.min_decrease_fraction,
        resend_after_ms=int(settings.resend_after_s * 1000),
        machine_cpu_millicores=settings.machine_cpu_millicores,
        machine_memory_bytes=settings.machine_memory_bytes,
        auto_ml=settings.auto_ml,
    )


def collect_inputs(sets: Sequence[recommendation_pb2.RecommendationSet]) -> dict[str, JobInputs]:
    """Per job, the newest output of each recommender in ``sets``."""
    inputs: dict[str, JobInputs] = {}
    for rs in sets:
        if not rs.job_id:
            continue
        job = inputs.setdefault(rs.job_id, JobInputs())
        for candidate in convert.candidates_in(rs):
            job.offer_vertical(candidate)
        for signal in convert.horizontal_inputs_in(rs):
            job.offer_horizontal(signal)
    return inputs


class DecisionLoop:
    def __init__(self, replica: AutopilotReplica, metrics: CellpilotMetrics | None = None) -> None:
        self.replica = replica
        self.metrics = metrics
        self.policy = policy_of(replica.settings)
        self.memories: dict[str, JobMemory] = {}
        self.held_since: dict[str, float] = {}
        self.actuations_published = 0

    def _lease_gone(self, leadership: Leadership) -> TermEnded | None:
        if self.replica.lock.holds() and self.replica.lock.held == leadership:
            return None
        return TermEnded(f"lease of token {leadership.token} is gone")

    async def run(self, leadership: Leadership) -> TermEnded:
        """Act for one leadership term, until it ends (the result says why) or the task is
        cancelled."""
        self.memories.clear()
        self.held_since.clear()
        offsets = await self.replica.store.offsets()
        consumer = AssignedConsumer(
            self.replica.access,
            [self.replica.settings.recommendations_topic],
            client_id=f"{self.replica.lock.replica_id}-decisions",
            log_check_interval_s=self.replica.settings.platform.log_check_interval_s,
        )
        await consumer.start(offsets)  # checks the stored positions against the broker's logs
        log.info("leading: deciding", extra={"token": leadership.token, "offsets": offsets.to_mapping()})
        next_scan = 0.0
        try:
            async for batch in consumer.batches(
                timeout_ms=100, max_records=self.replica.settings.max_poll_records
            ):
                if ended := self._lease_gone(leadership):
                    return ended
                # Periodically, records or not: a position whose log is gone (a broker that
                # lost its log) resumes at the new log's start.
                batch = await consumer.follow_log_resets(batch, [offsets])
                fresh = [r for r in batch if offsets.is_new(r)]
                if fresh and (ended := await self._apply(fresh, offsets, leadership)):
                    return ended
                if time.monotonic() >= next_scan:
                    if ended := await self._scan_held(leadership):
                        return ended
                    next_scan = time.monotonic() + self.replica.settings.hold_scan_interval_s
        finally:
            await consumer.stop()
        raise AssertionError("the consumer's batches never end")  # pragma: no cover

    # ------------------------------------------------------------------ recommendations
    async def _apply(
        self, records: list[kafka.Record], offsets: kafka.AppliedOffsets, leadership: Leadership
    ) -> TermEnded | None:
        # One decision span per batch, linked to the recommendations it weighs; the actuations
        # it publishes are its children (their headers carry it to the actuator).
        with tracer.start_as_current_span("autopilot decide", links=kafka.record_links(records)) as span:
            span.set_attribute("cellpilot.records", len(records))
            return await self._apply_batch(records, offsets, leadership)

    async def _apply_batch(
        self, records: list[kafka.Record], offsets: kafka.AppliedOffsets, leadership: Leadership
    ) -> TermEnded | None:
        sets = []
        for record in records:
            try:
                sets.append(record.decode(recommendation_pb2.RecommendationSet))
            except kafka.PoisonRecordError as poison:
                await kafka.dead_letter(self.replica.producer, poison)
        inputs = collect_inputs(sets)
        writes = FencedWrites()
        for job_id, job in inputs.items():
            self.replica.store.put_inputs(writes, job_id, job)
        outcomes = await self._decide_all(list(inputs), inputs, {}, leadership)
        if ended := await self._publish_and_store(outcomes, writes, leadership):
            return ended
        for record in records:
            offsets.mark(record)
        self.replica.store.put_offsets(writes, offsets)
        return None if await self.replica.store.commit(writes, leadership.encode()) else FENCED_WRITE_REFUSED

    async def _decide_all(
        self,
        job_ids: list[str],
        inputs: Mapping[str, JobInputs],
        statuses: Mapping[str, state_pb2.JobStatus],
        leadership: Leadership,
    ) -> list[JobOutcome]:
        registered = sorted(await self.replica.store.recommenders())
        gate = asyncio.Semaphore(MAX_CONCURRENT_OBSERVATIONS)

        async def one(job_id: str) -> JobOutcome | None:
            async with gate:
                return await self._decide_job(
                    job_id, inputs.get(job_id, JobInputs()), statuses.get(job_id), registered, leadership
                )

        results = await asyncio.gather(*(one(j) for j in job_ids))
        return [r for r in results if r is not None]

    async def _observe(self, job_id: str) -> state_pb2.JobStatus | None:
        try:
            return (await self.replica.borgmaster.get_job(job_id, include_tasks=True)).job
        except NotFoundError:
            return None

    async def _decide_job(
        self,
        job_id: str,
        new: JobInputs,
        status: state_pb2.JobStatus | None,
        registered: list[str],
        leadership: Leadership,
    ) -> JobOutcome | None:
        known = (await self.replica.store.inputs(job_id)).updated_with(new)
        newest = known.newest_window_ms
        try:
            if status is None:
                status = await self._observe(job_id)
        except CellpilotError as error:
            log.warning(
                "cannot observe the job; deciding later", extra={"job_id": job_id, "error": str(error)}
            )
            return None
        if status is None or status.state == state_pb2.JOB_STATE_DEAD:
            view = autopilot_pb2.JobRecommendations(job_id=job_id, updated_ms=newest)
            return JobOutcome(job_id, view, None, None)
        held = status.state == state_pb2.JOB_STATE_HELD_FOR_AUTOPILOT
        try:
            job = convert.job_view_in(status, True, self.replica.settings.reference_machine_memory_bytes)
        except InvalidField as error:
            log.warning("job has an unusable Autopilot config", extra={"job_id": job_id, "error": str(error)})
            return None
        if held:
            since = self.held_since.setdefault(job_id, time.monotonic())
            held_for_ms = int((time.monotonic() - since) * 1000)
            ready = hold_release_ready(
                job, bool(known), held_for_ms, int(self.replica.settings.hold_grace_s * 1000)
            )
            job = replace(job, held=ready)
        signal = known.signal(job.horizontal)
        memory = self.memories.get(job_id) or await self.replica.store.memory(job_id) or JobMemory()
        now_ms = newest or int(time.time() * 1000)
        decision, memory = decide(job, known.candidates(), signal, memory, self.policy, now_ms, registered)
        actuation = None
        if decision.actuate:
            key = idempotency_key(decision, leadership.token)
            actuation = convert.actuation_out(
                decision, key, leadership.token, leadership.holder, status.spec_version
            )
            memory = remember_sent(memory, decision, key)
        view = convert.job_recommendations_out(decision, memory, held, now_ms)
        return JobOutcome(job_id, view, memory, actuation)

    async def _publish_and_store(
        self, outcomes: list[JobOutcome], writes: FencedWrites, leadership: Leadership
    ) -> TermEnded | None:
        """Publish the outcomes' actuations (never once our term may be over) and add their
        views and memories to ``writes``."""
        actuations = [o.actuation for o in outcomes if o.actuation is not None]
        if actuations:
            if ended := self._lease_gone(leadership):
                return ended
            await asyncio.gather(
                *(
                    self.replica.producer.send(self.replica.settings.actuations_topic, a.job_id, a)
                    for a in actuations
                )
            )
            self.actuations_published += len(actuations)
            for a in actuations:
                log.info(
                    "actuation published",
                    extra={"cause_id": a.idempotency_key, "job_id": a.job_id, "reason": a.reason},
                )
        if self.metrics is not None and outcomes:
            self.metrics.recommendations.add(len(outcomes))  # one decided view per job
        for outcome in outcomes:
            writes.hset(self.replica.store.view_key, outcome.job_id, outcome.view.SerializeToString())
            if outcome.memory is not None:
                self.memories[outcome.job_id] = outcome.memory
                self.replica.store.put_memory(writes, outcome.job_id, outcome.memory)
        return None

    # ------------------------------------------------------------------ held jobs
    async def _scan_held(self, leadership: Leadership) -> TermEnded | None:
        try:
            held = await self.replica.borgmaster.list_jobs(
                borgmaster_pb2.ListJobsRequest(states=[state_pb2.JOB_STATE_HELD_FOR_AUTOPILOT])
            )
        except CellpilotError as error:
            log.warning("cannot list held jobs", extra={"error": str(error)})
            return None
        ids = {s.job_id for s in held}
        for gone in set(self.held_since) - ids:
            del self.held_since[gone]
        if not held:
            return None
        statuses = {s.job_id: s for s in held}
        outcomes = await self._decide_all(sorted(ids), {}, statuses, leadership)
        outcomes = [o for o in outcomes if o.actuation is not None]
        if not outcomes:
            return None
        writes = FencedWrites()
        if ended := await self._publish_and_store(outcomes, writes, leadership):
            return ended
        return None if await self.replica.store.commit(writes, leadership.encode()) else FENCED_WRITE_REFUSED
