"""Autopilot's evaluation metrics (§4.1.1, §4.3 Table 2, §4.4 Figure 7) per job-day, and their summary.

Per job and calendar day, from 5-minute windows (§4.1.1):

* **footprint**: the sum over tasks of their average limit weighted by their runtime that
  day, i.e. the sum over task-windows of limit x (window / day);
* **relative slack**: (limit - usage) / limit, with *usage* the 95 %ile of all 5-minute
  average usage values of all the job's tasks that day and *limit* the average limit over
  the day (runtime-weighted over the task-windows);
* **absolute slack**: limit-seconds minus usage-seconds over all tasks (5-minute
  averages), divided by one day: a number of bytes held but not used, on average;
* **relative OOM rate**: OOMs during the day / the average number of running tasks;
* **OOM-free** job-days, and job-days **seriously impacted by OOMs** (§4.3): at least
  max(n, f x tasks) OOMs for each (n, f) row of Table 2. The caption's "if 5, or 1/7th of
  the job's tasks (whichever is higher) are terminated" is read as ">="; "tasks" is the
  day's average number of running tasks (the relative OOM rate's denominator);
* **limit changes** per job-day (Figure 7): in every summary their mean and their 50th and
  99th percentiles over the job-days, for every decider (:data:`LIMIT_CHANGE_KEYS`).

Footprint and absolute slack are normalised by a machine's memory (§4.1.1: "the amount of
memory a single (largish) machine has"); fleet totals are sums over job-days divided by the
number of measured days ("summed over our sample ... and averaged over the month", §4.2).

Pure numpy: :class:`DayAccumulator` collects one day of windows for a chunk of jobs,
:func:`close_day` turns it into :class:`JobDays` rows, :func:`summarise` and :func:`goals`
aggregate them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from itertools import pairwise
from typing import Any

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import BoolArray, FloatArray, Int64Array, IntpArray
from cellpilot.usage.row_arrays import RowArrays

# Table 2: (number of OOMs, fraction of tasks); a job-day is seriously impacted when its
# OOMs reach the larger of the two.
TABLE2_ROWS: tuple[tuple[int, int], ...] = ((5, 7), (4, 5), (4, 7), (4, 10), (3, 7))  # (n, 1/f)
USAGE_PERCENTILE = 95.0  # §4.1.1: the 95 %ile of 5-minute average usage
OOM_TOLERANCES: tuple[str, ...] = ("minimal", "low", "intermediate")  # OomTolerance values, by code
# Figure 7: limit changes per job-day, the mean and the 50th / 99th percentiles over job-days.
LIMIT_CHANGE_KEYS: tuple[str, ...] = (
    "limit_changes_per_job_day",
    "limit_changes_per_job_day_p50",
    "limit_changes_per_job_day_p99",
)


def table2_label(row: tuple[int, int]) -> str:
    return f"{row[0]} OOMs or 1/{row[1]} of tasks"


@dataclass(frozen=True, eq=False)
class JobDays(RowArrays):
    """One row per job-day; CPU columns are NaN when CPU is not replayed."""

    job_id: Int64Array
    day: Int64Array
    serving: BoolArray  # the job is a serving job (the paper's population, §4.1.2)
    oom_tolerance: Int64Array  # index into OOM_TOLERANCES
    tasks: FloatArray  # average running tasks
    footprint: FloatArray  # bytes (runtime-weighted sum of limits / day)
    absolute_slack: FloatArray  # bytes
    average_limit: FloatArray  # bytes
    usage_p95: FloatArray  # bytes
    relative_slack: FloatArray
    ooms: Int64Array
    relative_oom_rate: FloatArray
    limit_changes: Int64Array
    cpu_relative_slack: FloatArray
    cpu_throttled_fraction: FloatArray

    @classmethod
    def empty(cls) -> JobDays:
        kinds: dict[str, type[np.generic]] = {"serving": np.bool_}
        kinds |= dict.fromkeys(("job_id", "day", "ooms", "limit_changes", "oom_tolerance"), np.int64)
        return cls(**{f.name: np.zeros(0, dtype=kinds.get(f.name, np.float64)) for f in fields(cls)})  # type: ignore[arg-type]


def seriously_impacted(ooms: npt.ArrayLike, tasks: npt.ArrayLike, count: int, fraction: float) -> BoolArray:
    """Table 2: at least max(count, fraction x tasks) OOMs (and at least one)."""
    o = np.asarray(ooms, dtype=np.float64)
    threshold = np.maximum(float(count), fraction * np.asarray(tasks, dtype=np.float64))
    return np.asarray((o >= threshold) & (o > 0), dtype=bool)


class DayAccumulator:
    """Sums over one day of windows for a chunk of jobs whose tasks are contiguous columns.

    ``add`` takes one window: each task's limit, 5-minute average usage and runtime weight
    (1 = ran the whole window; NaN usage where it did not run), its OOMs, and each job's
    limit changes. ``close_day`` turns the day into :class:`JobDays` rows.
    """

    def __init__(self, bounds: IntpArray, windows_per_day: int) -> None:
        self.bounds = np.asarray(bounds, dtype=np.intp)  # (J + 1,) column offsets of each job
        self.windows_per_day = windows_per_day
        tasks = int(self.bounds[-1])
        jobs = self.bounds.shape[0] - 1
        self.usage = np.full((windows_per_day, tasks), np.nan, dtype=np.float32)
        self.limit_weighted = np.zeros(tasks)
        self.usage_weighted = np.zeros(tasks)
        self.weight = np.zeros(tasks)
        self.ooms = np.zeros(tasks, dtype=np.int64)
        self.changes = np.zeros(jobs, dtype=np.int64)
        self.cpu_limit_weighted = np.zeros(tasks)
        self.cpu_weight = np.zeros(tasks)
        self.cpu_usage = np.full((windows_per_day, tasks), np.nan, dtype=np.float32)
        self.cpu_demand = np.zeros(tasks)
        self.cpu_served = np.zeros(tasks)
        self.with_cpu = False

    def add(
        self,
        slot: int,
        limit: FloatArray,
        usage: FloatArray,
        weight: FloatArray,
        ooms: BoolArray,
        changes: Int64Array,
    ) -> None:
        running = weight > 0.0
        self.usage[slot] = np.where(running, usage, np.nan)
        self.limit_weighted += np.where(running, limit * weight, 0.0)
        self.usage_weighted += np.where(running, usage * weight, 0.0)
        self.weight += weight
        self.ooms += ooms
        self.changes += changes

    def add_cpu(
        self,
        slot: int,
        limit: FloatArray,
        served_mean: FloatArray,
        demand_mean: FloatArray,
        weight: FloatArray,
    ) -> None:
        """CPU of one window: limit, throttled (served) and offered (demand) average usage."""
        self.with_cpu = True
        running = weight > 0.0
        self.cpu_usage[slot] = np.where(running, served_mean, np.nan)
        self.cpu_limit_weighted += np.where(running, limit * weight, 0.0)
        self.cpu_weight += weight
        self.cpu_demand += np.where(running, demand_mean * weight, 0.0)
        self.cpu_served += np.where(running, served_mean * weight, 0.0)

    def reset(self) -> None:
        self.usage.fill(np.nan)
        self.cpu_usage.fill(np.nan)
        for array in (
            self.limit_weighted,
            self.usage_weighted,
            self.weight,
            self.ooms,
            self.changes,
            self.cpu_limit_weighted,
            self.cpu_weight,
            self.cpu_demand,
            self.cpu_served,
        ):
            array.fill(0)

    def close_day(
        self, job_ids: Int64Array, day: int, serving: BoolArray, oom_tolerance: Int64Array
    ) -> JobDays:
        """The day's rows for jobs that ran at all; resets the accumulator."""
        starts = self.bounds[:-1]
        per_day = float(self.windows_per_day)

        def per_job(values: npt.NDArray[Any]) -> FloatArray:
            return np.asarray(np.add.reduceat(values.astype(np.float64), starts), dtype=np.float64)

        weight = per_job(self.weight)
        limit_w = per_job(self.limit_weighted)
        usage_w = per_job(self.usage_weighted)
        ran = weight > 0.0
        with np.errstate(invalid="ignore", divide="ignore"):
            average_limit = limit_w / weight
        usage_p95 = np.full(weight.shape, np.nan)
        cpu_slack = np.full(weight.shape, np.nan)
        cpu_throttled = np.full(weight.shape, np.nan)
        cpu_weight = per_job(self.cpu_weight) if self.with_cpu else None
        cpu_limit = per_job(self.cpu_limit_weighted) if self.with_cpu else None
        cpu_demand = per_job(self.cpu_demand) if self.with_cpu else None
        cpu_served = per_job(self.cpu_served) if self.with_cpu else None
        for j in np.flatnonzero(ran):
            lo, hi = int(self.bounds[j]), int(self.bounds[j + 1])
            values = self.usage[:, lo:hi]
            values = values[~np.isnan(values)]
            if values.size:
                usage_p95[j] = float(np.percentile(values, USAGE_PERCENTILE))
            if cpu_weight is not None and cpu_limit is not None and cpu_weight[j] > 0:
                cpu_values = self.cpu_usage[:, lo:hi]
                cpu_values = cpu_values[~np.isnan(cpu_values)]
                average = cpu_limit[j] / cpu_weight[j]
                if cpu_values.size and average > 0:
                    cpu_slack[j] = (average - float(np.percentile(cpu_values, USAGE_PERCENTILE))) / average
        if cpu_demand is not None and cpu_served is not None:
            with np.errstate(invalid="ignore", divide="ignore"):
                cpu_throttled = np.where(cpu_demand > 0, (cpu_demand - cpu_served) / cpu_demand, 0.0)
        tasks = weight / per_day
        ooms = np.add.reduceat(self.ooms, starts)
        with np.errstate(invalid="ignore", divide="ignore"):
            relative_slack = (average_limit - usage_p95) / average_limit
            relative_oom = ooms / tasks
        rows = JobDays(
            job_id=np.asarray(job_ids, dtype=np.int64),
            day=np.full(weight.shape, day, dtype=np.int64),
            serving=np.asarray(serving, dtype=bool),
            oom_tolerance=np.asarray(oom_tolerance, dtype=np.int64),
            tasks=tasks,
            footprint=limit_w / per_day,
            absolute_slack=(limit_w - usage_w) / per_day,
            average_limit=average_limit,
            usage_p95=usage_p95,
            relative_slack=relative_slack,
            ooms=ooms.astype(np.int64),
            relative_oom_rate=relative_oom,
            limit_changes=self.changes.copy(),
            cpu_relative_slack=cpu_slack,
            cpu_throttled_fraction=np.asarray(cpu_throttled, dtype=np.float64),
        ).select(ran)
        self.reset()
        return rows


