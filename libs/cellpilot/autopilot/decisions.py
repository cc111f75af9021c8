"""The Autopilot master's decision for one job (Autopilot §3.1-§3.3, §5): pure, ``now`` passed in.

From what it observes about a job (its spec and Autopilot config at the Borgmaster) and
the latest output of every recommender, the master:

1. per resource, selects the recommender (:mod:`selection`), applies the user's bounds,
   and decides whether the limit should change (a small dead band keeps tiny moves from
   churning the job's spec: every change may evict tasks, §2.3, §4.4);
2. horizontally, turns the CPU-utilisation signal r_S into n_r = r_S / (r* x limit) (or
   takes a custom target-size recommender's n_r) and stabilises it (§3.3, library
   :func:`~cellpilot.recommend.horizontal.stabilise`: deferred downscaling, defer small
   changes, limiting growth, slow decay);
3. reconciles the two: limits and task count never shrink in the same step (the task
   decrease waits for the next decision, by then computed with the new limit);
4. keeps DRY_RUN and OFF resources visible but unactuated (§5.1, §5.2);
5. releases a job held for Autopilot with its first recommendation (§3.1): the history's
   recommendation if there is one, else the job's own limits within its bounds.

What the master remembers between decisions (what it last sent, the stabiliser state) is
the :class:`JobMemory` it is given and returns.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from cellpilot.autopilot.selection import (
    AutoMl,
    JobTraits,
    RecommenderRef,
    VerticalConfig,
    select_recommender,
)
from cellpilot.autopilot.vertical_targets import (
    CLAMP_REASONS,
    ClampReason,
    significant_changes,
    vertical_targets,
)
from cellpilot.job_vocabulary import HorizontalSource, HorizontalStatistic, ScalingMode
from cellpilot.recommend.horizontal import (
    HOUR_MS,
    MINUTE_MS,
    DeferredDownscaling,
    DeferSmallChanges,
    HorizontalReason,
    LimitGrowth,
    SlowDecay,
    StabiliserConfig,
    StabiliserState,
    initial_stabiliser_state,
    raw_task_count,
    stabilise,
)
from cellpilot.usage.buckets import Resource


@dataclass(frozen=True)
class HorizontalConfig:
    """§3.3 settings; the defaults are those of the API (``job.proto``).

    Here a zero ``small_change_fraction``, ``max_initializing_fraction`` or
    ``slow_decay_half_period_ms`` turns that stabiliser off (the API's zeros mean "default"
    and are resolved when converting).
    """

    mode: ScalingMode = ScalingMode.OFF
    min_tasks: int = 1
    max_tasks: int | None = None
    source: HorizontalSource = HorizontalSource.CPU_UTILIZATION
    target_utilization: float | None = None  # r*, a fraction of the per-task reference size
    # The per-task size r* is a fraction of, millicores; None: the task's CPU limit after this
    # step's vertical decision (only when vertical CPU is not ON: see job.proto).
    reference_cpu_millicores: float | None = None
    statistic: HorizontalStatistic = HorizontalStatistic.MAX
    horizon_ms: int = 72 * HOUR_MS
    target_size_recommender: str = ""
    deferred_downscaling_ms: int = 48 * HOUR_MS
    slow_decay_half_period_ms: int = HOUR_MS
    small_change_fraction: float = 0.1
    max_initializing_fraction: float = 0.25

    def stabiliser_config(self) -> StabiliserConfig:
        return StabiliserConfig(
            deferred_downscaling=DeferredDownscaling(window_ms=self.deferred_downscaling_ms),
            defer_small_changes=(
                DeferSmallChanges(min_fraction=self.small_change_fraction)
                if self.small_change_fraction > 0
                else None
            ),
            limit_growth=(
                LimitGrowth(max_initialising_fraction=self.max_initializing_fraction)
                if self.max_initializing_fraction > 0
                else None
            ),
            slow_decay=(
                SlowDecay(halving_period_ms=self.slow_decay_half_period_ms, step_ms=5 * MINUTE_MS)
                if self.slow_decay_half_period_ms > 0
                else None
            ),
            min_tasks=max(1, self.min_tasks),
            max_tasks=self.max_tasks,
        )


@dataclass(frozen=True)
class JobView:
    """What the master observes about a job (from the Borgmaster)."""

    job_id: str
    spec_version: int
    cpu_limit: float  # per-task, millicores
    memory_limit: float  # per-task, bytes
    task_count: int
    traits: JobTraits = field(default_factory=JobTraits)
    cpu: VerticalConfig = field(default_factory=VerticalConfig)
    memory: VerticalConfig = field(default_factory=VerticalConfig)
    horizontal: HorizontalConfig = field(default_factory=HorizontalConfig)
    held: bool = False  # waiting in HELD_FOR_AUTOPILOT
    live: bool = True
    initialising: int = 0  # tasks not yet ready (pending)

    def vertical(self, resource: Resource) -> VerticalConfig:
        return self.cpu if resource is Resource.CPU else self.memory

    def limit(self, resource: Resource) -> float:
        return self.cpu_limit if resource is Resource.CPU else self.memory_limit


@dataclass(frozen=True)
class MlModelChoice:
    """The ML recommender's winning model (§3.2.3, eq. 9): its index in the model grid, decay
    rate d_m, safety margin M_m (the resource's unit) and decayed cost c_m[t]."""

    model_index: int
    decay_rate: float
    safety_margin: float
    cost: float


@dataclass(frozen=True)
class Candidate:
    """One recommender's latest per-task limit for a job and resource, with its explanation: all
    of a recommender's output (a ``Recommendation``), so the master keeps and shows it whole."""

    ref: RecommenderRef
    resource: Resource
    value: float  # millicores or bytes, after margin and the max over the last hour; NaN: none
    raw_value: float
    margin: float  # absolute, same unit
    window_end_ms: int
    recommendation_id: str
    statistic: str = ""  # the moving window's statistic, e.g. "S_p95"
    note: str = ""
    clamped_by: ClampReason | None = None  # how the recommender clamped it; None: not said
    unclamped_value: int = 0  # raw_value + margin before clamping
    ml_model: MlModelChoice | None = None  # the ML recommender's winning model
    job_id: str = ""
    history_start_ms: int = 0  # the oldest window with weight in the value; 0: not said

    @property
    def key(self) -> str:
        """``<resource>|<recommender label>``: one candidate per recommender and resource."""
        return f"{self.resource.value}|{self.ref.label}"

    @property
    def raised_by_window_max(self) -> bool:
        """Held at the maximum of the last hour (§3.2.2)."""
        return self.clamped_by is ClampReason.LAST_HOUR_MAX


@dataclass(frozen=True)
class HorizontalInput:
    """The newest horizontal signal: r_S (CPU utilisation) or a custom n_r (target size)."""

    window_end_ms: int
    recommendation_id: str
    usage_statistic: float | None = None  # r_S, millicores
    raw_task_count: float | None = None  # n_r from a target-size recommender
    producer: str = ""  # the custom recommender that sent it; "": the built-in CPU signal

    @property
    def label(self) -> str:
        """``builtin``, or ``custom:<name>``: one signal per source."""
        return f"custom:{self.producer}" if self.producer else "builtin"


@dataclass(frozen=True)
class SentTarget:
    value: float
    event_ms: int
    key: str


@dataclass(frozen=True)
class JobMemory:
    cpu: SentTarget | None = None
    memory: SentTarget | None = None
    tasks: SentTarget | None = None
    released: SentTarget | None = None
    stabiliser: StabiliserState | None = None
    stabiliser_slots: int = 0  # deferred-downscaling ring size the state was built for
    horizontal_input_ms: int = -1
    horizontal_target: int | None = None
    horizontal_raw: float | None = None
    horizontal_reason: HorizontalReason = HorizontalReason.NONE

    def sent(self, resource: Resource) -> SentTarget | None:
        return self.cpu if resource is Resource.CPU else self.memory


@dataclass(frozen=True)
class DecisionPolicy:
    min_increase_fraction: float = 0.01  # dead band: ignore smaller increases
    min_decrease_fraction: float = 0.05  # and smaller decreases
    resend_after_ms: int = 15 * MINUTE_MS  # re-send an unapplied target after this much event time
    machine_cpu_millicores: float | None = None  # the largest machine, caps recommendations
    machine_memory_bytes: float | None = None
    # §4.2: ML for serving jobs' memory (AutoMl); "never" = the §3.2.2 moving-window table only.
    auto_ml: AutoMl = AutoMl.SERVING_MEMORY

    def machine(self, resource: Resource) -> float | None:
        return self.machine_cpu_millicores if resource is Resource.CPU else self.machine_memory_bytes


@dataclass(frozen=True)
class VerticalOutcome:
    resource: Resource
    mode: ScalingMode
    selected: RecommenderRef
    selection_note: str
    chosen: Candidate | None
    value: int | None  # the limit Autopilot wants (after bounds); None = no recommendation yet
    clamp: ClampReason
    current: float
    actuate: bool  # this decision sends the value


@dataclass(frozen=True)
class HorizontalOutcome:
    mode: ScalingMode
    raw: float | None  # n_r[t]
    target: int | None  # after stabilisation and bounds
    current: int
    reason: HorizontalReason
    usage_statistic: float | None
    window_end_ms: int
    actuate: bool
    deferred_by_reconciliation: bool = False


@dataclass(frozen=True)
class JobDecision:
    job_id: str
    vertical: tuple[VerticalOutcome, ...]
    horizontal: HorizontalOutcome | None
    cpu_limit: int | None  # fields to actuate (None = unchanged)
    memory_limit: int | None
    task_count: int | None
    release_hold: bool
    reason: str
    source_ids: tuple[str, ...]
    event_time_ms: int

    @property
    def actuate(self) -> bool:
        return self.release_hold or any(
            v is not None for v in (self.cpu_limit, self.memory_limit, self.task_count)
        )


def significant_change(current: float, target: float, policy: DecisionPolicy) -> bool:
    """Outside the dead band around the current limit (any change from nothing counts)."""
    band = (policy.min_increase_fraction, policy.min_decrease_fraction)
    return bool(significant_changes([current], [target], *band)[0])


def _recently_sent(sent: SentTarget | None, value: float, now_ms: int, policy: DecisionPolicy) -> bool:
    return sent is not None and sent.value == value and now_ms - sent.event_ms < policy.resend_after_ms


def _vertical(
    job: JobView,
    resource: Resource,
    candidates: Mapping[str, Candidate],
    memory: JobMemory,
    policy: DecisionPolicy,
    registered_custom: Collection[str],
    now_ms: int,
) -> VerticalOutcome:
    config = job.vertical(resource)
    selection = select_recommender(resource, config, job.traits, registered_custom, policy.auto_ml)
    chosen = candidates.get(selection.ref.label)
    current = job.limit(resource)
    chosen_value = chosen.value if chosen is not None else math.nan
    sent = memory.sent(resource)
    targets = vertical_targets(
        [chosen_value],
        [chosen is not None and chosen.raised_by_window_max],
        [current],
        on=config.mode is ScalingMode.ON,
        held=[job.held],
        min_limit=math.nan if config.min_limit is None else config.min_limit,
        max_limit=math.nan if config.max_limit is None else config.max_limit,
        machine_capacity=policy.machine(resource),
        min_increase=policy.min_increase_fraction,
        min_decrease=policy.min_decrease_fraction,
    )
    target = float(targets.value[0])
    value = None if math.isnan(target) else int(target)
    clamp = CLAMP_REASONS[int(targets.clamp[0])]
    actuate = bool(targets.actuate[0]) and not (
        value is not None and _recently_sent(sent, value, now_ms, policy)
    )
    return VerticalOutcome(
        resource, config.mode, selection.ref, selection.note, chosen, value, clamp, current, actuate
    )


def _horizontal(
    job: JobView,
    signal: HorizontalInput | None,
    cpu_limit_after: float,
    memory: JobMemory,
    policy: DecisionPolicy,
    now_ms: int,
) -> tuple[HorizontalOutcome | None, JobMemory]:
    config = job.horizontal
    if config.mode is ScalingMode.OFF:
        return None, memory
    raw: float | None = None
    usage: float | None = None
    if signal is not None:
        if config.source is HorizontalSource.CPU_UTILIZATION:
            usage = signal.usage_statistic
            size = config.reference_cpu_millicores or cpu_limit_after
            if usage is not None and config.target_utilization and size > 0:
                # §3.3: n_r = r_S / r*, r* a fraction of the per-task reference size.
                raw = float(raw_task_count(usage, config.target_utilization, size))
        elif signal.producer == config.target_size_recommender:
            raw = signal.raw_task_count
    target, reason = memory.horizontal_target, memory.horizontal_reason
    if raw is not None and signal is not None and signal.window_end_ms > memory.horizontal_input_ms:
        stabiliser_config = config.stabiliser_config()
        slots = stabiliser_config.deferred_downscaling.slots if stabiliser_config.deferred_downscaling else 1
        state = memory.stabiliser
        if state is None or memory.stabiliser_slots != slots:
            state = initial_stabiliser_state(1, stabiliser_config)
        state, decision = stabilise(
            stabiliser_config,
            state,
            np.array([raw], dtype=np.float64),
            np.array([job.task_count], dtype=np.int64),
            np.array([signal.window_end_ms], dtype=np.int64),
            np.array([job.initialising], dtype=np.int64),
        )
        target, reason = int(decision.target[0]), HorizontalReason(int(decision.reason[0]))
        memory = replace(
            memory,
            stabiliser=state,
            stabiliser_slots=slots,
            horizontal_input_ms=signal.window_end_ms,
            horizontal_target=target,
            horizontal_raw=float(raw),
            horizontal_reason=reason,
        )
    actuate = (
        config.mode is ScalingMode.ON
        and target is not None
        and target != job.task_count
        and not _recently_sent(memory.tasks, target, now_ms, policy)
    )
    outcome = HorizontalOutcome(
        config.mode,
        memory.horizontal_raw,
        target,
        job.task_count,
        reason,
        usage,
        signal.window_end_ms if signal is not None else -1,
        actuate,
    )
    return outcome, memory


def reconcile(
    vertical: tuple[VerticalOutcome, ...], horizontal: HorizontalOutcome | None
) -> tuple[HorizontalOutcome | None, str]:
    """Never shrink limits and the task count in the same step: the task decrease waits."""
    if horizontal is None or not horizontal.actuate or horizontal.target is None:
        return horizontal, ""
    if horizontal.target >= horizontal.current:
        return horizontal, ""
    shrinking = [
        v.resource.value for v in vertical if v.actuate and v.value is not None and v.value < v.current
    ]
    if not shrinking:
        return horizontal, ""
    note = f"task decrease deferred: {' and '.join(shrinking)} limit shrinks in this step"
    return replace(horizontal, actuate=False, deferred_by_reconciliation=True), note


def decide(
    job: JobView,
    candidates: Mapping[Resource, Mapping[str, Candidate]],
    signal: HorizontalInput | None,
    memory: JobMemory,
    policy: DecisionPolicy,
    now_ms: int,
    registered_custom: Collection[str] = (),
) -> tuple[JobDecision, JobMemory]:
    """Decide one job; ``candidates[resource][ref.label]`` holds each recommender's latest."""
    vertical = tuple(
        _vertical(job, resource, candidates.get(resource, {}), memory, policy, registered_custom, now_ms)
        for resource in (Resource.CPU, Resource.MEMORY)
    )
    cpu = vertical[0]
    cpu_after = float(cpu.value) if cpu.actuate and cpu.value is not None else job.cpu_limit
    horizontal, memory = _horizontal(job, signal, cpu_after, memory, policy, now_ms)
    horizontal, note = reconcile(vertical, horizontal)
    release = job.held and not _recently_sent(memory.released, 1, now_ms, policy)
    fields = {v.resource: v.value for v in vertical if v.actuate}
    task_count = horizontal.target if horizontal is not None and horizontal.actuate else None
    sources = [v.chosen.recommendation_id for v in vertical if v.actuate and v.chosen is not None]
    if task_count is not None and signal is not None:
        sources.append(signal.recommendation_id)
    reasons = [
        f"{v.resource.value} {v.current:.0f} -> {v.value} ({v.selected.label}"
        f"{'' if v.clamp is ClampReason.NONE else ', ' + v.clamp.value})"
        for v in vertical
        if v.actuate
    ]
    if task_count is not None and horizontal is not None:
        reasons.append(f"tasks {horizontal.current} -> {task_count} ({horizontal.reason.label})")
    if release:
        reasons.append("first recommendation: release the Autopilot hold")
    if note:
        reasons.append(note)
    decision = JobDecision(
        job_id=job.job_id,
        vertical=vertical,
        horizontal=horizontal,
        cpu_limit=fields.get(Resource.CPU),
        memory_limit=fields.get(Resource.MEMORY),
        task_count=task_count,
        release_hold=release,
        reason="; ".join(reasons),
        source_ids=tuple(sources),
        event_time_ms=now_ms,
    )
    return decision, memory


def idempotency_key(decision: JobDecision, fencing_token: int) -> str:
    """Deterministic from the decision: a replay of the same decision has the same key."""
    parts = [
        decision.job_id,
        str(fencing_token),
        ",".join(sorted(decision.source_ids)),
        str(decision.cpu_limit),
        str(decision.memory_limit),
        str(decision.task_count),
        str(decision.release_hold),
        str(decision.event_time_ms),
    ]
    digest = hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]
    return f"{decision.job_id}/{fencing_token}/{digest}"


