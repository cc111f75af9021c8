"""The recommender worker's one meeting place of wire types and core types.

* ``usage.histograms`` UsageHistogram -> :class:`HistogramInput` (dense counts in the scheme,
  usage in millicores or bytes, as on the wire; a histogram under a legacy scheme id is read as
  the scheme it is re-labelled to, :data:`cellpilot.usage.buckets.LEGACY_SCHEMES`);
* ``borg.events`` BorgEvent with an OOM TaskEvent -> :class:`OomInput`; with a job's spec (a
  SUBMITTED or UPDATED JobEvent) -> its :class:`HorizontalSettings` (§3.3 horizon, statistic);
* a job's newest :class:`CandidateRow` per resource -> one RecommendationSet for
  ``recommendations`` (values in millicores / bytes, with the explanation fields).
"""

from __future__ import annotations

import math

import numpy as np

from cellpilot.api.v1 import job_pb2, recommendation_pb2, resources_pb2, state_pb2, usage_pb2
from cellpilot.autopilot.job_recommendations import (
    CandidateRow,
    HistogramInput,
    HorizontalSettings,
    OomInput,
    RecommenderConfig,
    RecommenderState,
)
from cellpilot.job_vocabulary import HorizontalStatistic, RecommenderKind
from cellpilot.platform.kafka import PoisonRecordError, Record
from cellpilot.platform.wire_enums import WireEnum
from cellpilot.usage.buckets import Resource, lookup_scheme

RESOURCES_BY_CODE = {resources_pb2.RESOURCE_CPU: Resource.CPU, resources_pb2.RESOURCE_MEMORY: Resource.MEMORY}
RESOURCE_CODES = {resource: code for code, resource in RESOURCES_BY_CODE.items()}
RECOMMENDER_KINDS = WireEnum(RecommenderKind, job_pb2.RecommenderKind)
HORIZONTAL_STATISTICS = WireEnum(
    HorizontalStatistic, job_pb2.HorizontalStatistic, read_as={"UNSPECIFIED": HorizontalStatistic.MAX}
)


def histogram_in(record: Record, config: RecommenderConfig) -> HistogramInput:
    """Decode and validate one ``usage.histograms`` record; PoisonRecordError names the field."""
    message = record.decode(usage_pb2.UsageHistogram)

    def bad(field: str, why: str) -> PoisonRecordError:
        return PoisonRecordError(record, f"UsageHistogram.{field}: {why}")

    if not message.job_id:
        raise bad("job_id", "is required")
    resource = RESOURCES_BY_CODE.get(message.resource)
    if resource is None:
        raise bad("resource", "must be RESOURCE_CPU or RESOURCE_MEMORY")
    if message.HasField("task_index"):
        raise bad("task_index", "recommenders take job histograms (no task_index)")
    scheme = config.for_resource(resource).scheme
    expected_id, expected_version = scheme.key()
    try:
        known = lookup_scheme(message.bucket_scheme_id, message.bucket_scheme_version)
    except KeyError:
        known = None
    if known is not scheme:
        raise bad(
            "bucket_scheme_id",
            f"{message.bucket_scheme_id!r} v{message.bucket_scheme_version}, "
            f"expected {expected_id!r} v{expected_version}",
        )
    if message.window_end_ms <= message.window_start_ms:
        raise bad("window_end_ms", "must be after window_start_ms")
    if len(message.bucket_indices) != len(message.counts):
        raise bad("counts", "needs one count per bucket index")
    indices = np.asarray(message.bucket_indices, dtype=np.int64)
    counts = np.asarray(message.counts, dtype=np.float64)
    if indices.size and (indices.min() < 0 or indices.max() >= scheme.size):
        raise bad("bucket_indices", f"must be in [0, {scheme.size})")
    if np.any(counts < 0):
        raise bad("counts", "must be >= 0")
    if not math.isfinite(message.mean_total_usage) or message.mean_total_usage < 0:
        raise bad("mean_total_usage", "must be a finite value >= 0")
    if not math.isfinite(message.mean_total_unmet) or message.mean_total_unmet < 0:
        raise bad("mean_total_unmet", "must be a finite value >= 0")
    dense = np.zeros(scheme.size)
    np.add.at(dense, indices, counts)
    return HistogramInput(
        message.job_id,
        resource,
        int(message.window_end_ms),
        dense,
        float(message.mean_total_usage),
        float(message.mean_total_unmet),
    )