def summarise(rows: JobDays, machine_bytes: float, days: int) -> dict[str, Any]:
    """The issue's per-recommender summary of job-day rows (``days`` = measured days)."""
    n = len(rows)
    if n == 0:
        return {"job_days": 0}
    slack = rows.relative_slack[np.isfinite(rows.relative_slack)]
    impacted = {
        table2_label(row): int(seriously_impacted(rows.ooms, rows.tasks, row[0], 1.0 / row[1]).sum())
        for row in TABLE2_ROWS
    }
    changes = rows.limit_changes.astype(np.float64)
    summary: dict[str, Any] = {
        "relative_slack_mean": float(slack.mean()) if slack.size else None,
        "relative_slack_median": float(np.median(slack)) if slack.size else None,
        "absolute_slack_machines": float(rows.absolute_slack.sum() / days / machine_bytes),
        "footprint_machines": float(rows.footprint.sum() / days / machine_bytes),
        "relative_oom_rate_per_task_day": float(np.mean(rows.relative_oom_rate)),
        "oom_free_job_days_fraction": float(np.mean(rows.ooms == 0)),
        "seriously_impacted_job_days": impacted,
        "seriously_impacted_job_days_fraction": {k: v / n for k, v in impacted.items()},
        "limit_changes_per_job_day": float(changes.mean()),
        "limit_changes_per_job_day_p50": float(np.percentile(changes, 50)),
        "limit_changes_per_job_day_p99": float(np.percentile(changes, 99)),
        "limit_changes_per_job_day_mean": float(changes.mean()),  # the same mean, its earlier name
        "job_days_without_limit_changes_fraction": float(np.mean(changes == 0)),
        "ooms_total": int(rows.ooms.sum()),
        "job_days": n,
        "jobs": int(np.unique(rows.job_id).size),
    }
    cpu = rows.cpu_relative_slack[np.isfinite(rows.cpu_relative_slack)]
    if cpu.size:
        throttled = rows.cpu_throttled_fraction[np.isfinite(rows.cpu_throttled_fraction)]
        summary["cpu_relative_slack_mean"] = float(cpu.mean())
        summary["cpu_throttled_fraction_mean"] = float(throttled.mean())
        summary["cpu_job_days_throttled_over_1pct_fraction"] = float(np.mean(throttled > 0.01))
    return summary


