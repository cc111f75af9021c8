"""The actuator (Autopilot §3.1): consumes ``actuations`` and applies each through the
Borgmaster's UpdateJob, following its elected master (:mod:`cellpilot.client`).

* **Idempotent.** The consumed offsets and every settled idempotency key are kept in
  Redis, saved in one transaction with the outcome; a record at an offset already applied
  is skipped, and an actuation whose key was settled before (the same decision published
  again) is a no-op recorded as DUPLICATE. The key is also the UpdateJob request id, so
  even a crash between UpdateJob and the save applies nothing twice.
* **Decisions in order.** A newer decision made on a spec version the actuator's own previous
  update replaced goes onto the version that update produced; a change by anyone else in
  between still refuses it (CONFLICT) (:class:`ActuationGuard`).
* **Fenced.** The highest fencing token that reached the Borgmaster is kept; an actuation
  with an older token comes from a deposed Autopilot master and is refused (FENCED). The
  Borgmaster checks the same per job.
* **Rate-limited** per job and globally (token buckets, :mod:`cellpilot.autopilot.rate_limit`).
* **Retries with backoff** while no Borgmaster master answers (failover), up to
  ``max_attempts``; then FAILED.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter

from opentelemetry import trace

from cellpilot.api.v1 import actuation_pb2
from cellpilot.autopilot.actuation_guard import ActuationGuard, Admission
from cellpilot.autopilot.rate_limit import KeyedBuckets, TokenBucket
from cellpilot.client.async_client import CellpilotClient
from cellpilot.client.errors import CellpilotError
from cellpilot.client.failover import RetryPolicy
from cellpilot.platform import kafka
from cellpilot.platform.grpc_server import GrpcServer
from cellpilot.platform.kafka_consumers import AssignedConsumer
from cellpilot.platform.metrics import CellpilotMetrics
from cellpilot.platform.redis_client import connect_redis, reply_bytes, reply_text
from cellpilot.platform.service import run_until_stopped
from cellpilot.platform.telemetry import Telemetry
from cellpilot.platform.topics import TOPICS, Topic
from cellpilot_services.actuator import update_request
from cellpilot_services.actuator.settings import ActuatorSettings

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)
OUTCOME = actuation_pb2.ActuationOutcome


class ActuationResults:
    """Where outcomes, offsets and the highest token live in Redis (prefix ``<p>``).

    ``<p>:result:<key>`` -> ``ActuationResult`` (expires after ``ttl_s``), ``<p>:offsets``
    hash (``<topic>/<partition>`` -> ``LogPosition.encode``), ``<p>:highest_token``.
    """

    def __init__(self, redis_url: str, prefix: str, ttl_s: int) -> None:
        self.redis = connect_redis(redis_url)
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.offsets_key = f"{prefix}:offsets"
        self.token_key = f"{prefix}:highest_token"

    def result_key(self, idempotency_key: str) -> str:
        return f"{self.prefix}:result:{idempotency_key}"

    async def load(self) -> tuple[kafka.AppliedOffsets, int]:
        raw = await self.redis.hgetall(self.offsets_key)
        token = await self.redis.get(self.token_key)
        offsets = kafka.AppliedOffsets.from_mapping({reply_text(k): reply_text(v) for k, v in raw.items()})
        return offsets, int(token or 0)

    async def result(self, idempotency_key: str) -> actuation_pb2.ActuationResult | None:
        raw = await self.redis.get(self.result_key(idempotency_key))
        if raw is None:
            return None
        out = actuation_pb2.ActuationResult()
        out.ParseFromString(reply_bytes(raw))
        return out

    async def save(
        self,
        record: kafka.Record,
        offsets: kafka.AppliedOffsets,
        highest_token: int,
        result: actuation_pb2.ActuationResult | None,
        duplicates_key: str = "",
    ) -> None:
        async with self.redis.pipeline(transaction=True) as tx:
            if result is not None:
                tx.set(self.result_key(result.idempotency_key), result.SerializeToString(), ex=self.ttl_s)
            if duplicates_key:
                tx.hincrby(f"{self.prefix}:replays", duplicates_key, 1)
            tx.hset(
                self.offsets_key,
                f"{record.topic}/{record.partition}",
                offsets.encoded((record.topic, record.partition)),
            )
            tx.set(self.token_key, str(highest_token))
            await tx.execute()

    async def replays(self, idempotency_key: str) -> int:
        raw = await self.redis.hget(f"{self.prefix}:replays", idempotency_key)
        return int(raw or 0)

    async def close(self) -> None:
        await self.redis.aclose()


class Actuator:
    def __init__(self, settings: ActuatorSettings, metrics: CellpilotMetrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics
        self.replica_id = settings.resolved_replica_id
        self.results = ActuationResults(
            settings.platform.redis_url_for("actuator"), settings.redis_prefix, settings.result_ttl_s
        )
        self.client = CellpilotClient(
            borgmaster=settings.borgmaster_addresses,
            policy=RetryPolicy(
                budget_s=settings.call_budget_s, call_timeout_s=min(5.0, settings.call_budget_s)
            ),
            # The actuator identity may change only limits / task counts of Autopilot-enabled
            # jobs and release their hold (cellpilot.security.policy).
            **settings.security.client_options("actuator"),
        )
        self.access = settings.stream_access()
        self.producer = kafka.MessageProducer(self.access, client_id=self.replica_id)
        self.guard = ActuationGuard()
        self.per_job = KeyedBuckets(settings.per_job_rate_per_s, settings.per_job_burst)
        self.cell = TokenBucket(settings.global_rate_per_s, settings.global_burst)
        self.outcomes: Counter[str] = Counter()
        self.replayed_records = 0
        self.server = GrpcServer(
            [],
            address=f"{settings.listen_host}:{settings.resolved_port}",
            **settings.security.server_options("actuator"),
        )
        self.address = ""
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> str:
        known = {t.name: t for t in TOPICS}
        topic = self.settings.actuations_topic
        await kafka.ensure_topics(self.access, [known.get(topic) or Topic(topic, 3, "job id", "")])
        await self.producer.start()
        port = await self.server.start()
        self.address = f"{self.settings.listen_host}:{port}"
        self._task = asyncio.create_task(self._run())
        return self.address

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.server.stop(1.0)
        await self.producer.stop()
        await self.client.close()
        await self.results.close()

    async def _run(self) -> None:
        """Consume until stopped. A failure of a store or the broker under it (Redis restarting:
        the outcome of a record cannot be saved) ends one pass, never the loop: the next pass
        resumes from the positions saved in Redis, once it answers again (a record whose outcome
        was not saved is read again; its idempotency key keeps it from being applied twice)."""
        backoff = self.settings.initial_backoff_s
        while True:
            began = time.monotonic()
            try:
                await self._consume()
            except asyncio.CancelledError:
                raise
            except Exception:
                if time.monotonic() - began > self.settings.max_backoff_s:
                    backoff = self.settings.initial_backoff_s  # it had been running fine
                log.exception(
                    "actuator loop failed; resuming from the saved positions", extra={"retry_in_s": backoff}
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.max_backoff_s)

    async def _consume(self) -> None:
        offsets, highest = await self.results.load()
        self.guard.accept_token(highest)
        consumer = AssignedConsumer(
            self.access,
            [self.settings.actuations_topic],
            client_id=self.replica_id,
            log_check_interval_s=self.settings.platform.log_check_interval_s,
        )
        await consumer.start(offsets)  # checks the stored positions against the broker's logs
        log.info("actuator consuming", extra={"offsets": offsets.to_mapping(), "highest_token": highest})
        try:
            async for batch in consumer.batches(timeout_ms=100, max_records=self.settings.max_poll_records):
                # Periodically, records or not: a position whose log is gone (a broker that
                # lost its log) resumes at the new log's start.
                batch = await consumer.follow_log_resets(batch, [offsets])
                for record in batch:
                    await self._handle(record, offsets)
        finally:
            await consumer.stop()

    async def _handle(self, record: kafka.Record, offsets: kafka.AppliedOffsets) -> None:
        if not offsets.is_new(record):
            self.replayed_records += 1
            return
        try:
            actuation = record.decode(actuation_pb2.Actuation)
        except kafka.PoisonRecordError as poison:
            await kafka.dead_letter(self.producer, poison)
            offsets.mark(record)
            await self.results.save(record, offsets, self.guard.highest_token, None)
            return
        key = actuation.idempotency_key
        if key and (self.guard.outcome_of(key) is not None or await self.results.result(key) is not None):
            offsets.mark(record)
            self.outcomes["duplicate"] += 1
            log.info("replayed actuation: no-op", extra={"cause_id": key, "job_id": actuation.job_id})
            await self.results.save(record, offsets, self.guard.highest_token, None, duplicates_key=key)
            return
        # The actuation's own trace: a child of the decision that published it (its headers),
        # and the parent of the Borgmaster UpdateJob call (the gRPC client propagates it).
        with tracer.start_as_current_span(
            "actuate", context=record.trace_context, kind=trace.SpanKind.CONSUMER
        ) as span:
            span.set_attribute("cellpilot.job_id", actuation.job_id)
            result = await self.apply(actuation)
            span.set_attribute("cellpilot.outcome", OUTCOME.Name(result.outcome))
        offsets.mark(record)
        await self.results.save(record, offsets, self.guard.highest_token, result)
        # Settled only once saved: a record whose outcome could not be saved is applied again
        # when read again, under the same request id (the Borgmaster answers as the first time).
        self.guard.settle(key, OUTCOME.Name(result.outcome))

    async def apply(self, actuation: actuation_pb2.Actuation) -> actuation_pb2.ActuationResult:
        result = actuation_pb2.ActuationResult(
            idempotency_key=actuation.idempotency_key,
            job_id=actuation.job_id,
            event_time_ms=actuation.event_time_ms,
        )
        problem = update_request.invalid_reason(actuation)
        if problem:
            return self._finish(result, actuation_pb2.ACTUATION_OUTCOME_INVALID, problem)
        if self.guard.admit(actuation.idempotency_key, actuation.fencing_token) is Admission.FENCED:
            detail = (
                f"token {actuation.fencing_token} < highest seen {self.guard.highest_token}: a deposed master"
            )
            return self._finish(result, actuation_pb2.ACTUATION_OUTCOME_FENCED, detail)
        now = time.monotonic()
        wait = max(self.per_job.reserve(actuation.job_id, now), self.cell.reserve(now))
        if wait > 0:
            await asyncio.sleep(wait)
        spec, paths = update_request.update_of(actuation)
        # A newer decision of the master made on a version its own previous actuation replaced
        # goes onto the version that one produced (ActuationGuard.expected_version).
        expected = self.guard.expected_version(actuation.job_id, actuation.based_on_spec_version)
        backoff = self.settings.initial_backoff_s
        last = ""
        for attempt in range(1, self.settings.max_attempts + 1):
            result.attempts = attempt
            try:
                response = await self.client.borgmaster.update_job(
                    actuation.job_id,
                    spec,
                    paths,
                    expected_spec_version=expected,
                    fencing_token=actuation.fencing_token,
                    release_hold=actuation.release_hold,
                    request_id=actuation.idempotency_key,
                )
            except CellpilotError as error:
                last = error.details
                if not update_request.is_transient(error):
                    return self._finish(result, update_request.refusal_outcome(error), error.details)
                await asyncio.sleep(backoff * (0.5 + random.random() / 2))
                backoff = min(backoff * 2, self.settings.max_backoff_s)
                continue
            self.guard.accept_token(actuation.fencing_token)
            self.guard.applied(actuation.job_id, expected, response.job.spec_version)
            result.spec_version = response.job.spec_version
            result.log_sequence = response.log_sequence
            return self._finish(result, actuation_pb2.ACTUATION_OUTCOME_APPLIED, "")
        return self._finish(result, actuation_pb2.ACTUATION_OUTCOME_FAILED, f"gave up: {last}")

    def _finish(
        self, result: actuation_pb2.ActuationResult, outcome: OUTCOME.ValueType, detail: str
    ) -> actuation_pb2.ActuationResult:
        result.outcome = outcome
        result.detail = detail
        name = OUTCOME.Name(outcome)
        self.outcomes[name.removeprefix("ACTUATION_OUTCOME_").lower()] += 1
        if self.metrics is not None and outcome == actuation_pb2.ACTUATION_OUTCOME_APPLIED:
            self.metrics.actuations.add(1)
        log.info(
            "actuation settled",
            extra={
                "cause_id": result.idempotency_key,
                "job_id": result.job_id,
                "outcome": name,
                "detail": detail,
            },
        )
        return result


async def serve(settings: ActuatorSettings, stop: asyncio.Event, telemetry: Telemetry | None = None) -> None:
    await run_until_stopped(
        Actuator(settings, CellpilotMetrics.on(telemetry.meter) if telemetry else None), stop
    )
