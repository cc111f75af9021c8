"""The horizontal autoscaling study's setting: its synthetic jobs and its configuration.

See :mod:`cellpilot.evaluate.horizontal_study` for what the study does with them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from cellpilot.autopilot.decisions import HorizontalConfig
from cellpilot.evaluate.hpa import DEFAULT_SCALE_DOWN
from cellpilot.recommend.horizontal import raw_task_count
from cellpilot.units import MIB
from cellpilot.world.job_demand import DemandSeries, JobDemand

FloatArray = npt.NDArray[np.float64]
DAY_S = 86_400
DECIDERS = ("autopilot-cpu", "autopilot-target-size", "hpa", "bound", "fixed-peak", "fixed-mean")
AUTOPILOT = ("autopilot-cpu", "autopilot-target-size")
MAX_DAYS = 60
MAX_SEEDS = 100
MAX_TASKS = 10_000
HOUR_S = 3600.0
MIN_WINDOW_H = 5 / 60  # Autopilot's 5-minute averaging and deferral slots: the shortest window
# Each decider's knobs (what its owner sets) in the sweep's settings; a setting maps every knob
# of its decider to a value. HPA: its target and scale-down stabilisation window; Autopilot §3.3:
# r*, the horizon T of the CPU source, the deferred-downscaling window T_d.
KNOBS: dict[str, tuple[str, ...]] = {
    "autopilot-cpu": ("target_utilisation", "horizon_h", "deferral_h"),
    "autopilot-target-size": ("target_utilisation", "deferral_h"),
    "hpa": ("target_utilisation", "downscale_window_s"),
    "bound": ("target_utilisation",),
    "fixed-peak": ("target_utilisation",),
    "fixed-mean": ("target_utilisation",),
}
Setting = tuple[tuple[str, float], ...]  # (knob, value) in KNOBS order: hashable, JSON-able as a dict
# Each task's own usage (its base, under the job's share): idle, so all CPU is the job's demand.
TASK_BASE = (
    "steady",
    {"cpu_millicores": 0.0, "cpu_noise": 0.0, "memory_bytes": 64 * MIB, "memory_noise": 0.0},
)


@dataclass(frozen=True)
class Workload:
    """One job's demand: a usage model with parameters, or a replayed series; a step workload
    also names when its demand steps and to what level (for the time-to-follow metric)."""

    name: str
    model: str = ""
    params: Mapping[str, float] = field(default_factory=dict)
    trace: DemandSeries | None = None
    step_at_s: float | None = None
    step_level_millicores: float | None = None

    def demand(self, seed: int) -> JobDemand:
        return JobDemand.build(self.model, dict(self.params), self.trace, seed=seed)


def synthetic_workloads(days: float) -> tuple[Workload, ...]:
    """The study's synthetic jobs (chosen once, before any result; 1 core = 1000 millicores)."""
    step_at = days * DAY_S / 2
    return (
        Workload(
            "diurnal", "diurnal", {"cpu_mean_millicores": 8000.0, "cpu_amplitude": 0.6, "cpu_noise": 0.05}
        ),
        Workload(
            "spiky",
            "spiky",
            {
                "cpu_base_millicores": 6000.0,
                "cpu_noise_sigma": 0.2,
                "cpu_spike_millicores": 6000.0,
                "spike_probability": 0.05,
                "spike_seconds": 600.0,
            },
        ),
        Workload(
            "growth", "growth", {"cpu_start_millicores": 3000.0, "cpu_growth_per_day": 0.5, "cpu_noise": 0.05}
        ),
        Workload(
            "step",
            "step",
            {
                "cpu_before_millicores": 4000.0,
                "cpu_after_millicores": 12000.0,
                "step_after_seconds": step_at,
                "cpu_noise": 0.05,
            },
            step_at_s=step_at,
            step_level_millicores=12000.0,
        ),
    )


def _checked_values(name: str, values: Sequence[float], low: float, high: float, low_open: bool) -> None:
    ok = bool(values) and all(
        math.isfinite(v) and (v > low if low_open else v >= low) and v <= high for v in values
    )
    if not ok:
        bracket = "(" if low_open else "["
        raise ValueError(
            f"--{name} must be a non-empty list of values in {bracket}{low:g}, {high:g}], got {values}"
        )


