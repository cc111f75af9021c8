"""What a vertical recommendation says and why (§5.2: limits must be explainable to users).

:class:`RecommendationBatch` is what flows through a recommender pipeline for many jobs
at once (arrays); :class:`Recommendation` is one job's row, with the winning statistic or
model, the raw value, the safety margin, whether the max over the last hour raised it,
and why user bounds clamped it. :class:`JobSettings` carries the per-job inputs that are
configuration rather than history (the policy's statistic, user bounds).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from cellpilot.recommend.policy import Statistic
from cellpilot.recommend.post_processing import ClampReason
from cellpilot.usage.buckets import Resource

FloatArray = npt.NDArray[np.float64]
Int64Array = npt.NDArray[np.int64]
Int8Array = npt.NDArray[np.int8]
Int16Array = npt.NDArray[np.int16]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, eq=False)
class JobSettings:
    """Per-job configuration for one batched update; ``None`` means the default for all jobs.

    ``statistic``: :class:`~cellpilot.recommend.policy.Statistic` codes (moving window only);
    ``lower`` / ``upper``: user bounds in the resource's unit, NaN for none.
    """

    statistic: Int8Array | None = None
    lower: FloatArray | None = None
    upper: FloatArray | None = None

    @classmethod
    def single(
        cls, statistic: Statistic | None = None, lower: float | None = None, upper: float | None = None
    ) -> JobSettings:
        return cls(
            None if statistic is None else np.array([int(statistic)], dtype=np.int8),
            None if lower is None else np.array([lower], dtype=np.float64),
            None if upper is None else np.array([upper], dtype=np.float64),
        )


def _optional(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


@dataclass(frozen=True)
class Recommendation:
    """One job's recommended limit and its explanation."""

    resource: Resource
    unit: str
    time_ms: int
    value: float | None  # the limit to apply; None until the job has usage
    raw_value: float | None  # the base estimator's output (statistic or model limit)
    source: str  # e.g. "moving_window:p98" or "ml:model 37 (d=0.01, margin +10.0%)"
    margin: float | None  # relative safety margin added by post-processing
    raised_by_window_max: bool  # the max over the recent window was higher than this value
    clamp: ClampReason
    details: Mapping[str, float] = field(default_factory=dict)

    def explain(self) -> str:
        if self.value is None or self.raw_value is None:
            return f"{self.source}: no usage observed yet, no recommendation"
        parts = [f"{self.value:.6g} {self.unit} from {self.source} = {self.raw_value:.6g}"]
        if self.margin is not None:
            parts.append(f"+{self.margin:.1%} safety margin")
        if self.raised_by_window_max:
            parts.append("held at the maximum of the last hour")
        if self.clamp is not ClampReason.NONE:
            parts.append(self.clamp.label)
        return "; ".join(parts)


@dataclass(frozen=True, eq=False)
class RecommendationBatch:
    """Recommendations for J jobs; post-processors return modified copies."""

    resource: Resource
    unit: str
    time_ms: Int64Array
    value: FloatArray
    raw_value: FloatArray
    source: Int16Array  # index into source_names
    source_names: tuple[str, ...]
    margin: FloatArray  # NaN = no margin step
    raised_by_window_max: BoolArray
    clamp: Int8Array
    details: Mapping[str, FloatArray]

    @classmethod
    def from_estimate(
        cls,
        resource: Resource,
        unit: str,
        time_ms: Int64Array,
        value: FloatArray,
        source: npt.ArrayLike,
        source_names: tuple[str, ...],
        details: Mapping[str, FloatArray],
    ) -> RecommendationBatch:
        jobs = value.shape[0]
        return cls(
            resource=resource,
            unit=unit,
            time_ms=np.asarray(time_ms, dtype=np.int64),
            value=value,
            raw_value=value.copy(),
            source=np.asarray(source, dtype=np.int16),
            source_names=source_names,
            margin=np.full(jobs, np.nan),
            raised_by_window_max=np.zeros(jobs, dtype=bool),
            clamp=np.zeros(jobs, dtype=np.int8),
            details=details,
        )

    def __len__(self) -> int:
        return int(self.value.shape[0])

    def row(self, i: int) -> Recommendation:
        return Recommendation(
            resource=self.resource,
            unit=self.unit,
            time_ms=int(self.time_ms[i]),
            value=_optional(float(self.value[i])),
            raw_value=_optional(float(self.raw_value[i])),
            source=self.source_names[int(self.source[i])],
            margin=_optional(float(self.margin[i])),
            raised_by_window_max=bool(self.raised_by_window_max[i]),
            clamp=ClampReason(int(self.clamp[i])),
            details={name: float(values[i]) for name, values in self.details.items()},
        )

    def rows(self) -> list[Recommendation]:
        return [self.row(i) for i in range(len(self))]
