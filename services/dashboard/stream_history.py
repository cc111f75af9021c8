"""The history behind the job page, read from the streams of facts (from their beginning).

``borg.events`` gives each job's limit over time (the spec of every SUBMITTED / UPDATED job
event) and its OOM kills (task events of kind OOM, with the usage at the kill);
``recommendations`` gives every recommender's output per window, so a dry-run job's page
shows what Autopilot would have done (Autopilot §5.2, Figure 9), and the horizontal
recommenders' task counts with the CPU statistic r_S they were computed from (§3.3). Kept in
memory, bounded per series; without Kafka the dashboard still shows the current state from the
gRPC APIs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, field

from cellpilot.api.v1 import recommendation_pb2, resources_pb2, state_pb2
from cellpilot.client.wording import recommender_name
from cellpilot.platform.kafka import Record
from cellpilot.platform.kafka_consumers import MessageConsumer
from cellpilot.platform.metrics import CellpilotMetrics
from cellpilot.platform.stream_access import StreamAccess

log = logging.getLogger(__name__)

RESOURCE_NAMES = {resources_pb2.RESOURCE_CPU: "cpu", resources_pb2.RESOURCE_MEMORY: "memory"}


@dataclass(frozen=True)
class LimitStep:
    """The job's spec from ``t_ms`` on: task limits and task count."""

    t_ms: int
    cpu_millicores: int
    memory_bytes: int
    task_count: int = 0


@dataclass(frozen=True)
class TaskCountPoint:
    """One horizontal recommendation at a window's end: r_S (the CPU-utilisation source, from
    the recommender workers) or n_r (a target-size recommender's raw task count)."""

    t_ms: int
    raw_task_count: float
    usage_statistic: float


@dataclass(frozen=True)
class OomKill:
    t_ms: int
    task_index: int
    memory_bytes: int


@dataclass
class JobStreams:
    limits: deque[LimitStep]
    ooms: deque[OomKill]
    # (resource name, recommender name) -> (window_end_ms, value)
    recommendations: dict[tuple[str, str], deque[tuple[int, int]]] = field(default_factory=dict)
    # recommender name -> its horizontal recommendations
    horizontal: dict[str, deque[TaskCountPoint]] = field(default_factory=dict)


class StreamHistory:
    def __init__(
        self,
        access: StreamAccess,
        events_topic: str,
        recommendations_topic: str,
        max_points: int,
        metrics: CellpilotMetrics | None = None,
    ) -> None:
        self.access = access
        self.events_topic = events_topic
        self.recommendations_topic = recommendations_topic
        self.max_points = max_points
        self.metrics = metrics
        self.connected = False
        self.records_read = 0
        self._jobs: dict[str, JobStreams] = defaultdict(self._new_job)

    def _new_job(self) -> JobStreams:
        return JobStreams(limits=deque(maxlen=self.max_points), ooms=deque(maxlen=self.max_points))

    def job(self, job_id: str) -> JobStreams | None:
        return self._jobs.get(job_id)

    def apply(self, record: Record) -> None:
        """Fold one record into the history; records that do not decode are skipped."""
        try:
            if record.topic == self.events_topic:
                self._event(record.decode(state_pb2.BorgEvent))
            elif record.topic == self.recommendations_topic:
                self._recommendations(record.decode(recommendation_pb2.RecommendationSet))
        except Exception as error:  # a poison record must not stop the page's history
            log.warning("skipped a record", extra={"topic": record.topic, "error": str(error)})
        self.records_read += 1

    def _event(self, event: state_pb2.BorgEvent) -> None:
        kind = event.WhichOneof("event")
        if kind == "job" and event.job.kind in (
            state_pb2.JOB_EVENT_KIND_SUBMITTED,
            state_pb2.JOB_EVENT_KIND_UPDATED,
        ):
            limits = event.job.spec.task.limits
            steps = self._jobs[event.job.job_id].limits
            step = LimitStep(
                event.job.event_time_ms, limits.cpu_millicores, limits.memory_bytes, event.job.spec.task_count
            )
            if not steps or (steps[-1].cpu_millicores, steps[-1].memory_bytes, steps[-1].task_count) != (
                step.cpu_millicores,
                step.memory_bytes,
                step.task_count,
            ):
                steps.append(step)
        elif kind == "task" and event.task.kind == state_pb2.TASK_EVENT_KIND_OOM:
            task = event.task
            self._jobs[task.job_id].ooms.append(
                OomKill(task.event_time_ms, task.task_index, task.usage.memory_bytes)
            )
            if self.metrics is not None:
                self.metrics.ooms.add(1, {"job_id": task.job_id})

    def _recommendations(self, message: recommendation_pb2.RecommendationSet) -> None:
        job = self._jobs[message.job_id]
        for rec in message.vertical:
            resource = RESOURCE_NAMES.get(rec.resource)
            if resource is None:
                continue
            key = (resource, recommender_name(rec.recommender))
            series = job.recommendations.setdefault(key, deque(maxlen=self.max_points))
            if series and series[-1][0] >= rec.window_end_ms:
                continue  # a redelivery or an older window: the line only moves forward
            series.append((rec.window_end_ms, rec.value))
        for horizontal in message.horizontal:
            points = job.horizontal.setdefault(
                recommender_name(horizontal.recommender), deque(maxlen=self.max_points)
            )
            if points and points[-1].t_ms >= horizontal.window_end_ms:
                continue
            points.append(
                TaskCountPoint(
                    horizontal.window_end_ms, horizontal.raw_task_count, horizontal.usage_statistic
                )
            )

    async def run(self, stop: asyncio.Event) -> None:
        """Read both topics until ``stop``; reconnects while Kafka is unreachable."""
        while not stop.is_set():
            consumer = MessageConsumer(
                self.access,
                [self.events_topic, self.recommendations_topic],
                group_id=f"dashboard-{uuid.uuid4().hex[:12]}",  # its own group: every record, from the start
                client_id="dashboard",
            )
            try:
                await consumer.start()
                self._jobs.clear()  # a new group reads from the start again: rebuild, never double
                self.connected = True
                async for batch in consumer.batches(timeout_ms=500, max_records=2000):
                    for record in batch:
                        self.apply(record)
                    if stop.is_set():
                        break
            except Exception as error:
                log.warning("cannot read the event streams", extra={"error": str(error)})
                self.connected = False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=5.0)
            finally:
                with contextlib.suppress(Exception):
                    await consumer.stop()
