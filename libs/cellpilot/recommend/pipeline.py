"""Composable vertical recommenders (DESIGN rule 6): a base estimator plus post-processors.

* An :class:`Estimator` turns one new histogram per job into a raw value with its source
  (moving-window statistic per the policy table, or the ML ensemble's chosen model).
* A :class:`PostProcessor` decorates that value: :class:`SafetyMargin`,
  :class:`MaxOverWindow` (max over the last hour), :class:`UserBounds`. Each may keep
  per-job state and records what it did in the recommendation's explanation.
* :class:`VerticalRecommender` chains them. ``update_batch(state, counts, time_ms)`` runs
  many jobs at once; ``update(state, histogram)`` is the one-job form. The state
  (:class:`RecommenderState`) holds the estimator's and every step's state and serialises
  itself (``to_bytes`` / ``from_bytes``), so a worker can crash and another resume.

Custom recommenders (§5.4) plug in by implementing :class:`Estimator`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from cellpilot.recommend.explanation import JobSettings, Recommendation, RecommendationBatch
from cellpilot.recommend.job_arrays import JobArrays
from cellpilot.recommend.ml_ensemble import (
    EnsembleConfig,
    EnsembleState,
    initial_ensemble_state,
    update_ensemble,
)
from cellpilot.recommend.moving_window import (
    WindowConfig,
    WindowState,
    initial_window_state,
    update_window,
)
from cellpilot.recommend.policy import TERMS, JobProfile, Statistic, evaluate_statistics, statistic_for
from cellpilot.recommend.post_processing import (
    HOUR_MS,
    MINUTE_MS,
    MarginCurve,
    WindowMaxState,
    clamp_to_bounds,
    initial_window_max,
    update_window_max,
)
from cellpilot.usage.buckets import BucketScheme, Resource, default_scheme
from cellpilot.usage.histogram import Histogram

FloatArray = npt.NDArray[np.float64]


class Estimator(Protocol):
    """The base of a recommender: history state in, one raw value per job out."""

    @property
    def scheme(self) -> BucketScheme: ...

    def initial_state(self, jobs: int) -> JobArrays: ...

    def estimate(
        self, state: JobArrays, counts: FloatArray, time_ms: npt.NDArray[np.int64], settings: JobSettings
    ) -> tuple[JobArrays, RecommendationBatch]: ...


class PostProcessor(Protocol):
    """A decorator step over an estimate; ``initial_state`` returns None if stateless."""

    def initial_state(self, jobs: int) -> JobArrays | None: ...

    def apply(
        self, state: JobArrays | None, batch: RecommendationBatch, settings: JobSettings
    ) -> tuple[JobArrays | None, RecommendationBatch]: ...


# -- estimators ------------------------------------------------------------------------


@dataclass(frozen=True)
class MovingWindowEstimator:
    """§3.2.2: S_max / S_avg / S_pj, each job valued by its policy statistic.

    ``settings.statistic`` gives each job's statistic; jobs without one use
    ``default_statistic``. Every statistic is also returned in ``details``.
    """

    scheme: BucketScheme
    config: WindowConfig
    default_statistic: Statistic

    def initial_state(self, jobs: int) -> WindowState:
        return initial_window_state(jobs, self.scheme.size, self.config)

    def estimate(
        self, state: JobArrays, counts: FloatArray, time_ms: npt.NDArray[np.int64], settings: JobSettings
    ) -> tuple[WindowState, RecommendationBatch]:
        if not isinstance(state, WindowState):
            raise TypeError("moving-window estimator needs a WindowState")
        new_state, stats = update_window(self.config, self.scheme.boundaries, state, counts, time_ms)
        jobs = counts.shape[0]
        codes = (
            settings.statistic
            if settings.statistic is not None
            else np.full(jobs, self.default_statistic, np.int8)
        )
        values, terms = evaluate_statistics(codes, stats)
        batch = RecommendationBatch.from_estimate(
            self.scheme.resource,
            self.scheme.unit,
            time_ms,
            values,
            terms,
            tuple(f"moving_window:{term}" for term in TERMS),
            stats.as_dict(),
        )
        return new_state, batch


@dataclass(frozen=True)
class MlEstimator:
    """§3.2.3: the ensemble of arg-min models; the value is L[t] of eq. 9."""

    scheme: BucketScheme
    config: EnsembleConfig = field(default_factory=EnsembleConfig)

    def initial_state(self, jobs: int) -> EnsembleState:
        return initial_ensemble_state(jobs, self.scheme.size, self.config)

    def estimate(
        self, state: JobArrays, counts: FloatArray, time_ms: npt.NDArray[np.int64], settings: JobSettings
    ) -> tuple[EnsembleState, RecommendationBatch]:
        if not isinstance(state, EnsembleState):
            raise TypeError("ML estimator needs an EnsembleState")
        new_state, decision = update_ensemble(self.config, self.scheme.boundaries, state, counts, time_ms)
        # A job with no usage at all yet has no meaningful limit. Index 0 is the slowest
        # decay rate, the last smoothed histogram to forget usage.
        limit = np.where(new_state.smoothed[:, 0, :].sum(axis=1) > 0.0, decision.limit, np.nan)
        grid = self.config.grid
        batch = RecommendationBatch.from_estimate(
            self.scheme.resource,
            self.scheme.unit,
            time_ms,
            limit,
            decision.model,
            tuple(f"ml:{grid.describe(m)}" for m in range(grid.models)),
            {
                "model_raw_limit": decision.raw_limit,
                "model_margin": decision.margin,
                "model_cost": decision.cost,
                "limit_changed": decision.limit_changed.astype(np.float64),
                "model_changed": decision.model_changed.astype(np.float64),
            },
        )
        return new_state, batch


# -- post-processors -------------------------------------------------------------------


@dataclass(frozen=True)
class SafetyMargin:
    """§3.2.2: raise by 10-15 %, less for larger limits."""

    curve: MarginCurve

    def initial_state(self, jobs: int) -> None:
        return None

    def apply(
        self, state: JobArrays | None, batch: RecommendationBatch, settings: JobSettings
    ) -> tuple[None, RecommendationBatch]:
        value, margin = self.curve.apply(batch.value)
        return None, replace(batch, value=value, margin=margin)


@dataclass(frozen=True)
class MaxOverWindow:
    """§3.2.2: the maximum recommendation over the last hour (at ``slot_ms`` granularity)."""

    window_ms: int = HOUR_MS
    slot_ms: int = 5 * MINUTE_MS

    @property
    def slots(self) -> int:
        return -(-self.window_ms // self.slot_ms)

    def initial_state(self, jobs: int) -> WindowMaxState:
        return initial_window_max(jobs, self.slots)

    def apply(
        self, state: JobArrays | None, batch: RecommendationBatch, settings: JobSettings
    ) -> tuple[WindowMaxState, RecommendationBatch]:
        if not isinstance(state, WindowMaxState):
            raise TypeError("MaxOverWindow needs a WindowMaxState")
        new_state, window_max = update_window_max(state, batch.value, batch.time_ms, self.slot_ms)
        raised = window_max > batch.value
        return new_state, replace(batch, value=np.fmax(batch.value, window_max), raised_by_window_max=raised)


@dataclass(frozen=True)
class UserBounds:
    """§3.2: user lower/upper bounds clamp the result; the reason is recorded."""

    def initial_state(self, jobs: int) -> None:
        return None

    def apply(
        self, state: JobArrays | None, batch: RecommendationBatch, settings: JobSettings
    ) -> tuple[None, RecommendationBatch]:
        value, reason = clamp_to_bounds(batch.value, settings.lower, settings.upper)
        reason = np.where(np.isnan(batch.value), 0, reason).astype(np.int8)
        return None, replace(batch, value=value, clamp=reason)


# -- composition -----------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class RecommenderState(JobArrays):
    estimator: JobArrays
    steps: tuple[JobArrays | None, ...]


@dataclass(frozen=True)
class VerticalRecommender:
    estimator: Estimator
    post_processors: tuple[PostProcessor, ...] = ()

    @property
    def scheme(self) -> BucketScheme:
        return self.estimator.scheme

    def initial_state(self, jobs: int = 1) -> RecommenderState:
        return RecommenderState(
            self.estimator.initial_state(jobs), tuple(p.initial_state(jobs) for p in self.post_processors)
        )

    def update_batch(
        self,
        state: RecommenderState,
        counts: npt.ArrayLike,
        time_ms: npt.ArrayLike,
        settings: JobSettings | None = None,
    ) -> tuple[RecommenderState, RecommendationBatch]:
        """One new histogram per job: ``counts`` (J, K) at event times ``time_ms`` (J,)."""
        if len(state.steps) != len(self.post_processors):
            raise ValueError("state was built for a different pipeline")
        settings = settings or JobSettings()
        s = np.asarray(counts, dtype=np.float64)
        t = np.asarray(time_ms, dtype=np.int64)
        estimator_state, batch = self.estimator.estimate(state.estimator, s, t, settings)
        step_states: list[JobArrays | None] = []
        for step, step_state in zip(self.post_processors, state.steps, strict=True):
            new_step_state, batch = step.apply(step_state, batch, settings)
            step_states.append(new_step_state)
        return RecommenderState(estimator_state, tuple(step_states)), batch

    def update(
        self, state: RecommenderState, histogram: Histogram, settings: JobSettings | None = None
    ) -> tuple[RecommenderState, Recommendation]:
        """The one-job form: ``state`` holds one job; the histogram's end is its event time."""
        if state.jobs != 1:
            raise ValueError("update() takes a one-job state; use update_batch for many jobs")
        if histogram.scheme != self.scheme:
            raise ValueError(f"histogram uses {histogram.scheme!r}, recommender expects {self.scheme!r}")
        new_state, batch = self.update_batch(
            state, histogram.counts[None, :], np.array([histogram.end_ms], dtype=np.int64), settings
        )
        return new_state, batch.row(0)


