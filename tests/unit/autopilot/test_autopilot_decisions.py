"""The master's per-job decision: selection, bounds, dead band, dry run, reconciliation, hold."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cellpilot.autopilot.decisions import (
    Candidate,
    DecisionPolicy,
    HorizontalConfig,
    HorizontalInput,
    JobMemory,
    JobView,
    decide,
    idempotency_key,
    reconcile,
    remember_sent,
)
from cellpilot.autopilot.recommender_registry import BUILTIN_RECOMMENDERS
from cellpilot.autopilot.selection import (
    AutoMl,
    ClampReason,
    JobTraits,
    RecommenderRef,
    VerticalConfig,
    apply_bounds,
    auto_kind,
    select_recommender,
)
from cellpilot.job_vocabulary import (
    AppClass,
    LatencySensitivity,
    OomTolerance,
    RecommenderKind,
    ScalingMode,
)
from cellpilot.units import GIB
from cellpilot.usage.buckets import Resource

MIN = 60_000
ON = VerticalConfig(ScalingMode.ON)
POLICY = DecisionPolicy()


def job(**overrides: object) -> JobView:
    base = JobView(
        job_id="u/web",
        spec_version=3,
        cpu_limit=1000.0,
        memory_limit=float(GIB),
        task_count=4,
        cpu=ON,
        memory=ON,
    )
    return replace(base, **overrides)  # type: ignore[arg-type]


def candidate(resource: Resource, kind: RecommenderKind, value: float, t: int = 10 * MIN) -> Candidate:
    return Candidate(
        RecommenderRef.builtin(kind), resource, value, value / 1.1, value - value / 1.1, t, f"{kind}-{t}"
    )


def candidates(cpu: float | None = None, memory: float | None = None, t: int = 10 * MIN) -> dict:
    out: dict[Resource, dict[str, Candidate]] = {Resource.CPU: {}, Resource.MEMORY: {}}
    if cpu is not None:
        for kind in BUILTIN_RECOMMENDERS:
            out[Resource.CPU][kind.value] = candidate(Resource.CPU, kind, cpu, t)
    if memory is not None:
        for kind in BUILTIN_RECOMMENDERS:
            out[Resource.MEMORY][kind.value] = candidate(Resource.MEMORY, kind, memory, t)
    return out


@pytest.mark.parametrize(
    ("resource", "traits", "expected"),
    [
        (Resource.CPU, JobTraits(AppClass.BATCH), RecommenderKind.MOVING_WINDOW_AVG),
        (
            Resource.CPU,
            JobTraits(AppClass.LATENCY_SENSITIVE, LatencySensitivity.HIGH),
            RecommenderKind.MOVING_WINDOW_P95,
        ),
        (
            Resource.CPU,
            JobTraits(AppClass.LATENCY_SENSITIVE, LatencySensitivity.MODERATE),
            RecommenderKind.MOVING_WINDOW_P90,
        ),
        (Resource.MEMORY, JobTraits(oom_tolerance=OomTolerance.LOW), RecommenderKind.MOVING_WINDOW_P98),
        (Resource.MEMORY, JobTraits(oom_tolerance=OomTolerance.MINIMAL), RecommenderKind.MOVING_WINDOW_MAX),
        (
            Resource.MEMORY,
            JobTraits(oom_tolerance=OomTolerance.INTERMEDIATE),
            RecommenderKind.MOVING_WINDOW_P60_HALF_MAX,
        ),
        (Resource.MEMORY, JobTraits(footprint_machines=2.0), RecommenderKind.MOVING_WINDOW_MAX),
        (Resource.MEMORY, JobTraits(footprint_machines=50.0), RecommenderKind.MOVING_WINDOW_P98),
    ],
    ids=[
        "batch",
        "serving-high",
        "serving-moderate",
        "oom-low",
        "oom-minimal",
        "oom-intermediate",
        "small",
        "large",
    ],
)
def test_auto_follows_the_policy_table(
    resource: Resource, traits: JobTraits, expected: RecommenderKind
) -> None:
    assert auto_kind(resource, traits) is expected


@pytest.mark.parametrize(
    ("choice", "registered", "expected_kind"),
    [
        (RecommenderRef.builtin(RecommenderKind.ML), (), "ml"),
        (RecommenderRef.custom("fs-size"), ("fs-size",), "custom"),
        (RecommenderRef.custom("gone"), ("fs-size",), "moving_window_p95"),
    ],
    ids=["explicit-builtin", "registered-custom", "unregistered-custom-falls-back"],
)
def test_explicit_choices_and_custom_fallback(
    choice: RecommenderRef, registered: tuple[str, ...], expected_kind: str
) -> None:
    selection = select_recommender(Resource.CPU, VerticalConfig(recommender=choice), JobTraits(), registered)
    assert selection.ref.kind == expected_kind


@pytest.mark.parametrize(
    ("value", "config", "machine", "expected"),
    [
        (500.0, VerticalConfig(min_limit=800), None, (800.0, ClampReason.MIN_BOUND)),
        (5000.0, VerticalConfig(max_limit=2000), None, (2000.0, ClampReason.MAX_BOUND)),
        (5000.0, VerticalConfig(), 4000.0, (4000.0, ClampReason.MACHINE_SIZE)),
        (1500.0, VerticalConfig(min_limit=1000, max_limit=2000), 4000.0, (1500.0, ClampReason.NONE)),
    ],
    ids=["below-min", "above-max", "bigger-than-a-machine", "inside"],
)
def test_bounds(
    value: float, config: VerticalConfig, machine: float | None, expected: tuple[float, ClampReason]
) -> None:
    assert apply_bounds(value, config, machine) == expected


@pytest.mark.parametrize(
    ("cpu_rec", "actuates"),
    [(1005.0, False), (1020.0, True), (960.0, False), (900.0, True)],
    ids=["tiny-increase", "increase", "small-decrease", "decrease"],
)
def test_dead_band(cpu_rec: float, actuates: bool) -> None:
    decision, _ = decide(job(), candidates(cpu=cpu_rec), None, JobMemory(), POLICY, 10 * MIN)
    assert (decision.cpu_limit is not None) is actuates
    if actuates:
        assert decision.cpu_limit == round(cpu_rec)
        assert decision.vertical[0].selected.kind == "moving_window_p95"


@pytest.mark.parametrize("mode", [ScalingMode.DRY_RUN, ScalingMode.OFF], ids=["dry-run", "off"])
def test_dry_run_and_off_show_the_recommendation_but_never_actuate(mode: ScalingMode) -> None:
    view = job(cpu=VerticalConfig(mode), memory=VerticalConfig(mode))
    decision, _ = decide(view, candidates(cpu=3000.0, memory=3.0 * GIB), None, JobMemory(), POLICY, 10 * MIN)
    assert not decision.actuate
    assert [v.value for v in decision.vertical] == [3000, 3 * GIB]


def test_the_same_target_is_not_resent_until_the_resend_period_passed() -> None:
    decision, memory = decide(job(), candidates(cpu=2000.0), None, JobMemory(), POLICY, 10 * MIN)
    memory = remember_sent(memory, decision, idempotency_key(decision, 7))
    again, _ = decide(job(), candidates(cpu=2000.0), None, memory, POLICY, 15 * MIN)
    assert again.cpu_limit is None
    later, _ = decide(job(), candidates(cpu=2000.0), None, memory, POLICY, 10 * MIN + POLICY.resend_after_ms)
    assert later.cpu_limit == 2000


def test_held_job_is_released_with_its_own_limits_when_there_is_no_history() -> None:
    view = job(held=True, memory=VerticalConfig(ScalingMode.ON, min_limit=2.0 * GIB))
    decision, memory = decide(view, candidates(), None, JobMemory(), POLICY, 0)
    assert decision.release_hold
    assert decision.cpu_limit is None  # its own limit: nothing to change
    assert decision.memory_limit == 2 * GIB  # raised to the user's lower bound
    memory = remember_sent(memory, decision, "k")
    again, _ = decide(view, candidates(), None, memory, POLICY, MIN)
    assert not again.release_hold


def test_held_dry_run_job_is_released_without_changes() -> None:
    view = job(held=True, cpu=VerticalConfig(ScalingMode.DRY_RUN), memory=VerticalConfig(ScalingMode.DRY_RUN))
    decision, _ = decide(view, candidates(cpu=5000.0), None, JobMemory(), POLICY, 0)
    assert decision.release_hold
    assert (decision.cpu_limit, decision.memory_limit, decision.task_count) == (None, None, None)


HORIZONTAL = HorizontalConfig(
    ScalingMode.ON,
    target_utilization=0.5,
    deferred_downscaling_ms=60 * MIN,
    small_change_fraction=0.0,
    max_initializing_fraction=0.0,
    slow_decay_half_period_ms=0,
)


def signal(usage: float, t: int) -> HorizontalInput:
    return HorizontalInput(t, f"h-{t}", usage_statistic=usage)


def test_horizontal_scales_up_at_once_and_down_only_after_the_deferral() -> None:
    view = job(
        cpu=VerticalConfig(ScalingMode.OFF), memory=VerticalConfig(ScalingMode.OFF), horizontal=HORIZONTAL
    )
    memory = JobMemory()
    # r_S = 4000 millicores at r* = 0.5 of a 1000-millicore limit: 8 tasks.
    decision, memory = decide(view, {}, signal(4000.0, 5 * MIN), memory, POLICY, 5 * MIN)
    assert decision.task_count == 8
    view = replace(view, task_count=8)
    counts = []
    for step in range(2, 20):
        t = step * 5 * MIN
        decision, memory = decide(view, {}, signal(1000.0, t), memory, POLICY, t)
        if decision.task_count is not None:
            view = replace(view, task_count=decision.task_count)
        counts.append((t, view.task_count))
    first_drop = next(t for t, n in counts if n < 8)
    assert first_drop - 5 * MIN >= 60 * MIN, "a decrease must wait for the deferred-downscaling period"
    assert counts[-1][1] < 8


def test_a_reference_size_not_the_moving_limit_is_what_r_star_is_a_share_of() -> None:
    view = job(
        memory=VerticalConfig(ScalingMode.OFF),
        horizontal=replace(HORIZONTAL, reference_cpu_millicores=1000.0),
    )
    # The CPU limit shrinks to 500 in this step; r_S = 4000 at r* = 0.5 of the 1000 reference: 8 tasks
    # (against the new limit it would be 16).
    decision, _ = decide(view, candidates(cpu=500.0), signal(4000.0, 5 * MIN), JobMemory(), POLICY, 5 * MIN)
    assert decision.cpu_limit == 500
    assert decision.task_count == 8


def test_limits_and_tasks_never_shrink_in_the_same_step() -> None:
    view = job(
        memory=VerticalConfig(ScalingMode.OFF), horizontal=replace(HORIZONTAL, deferred_downscaling_ms=MIN)
    )
    memory = JobMemory()
    # 8 tasks wanted at first; then both the CPU limit and the task count want to shrink.
    _, memory = decide(view, candidates(cpu=1000.0), signal(4000.0, 5 * MIN), memory, POLICY, 5 * MIN)
    view = replace(view, task_count=8)
    decision, memory = decide(
        view, candidates(cpu=500.0, t=20 * MIN), signal(600.0, 20 * MIN), memory, POLICY, 20 * MIN
    )
    assert decision.cpu_limit == 500
    assert decision.task_count is None
    assert decision.horizontal is not None
    assert decision.horizontal.deferred_by_reconciliation
    assert "deferred" in decision.reason
    # Next step: the limit is in place, so the task decrease goes ahead (computed with it).
    view = replace(view, cpu_limit=500.0)
    decision, _ = decide(
        view, candidates(cpu=500.0, t=25 * MIN), signal(600.0, 25 * MIN), memory, POLICY, 25 * MIN
    )
    assert decision.cpu_limit is None
    assert decision.task_count is not None
    assert decision.task_count < 8


def test_growth_with_shrinking_limits_is_allowed() -> None:
    view = job(task_count=2, memory=VerticalConfig(ScalingMode.OFF), horizontal=HORIZONTAL)
    decision, _ = decide(view, candidates(cpu=800.0), signal(4000.0, 5 * MIN), JobMemory(), POLICY, 5 * MIN)
    assert decision.cpu_limit == 800
    assert decision.task_count == 10  # 4000 / (0.5 * 800)
    shrink_only, note = reconcile(decision.vertical, decision.horizontal)
    assert note == ""
    assert shrink_only is decision.horizontal


def test_idempotency_key_is_deterministic_and_depends_on_the_token() -> None:
    decision, _ = decide(job(), candidates(cpu=2000.0), None, JobMemory(), POLICY, 10 * MIN)
    same, _ = decide(job(), candidates(cpu=2000.0), None, JobMemory(), POLICY, 10 * MIN)
    assert idempotency_key(decision, 3) == idempotency_key(same, 3)
    assert idempotency_key(decision, 3) != idempotency_key(decision, 4)


@pytest.mark.parametrize(
    ("resource", "job_class", "auto_ml", "expected"),
    [
        (Resource.MEMORY, AppClass.LATENCY_SENSITIVE, AutoMl.SERVING_MEMORY, RecommenderKind.ML),
        (Resource.MEMORY, AppClass.BATCH, AutoMl.SERVING_MEMORY, RecommenderKind.MOVING_WINDOW_MAX),
        (Resource.CPU, AppClass.LATENCY_SENSITIVE, AutoMl.SERVING_MEMORY, RecommenderKind.MOVING_WINDOW_P95),
        (Resource.MEMORY, AppClass.LATENCY_SENSITIVE, AutoMl.NEVER, RecommenderKind.MOVING_WINDOW_MAX),
        (Resource.CPU, AppClass.BATCH, AutoMl.ALWAYS, RecommenderKind.ML),
    ],
    ids=["serving-memory-ml", "batch-memory-table", "cpu-table", "never", "always"],
)
def test_auto_follows_section_4_2_and_says_why(
    resource: Resource, job_class: AppClass, auto_ml: AutoMl, expected: RecommenderKind
) -> None:
    traits = JobTraits(job_class, LatencySensitivity.HIGH, OomTolerance.MINIMAL)
    selection = select_recommender(resource, VerticalConfig(), traits, (), auto_ml)
    assert selection.ref.kind == expected.value
    assert ("§4.2" in selection.note) is (expected is RecommenderKind.ML)
    assert DecisionPolicy().auto_ml is AutoMl.SERVING_MEMORY  # the master's default
