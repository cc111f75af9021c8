"""Wire types <-> the core's dataclasses for the Autopilot master (docs/architecture.md rule 2).

Recommendations and horizontal signals in as :class:`Candidate` and :class:`HorizontalInput`
(and out again, as the master stores them in Redis), ``JobStatus`` in as a :class:`JobView`,
decisions out as ``JobRecommendations`` (what the API shows) and ``Actuation`` (what the
actuator applies). Bad API input raises :class:`InvalidField` naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cellpilot.api.v1 import (
    actuation_pb2,
    autopilot_pb2,
    job_pb2,
    recommendation_pb2,
    resources_pb2,
    state_pb2,
)
from cellpilot.autopilot.decisions import (
    Candidate,
    HorizontalConfig,
    HorizontalInput,
    JobDecision,
    JobMemory,
    JobView,
    MlModelChoice,
    SentTarget,
    VerticalOutcome,
)
from cellpilot.autopilot.selection import AutoMl, ClampReason, JobTraits, RecommenderRef, VerticalConfig
from cellpilot.job_vocabulary import (
    AppClass,
    HorizontalSource,
    HorizontalStatistic,
    LatencySensitivity,
    OomTolerance,
    RecommenderKind,
    ScalingMode,
)
from cellpilot.platform.request_validation import InvalidField
from cellpilot.platform.wire_enums import UnknownWireValueError, WireEnum
from cellpilot.recommend.horizontal import HorizontalReason
from cellpilot.usage.buckets import Resource

RESOURCES = (Resource.CPU, Resource.MEMORY)
_RESOURCE_OUT = {Resource.CPU: resources_pb2.RESOURCE_CPU, Resource.MEMORY: resources_pb2.RESOURCE_MEMORY}
_RESOURCE_IN = {v: k for k, v in _RESOURCE_OUT.items()}
# The API's zeros are read as its documented defaults (job.proto).
SCALING_MODES = WireEnum(ScalingMode, job_pb2.ScalingMode, read_as={"UNSPECIFIED": ScalingMode.OFF})
RECOMMENDER_KINDS = WireEnum(
    RecommenderKind, job_pb2.RecommenderKind, read_as={"UNSPECIFIED": RecommenderKind.AUTO}
)
HORIZONTAL_SOURCES = WireEnum(
    HorizontalSource, job_pb2.HorizontalSource, read_as={"UNSPECIFIED": HorizontalSource.CPU_UTILIZATION}
)
HORIZONTAL_STATISTICS = WireEnum(
    HorizontalStatistic, job_pb2.HorizontalStatistic, read_as={"UNSPECIFIED": HorizontalStatistic.MAX}
)
APP_CLASSES = WireEnum(AppClass, job_pb2.AppClass, read_as={"UNSPECIFIED": AppClass.LATENCY_SENSITIVE})
LATENCY_SENSITIVITIES = WireEnum(
    LatencySensitivity, job_pb2.LatencySensitivity, read_as={"UNSPECIFIED": LatencySensitivity.HIGH}
)
OOM_TOLERANCES = WireEnum(OomTolerance, job_pb2.OomTolerance)
_CLAMP_OUT = {
    ClampReason.NONE: recommendation_pb2.CLAMP_REASON_NONE,
    ClampReason.MIN_BOUND: recommendation_pb2.CLAMP_REASON_MIN_BOUND,
    ClampReason.MAX_BOUND: recommendation_pb2.CLAMP_REASON_MAX_BOUND,
    ClampReason.LAST_HOUR_MAX: recommendation_pb2.CLAMP_REASON_LAST_HOUR_MAX,
    ClampReason.MACHINE_SIZE: recommendation_pb2.CLAMP_REASON_MACHINE_SIZE,
}
_CLAMP_IN = {wire: core for core, wire in _CLAMP_OUT.items()}
_STABILISER_OUT = {
    HorizontalReason.NONE: recommendation_pb2.STABILISER_NONE,
    HorizontalReason.DEFERRED_DOWNSCALING: recommendation_pb2.STABILISER_DEFERRED_DOWNSCALING,
    HorizontalReason.SMALL_CHANGE_IGNORED: recommendation_pb2.STABILISER_SMALL_CHANGE,
    HorizontalReason.GROWTH_LIMITED: recommendation_pb2.STABILISER_LIMITED_GROWTH,
    HorizontalReason.SLOW_DECAY: recommendation_pb2.STABILISER_SLOW_DECAY,
}
# API defaults of HorizontalScalingConfig (job.proto), §3.3.
DEFAULT_HORIZON_S = 259_200
DEFAULT_DEFERRED_DOWNSCALING_S = 172_800
DEFAULT_SLOW_DECAY_HALF_PERIOD_S = 3_600
DEFAULT_SMALL_CHANGE_FRACTION = 0.1
DEFAULT_MAX_INITIALIZING_FRACTION = 0.25
DEFAULT_AVERAGING_WINDOW_S = 300


def _mode_in(value: int, field: str) -> ScalingMode:
    try:
        return SCALING_MODES.to_core(value)
    except UnknownWireValueError:
        raise InvalidField(field, f"unknown scaling mode {value}") from None


# ---------------------------------------------------------------------- recommenders
def ref_in(ref: job_pb2.RecommenderRef, field: str) -> RecommenderRef:
    if ref.kind in (job_pb2.RECOMMENDER_KIND_UNSPECIFIED, job_pb2.RECOMMENDER_KIND_AUTO):
        if ref.custom_name:
            raise InvalidField(f"{field}.custom_name", "only allowed with kind CUSTOM")
        return RecommenderRef(RecommenderKind.AUTO)
    if ref.kind == job_pb2.RECOMMENDER_KIND_CUSTOM:
        if not ref.custom_name:
            raise InvalidField(f"{field}.custom_name", "required for kind CUSTOM")
        return RecommenderRef.custom(ref.custom_name)
    try:
        kind = RECOMMENDER_KINDS.to_core(ref.kind)
    except UnknownWireValueError:
        raise InvalidField(f"{field}.kind", f"unknown recommender kind {ref.kind}") from None
    if ref.custom_name:
        raise InvalidField(f"{field}.custom_name", "only allowed with kind CUSTOM")
    return RecommenderRef.builtin(kind)


def ref_out(ref: RecommenderRef) -> job_pb2.RecommenderRef:
    return job_pb2.RecommenderRef(kind=RECOMMENDER_KINDS.to_wire(ref.kind), custom_name=ref.custom_name)


def resource_in(value: int, field: str) -> Resource:
    resource = _RESOURCE_IN.get(value)  # type: ignore[call-overload]
    if resource is None:
        raise InvalidField(field, "must be RESOURCE_CPU or RESOURCE_MEMORY")
    return resource  # type: ignore[no-any-return]


def resource_out(resource: Resource) -> resources_pb2.Resource.ValueType:
    return _RESOURCE_OUT[resource]


def candidate_in(rec: recommendation_pb2.Recommendation) -> Candidate | None:
    """A recommender's output as the core keeps it (None for what the core cannot use: no CPU or
    memory resource, an unusable or AUTO recommender)."""
    resource = _RESOURCE_IN.get(rec.resource)
    if resource is None:
        return None
    try:
        ref = ref_in(rec.recommender, "recommender")
    except InvalidField:
        return None
    if ref.kind is RecommenderKind.AUTO:
        return None
    explanation = rec.explanation
    ml = explanation.ml_model
    return Candidate(
        ref=ref,
        resource=resource,
        value=float(rec.value) if rec.value > 0 else math.nan,
        raw_value=float(rec.raw_value),
        margin=float(rec.margin),
        window_end_ms=rec.window_end_ms,
        recommendation_id=rec.recommendation_id,
        statistic=explanation.statistic,
        note=explanation.note,
        clamped_by=_CLAMP_IN.get(explanation.clamped_by),
        unclamped_value=explanation.unclamped_value,
        ml_model=(
            MlModelChoice(ml.model_index, ml.decay_rate, ml.safety_margin, ml.cost)
            if explanation.HasField("ml_model")
            else None
        ),
        job_id=rec.job_id,
        history_start_ms=rec.history_start_ms,
    )


def candidate_out(candidate: Candidate) -> recommendation_pb2.Recommendation:
    """The ``Recommendation`` a candidate was read from (:func:`candidate_in`), field for field."""
    out = recommendation_pb2.Recommendation(
        recommendation_id=candidate.recommendation_id,
        job_id=candidate.job_id,
        resource=_RESOURCE_OUT[candidate.resource],
        recommender=ref_out(candidate.ref),
        value=0 if math.isnan(candidate.value) else round(candidate.value),
        raw_value=round(candidate.raw_value),
        margin=round(candidate.margin),
        window_end_ms=candidate.window_end_ms,
        history_start_ms=candidate.history_start_ms,
    )
    explanation = recommendation_pb2.Explanation(
        statistic=candidate.statistic,
        clamped_by=(
            recommendation_pb2.CLAMP_REASON_UNSPECIFIED
            if candidate.clamped_by is None
            else _CLAMP_OUT[candidate.clamped_by]
        ),
        unclamped_value=candidate.unclamped_value,
        note=candidate.note,
    )
    ml = candidate.ml_model
    if ml is not None:
        explanation.ml_model.CopyFrom(
            recommendation_pb2.MlModelChoice(
                model_index=ml.model_index,
                decay_rate=ml.decay_rate,
                safety_margin=ml.safety_margin,
                cost=ml.cost,
            )
        )
    if explanation.ByteSize():
        out.explanation.CopyFrom(explanation)
    return out


def candidates_in(rs: recommendation_pb2.RecommendationSet) -> list[Candidate]:
    """The set's vertical recommendations the core can use (none of another job)."""
    found = []
    for rec in rs.vertical:
        candidate = candidate_in(rec)
        if candidate is not None and (not rec.job_id or rec.job_id == rs.job_id):
            found.append(candidate)
    return found


