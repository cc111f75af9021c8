"""The §3.2.2 policy table: which moving-window statistic sizes which job.

CPU: batch jobs use S_avg; serving jobs S_p95 or S_p90 by latency sensitivity.
Memory, by OOM tolerance: low -> S_p98; minimal -> S_max; intermediate ->
max(S_p60, 0.5 * S_max). A user may override the choice (§3.2).

Statistics are small integer codes so a batch of jobs with different policies is
evaluated in one vectorised pass (:func:`evaluate_statistics`), which also records the
*term* that produced each value (for the combined memory rule, whether p60 or half the
peak won) for the recommendation's explanation.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray, Int8Array
from cellpilot.job_vocabulary import AppClass, LatencySensitivity, OomTolerance
from cellpilot.recommend.moving_window import WindowStatistics
from cellpilot.usage.buckets import Resource


class Statistic(IntEnum):
    MAX = 0
    AVG = 1
    P60 = 2
    P90 = 3
    P95 = 4
    P98 = 5
    MAX_OF_P60_AND_HALF_PEAK = 6

    @property
    def label(self) -> str:
        return STATISTIC_LABELS[self]


STATISTIC_LABELS: dict[Statistic, str] = {
    Statistic.MAX: "max",
    Statistic.AVG: "avg",
    Statistic.P60: "p60",
    Statistic.P90: "p90",
    Statistic.P95: "p95",
    Statistic.P98: "p98",
    Statistic.MAX_OF_P60_AND_HALF_PEAK: "max(p60,0.5*max)",
}

# The term that produced a value: a statistic's own label, or "0.5*max" when the
# intermediate-tolerance rule was decided by half the peak.
TERMS: tuple[str, ...] = ("max", "avg", "p60", "p90", "p95", "p98", "0.5*max")
_HALF_PEAK_TERM = 6
_PERCENTILE_OF: dict[Statistic, float] = {
    Statistic.P60: 60.0,
    Statistic.P90: 90.0,
    Statistic.P95: 95.0,
    Statistic.P98: 98.0,
}


@dataclass(frozen=True)
class JobProfile:
    """What the §3.2.2 table looks at, plus an optional user override."""

    resource: Resource
    job_class: AppClass = AppClass.LATENCY_SENSITIVE
    latency: LatencySensitivity = LatencySensitivity.MODERATE
    oom_tolerance: OomTolerance = OomTolerance.LOW
    statistic_override: Statistic | None = None


def statistic_for(profile: JobProfile) -> Statistic:
    """The §3.2.2 policy table."""
    if profile.statistic_override is not None:
        return profile.statistic_override
    if profile.resource is Resource.CPU:
        if profile.job_class is AppClass.BATCH:
            return Statistic.AVG
        return Statistic.P95 if profile.latency is LatencySensitivity.HIGH else Statistic.P90
    return {
        OomTolerance.LOW: Statistic.P98,
        OomTolerance.MINIMAL: Statistic.MAX,
        OomTolerance.INTERMEDIATE: Statistic.MAX_OF_P60_AND_HALF_PEAK,
    }[profile.oom_tolerance]


def default_oom_tolerance(footprint_machines: float, small_job_machines: float = 10.0) -> OomTolerance:
    """§3.2.2: "low" by default for large jobs, "minimal" for small ones.

    The paper gives no threshold; §5.3 calls jobs with an aggregate limit up to roughly 10
    machines small, which is our default.
    """
    return OomTolerance.MINIMAL if footprint_machines <= small_job_machines else OomTolerance.LOW


def statistic_codes(statistics: list[Statistic] | tuple[Statistic, ...]) -> Int8Array:
    return np.asarray([int(s) for s in statistics], dtype=np.int8)


def evaluate_statistics(codes: npt.ArrayLike, stats: WindowStatistics) -> tuple[FloatArray, Int8Array]:
    """Per job, the value of its statistic and the index in :data:`TERMS` of the term that won.

    NaN where the job has no usage yet. Raises KeyError if a needed percentile was not
    computed by the moving-window configuration.
    """
    code = np.asarray(codes, dtype=np.int8)
    jobs = stats.s_max.shape[0]
    if code.shape != (jobs,):
        raise ValueError(f"need one statistic code per job ({jobs}), got shape {code.shape}")
    values = np.full(jobs, np.nan)
    terms = code.copy()
    values[code == Statistic.MAX] = stats.s_max[code == Statistic.MAX]
    values[code == Statistic.AVG] = stats.s_avg[code == Statistic.AVG]
    for statistic, level in _PERCENTILE_OF.items():
        rows = code == statistic
        if rows.any():
            values[rows] = stats.percentile(level)[rows]
    rows = code == Statistic.MAX_OF_P60_AND_HALF_PEAK
    if rows.any():
        p60 = stats.percentile(60.0)[rows]
        half_peak = 0.5 * stats.s_max[rows]
        values[rows] = np.fmax(p60, half_peak)
        terms[rows] = np.where(half_peak > p60, _HALF_PEAK_TERM, Statistic.P60)
    unknown = (code < 0) | (code > max(Statistic))
    if unknown.any():
        raise ValueError(f"unknown statistic codes {sorted(set(code[unknown].tolist()))}")
    return values, terms
