"""Per-task usage signals on the 5-minute grid: what the synthetic generator and the trace readers yield.

Autopilot §3.2.1 aggregates each task's raw usage into 5-minute windows; §4.1.1 computes
its metrics from those windows: a task's *average* memory in each window (relative and
absolute slack) and its *peak* (what a limit has to hold, the memory histogram's single
sample). A :class:`TaskSignal` is one task's series on a study's common window grid, with
the limits its owner set by hand (the manual baseline of §4); :class:`JobSignals` stacks
the tasks of one job as ``(windows, tasks)`` arrays, the layout the replay consumes.

Conventions:

* window ``w`` of a study covers ``[origin_ms + w * WINDOW_MS, origin_ms + (w + 1) * WINDOW_MS)``;
  day ``d`` is windows ``[d * WINDOWS_PER_DAY, (d + 1) * WINDOWS_PER_DAY)``;
* memory in bytes, CPU in millicores; a task that is not running in a window has NaN usage;
* ``restart`` marks windows at whose start the task was (re)started by its owner (a
  roll-out of a new binary, a new batch task instance): state that grows with the task's
  age (a memory leak) starts again there;
* ``memory_leak_per_window`` is growth (bytes per window of running time) that the replay
  adds on top of the recorded memory since the task's last (re)start, so that a restart,
  planned or caused by an OOM, resets it. Traces have none (their usage is what it was);
* two manual memory limits: what an owner using *hard* RAM limits set, and what one using
  *soft* limits set (Autopilot §2.3, §4.1: both populations are compared); traces have one
  requested limit, used for both.

Arrays are float32 (a 500-job, 16-day study holds tens of millions of task-windows).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from cellpilot.job_vocabulary import AppClass, LatencySensitivity, OomTolerance

F32 = npt.NDArray[np.float32]
Floats = npt.NDArray[np.floating[Any]]  # any float array in; stored as float32
BoolArray = npt.NDArray[np.bool_]

WINDOW_MS = 300_000  # §3.2.1 / §4.1.1: 5-minute aggregation windows
WINDOWS_PER_DAY = 288  # §4.1.1: metrics per calendar day
DAY_MS = WINDOW_MS * WINDOWS_PER_DAY
CPU_DECILES = 11  # 2019 traces: CPU usage at percentiles 0, 10, ..., 100 of each window


def _f32(values: npt.ArrayLike) -> F32:
    return np.ascontiguousarray(np.asarray(values, dtype=np.float32))


@dataclass(frozen=True)
class JobTraits:
    """What Autopilot's policy table (§3.2.2) and the metrics need to know about a job."""

    job_class: AppClass = AppClass.LATENCY_SENSITIVE
    latency: LatencySensitivity = LatencySensitivity.MODERATE
    oom_tolerance: OomTolerance = OomTolerance.LOW
    priority: int = 0
    kind: str = "serving"  # a free-form label of how the job was made (generator shape, trace)


@dataclass(frozen=True, eq=False)
class TaskSignal:
    """One task on the study grid, starting at window ``first_window`` (all arrays length W)."""

    job_id: int
    task_index: int
    first_window: int
    memory_mean: Floats  # bytes, NaN = not running
    memory_peak: Floats  # bytes
    cpu_mean: Floats  # millicores
    cpu_peak: Floats  # millicores
    memory_limit: Floats  # bytes, the manual limit (hard-limit owner / the trace's request)
    cpu_limit: Floats  # millicores, the manual CPU limit
    memory_limit_soft: Floats | None = None  # bytes, what a soft-limit owner set; None = memory_limit
    restart: BoolArray | None = None  # planned (re)start at the window's start
    memory_leak_per_window: float = 0.0
    cpu_deciles: Floats | None = None  # (W, 11) within-window CPU percentiles 0..100, if known

    def __post_init__(self) -> None:
        n = np.asarray(self.memory_mean).shape[0]
        for name in ("memory_mean", "memory_peak", "cpu_mean", "cpu_peak", "memory_limit", "cpu_limit"):
            array = _f32(getattr(self, name))
            if array.shape != (n,):
                raise ValueError(f"{name} must have shape ({n},), got {array.shape}")
            object.__setattr__(self, name, array)
        if self.memory_limit_soft is not None:
            object.__setattr__(self, "memory_limit_soft", _f32(self.memory_limit_soft))
        if self.restart is not None:
            object.__setattr__(self, "restart", np.asarray(self.restart, dtype=bool))
        if self.cpu_deciles is not None:
            deciles = _f32(self.cpu_deciles)
            if deciles.shape != (n, CPU_DECILES):
                raise ValueError(f"cpu_deciles must have shape ({n}, {CPU_DECILES})")
            object.__setattr__(self, "cpu_deciles", deciles)
        if self.first_window < 0:
            raise ValueError("first_window must be >= 0")

    @property
    def windows(self) -> int:
        return int(self.memory_mean.shape[0])

    @property
    def running(self) -> BoolArray:
        return np.asarray(~np.isnan(self.memory_mean))