def horizontal_input_in(rec: recommendation_pb2.HorizontalRecommendation) -> HorizontalInput | None:
    """A horizontal signal as the core keeps it (None for a custom one that names no recommender)."""
    custom = rec.recommender.kind == job_pb2.RECOMMENDER_KIND_CUSTOM
    if custom and not rec.recommender.custom_name:
        return None
    return HorizontalInput(
        window_end_ms=rec.window_end_ms,
        recommendation_id=rec.recommendation_id,
        usage_statistic=rec.usage_statistic if rec.usage_statistic > 0 else None,
        raw_task_count=rec.raw_task_count if (custom or rec.raw_task_count > 0) else None,
        producer=rec.recommender.custom_name if custom else "",
    )


def horizontal_input_out(signal: HorizontalInput, job_id: str) -> recommendation_pb2.HorizontalRecommendation:
    """The fields of a ``HorizontalRecommendation`` the master reads (:func:`horizontal_input_in`)."""
    recommender = (
        job_pb2.RecommenderRef(kind=job_pb2.RECOMMENDER_KIND_CUSTOM, custom_name=signal.producer)
        if signal.producer
        else job_pb2.RecommenderRef(kind=job_pb2.RECOMMENDER_KIND_AUTO)
    )
    return recommendation_pb2.HorizontalRecommendation(
        recommendation_id=signal.recommendation_id,
        job_id=job_id,
        recommender=recommender,
        raw_task_count=signal.raw_task_count or 0.0,
        usage_statistic=signal.usage_statistic or 0.0,
        window_end_ms=signal.window_end_ms,
    )