CORE_KEYS: tuple[str, ...] = (
    "relative_slack_mean",
    "relative_slack_median",
    "absolute_slack_machines",
    "footprint_machines",
    "relative_oom_rate_per_task_day",
    "oom_free_job_days_fraction",
    "seriously_impacted_job_days",
    *LIMIT_CHANGE_KEYS,
    "job_days",
)
POPULATIONS = ("serving", "all")


def summarise_study(
    rows: JobDays, machine_bytes: float, days: int, population: str = "serving"
) -> dict[str, Any]:
    """The summary on ``population`` plus breakdowns (all jobs, batch jobs, per OOM tolerance).

    ``"serving"`` is the paper's population (§4.1.2: long-running, serving jobs); ``"all"``
    includes batch jobs.
    """
    if population not in POPULATIONS:
        raise ValueError(f"population must be one of {POPULATIONS}")
    main = rows.select(rows.serving) if population == "serving" else rows
    out = summarise(main, machine_bytes, days)
    out["population"] = population

    def core(subset: JobDays) -> dict[str, Any]:
        full = summarise(subset, machine_bytes, days)
        return {k: full[k] for k in CORE_KEYS if k in full}

    out["breakdown"] = {
        "all_jobs": core(rows),
        "batch_jobs": core(rows.select(~rows.serving)),
        **{
            f"{population}_oom_tolerance_{name}": core(main.select(main.oom_tolerance == i))
            for i, name in enumerate(OOM_TOLERANCES)
        },
    }
    return out


