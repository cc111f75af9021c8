"""Post-processing of raw recommendations (Autopilot §3.2.2 last paragraph, §3.2).

1. Safety margin: a raw recommendation is increased by 10-15 %, less for large limits
   (:class:`MarginCurve`).
2. The maximum recommendation seen over the last hour, to damp fluctuations
   (:class:`LastHourMax` over :func:`update_window_max`, also used by horizontal deferred
   downscaling, §3.3).
Both decorate a recommender kind (:mod:`cellpilot.recommend.estimator`).
User bounds are the master's (:mod:`cellpilot.autopilot.vertical_targets`), not a
recommender's: one assembly of Autopilot, shared by the services and the studies.

All functions are vectorised over jobs; state is :class:`WindowMaxState` (per-job arrays).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray, Int64Array
from cellpilot.recommend.job_arrays import JobArrays
from cellpilot.units import GIB, MILLICORES_PER_CORE
from cellpilot.usage.buckets import Resource

MINUTE_MS = 60 * 1000
HOUR_MS = 60 * MINUTE_MS
EMPTY_SLOT = np.iinfo(np.int64).min  # a ring entry holding no slot (times may be negative)


@dataclass(frozen=True)
class MarginCurve:
    """Relative safety margin as a function of the limit (§3.2.2: "10-15 % ... less for large limits").

    ``small_margin`` up to ``small_limit``, ``large_margin`` from ``large_limit`` on, and
    log-linear interpolation between (the paper gives the range, not the curve).
    """

    small_limit: float
    large_limit: float
    small_margin: float = 0.15
    large_margin: float = 0.10

    def __post_init__(self) -> None:
        if not 0.0 < self.small_limit < self.large_limit:
            raise ValueError("need 0 < small_limit < large_limit")
        if self.small_margin < 0.0 or self.large_margin < 0.0:
            raise ValueError("margins must be non-negative")

    @classmethod
    def for_resource(cls, resource: Resource) -> MarginCurve:
        # 15 % up to 1 core / 1 GiB, 10 % from 64 cores / 64 GiB: our choice of "large".
        if resource is Resource.CPU:
            return cls(small_limit=float(MILLICORES_PER_CORE), large_limit=float(64 * MILLICORES_PER_CORE))
        return cls(small_limit=float(GIB), large_limit=float(64 * GIB))

    def margin_for(self, values: npt.ArrayLike) -> FloatArray:
        """The relative margin for each raw value (NaN stays NaN)."""
        v = np.asarray(values, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            position = np.log(np.maximum(v, self.small_limit) / self.small_limit) / np.log(
                self.large_limit / self.small_limit
            )
        position = np.clip(position, 0.0, 1.0)
        margin = self.small_margin + (self.large_margin - self.small_margin) * position
        return np.where(np.isnan(v), np.nan, margin)

    def apply(self, values: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
        """(values increased by their margin, the margin used)."""
        v = np.asarray(values, dtype=np.float64)
        margin = self.margin_for(v)
        return v * (1.0 + margin), margin


@dataclass(frozen=True, eq=False)
class WindowMaxState(JobArrays):
    """Per job, the maximum value seen in each of the last ``slots`` time slots.

    Slot s covers [s * slot_ms, (s + 1) * slot_ms); ``slot_ids`` says which slot each ring
    entry currently holds, so updates at any rate are handled exactly at slot
    granularity and a long silence simply leaves stale entries that no query counts.
    """

    slot_ids: Int64Array  # (J, S), EMPTY_SLOT = none
    values: FloatArray  # (J, S)


def initial_window_max(jobs: int, slots: int) -> WindowMaxState:
    return WindowMaxState(np.full((jobs, slots), EMPTY_SLOT, dtype=np.int64), np.full((jobs, slots), np.nan))


def update_window_max(
    state: WindowMaxState, values: npt.ArrayLike, time_ms: npt.ArrayLike, slot_ms: int
) -> tuple[WindowMaxState, FloatArray]:
    """Record ``values`` (J,) at ``time_ms`` (J,) and return the max over the window.

    The window is the current slot and the ``slots - 1`` before it, i.e. a span of
    ``slots * slot_ms`` ending now (at slot granularity). NaN values (no recommendation)
    are not recorded; a job with nothing in the window gets NaN.
    """
    v = np.asarray(values, dtype=np.float64)
    t = np.asarray(time_ms, dtype=np.int64)
    jobs, slots = state.values.shape
    if v.shape != (jobs,) or t.shape != (jobs,):
        raise ValueError(f"expected ({jobs},) values and times")
    current = t // slot_ms
    ring = (current % slots).astype(np.intp)
    rows = np.arange(jobs)
    slot_ids = state.slot_ids.copy()
    stored = state.values.copy()
    fresh = slot_ids[rows, ring] != current
    record = ~np.isnan(v)
    # A new slot starts from this value; an existing one keeps its maximum.
    held = stored[rows, ring]
    new_value = np.where(fresh, v, np.fmax(held, v))
    write = record | fresh
    stored[rows[write], ring[write]] = new_value[write]
    slot_ids[rows[write], ring[write]] = np.where(record[write], current[write], EMPTY_SLOT)
    valid = slot_ids > (current - slots)[:, None]
    with np.errstate(invalid="ignore"):
        window_max = np.where(valid, stored, -np.inf).max(axis=1)
    window_max = np.where(np.isneginf(window_max), np.nan, window_max)
    return WindowMaxState(slot_ids, stored), window_max


@dataclass(frozen=True)
class LastHourMax:
    """§3.2.2 post-processing: "the maximum recommendation value seen over the last hour".

    A decorator with state: the caller keeps one :class:`WindowMaxState` ring per recommender
    kind (``slots`` slots of ``slot_ms``, spanning ``span_ms``) and passes it in."""

    span_ms: int = HOUR_MS
    slot_ms: int = 5 * MINUTE_MS

    @property
    def slots(self) -> int:
        return -(-self.span_ms // self.slot_ms)

    def initial(self, jobs: int) -> WindowMaxState:
        return initial_window_max(jobs, self.slots)

    def record(
        self, ring: WindowMaxState, values: npt.ArrayLike, time_ms: npt.ArrayLike
    ) -> tuple[WindowMaxState, FloatArray]:
        """Record (J,) values at (J,) times; (new ring, the max over the last hour)."""
        return update_window_max(ring, values, time_ms, self.slot_ms)
