"""A job's demand, shared among its ready tasks by a load balancer: the job-level half of the world.

A serving job's load belongs to the job, not to its tasks: requests arrive for the service and
a load balancer spreads them over the replicas it can see. Borg publishes each job's size and
its tasks' health "so load balancers can see where to route requests to" (Borg §2.6), and
horizontal autoscaling exists because adding replicas lowers the load per replica (Autopilot
§3.3). So here a job has one demand signal D(t) — CPU millicores and load-dependent memory
bytes — and each task that the balancer routes to takes a share of it:

    task i's usage = base_i(t)  +  D(t) * w_i / sum_{j routed} w_j     (i routed; else base_i(t))

* ``D(t)`` is any usage model of :mod:`cellpilot.world.usage_models` (steady, diurnal,
  weekly, spiky, growth, leak, step, batch) evaluated once for the job, under the job's own
  random key; models with age effects count the age from the job's origin (its submission).
  Or a :class:`DemandSeries` replayed point by point, e.g. a traced job's summed usage
  (:meth:`DemandSeries.from_job_signals` reads what the trace readers produce).
* ``w_i`` are the balancer's weights: 1 for an even split, or a persistent per-task
  log-normal factor with sigma ``imbalance`` (a balancer that is not perfectly fair).
* *routed* tasks are the job's running tasks that are ready (past their start-up, passing
  their health checks: a balancer sends no traffic to an initialising replica). Adding a
  routed task lowers every other share; losing one raises them; the shares of the routed
  tasks always sum to 1, so the total demand is conserved. With no task routed the whole
  demand is unrouted (nothing serves it).
* ``base_i(t)`` is the task's own usage model (idle CPU, resident memory, its own age
  effects such as a leak); it is not part of this module.

Pure and vectorised: times ``(k,)`` against tasks ``(n,)`` give ``(k, n)`` arrays. The same
functions serve the Borglet's simulated runtime (through :mod:`cellpilot.world.step`)
and the studies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray
from cellpilot.world.usage_models import (
    evaluate_usage,
    lognormal_factor,
    model_names,
    model_parameters,
    resolve_params,
)

# The job's random key is its seed mixed with this constant, apart from its tasks' keys (seed + i).
JOB_KEY_SALT = 0x4A4F4244454D4E44  # "JOBDEMND"
_WEIGHT_SALT = 0x42414C414E434552  # "BALANCER": the balancer's per-task weights
MAX_TRACE_POINTS = 20_000  # ~70 days of 5-minute points
MAX_TRACE_VALUE = 1e15
MAX_STEP_SECONDS = 10_000_000
MAX_IMBALANCE = 3.0


class DemandError(ValueError):
    """A demand that cannot be evaluated; ``field`` names the offending part (relative)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


