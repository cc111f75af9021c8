"""Which vertical recommender kinds a worker runs, in which output column, composed how.

Autopilot §3.2: every recommender runs on every job (users compare them, §5.2) and the
master selects one. A kind is registered data: its name, how to build its
:class:`~cellpilot.recommend.estimator.Estimator` (the estimator and its decorators) from a
resource's :class:`~cellpilot.autopilot.candidates.CandidateConfig`, and whether the max over
the last hour (§3.2.2) holds its output. The batch path
(:func:`~cellpilot.autopilot.candidates.update_candidates`) runs whatever a registry lists,
one output column per kind in registration order, so a new built-in kind is one module (its
estimator) plus one registration below; a wire-visible kind also needs its name in
:class:`~cellpilot.job_vocabulary.RecommenderKind` and the API's enum.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cellpilot.job_vocabulary import RecommenderKind
from cellpilot.recommend.estimator import Estimator, WithMargin
from cellpilot.recommend.ml_kind import EnsembleEstimator
from cellpilot.recommend.policy import Statistic
from cellpilot.recommend.window_statistic_kind import WindowStatisticEstimator

if TYPE_CHECKING:
    from cellpilot.autopilot.candidates import CandidateConfig


@dataclass(frozen=True)
class RecommenderRegistration:
    """One recommender kind: how it is built and described."""

    kind: str  # a RecommenderKind for the built-ins
    build: Callable[[CandidateConfig], Estimator]
    label: str  # its short name in an explanation (§5.2), e.g. "S_p98"
    description: str  # one line for users listing the recommenders
    hour_max: bool = True  # §3.2.2: held at the max of its values over the last hour
    statistic: Statistic | None = None  # the §3.2.2 policy table's statistic it computes, if any


@dataclass(frozen=True)
class RecommenderRegistry:
    """The kinds a worker runs; column c of every output is ``registrations[c]``."""

    registrations: tuple[RecommenderRegistration, ...]

    def __post_init__(self) -> None:
        if len(set(self.kinds)) != len(self.kinds):
            raise ValueError(f"a recommender kind is registered twice: {self.kinds}")

    def __len__(self) -> int:
        return len(self.registrations)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(r.kind for r in self.registrations)

    def column(self, kind: str) -> int:
        return self.kinds.index(kind)

    def registered(self, registration: RecommenderRegistration) -> RecommenderRegistry:
        """This registry with one more kind, in a new last column."""
        return RecommenderRegistry((*self.registrations, registration))


@dataclass(frozen=True)
class _StatisticWithMargin:
    """Builds §3.2.2's statistic plus the resource's safety margin (a value, so configs pickle)."""

    statistic: Statistic

    def __call__(self, config: CandidateConfig) -> Estimator:
        return WithMargin(WindowStatisticEstimator(self.statistic), config.margin)


def _ensemble(config: CandidateConfig) -> Estimator:
    return EnsembleEstimator()


def _moving_window(kind: RecommenderKind, statistic: Statistic, label: str) -> RecommenderRegistration:
    """§3.2.2: a statistic of the decayed histogram, plus the safety margin, plus the hour's max."""
    return RecommenderRegistration(
        kind,
        _StatisticWithMargin(statistic),
        label,
        f"moving window {label} (§3.2.2)",
        statistic=statistic,
    )


BUILTIN_REGISTRY = RecommenderRegistry(
    (
        _moving_window(RecommenderKind.MOVING_WINDOW_MAX, Statistic.MAX, "S_max"),
        _moving_window(RecommenderKind.MOVING_WINDOW_AVG, Statistic.AVG, "S_avg"),
        _moving_window(RecommenderKind.MOVING_WINDOW_P90, Statistic.P90, "S_p90"),
        _moving_window(RecommenderKind.MOVING_WINDOW_P95, Statistic.P95, "S_p95"),
        _moving_window(RecommenderKind.MOVING_WINDOW_P98, Statistic.P98, "S_p98"),
        _moving_window(
            RecommenderKind.MOVING_WINDOW_P60_HALF_MAX,
            Statistic.MAX_OF_P60_AND_HALF_PEAK,
            "max(S_p60, 0.5*S_max)",
        ),
        # §3.2.3: eq. 7's margins are per model, so no safety margin; the hour's max holds it.
        RecommenderRegistration(
            RecommenderKind.ML,
            _ensemble,
            "ML",
            "ensemble of arg-min models, eqs. 4-9 (Autopilot §3.2.3)",
        ),
    )
)
# The built-in kinds in the order of their output columns (the wire's and the studies' order).
BUILTIN_RECOMMENDERS: tuple[RecommenderKind, ...] = tuple(RecommenderKind(k) for k in BUILTIN_REGISTRY.kinds)

__all__ = ["BUILTIN_RECOMMENDERS", "BUILTIN_REGISTRY", "RecommenderRegistration", "RecommenderRegistry"]