def moving_window_recommender(
    profile: JobProfile | Resource,
    *,
    scheme: BucketScheme | None = None,
    config: WindowConfig | None = None,
    margin: MarginCurve | None = None,
    hour_max: bool = True,
) -> VerticalRecommender:
    """The §3.2.2 pipeline: statistic (by ``profile``'s policy) -> margin -> max over 1 h -> bounds."""
    job_profile = profile if isinstance(profile, JobProfile) else JobProfile(profile)
    resource = job_profile.resource
    estimator = MovingWindowEstimator(
        scheme or default_scheme(resource),
        config or WindowConfig.for_resource(resource),
        statistic_for(job_profile),
    )
    steps: list[PostProcessor] = [SafetyMargin(margin or MarginCurve.for_resource(resource))]
    if hour_max:
        steps.append(MaxOverWindow())
    steps.append(UserBounds())
    return VerticalRecommender(estimator, tuple(steps))


def ml_recommender(
    resource: Resource,
    *,
    scheme: BucketScheme | None = None,
    config: EnsembleConfig | None = None,
    hour_max: bool = False,
) -> VerticalRecommender:
    """The §3.2.3 pipeline: ensemble (margins are per model, eq. 7) -> optional max -> bounds."""
    estimator = MlEstimator(scheme or default_scheme(resource), config or EnsembleConfig())
    steps: list[PostProcessor] = [MaxOverWindow()] if hour_max else []
    steps.append(UserBounds())
    return VerticalRecommender(estimator, tuple(steps))