@dataclass(frozen=True, eq=False)
class DemandSeries:
    """A demand replayed point by point: point k holds over ``[k, k + 1) * step_seconds`` of the
    job's age, and the series repeats after its last point."""

    step_seconds: float
    cpu_millicores: FloatArray
    memory_bytes: FloatArray  # same length as cpu_millicores

    def __post_init__(self) -> None:
        cpu = np.asarray(self.cpu_millicores, dtype=np.float64).reshape(-1)
        memory = np.asarray(self.memory_bytes, dtype=np.float64).reshape(-1)
        if memory.size == 0:
            memory = np.zeros(cpu.shape)
        problem = _series_problem(self.step_seconds, cpu, memory)
        if problem is not None:
            raise DemandError(*problem)
        object.__setattr__(self, "step_seconds", float(self.step_seconds))
        object.__setattr__(self, "cpu_millicores", cpu)
        object.__setattr__(self, "memory_bytes", memory)

    def __len__(self) -> int:
        return int(self.cpu_millicores.shape[0])

    def at(self, age_seconds: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
        """(CPU, memory) at each age (seconds since the job's origin; before it, the first point)."""
        age = np.maximum(np.asarray(age_seconds, dtype=np.float64), 0.0)
        index = np.floor(age / self.step_seconds).astype(np.int64) % len(self)
        return self.cpu_millicores[index], self.memory_bytes[index]

    @classmethod
    def from_job_signals(cls, job: object, window_seconds: float = 300.0) -> DemandSeries:
        """A traced (or generated) job's demand: per window, the sum over its running tasks of
        their mean CPU (cores -> millicores) and mean memory — what the trace readers yield
        (:class:`cellpilot.workloads.task_signals.JobSignals`)."""
        cpu = np.asarray(job.cpu_mean, dtype=np.float64)  # type: ignore[attr-defined]
        memory = np.asarray(job.memory_mean, dtype=np.float64)  # type: ignore[attr-defined]
        return cls(window_seconds, np.nansum(cpu, axis=1) * 1000.0, np.nansum(memory, axis=1))

    @classmethod
    def from_csv_lines(cls, lines: Sequence[str], step_seconds: float | None = None) -> DemandSeries:
        """A demand from CSV text (lines already read): a header naming ``cpu_millicores`` and
        optionally ``memory_bytes`` and ``seconds``. With ``seconds`` the points must be evenly
        spaced and that spacing is the step; without it ``step_seconds`` gives the step. A
        ``DemandError`` names the line and column of the first bad value."""
        rows = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not rows:
            raise DemandError("csv", "no header line (expected cpu_millicores[,memory_bytes][,seconds])")
        header = [name.strip() for name in rows[0].split(",")]
        unknown = sorted(set(header) - {"cpu_millicores", "memory_bytes", "seconds"})
        if "cpu_millicores" not in header or unknown or len(set(header)) != len(header):
            raise DemandError(
                "csv",
                f"header {rows[0]!r}: needs cpu_millicores, optionally memory_bytes and seconds, each once",
            )
        values = np.zeros((len(rows) - 1, len(header)))
        for number, row in enumerate(rows[1:], start=2):
            cells = row.split(",")
            if len(cells) != len(header):
                raise DemandError(
                    "csv", f"line {number}: {len(cells)} values, the header names {len(header)}"
                )
            for column, cell in enumerate(cells):
                try:
                    values[number - 2, column] = float(cell)
                except ValueError:
                    raise DemandError(
                        "csv", f"line {number}: {header[column]} {cell.strip()!r} is not a number"
                    ) from None
        column_of = {name: i for i, name in enumerate(header)}
        if "seconds" in column_of:
            seconds = values[:, column_of["seconds"]]
            gaps = np.diff(seconds)
            if seconds.size < 2 or not np.all(gaps > 0) or np.ptp(gaps) > 1e-6 * gaps[0]:
                raise DemandError("csv", "seconds must increase in equal steps (at least two points)")
            step_seconds = float(gaps[0])
        elif step_seconds is None:
            raise DemandError("step_seconds", "required when the CSV has no seconds column")
        memory = values[:, column_of["memory_bytes"]] if "memory_bytes" in column_of else np.zeros(0)
        return cls(step_seconds, values[:, column_of["cpu_millicores"]], memory)


def _series_problem(step: float, cpu: FloatArray, memory: FloatArray) -> tuple[str, str] | None:
    if not (math.isfinite(step) and 0 < step <= MAX_STEP_SECONDS):
        return "step_seconds", f"must be in (0, {MAX_STEP_SECONDS}], got {step}"
    if not 1 <= cpu.size <= MAX_TRACE_POINTS:
        return "cpu_millicores", f"needs 1..{MAX_TRACE_POINTS} points, got {cpu.size}"
    if memory.shape != cpu.shape:
        return "memory_bytes", f"has {memory.size} points; cpu_millicores has {cpu.size} (or leave it empty)"
    for name, values in (("cpu_millicores", cpu), ("memory_bytes", memory)):
        bad = np.flatnonzero(~np.isfinite(values) | (values < 0) | (values > MAX_TRACE_VALUE))
        if bad.size:
            i = int(bad[0])
            return f"{name}[{i}]", f"must be a finite number in 0..{MAX_TRACE_VALUE:g}, got {values[i]}"
    return None


@dataclass(frozen=True, eq=False)
class JobDemand:
    """One job's demand signal and how its balancer weighs its tasks. Build with :meth:`build`."""

    model: str  # a usage model's name, or "" when ``trace`` is set
    params: tuple[tuple[str, float], ...]  # the model's resolved parameters, sorted by name
    trace: DemandSeries | None
    imbalance: float
    seed: int

    @classmethod
    def build(
        cls,
        model: str = "",
        params: Mapping[str, float] | None = None,
        trace: DemandSeries | None = None,
        imbalance: float = 0.0,
        seed: int = 0,
    ) -> JobDemand:
        """Validated: a ``DemandError`` names the bad field (``usage_model``, ``params.<name>``,
        ``trace``, ``imbalance``)."""
        if trace is not None and model:
            raise DemandError("trace", "set either usage_model or trace, not both")
        if not (math.isfinite(imbalance) and 0.0 <= imbalance <= MAX_IMBALANCE):
            raise DemandError("imbalance", f"must be in 0..{MAX_IMBALANCE}, got {imbalance}")
        if trace is not None:
            if params:
                raise DemandError("params", "a replayed trace takes no model parameters")
            return cls("", (), trace, float(imbalance), seed)
        if not model:
            raise DemandError(
                "usage_model", f"required (one of {', '.join(model_names())}) unless a trace is set"
            )
        if model not in model_names():
            raise DemandError(
                "usage_model", f"unknown usage model {model!r}; known: {', '.join(model_names())}"
            )
        allowed = model_parameters(model)
        for name, value in (params or {}).items():
            if name not in allowed:
                raise DemandError(
                    f"params.{name}", f"usage model {model!r} has no parameter {name!r}; its parameters: "
                    f"{', '.join(allowed)}"
                )  # fmt: skip
            try:
                resolve_params(model, {name: value})
            except ValueError as error:
                raise DemandError(f"params.{name}", str(error)) from error
        resolved = resolve_params(model, params)
        return cls(model, tuple(sorted(resolved.items())), None, float(imbalance), seed)

    @property
    def key(self) -> int:
        """The job's random key for its demand model (apart from every task's key)."""
        return (self.seed ^ JOB_KEY_SALT) & 0xFFFFFFFFFFFFFFFF

    def total(self, t_seconds: npt.ArrayLike, origin_seconds: float = 0.0) -> tuple[FloatArray, FloatArray]:
        """D(t): the job's total CPU (millicores) and load-dependent memory (bytes) at each time."""
        t = np.asarray(t_seconds, dtype=np.float64)
        if self.trace is not None:
            return self.trace.at(t - origin_seconds)
        cpu, memory = evaluate_usage(self.model, dict(self.params), self.key, 0, t, origin_seconds)
        return cpu, memory.astype(np.float64)

    def weights(self, task_index: npt.ArrayLike) -> FloatArray:
        """The balancer's weight of each task (1 each when ``imbalance`` is 0): persistent per
        task index, so every Borglet computes the same weights for a job's tasks."""
        return lognormal_factor((self.seed ^ _WEIGHT_SALT) & 0xFFFFFFFFFFFFFFFF, task_index, self.imbalance)


def split_demand(
    total: npt.ArrayLike,
    weights: npt.ArrayLike,
    routed: npt.ArrayLike,
    routed_weight: npt.ArrayLike | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Each task's share of the job's demand, and the demand nobody serves.

    ``total`` (k,) is D at k times; ``weights`` (n,) the balancer weights of the tasks asked
    about; ``routed`` (n,) or (k, n) whether the balancer sends them traffic. The routed tasks'
    shares sum to ``total`` (conservation); with none routed, ``total`` is unrouted.
    ``routed_weight`` (k,) is the sum of the weights of *every* routed task of the job when
    only some of them are asked about (a Borglet sees the tasks on its machines; the balancer's
    view names the rest); default: the routed tasks given here are all of them.

    Returns (shares (k, n), unrouted (k,)).
    """
    d = np.asarray(total, dtype=np.float64).reshape(-1)
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    r = np.broadcast_to(np.asarray(routed, dtype=bool), (d.shape[0], w.shape[0]))
    routed_w = np.where(r, w[None, :], 0.0)
    denominator = (
        routed_w.sum(axis=1) if routed_weight is None else np.asarray(routed_weight, dtype=np.float64)
    )
    denominator = np.broadcast_to(denominator, d.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        fraction = np.where(denominator[:, None] > 0, routed_w / denominator[:, None], 0.0)
    unrouted = np.where(denominator > 0, 0.0, d)
    return d[:, None] * fraction, unrouted


def job_task_demand(
    demand: JobDemand,
    t_seconds: npt.ArrayLike,
    origin_seconds: float,
    task_index: Sequence[int] | npt.ArrayLike,
    routed: npt.ArrayLike,
    routed_weight: npt.ArrayLike | None = None,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(CPU (k, n), memory (k, n), unrouted CPU (k,)): the shares of a job's demand at k times
    for n of its tasks; see :func:`split_demand` for ``routed`` and ``routed_weight``."""
    cpu_total, memory_total = demand.total(
        np.asarray(t_seconds, dtype=np.float64).reshape(-1), origin_seconds
    )
    weights = demand.weights(task_index)
    cpu, unrouted = split_demand(cpu_total, weights, routed, routed_weight)
    memory, _ = split_demand(memory_total, weights, routed, routed_weight)
    return cpu, memory, unrouted