def remember_sent(memory: JobMemory, decision: JobDecision, key: str) -> JobMemory:
    """What the master sent, so it does not send the same target again right away."""
    t = decision.event_time_ms
    out = memory
    if decision.cpu_limit is not None:
        out = replace(out, cpu=SentTarget(decision.cpu_limit, t, key))
    if decision.memory_limit is not None:
        out = replace(out, memory=SentTarget(decision.memory_limit, t, key))
    if decision.task_count is not None:
        out = replace(out, tasks=SentTarget(decision.task_count, t, key))
    if decision.release_hold:
        out = replace(out, released=SentTarget(1, t, key))
    return out


def hold_release_ready(job: JobView, has_recommendation: bool, held_for_ms: int, grace_ms: int) -> bool:
    """Whether a job waiting in HELD_FOR_AUTOPILOT should be released now (§3.1).

    With its first recommendation; at once if nothing of it is actuated (DRY_RUN or OFF
    only: nothing to wait for); or, when no recommender has anything for it (a new job has
    no usage history), after ``grace_ms`` with its own limits.
    """
    if not job.held:
        return False
    actuated = ScalingMode.ON in (job.cpu.mode, job.memory.mode, job.horizontal.mode)
    return has_recommendation or not actuated or held_for_ms >= grace_ms