@dataclass(frozen=True, eq=False)
class JobSignals:
    """The tasks of one job stacked on the study grid: every array is ``(windows, tasks)``."""

    job_id: int
    traits: JobTraits
    memory_mean: F32
    memory_peak: F32
    cpu_mean: F32
    cpu_peak: F32
    memory_limit_hard: F32
    memory_limit_soft: F32
    cpu_limit: F32
    restart: BoolArray
    memory_leak_per_window: F32  # (tasks,)
    cpu_deciles: F32 | None = None  # (windows, tasks, 11)
    running: BoolArray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        shape = np.asarray(self.memory_mean).shape
        if len(shape) != 2:
            raise ValueError("memory_mean must be (windows, tasks)")
        for name in (
            "memory_mean",
            "memory_peak",
            "cpu_mean",
            "cpu_peak",
            "memory_limit_hard",
            "memory_limit_soft",
            "cpu_limit",
        ):
            array = _f32(getattr(self, name))
            if array.shape != shape:
                raise ValueError(f"{name} must have shape {shape}, got {array.shape}")
            object.__setattr__(self, name, array)
        restart = np.asarray(self.restart, dtype=bool)
        if restart.shape != shape:
            raise ValueError(f"restart must have shape {shape}")
        object.__setattr__(self, "restart", restart)
        leak = _f32(self.memory_leak_per_window)
        if leak.shape != (shape[1],):
            raise ValueError(f"memory_leak_per_window must have shape ({shape[1]},)")
        object.__setattr__(self, "memory_leak_per_window", leak)
        if self.cpu_deciles is not None:
            deciles = _f32(self.cpu_deciles)
            if deciles.shape != (*shape, CPU_DECILES):
                raise ValueError(f"cpu_deciles must have shape {(*shape, CPU_DECILES)}")
            object.__setattr__(self, "cpu_deciles", deciles)
        running = ~np.isnan(self.memory_mean)
        if np.any(running & ~np.isfinite(self.memory_limit_hard)):
            raise ValueError(f"job {self.job_id}: a running task has no manual memory limit")
        object.__setattr__(self, "running", running)

    @property
    def windows(self) -> int:
        return int(self.memory_mean.shape[0])

    @property
    def tasks(self) -> int:
        return int(self.memory_mean.shape[1])

    def task_signals(self) -> Iterator[TaskSignal]:
        """The per-task view: one :class:`TaskSignal` per task, trimmed to its running span."""
        for i in range(self.tasks):
            rows = np.flatnonzero(self.running[:, i])
            if rows.size == 0:
                continue
            lo, hi = int(rows[0]), int(rows[-1]) + 1
            yield TaskSignal(
                job_id=self.job_id,
                task_index=i,
                first_window=lo,
                memory_mean=self.memory_mean[lo:hi, i],
                memory_peak=self.memory_peak[lo:hi, i],
                cpu_mean=self.cpu_mean[lo:hi, i],
                cpu_peak=self.cpu_peak[lo:hi, i],
                memory_limit=self.memory_limit_hard[lo:hi, i],
                cpu_limit=self.cpu_limit[lo:hi, i],
                memory_limit_soft=self.memory_limit_soft[lo:hi, i],
                restart=self.restart[lo:hi, i],
                memory_leak_per_window=float(self.memory_leak_per_window[i]),
                cpu_deciles=None if self.cpu_deciles is None else self.cpu_deciles[lo:hi, i],
            )

    def window_slice(self, start: int, stop: int) -> JobSignals:
        """The job restricted to windows ``[start, stop)`` of the grid."""
        return JobSignals(
            job_id=self.job_id,
            traits=self.traits,
            memory_mean=self.memory_mean[start:stop],
            memory_peak=self.memory_peak[start:stop],
            cpu_mean=self.cpu_mean[start:stop],
            cpu_peak=self.cpu_peak[start:stop],
            memory_limit_hard=self.memory_limit_hard[start:stop],
            memory_limit_soft=self.memory_limit_soft[start:stop],
            cpu_limit=self.cpu_limit[start:stop],
            restart=self.restart[start:stop],
            memory_leak_per_window=self.memory_leak_per_window,
            cpu_deciles=None if self.cpu_deciles is None else self.cpu_deciles[start:stop],
        )