def oom_in(record: Record) -> OomInput | None:
    """The OOM in a ``borg.events`` record, or None for every other event."""
    event = record.decode(state_pb2.BorgEvent)
    if event.WhichOneof("event") != "task" or event.task.kind != state_pb2.TASK_EVENT_KIND_OOM:
        return None
    task = event.task
    if not task.job_id:
        raise PoisonRecordError(record, "TaskEvent.job_id: is required")
    return OomInput(
        task.job_id, int(task.event_time_ms), float(task.limits.memory_bytes), float(task.usage.memory_bytes)
    )


def horizontal_settings_in(
    record: Record, config: RecommenderConfig
) -> tuple[str, HorizontalSettings] | None:
    """A job's own §3.3 horizon T and statistic S, from a SUBMITTED or UPDATED job event's spec
    (zero horizon: the default); None for every other event."""
    event = record.decode(state_pb2.BorgEvent)
    if event.WhichOneof("event") != "job" or event.job.kind not in (
        state_pb2.JOB_EVENT_KIND_SUBMITTED,
        state_pb2.JOB_EVENT_KIND_UPDATED,
    ):
        return None
    job = event.job
    if not job.job_id or not job.HasField("spec"):
        return None
    horizontal = job.spec.autopilot.horizontal
    if horizontal.horizon_seconds < 0:
        raise PoisonRecordError(record, "JobEvent.spec.autopilot.horizontal.horizon_seconds: must be >= 0")
    horizon_ms = horizontal.horizon_seconds * 1000 or config.horizon_ms
    statistic = HORIZONTAL_STATISTICS.get(horizontal.statistic, HorizontalStatistic.MAX)
    return job.job_id, HorizontalSettings(horizon_ms, statistic)


def _recommendation(
    job_id: str, resource: Resource, column: int, row: CandidateRow, config: RecommenderConfig
) -> recommendation_pb2.Recommendation | None:
    registration = config.for_resource(resource).registry.registrations[column]
    kind = RecommenderKind(registration.kind)
    value = float(row.value[column])
    if math.isnan(value):
        return None
    raw = float(row.raw_value[column])
    relative = float(row.margin[column])
    unclamped = raw * (1.0 + relative) if not math.isnan(relative) else value
    explanation = recommendation_pb2.Explanation(
        clamped_by=(
            recommendation_pb2.CLAMP_REASON_LAST_HOUR_MAX
            if row.raised_by_window_max[column]
            else recommendation_pb2.CLAMP_REASON_NONE
        ),
        unclamped_value=round(unclamped),
        note="bumped after OOM" if row.oom_bumped else "",
    )
    if kind is RecommenderKind.ML:
        if row.ml_model >= 0:
            grid = config.for_resource(resource).ensemble.grid
            explanation.ml_model.CopyFrom(
                recommendation_pb2.MlModelChoice(
                    model_index=row.ml_model,
                    decay_rate=grid.decay_rates[row.ml_model],
                    safety_margin=raw * relative,
                    cost=0.0 if math.isnan(row.ml_cost) else row.ml_cost,
                )
            )
    else:
        explanation.statistic = registration.label
    raw_wire = round(raw) if not math.isnan(raw) else 0
    return recommendation_pb2.Recommendation(
        recommendation_id=f"{job_id}/{resource.value}/{kind.value}/{row.time_ms}",
        job_id=job_id,
        resource=RESOURCE_CODES[resource],  # type: ignore[arg-type]
        recommender=job_pb2.RecommenderRef(kind=RECOMMENDER_KINDS.to_wire(kind)),
        value=round(value),
        raw_value=raw_wire,
        margin=max(round(unclamped) - raw_wire, 0),
        explanation=explanation,
        window_end_ms=row.time_ms,
    )


def recommendation_set(
    job_id: str, state: RecommenderState, window_end_ms: int, producer: str, config: RecommenderConfig
) -> recommendation_pb2.RecommendationSet:
    """Every recommender's newest value per resource for one job, plus the r_S signal (§3.3)."""
    out = recommendation_pb2.RecommendationSet(job_id=job_id, window_end_ms=window_end_ms, producer=producer)
    for resource, row in sorted(state.rows.items()):
        for column in range(len(config.for_resource(resource).registry)):
            rec = _recommendation(job_id, resource, column, row, config)
            if rec is not None:
                out.vertical.append(rec)
    cpu_row = state.rows.get(Resource.CPU)
    if cpu_row is not None and not math.isnan(state.usage_statistic):
        out.horizontal.append(
            recommendation_pb2.HorizontalRecommendation(
                recommendation_id=f"{job_id}/tasks/builtin/{cpu_row.time_ms}",
                job_id=job_id,
                recommender=job_pb2.RecommenderRef(kind=job_pb2.RECOMMENDER_KIND_AUTO),
                usage_statistic=state.usage_statistic,
                window_end_ms=cpu_row.time_ms,
            )
        )
    return out