def horizontal_inputs_in(rs: recommendation_pb2.RecommendationSet) -> list[HorizontalInput]:
    """The set's horizontal signals the core can use (none of another job)."""
    found = []
    for rec in rs.horizontal:
        signal = horizontal_input_in(rec)
        if signal is not None and (not rec.job_id or rec.job_id == rs.job_id):
            found.append(signal)
    return found


# ---------------------------------------------------------------------- configuration
def vertical_config_in(pb: job_pb2.VerticalScalingConfig, field: str) -> VerticalConfig:
    mode = _mode_in(pb.mode, f"{field}.mode")
    for name, value in (("min_limit", pb.min_limit), ("max_limit", pb.max_limit)):
        if value < 0:
            raise InvalidField(f"{field}.{name}", "must be >= 0")
    if pb.min_limit and pb.max_limit and pb.min_limit > pb.max_limit:
        raise InvalidField(f"{field}.min_limit", f"{pb.min_limit} exceeds max_limit {pb.max_limit}")
    return VerticalConfig(
        mode=mode,
        min_limit=float(pb.min_limit) if pb.min_limit else None,
        max_limit=float(pb.max_limit) if pb.max_limit else None,
        recommender=ref_in(pb.recommender, f"{field}.recommender"),
    )


def horizontal_config_in(pb: job_pb2.HorizontalScalingConfig, field: str) -> HorizontalConfig:
    mode = _mode_in(pb.mode, f"{field}.mode")
    if pb.min_tasks < 0 or pb.max_tasks < 0:
        raise InvalidField(f"{field}.min_tasks" if pb.min_tasks < 0 else f"{field}.max_tasks", "must be >= 0")
    if pb.max_tasks and pb.max_tasks < max(1, pb.min_tasks):
        raise InvalidField(f"{field}.max_tasks", "must be >= min_tasks")
    source = HORIZONTAL_SOURCES.get(pb.source, HorizontalSource.CPU_UTILIZATION)
    if mode is not ScalingMode.OFF:
        if source is HorizontalSource.CPU_UTILIZATION and not 0 < pb.target_utilization <= 1:
            raise InvalidField(f"{field}.target_utilization", "must be in (0, 1] for CPU_UTILIZATION")
        if source is HorizontalSource.TARGET_SIZE and not pb.target_size_recommender:
            raise InvalidField(f"{field}.target_size_recommender", "required for TARGET_SIZE")
    if pb.reference_cpu_millicores < 0:
        raise InvalidField(f"{field}.reference_cpu_millicores", "must be >= 0")
    for name in ("small_change_fraction", "max_initializing_fraction"):
        if not 0 <= getattr(pb, name) <= 1:
            raise InvalidField(f"{field}.{name}", "must be in [0, 1]")
    for name in ("horizon_seconds", "deferred_downscaling_seconds", "slow_decay_half_period_seconds"):
        if getattr(pb, name) < 0:
            raise InvalidField(f"{field}.{name}", "must be >= 0")
    return HorizontalConfig(
        mode=mode,
        min_tasks=max(1, pb.min_tasks),
        max_tasks=pb.max_tasks or None,
        source=source,
        target_utilization=pb.target_utilization or None,
        statistic=HORIZONTAL_STATISTICS.get(pb.statistic, HorizontalStatistic.MAX),
        horizon_ms=(pb.horizon_seconds or DEFAULT_HORIZON_S) * 1000,
        target_size_recommender=pb.target_size_recommender,
        deferred_downscaling_ms=(pb.deferred_downscaling_seconds or DEFAULT_DEFERRED_DOWNSCALING_S) * 1000,
        slow_decay_half_period_ms=(pb.slow_decay_half_period_seconds or DEFAULT_SLOW_DECAY_HALF_PERIOD_S)
        * 1000,
        small_change_fraction=pb.small_change_fraction or DEFAULT_SMALL_CHANGE_FRACTION,
        max_initializing_fraction=pb.max_initializing_fraction or DEFAULT_MAX_INITIALIZING_FRACTION,
        reference_cpu_millicores=float(pb.reference_cpu_millicores) or None,
    )