def cdf(values: npt.ArrayLike, points: int = 400) -> tuple[list[float], list[float]]:
    """(x, F(x)) of the empirical CDF at up to ``points`` quantiles (for plots and JSON)."""
    v = np.sort(np.asarray(values, dtype=np.float64)[np.isfinite(np.asarray(values, dtype=np.float64))])
    if v.size == 0:
        return [], []
    index = np.unique(np.linspace(0, v.size - 1, min(points, v.size)).round().astype(np.intp))
    # F(x) = share of values <= x, ties included: a mass at 0 (OOM-free job-days) shows at x = 0.
    return v[index].tolist(), (np.searchsorted(v, v[index], side="right") / v.size).tolist()


@dataclass(frozen=True)
class Goal:
    name: str
    met: bool
    detail: str


BOUND = "clairvoyant"
BOUND_RATIO = "absolute_slack_vs_bound"
SLACK_RATIO = "slack_vs_bound"


def add_bound_ratios(summaries: dict[str, dict[str, Any]], bound: str = BOUND) -> None:
    """Each recommender's slack as a ratio to the clairvoyant bound's (in place; the breakdowns
    too): ``absolute_slack_vs_bound`` (absolute slack) and ``slack_vs_bound`` (mean relative
    slack, §4.1.1). The bound never sets a limit below the day's p95 usage, so its relative
    slack is >= 0 (:mod:`cellpilot.evaluate.autopilot_bound`); a ratio is left out where the
    bound's slack is not positive."""
    if bound not in summaries:
        return

    def ratio(summary: dict[str, Any], base: dict[str, Any]) -> None:
        for key, name in (("absolute_slack_machines", BOUND_RATIO), ("relative_slack_mean", SLACK_RATIO)):
            value, floor = summary.get(key), base.get(key)
            if value is not None and floor is not None and floor > 0:
                summary[name] = float(value) / float(floor)

    base = summaries[bound]
    for summary in summaries.values():
        ratio(summary, base)
        for key, part in summary.get("breakdown", {}).items():
            ratio(part, base.get("breakdown", {}).get(key, {}))


