"""The master's vertical step for many jobs at once: chosen recommender -> bounds -> dead band.

One array function per step, called by the Autopilot master on its batch (one job per
decision today) and by the replay on every job of a window at once, so both take the
same decision from the same recommender outputs (Autopilot §3.1-§3.2):

* :func:`chosen_values`: per job the value of the recommender the selection picked
  (:mod:`cellpilot.autopilot.selection`), and whether its max over the last hour
  (§3.2.2) raised it;
* :func:`bound_limits`: the user's lower and upper bounds (§3.2 "optional user inputs
  ... upper and lower bounds on the limits"), then the largest machine (a recommendation
  must be placeable), with the reason kept for the explanation (§5.2);
* :func:`significant_changes`: the dead band around the current limit (every limit
  change may evict tasks, §2.3, §4.4);
* :func:`vertical_targets`: all of the above plus the job's mode (only ON actuates, DRY_RUN
  stays visible, §5.1) and the jobs held for their first recommendation (§3.1).

Clamp reasons are one enumeration, :class:`ClampReason`; arrays carry its position in
:data:`CLAMP_REASONS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import BoolArray, FloatArray, Int8Array


class ClampReason(StrEnum):
    """Why the limit Autopilot wants differs from the chosen recommender's raw output."""

    NONE = "none"
    MIN_BOUND = "min_bound"
    MAX_BOUND = "max_bound"
    LAST_HOUR_MAX = "last_hour_max"
    MACHINE_SIZE = "machine_size"

    @property
    def code(self) -> int:
        return CLAMP_REASONS.index(self)


CLAMP_REASONS: tuple[ClampReason, ...] = tuple(ClampReason)
_MIN, _MAX, _HOUR, _MACHINE = (r.code for r in CLAMP_REASONS[1:])


def _per_job(value: npt.ArrayLike | None, jobs: int) -> FloatArray:
    if value is None:
        return np.full(jobs, np.nan)
    return np.broadcast_to(np.asarray(value, dtype=np.float64), (jobs,))


def bound_limits(
    values: npt.ArrayLike,
    min_limit: npt.ArrayLike | None = None,
    max_limit: npt.ArrayLike | None = None,
    machine_capacity: float | None = None,
) -> tuple[FloatArray, Int8Array]:
    """Clamp (J,) values to the user's bounds (NaN bound = none), then to the largest machine.

    Returns the bounded values and the reason codes (positions in :data:`CLAMP_REASONS`);
    a NaN value (no recommendation yet) stays NaN with reason NONE.
    """
    v = np.asarray(values, dtype=np.float64)
    jobs = v.shape[0]
    lo, hi = _per_job(min_limit, jobs), _per_job(max_limit, jobs)
    if np.any(lo > hi):
        raise ValueError("a min_limit exceeds its max_limit")
    reason = np.zeros(jobs, dtype=np.int8)
    below, above = v < lo, v > hi
    out = np.where(below, lo, np.where(above, hi, v))
    reason[below] = _MIN
    reason[above] = _MAX
    if machine_capacity is not None:
        too_big = out > machine_capacity
        out = np.where(too_big, machine_capacity, out)
        reason[too_big] = _MACHINE
    return out, reason


def significant_changes(
    current: npt.ArrayLike, target: npt.ArrayLike, min_increase: float, min_decrease: float
) -> BoolArray:
    """Outside the dead band around the current limit (any change from nothing counts)."""
    c = np.asarray(current, dtype=np.float64)
    t = np.asarray(target, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = t / c
        outside = (ratio >= 1.0 + min_increase) | (ratio <= 1.0 - min_decrease)
    return np.asarray(np.where(c > 0, outside, t > 0), dtype=bool)


def chosen_values(
    values: npt.ArrayLike, raised: npt.ArrayLike, column: npt.ArrayLike
) -> tuple[FloatArray, BoolArray]:
    """Per job, column ``column[j]`` of (J, C) recommender outputs (-1: none -> NaN)."""
    v = np.asarray(values, dtype=np.float64)
    r = np.asarray(raised, dtype=bool)
    c = np.asarray(column, dtype=np.intp)
    rows = np.arange(v.shape[0])
    safe = np.maximum(c, 0)
    return np.where(c >= 0, v[rows, safe], np.nan), np.asarray((c >= 0) & r[rows, safe], dtype=bool)


@dataclass(frozen=True, eq=False)
class VerticalTargets:
    value: FloatArray  # (J,) the limit Autopilot wants, whole units; NaN = no recommendation yet
    clamp: Int8Array  # (J,) positions in CLAMP_REASONS
    actuate: BoolArray  # (J,) this decision sends the value


def vertical_targets(
    chosen: npt.ArrayLike,
    raised_by_hour_max: npt.ArrayLike,
    current: npt.ArrayLike,
    *,
    on: npt.ArrayLike,
    held: npt.ArrayLike | None = None,
    min_limit: npt.ArrayLike | None = None,
    max_limit: npt.ArrayLike | None = None,
    machine_capacity: float | None = None,
    min_increase: float = 0.01,
    min_decrease: float = 0.05,
    recently_sent: npt.ArrayLike | None = None,
) -> VerticalTargets:
    """The master's vertical decision for J jobs of one resource.

    ``chosen``: the selected recommender's value (NaN: none yet); a held ON job without one
    starts from its own limit (§3.1). The target is bounded, rounded to whole units (at
    least 1), and actuated when the job is ON, it differs from the current limit and
    either leaves the dead band or was moved by a user bound, and the same value was not
    sent moments ago (``recently_sent``).
    """
    cur = np.asarray(current, dtype=np.float64)
    jobs = cur.shape[0]
    is_on = np.broadcast_to(np.asarray(on, dtype=bool), (jobs,))
    base = np.asarray(chosen, dtype=np.float64)
    if held is not None:
        base = np.where(np.isnan(base) & np.asarray(held, dtype=bool) & is_on, cur, base)
    bounded, clamp = bound_limits(base, min_limit, max_limit, machine_capacity)
    hour = (clamp == 0) & np.asarray(raised_by_hour_max, dtype=bool) & ~np.isnan(bounded)
    clamp = np.where(hour, np.int8(_HOUR), clamp).astype(np.int8)
    value = np.where(np.isnan(bounded), np.nan, np.maximum(1.0, np.round(bounded)))
    by_bound = (clamp == _MIN) | (clamp == _MAX)
    with np.errstate(invalid="ignore"):
        differs = ~np.isnan(value) & (value != np.round(cur))
    actuate = is_on & differs & (significant_changes(cur, value, min_increase, min_decrease) | by_bound)
    if recently_sent is not None:
        actuate &= ~np.asarray(recently_sent, dtype=bool)
    return VerticalTargets(value, clamp, actuate)