def check_config(config: job_pb2.AutopilotConfig, field: str = "config") -> None:
    """Raises :class:`InvalidField` for a config Autopilot cannot act on."""
    vertical_config_in(config.cpu, f"{field}.cpu")
    vertical_config_in(config.memory, f"{field}.memory")
    horizontal_config_in(config.horizontal, f"{field}.horizontal")


def traits_in(spec: job_pb2.JobSpec, reference_machine_memory_bytes: float) -> JobTraits:
    footprint = spec.task_count * spec.task.limits.memory_bytes / reference_machine_memory_bytes
    return JobTraits(
        job_class=APP_CLASSES.get(spec.app_class, AppClass.LATENCY_SENSITIVE),
        latency=LATENCY_SENSITIVITIES.get(spec.latency_sensitivity, LatencySensitivity.HIGH),
        oom_tolerance=OOM_TOLERANCES.get(spec.oom_tolerance, OomTolerance.UNSPECIFIED),
        footprint_machines=footprint,
    )


def _initialising(status: state_pb2.JobStatus) -> int:
    if not status.tasks:
        return status.task_counts.pending
    return sum(
        1
        for t in status.tasks
        if t.task_index < status.spec.task_count
        and (
            t.state == state_pb2.TASK_STATE_PENDING
            or (t.state == state_pb2.TASK_STATE_RUNNING and not t.ready)
        )
    )