OOM_FREE_GOAL = 0.995  # §4.3: "over 99.5% of Autopilot job-days see no OOMs"
LIMIT_CHANGES_FACTOR = 2.0  # ML's limit changes per job-day (mean) at most this times the window's
SLACK_KEY = "relative_slack_mean"
OOM_KEY = "relative_oom_rate_per_task_day"
CHANGES_KEY = "limit_changes_per_job_day"
FREE_KEY = "oom_free_job_days_fraction"


def goals(summaries: Mapping[str, Mapping[str, Any]]) -> list[Goal]:
    """The goals, under whichever cell model the study ran, checked on the deciders replayed
    (a goal whose deciders are missing is left out). Each row gives its numbers, met or not:

    1. ML's relative slack (mean, §4.1.1) below the moving window's (§4.2), at a relative OOM
       rate no higher than the window's and at most :data:`LIMIT_CHANGES_FACTOR` times its
       limit changes per job-day (mean; Figure 7 reports similar change counts);
    2. ML's relative slack below VPA's at a relative OOM rate no higher than VPA's;
    3. relative slack manual-hard > manual-soft > moving window (§4.2, Figure 3a);
    4. ML and the moving window each keep >= 99.5 % of job-days OOM-free (§4.3);
    5. the clairvoyant bound's relative slack >= 0 (it bounds the others from below).
    """
    out: list[Goal] = []

    def value(name: str, key: str) -> float:
        v = summaries[name].get(key)
        return float("nan") if v is None else float(v)

    if "ml" in summaries and "moving-window" in summaries:
        slack, window_slack = value("ml", SLACK_KEY), value("moving-window", SLACK_KEY)
        oom, window_oom = value("ml", OOM_KEY), value("moving-window", OOM_KEY)
        changes = value("ml", CHANGES_KEY)
        allowed = LIMIT_CHANGES_FACTOR * value("moving-window", CHANGES_KEY)
        out.append(
            Goal(
                "ml: relative slack < moving-window's at an OOM rate <= its and "
                f"<= {LIMIT_CHANGES_FACTOR:g}x its limit changes per job-day",
                bool(slack < window_slack and oom <= window_oom and changes <= allowed),
                f"slack {slack:.3f} vs {window_slack:.3f}; OOMs/task-day {oom:.4f} vs {window_oom:.4f}; "
                f"limit changes/job-day {changes:.2f} vs {allowed:.2f} allowed",
            )
        )
    if "ml" in summaries and "vpa" in summaries:
        slack, vpa_slack = value("ml", SLACK_KEY), value("vpa", SLACK_KEY)
        oom, vpa_oom = value("ml", OOM_KEY), value("vpa", OOM_KEY)
        out.append(
            Goal(
                "ml: relative slack < vpa's at an OOM rate <= vpa's",
                bool(slack < vpa_slack and oom <= vpa_oom),
                f"slack {slack:.3f} vs {vpa_slack:.3f}; OOMs/task-day {oom:.4f} vs {vpa_oom:.4f}",
            )
        )
    order = [n for n in ("manual-hard", "manual-soft", "moving-window") if n in summaries]
    if len(order) >= 2:
        values = [value(n, SLACK_KEY) for n in order]
        out.append(
            Goal(
                "relative slack " + " > ".join(order),
                all(a > b for a, b in pairwise(values)),
                " > ".join(f"{n} {v:.3f}" for n, v in zip(order, values, strict=True)),
            )
        )
    free = [n for n in ("ml", "moving-window") if n in summaries]
    if free:
        fractions = [value(n, FREE_KEY) for n in free]
        out.append(
            Goal(
                f"{' and '.join(free)}: >= {OOM_FREE_GOAL:.1%} of job-days OOM-free",
                all(f >= OOM_FREE_GOAL for f in fractions),
                ", ".join(f"{n} {f:.2%}" for n, f in zip(free, fractions, strict=True)),
            )
        )
    if BOUND in summaries:
        bound = value(BOUND, SLACK_KEY)
        out.append(Goal("clairvoyant bound: relative slack >= 0", bool(bound >= 0.0), f"{bound:.3f}"))
    return out