def _fill_limits(limits: F32, running: BoolArray) -> F32:
    """Forward-fill, then back-fill, a task's limit over its running windows (column-wise)."""
    out = limits.copy()
    windows = out.shape[0]
    index = np.where(np.isfinite(out), np.arange(windows)[:, None], -1)
    np.maximum.accumulate(index, axis=0, out=index)
    filled = np.take_along_axis(out, np.maximum(index, 0), axis=0)
    out = np.where(index >= 0, filled, np.nan).astype(np.float32)
    # Back-fill the windows before the first known value with that first value.
    first = np.argmax(np.isfinite(out), axis=0)
    has = np.asarray(np.isfinite(out).any(axis=0), dtype=bool)
    head = np.arange(windows)[:, None] < first[None, :]
    out = np.where(head & has[None, :], out[first, np.arange(out.shape[1])][None, :], out)
    return np.where(running, out, np.nan).astype(np.float32)


def stack_tasks(
    job_id: int, traits: JobTraits, tasks: Sequence[TaskSignal], windows: int
) -> JobSignals | None:
    """Stack one job's tasks onto a grid of ``windows`` windows (tasks past the end are cut).

    Missing manual limits are forward/back-filled within a task, then taken from the job's
    other tasks (the median); a job whose running tasks still lack a limit is dropped
    (``None``), as is a job with no running task-window on the grid.
    """
    n = len(tasks)
    if n == 0:
        return None
    shape = (windows, n)

    def blank() -> F32:
        return np.full(shape, np.nan, dtype=np.float32)

    arrays = {name: blank() for name in ("mm", "mp", "cm", "cp", "lh", "ls", "lc")}
    restart = np.zeros(shape, dtype=bool)
    leak = np.zeros(n, dtype=np.float32)
    with_deciles = all(t.cpu_deciles is not None for t in tasks)
    deciles = np.full((*shape, CPU_DECILES), np.nan, dtype=np.float32) if with_deciles else None
    for i, task in enumerate(tasks):
        lo = task.first_window
        hi = min(lo + task.windows, windows)
        if hi <= lo:
            continue
        span = slice(0, hi - lo)
        arrays["mm"][lo:hi, i] = task.memory_mean[span]
        arrays["mp"][lo:hi, i] = task.memory_peak[span]
        arrays["cm"][lo:hi, i] = task.cpu_mean[span]
        arrays["cp"][lo:hi, i] = task.cpu_peak[span]
        arrays["lh"][lo:hi, i] = task.memory_limit[span]
        soft = task.memory_limit_soft if task.memory_limit_soft is not None else task.memory_limit
        arrays["ls"][lo:hi, i] = soft[span]
        arrays["lc"][lo:hi, i] = task.cpu_limit[span]
        if task.restart is not None:
            restart[lo:hi, i] = task.restart[span]
        leak[i] = task.memory_leak_per_window
        if deciles is not None and task.cpu_deciles is not None:
            deciles[lo:hi, i] = task.cpu_deciles[span]
    running = ~np.isnan(arrays["mm"])
    if not running.any():
        return None
    # A window with usage but no recorded peak: the mean is the best lower bound we have.
    arrays["mp"] = np.where(running & np.isnan(arrays["mp"]), arrays["mm"], arrays["mp"])
    arrays["mp"] = np.fmax(arrays["mp"], arrays["mm"])
    arrays["cm"] = np.where(running & np.isnan(arrays["cm"]), 0.0, arrays["cm"]).astype(np.float32)
    arrays["cp"] = np.where(running, np.fmax(arrays["cp"], arrays["cm"]), np.nan).astype(np.float32)
    for key in ("lh", "ls", "lc"):
        filled = _fill_limits(arrays[key], running)
        known = filled[running]
        median = float(np.nanmedian(known)) if np.isfinite(known).any() else float("nan")
        arrays[key] = np.where(running & ~np.isfinite(filled), median, filled).astype(np.float32)
    if np.any(running & ~np.isfinite(arrays["lh"])):
        return None
    arrays["ls"] = np.where(np.isfinite(arrays["ls"]), arrays["ls"], arrays["lh"]).astype(np.float32)
    return JobSignals(
        job_id=job_id,
        traits=traits,
        memory_mean=arrays["mm"],
        memory_peak=arrays["mp"],
        cpu_mean=arrays["cm"],
        cpu_peak=arrays["cp"],
        memory_limit_hard=arrays["lh"],
        memory_limit_soft=arrays["ls"],
        cpu_limit=arrays["lc"],
        restart=restart,
        memory_leak_per_window=leak,
        cpu_deciles=deciles,
    )


def group_tasks(tasks: Iterable[TaskSignal], traits: dict[int, JobTraits], windows: int) -> list[JobSignals]:
    """Stack a stream of task signals into jobs (sorted by job id, tasks by task index)."""
    by_job: dict[int, list[TaskSignal]] = {}
    for task in tasks:
        by_job.setdefault(task.job_id, []).append(task)
    jobs: list[JobSignals] = []
    for job_id in sorted(by_job):
        members = sorted(by_job[job_id], key=lambda t: (t.task_index, t.first_window))
        stacked = stack_tasks(job_id, traits.get(job_id, JobTraits()), members, windows)
        if stacked is not None:
            jobs.append(stacked)
    return jobs