def job_view_in(
    status: state_pb2.JobStatus, release_ready: bool, reference_machine_memory_bytes: float
) -> JobView:
    """``release_ready``: whether a held job may be released now (else it is shown held but waits)."""
    spec = status.spec
    a = spec.autopilot
    return JobView(
        job_id=status.job_id,
        spec_version=status.spec_version,
        cpu_limit=float(spec.task.limits.cpu_millicores),
        memory_limit=float(spec.task.limits.memory_bytes),
        task_count=spec.task_count,
        traits=traits_in(spec, reference_machine_memory_bytes),
        cpu=vertical_config_in(a.cpu, "spec.autopilot.cpu"),
        memory=vertical_config_in(a.memory, "spec.autopilot.memory"),
        horizontal=horizontal_config_in(a.horizontal, "spec.autopilot.horizontal"),
        held=release_ready and status.state == state_pb2.JOB_STATE_HELD_FOR_AUTOPILOT,
        live=status.state != state_pb2.JOB_STATE_DEAD,
        initialising=_initialising(status),
    )


def effective_config_out(
    config: job_pb2.AutopilotConfig, traits: JobTraits, registered: Sequence[str], auto_ml: AutoMl
) -> job_pb2.AutopilotConfig:
    """``config`` with defaults filled in and RecommenderKind.AUTO (or an unregistered custom) resolved."""
    from cellpilot.autopilot.selection import select_recommender

    out = job_pb2.AutopilotConfig()
    out.CopyFrom(config)
    for resource, pb, field in (
        (Resource.CPU, out.cpu, "config.cpu"),
        (Resource.MEMORY, out.memory, "config.memory"),
    ):
        core = vertical_config_in(pb, field)
        pb.mode = SCALING_MODES.to_wire(core.mode)
        selection = select_recommender(resource, core, traits, registered, auto_ml)
        pb.recommender.CopyFrom(ref_out(selection.ref))
    h = horizontal_config_in(out.horizontal, "config.horizontal")
    hp = out.horizontal
    hp.mode = SCALING_MODES.to_wire(h.mode)
    hp.min_tasks = h.min_tasks
    hp.source = HORIZONTAL_SOURCES.to_wire(h.source)
    hp.statistic = HORIZONTAL_STATISTICS.to_wire(h.statistic)
    hp.averaging_window_seconds = hp.averaging_window_seconds or DEFAULT_AVERAGING_WINDOW_S
    hp.horizon_seconds = h.horizon_ms // 1000
    hp.deferred_downscaling_seconds = h.deferred_downscaling_ms // 1000
    hp.slow_decay_half_period_seconds = h.slow_decay_half_period_ms // 1000
    hp.small_change_fraction = h.small_change_fraction
    hp.max_initializing_fraction = h.max_initializing_fraction
    hp.reference_cpu_millicores = round(h.reference_cpu_millicores or 0)
    return out