@dataclass(frozen=True)
class SweepGrid:
    """The knob values the sweep replays: the HPA at every (target, window), Autopilot's CPU
    source at every (r*, horizon, deferral). The study's default settings are run besides."""

    hpa_targets: tuple[float, ...] = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
    hpa_windows_s: tuple[float, ...] = (0.0, 300.0, 1800.0)
    autopilot_targets: tuple[float, ...] = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    autopilot_horizons_h: tuple[float, ...] = (0.5, 72.0)
    autopilot_deferrals_h: tuple[float, ...] = (0.25, 6.0, 48.0)

    def __post_init__(self) -> None:
        _checked_values("hpa-targets", self.hpa_targets, 0.0, 1.0, low_open=True)
        _checked_values("hpa-windows", self.hpa_windows_s, 0.0, 3600.0, low_open=False)
        _checked_values("autopilot-targets", self.autopilot_targets, 0.0, 1.0, low_open=True)
        _checked_values("autopilot-horizons", self.autopilot_horizons_h, MIN_WINDOW_H, 24.0 * MAX_DAYS, False)
        _checked_values(
            "autopilot-deferrals", self.autopilot_deferrals_h, MIN_WINDOW_H, 24.0 * MAX_DAYS, False
        )

    def settings(self, decider: str) -> list[Setting]:
        """The grid's settings of ``decider`` (none for a decider the sweep does not vary)."""
        if decider == "hpa":
            return [
                (("target_utilisation", t), ("downscale_window_s", w))
                for t in self.hpa_targets
                for w in self.hpa_windows_s
            ]
        if decider == "autopilot-cpu":
            return [
                (("target_utilisation", t), ("horizon_h", h), ("deferral_h", d))
                for t in self.autopilot_targets
                for h in self.autopilot_horizons_h
                for d in self.autopilot_deferrals_h
            ]
        return []


@dataclass(frozen=True)
class HorizontalStudyConfig:
    days: float = 7.0
    seeds: int = 3
    seed: int = 0
    step_s: int = 60  # decision step
    sample_s: int = 30  # world samples within a step
    startup_s: int = 300  # a new task is ready (takes traffic) this long after it starts
    target_utilisation: float = 0.6  # r*, of the task's CPU limit, for every decider
    task_cpu_limit: float = 1000.0  # millicores
    machine_cpu_millicores: float | None = None  # None: a task gets at most its limit
    workloads: tuple[Workload, ...] = ()
    deciders: tuple[str, ...] = DECIDERS
    sweep: SweepGrid | None = None  # None: every decider at its default setting only

    def __post_init__(self) -> None:
        problems = [
            ("days", math.isfinite(self.days) and 0 < self.days <= MAX_DAYS, f"must be in (0, {MAX_DAYS}]"),
            ("seeds", 1 <= self.seeds <= MAX_SEEDS, f"must be in 1..{MAX_SEEDS}"),
            ("seed", 0 <= self.seed < 2**32, "must be in 0..2^32-1"),
            ("step", 10 <= self.step_s <= 3600, "must be in 10..3600 seconds"),
            (
                "sample",
                1 <= self.sample_s <= self.step_s and self.step_s % self.sample_s == 0,
                "must be 1..step seconds and divide the step",
            ),
            ("startup", 0 <= self.startup_s <= 3600, "must be in 0..3600 seconds"),
            ("target-utilisation", 0 < self.target_utilisation <= 1, "must be in (0, 1]"),
            ("task-cpu", math.isfinite(self.task_cpu_limit) and self.task_cpu_limit > 0, "must be positive"),
            (
                "machine-cpu",
                self.machine_cpu_millicores is None or self.machine_cpu_millicores >= self.task_cpu_limit,
                "must be at least the task CPU limit",
            ),
            (
                "deciders",
                bool(self.deciders) and set(self.deciders) <= set(DECIDERS),
                f"must be some of {', '.join(DECIDERS)}",
            ),
        ]
        for name, ok, message in problems:
            if not ok:
                raise ValueError(f"--{name} {message}, got {getattr(self, _FIELDS.get(name, name), '')}")
        if self.days * DAY_S < 2 * self.step_s:
            raise ValueError(f"--days {self.days} is shorter than two decision steps")
        if not self.workloads:
            object.__setattr__(self, "workloads", synthetic_workloads(self.days))

    @property
    def steps(self) -> int:
        return int(self.days * DAY_S // self.step_s)

    def default_setting(self, decider: str) -> Setting:
        """``decider``'s knobs as the study sets them by default: r* for everyone, the HPA's
        documented 5-minute scale-down window, Autopilot's API defaults (72 h, 48 h)."""
        autopilot = HorizontalConfig()
        values = {
            "target_utilisation": self.target_utilisation,
            "downscale_window_s": DEFAULT_SCALE_DOWN.stabilisation_window_s,
            "horizon_h": autopilot.horizon_ms / (1000 * HOUR_S),
            "deferral_h": autopilot.deferred_downscaling_ms / (1000 * HOUR_S),
        }
        return tuple((knob, values[knob]) for knob in KNOBS[decider])

    def settings(self, decider: str) -> list[Setting]:
        """Every setting ``decider`` is replayed at: its default first, then the sweep's others."""
        default = self.default_setting(decider)
        swept = self.sweep.settings(decider) if self.sweep is not None else []
        return [default, *(s for s in dict.fromkeys(swept) if s != default)]

    @property
    def task_capacity(self) -> float:
        return self.machine_cpu_millicores or self.task_cpu_limit

    def tasks_for(self, load: npt.ArrayLike) -> FloatArray:
        """The fewest tasks that serve ``load`` at the target utilisation."""
        return raw_task_count(load, self.target_utilisation, self.task_cpu_limit)


_FIELDS = {
    "step": "step_s",
    "sample": "sample_s",
    "startup": "startup_s",
    "target-utilisation": "target_utilisation",
    "task-cpu": "task_cpu_limit",
    "machine-cpu": "machine_cpu_millicores",
}
