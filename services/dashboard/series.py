"""Time series the charts draw, built from what the sources answered (plain functions, no I/O).

Times are event times in ms since epoch; a window's value is drawn at its end, where the
recommendations computed from it are stamped too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

import numpy as np

from cellpilot.recommend.horizontal import raw_task_count
from cellpilot_services.dashboard import models

HOUR_MS = 3_600_000
OTHER_JOBS = "other jobs"


class Window(Protocol):
    """What the charts need of a job's usage histogram (``usage_pb2.UsageHistogram``)."""

    @property
    def window_start_ms(self) -> int: ...
    @property
    def window_end_ms(self) -> int: ...
    @property
    def mean_total_usage(self) -> float: ...


W = TypeVar("W", bound=Window)


def recent(windows: Sequence[W], hours: float) -> list[W]:
    """The windows of the last ``hours`` of event time back from the newest one (0: all)."""
    if not windows or hours <= 0:
        return list(windows)
    newest = max(w.window_end_ms for w in windows)
    return [w for w in windows if w.window_start_ms >= newest - hours * HOUR_MS]


def steps(
    history: Iterable[models.SeriesPoint], current: float, since_ms: int, span: tuple[int, int] | None
) -> list[models.SeriesPoint]:
    """A step function (a limit, a task count) from its recorded changes and its value now.

    ``current`` is appended at ``since_ms`` when the history does not end with it; with a
    ``span`` (the chart's first and last time) the steps are cut to it, starting with the value
    in force at its start and ending with a point at its end, so the line crosses the chart."""
    points = list(history)
    if not points or points[-1].value != current:
        points.append(models.SeriesPoint(t_ms=since_ms, value=current))
    if span is None:
        return points
    start, end = span
    before = [p for p in points if p.t_ms <= start]
    inside = [p for p in points if start < p.t_ms <= end]
    first_value = before[-1].value if before else points[0].value
    cut = [models.SeriesPoint(t_ms=start, value=first_value), *inside]
    cut.append(models.SeriesPoint(t_ms=end, value=cut[-1].value))
    return cut


class HorizontalPoint(Protocol):
    """A horizontal recommendation as the stream history keeps it."""

    @property
    def t_ms(self) -> int: ...
    @property
    def raw_task_count(self) -> float: ...
    @property
    def usage_statistic(self) -> float: ...


def raw_task_counts(
    points: Sequence[HorizontalPoint], target_utilisation: float, limits: Sequence[tuple[int, int]]
) -> list[models.SeriesPoint]:
    """n_r over time: a target-size recommender's own raw count, else the CPU-utilisation
    source's ceil(r_S / (r* x limit)) with the job's CPU limit in force at each point (Autopilot
    §3.3). ``limits`` are (from ms, millicores) steps in time order."""
    starts = np.asarray([t for t, _ in limits], dtype=np.int64)
    values = np.asarray([v for _, v in limits], dtype=np.float64)
    times = np.asarray([p.t_ms for p in points], dtype=np.int64)
    limit = values[np.clip(np.searchsorted(starts, times, side="right") - 1, 0, len(values) - 1)]
    statistic = np.asarray([p.usage_statistic for p in points], dtype=np.float64)
    derived = (
        raw_task_count(statistic, target_utilisation, np.maximum(limit, 1.0))
        if target_utilisation > 0
        else np.zeros(len(points))
    )
    return [
        models.SeriesPoint(t_ms=p.t_ms, value=p.raw_task_count if p.raw_task_count > 0 else float(n))
        for p, n in zip(points, derived, strict=True)
        if p.raw_task_count > 0 or (p.usage_statistic > 0 and target_utilisation > 0)
    ]


def demand(windows: Iterable[Window]) -> list[models.SeriesPoint]:
    """Each window's mean summed usage of the job's tasks (the horizontal signal of Autopilot §3.3)."""
    return [models.SeriesPoint(t_ms=w.window_end_ms, value=w.mean_total_usage) for w in windows]


def cell_usage(
    per_job: dict[str, Sequence[Window]], hours: float, largest: int = 6
) -> tuple[list[models.SeriesPoint], list[models.UsageSeries]]:
    """The cell's usage per window summed over its jobs, and the ``largest`` jobs' own series
    (by usage over the span) with the rest summed as "other jobs", all on the same times.

    A job without a window at some time used nothing then (not yet started, or finished)."""
    everything = [w for windows in per_job.values() for w in windows]
    if not everything:
        return [], []
    newest = max(w.window_end_ms for w in everything)
    oldest = newest - hours * HOUR_MS if hours > 0 else None
    usage: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for job_id, windows in per_job.items():
        for w in windows:
            if oldest is None or w.window_start_ms >= oldest:
                usage[job_id][w.window_end_ms] += w.mean_total_usage
    times = sorted({t for by_time in usage.values() for t in by_time})
    total = [models.SeriesPoint(t_ms=t, value=sum(u.get(t, 0.0) for u in usage.values())) for t in times]
    ranked = sorted(usage, key=lambda job: (-sum(usage[job].values()), job))
    shown, rest = ranked[:largest], ranked[largest:]

    def line(name: str, jobs: list[str]) -> models.UsageSeries:
        values = [sum(usage[j].get(t, 0.0) for j in jobs) for t in times]
        return models.UsageSeries(
            name=name,
            points=[models.SeriesPoint(t_ms=t, value=v) for t, v in zip(times, values, strict=True)],
        )

    by_job = [line(job, [job]) for job in shown]
    if rest:
        by_job.append(line(OTHER_JOBS, rest))
    return total, by_job