# ---------------------------------------------------------------------- decisions out
def _sent_fields(sent: SentTarget | None) -> tuple[str, int]:
    return ("", 0) if sent is None else (sent.key, sent.event_ms)


def _chosen_out(outcome: VerticalOutcome, job_id: str) -> recommendation_pb2.Recommendation | None:
    if outcome.value is None:
        return None
    chosen = recommendation_pb2.Recommendation()
    if outcome.chosen is not None:
        chosen.CopyFrom(candidate_out(outcome.chosen))
        unclamped = chosen.value
    else:
        chosen.job_id = job_id
        chosen.resource = _RESOURCE_OUT[outcome.resource]
        chosen.recommender.CopyFrom(ref_out(outcome.selected))
        chosen.raw_value = round(outcome.current)
        unclamped = round(outcome.current)
    chosen.value = outcome.value
    explanation = chosen.explanation
    if outcome.clamp is not ClampReason.NONE or not explanation.clamped_by:
        explanation.clamped_by = _CLAMP_OUT[outcome.clamp]
    explanation.unclamped_value = unclamped
    note = (
        outcome.selection_note if outcome.chosen is not None else "no recommendation yet: the job's own limit"
    )
    explanation.note = f"{explanation.note}; {note}" if explanation.note else note
    return chosen


def job_recommendations_out(
    decision: JobDecision, memory: JobMemory, held: bool, updated_ms: int
) -> autopilot_pb2.JobRecommendations:
    """What the API shows of a job's decision: per resource the chosen candidate after the
    master's bounds (with its explanation), what was last sent, the horizontal decision."""
    out = autopilot_pb2.JobRecommendations(job_id=decision.job_id, held=held, updated_ms=updated_ms)
    for v in decision.vertical:
        key, at = _sent_fields(memory.sent(v.resource))
        entry = out.vertical.add(
            resource=_RESOURCE_OUT[v.resource],
            mode=SCALING_MODES.to_wire(v.mode),
            current_limit=round(v.current),
            last_actuation_key=key,
            last_actuated_ms=at,
        )
        entry.selected.CopyFrom(ref_out(v.selected))
        chosen = _chosen_out(v, decision.job_id)
        if chosen is not None:
            entry.chosen.CopyFrom(chosen)
    h = decision.horizontal
    if h is not None:
        key, at = _sent_fields(memory.tasks)
        hd = out.horizontal
        hd.mode = SCALING_MODES.to_wire(h.mode)
        hd.current_task_count = h.current
        hd.last_actuation_key = key
        hd.last_actuated_ms = at
        if h.target is not None:
            hd.chosen.CopyFrom(
                recommendation_pb2.HorizontalRecommendation(
                    job_id=decision.job_id,
                    raw_task_count=h.raw or 0.0,
                    task_count=h.target,
                    current_task_count=h.current,
                    stabiliser=_STABILISER_OUT[h.reason],
                    usage_statistic=h.usage_statistic or 0.0,
                    window_end_ms=max(h.window_end_ms, 0),
                )
            )
    return out


def actuation_out(
    decision: JobDecision, key: str, fencing_token: int, leader_id: str, spec_version: int
) -> actuation_pb2.Actuation:
    out = actuation_pb2.Actuation(
        idempotency_key=key,
        job_id=decision.job_id,
        release_hold=decision.release_hold,
        reason=decision.reason,
        source_recommendation_ids=list(decision.source_ids),
        fencing_token=fencing_token,
        leader_id=leader_id,
        based_on_spec_version=spec_version,
        event_time_ms=decision.event_time_ms,
    )
    if decision.cpu_limit is not None:
        out.cpu_limit_millicores = decision.cpu_limit
    if decision.memory_limit is not None:
        out.memory_limit_bytes = decision.memory_limit
    if decision.task_count is not None:
        out.task_count = decision.task_count
    return out
