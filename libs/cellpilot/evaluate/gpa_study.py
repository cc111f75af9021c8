"""The Monte Carlo experiment of GPA §5: machines used (m) and overflow frequency (q).

GPA §5.1: instances of N' tasks, each task with R realisations of its instantaneous
CPU usage. Realisations are split into an observation set O (what the packer sees)
and an evaluation set E; under full clairvoyance O = E = all R. Each method packs the
tasks with Best Fit (or First Fit) followed by rebalancing:

* ``gpa-<rho>``: the Gaussian fit test with overflow probability rho (§4);
* ``av-<f>``: sizes f times the observed mean; ``perc-<p>``: the p-th percentile of
  the observed samples; ``cantelli-<b>``: mean plus b standard deviations (§5.1).

Metrics (§5.1): m = m_abs / m_norm with m_norm = ceil(sum_i mean_i / c); and
q = (1 / (m |E|)) sum_j sum_{t in E} [sum_{i in S_j} x_i(t) > c]. Both are averaged
over instances. The study checks the issue's goals: |q - rho| / rho <= 0.3 for
rho in {0.1, 0.05, 0.01}, and GPA needing fewer machines than perc-90 and Cantelli.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from cellpilot.evaluate.sharding import IN_PROCESS, ShardRunner, counting_shards
from cellpilot.schedule.gpa import ALGORITHMS, pack, size_av, size_cantelli
from cellpilot.workloads.gpa_tasks import synthetic_usage

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Method:
    kind: str  # "gpa", "av", "perc", "cantelli"
    parameter: float

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.parameter:g}"


DEFAULT_METHODS: tuple[Method, ...] = (
    *(Method("gpa", r) for r in (0.1, 0.05, 0.01, 0.001)),
    *(Method("av", f) for f in (1.0, 1.25, 2.0)),
    *(Method("perc", float(p)) for p in (50, 70, 90, 95, 99, 100)),
    *(Method("cantelli", b) for b in (1.0, 1.7, 4.4)),
)
GOAL_RHOS = (0.1, 0.05, 0.01)
GOAL_TOLERANCE = 0.30


@dataclass(frozen=True)
class GpaStudyConfig:
    instances: int = 50
    tasks: int = 1000
    realizations: int = 10_000
    observe: float = 1.0  # fraction of realisations in the observation set; 1.0: O = E = R
    seed: int = 0
    capacity: float = 1.0
    algorithm: str = "best-fit"
    rebalance: bool = True
    methods: tuple[Method, ...] = field(default=DEFAULT_METHODS)

    def __post_init__(self) -> None:
        if self.instances < 1 or self.tasks < 1 or self.realizations < 2:
            raise ValueError("instances and tasks must be >= 1, realizations >= 2")
        if not 0.0 < self.observe <= 1.0:
            raise ValueError("observe must be in (0, 1]")
        if self.capacity <= 0:
            raise ValueError("capacity must be > 0")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")

    def split(self, realizations: int) -> tuple[slice, slice]:
        """Observation and evaluation columns (GPA §5.1)."""
        if self.observe >= 1.0:
            return slice(0, realizations), slice(0, realizations)
        n_obs = min(max(1, math.ceil(self.observe * realizations)), realizations - 1)
        return slice(0, n_obs), slice(n_obs, realizations)


@dataclass(frozen=True)
class InstanceResult:
    m_norm: int
    machines: dict[str, int]  # method -> m_abs
    q: dict[str, float]  # method -> overflow frequency


def overflow_frequency(x_eval: F32, assignment: npt.NDArray[np.intp], bins: int, capacity: float) -> float:
    """q of §5.1: the share of (machine, realisation) pairs whose total exceeds the capacity."""
    order = np.argsort(assignment, kind="stable")
    starts = np.searchsorted(assignment[order], np.arange(bins))
    totals = np.add.reduceat(x_eval[order], starts, axis=0, dtype=np.float64)
    return float(np.mean(totals > capacity))


def run_instance(x: F32, config: GpaStudyConfig) -> InstanceResult:
    """Packs one instance (tasks x realisations) with every method and measures it."""
    obs, ev = config.split(x.shape[1])
    x_obs = x[:, obs]
    x_eval = np.ascontiguousarray(x[:, ev])
    mean = x_obs.mean(axis=1, dtype=np.float64)
    std = x_obs.std(axis=1, dtype=np.float64)
    percents = sorted({m.parameter for m in config.methods if m.kind == "perc"})
    percentile = dict(zip(percents, np.percentile(x_obs, percents, axis=1), strict=True)) if percents else {}
    m_norm = max(1, math.ceil(float(x.mean(axis=1, dtype=np.float64).sum()) / config.capacity - 1e-9))
    machines: dict[str, int] = {}
    q: dict[str, float] = {}
    for method in config.methods:
        kwargs: dict[str, Any] = {
            "capacity": config.capacity,
            "algorithm": config.algorithm,
            "rebalance": config.rebalance,
        }
        if method.kind == "gpa":
            packing = pack(mean, std**2, rho=method.parameter, **kwargs)
        elif method.kind == "av":
            packing = pack(size_av(mean, method.parameter), **kwargs)
        elif method.kind == "perc":
            packing = pack(np.asarray(percentile[method.parameter], dtype=np.float64), **kwargs)
        elif method.kind == "cantelli":
            packing = pack(size_cantelli(mean, std, method.parameter), **kwargs)
        else:
            raise ValueError(f"unknown method kind {method.kind!r}")
        machines[method.name] = packing.bins
        q[method.name] = overflow_frequency(x_eval, packing.assignment, packing.bins, config.capacity)
    return InstanceResult(m_norm, machines, q)


def instance_samples(config: GpaStudyConfig, rng: np.random.Generator, trace_pool: F32 | None = None) -> F32:
    """One instance: synthetic tasks, or a sample without replacement from a trace pool (§5.1)."""
    if trace_pool is None:
        x, _ = synthetic_usage(config.tasks, config.realizations, rng)
        return x
    if trace_pool.shape[0] < config.tasks:
        raise ValueError(f"the trace has {trace_pool.shape[0]} tasks, fewer than {config.tasks} per instance")
    rows = np.sort(rng.choice(trace_pool.shape[0], size=config.tasks, replace=False))
    return trace_pool[rows]


def run_instance_shard(
    context: tuple[GpaStudyConfig, F32 | None], state: Mapping[str, Any]
) -> InstanceResult:
    """One shard: the instance the study's random stream draws from ``state``, packed and measured."""
    config, trace_pool = context
    rng = np.random.Generator(np.random.PCG64())
    rng.bit_generator.state = state
    return run_instance(instance_samples(config, rng, trace_pool), config)


def instance_states(config: GpaStudyConfig, trace_pool: F32 | None = None) -> list[Mapping[str, Any]]:
    """The random stream's state at the start of each instance (one stream, seeded once, as a
    sequential run draws it): every instance is the same wherever it runs."""
    rng = np.random.default_rng(config.seed)
    states: list[Mapping[str, Any]] = []
    for _ in range(config.instances):
        states.append(rng.bit_generator.state)
        instance_samples(config, rng, trace_pool)  # advances the stream past this instance
    return states


def run_study(
    config: GpaStudyConfig,
    trace_pool: F32 | None = None,
    progress: Callable[[int], None] | None = None,
    *,
    runner: ShardRunner = IN_PROCESS,
) -> dict[str, Any]:
    """Runs every instance (one shard each) and returns the summary (rows per method, goals, settings)."""
    states = instance_states(config, trace_pool)
    results = runner.map(run_instance_shard, (config, trace_pool), states, on_done=counting_shards(progress))
    return summarise(config, results, source="trace" if trace_pool is not None else "synthetic")


def summarise(config: GpaStudyConfig, results: Sequence[InstanceResult], source: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for method in config.methods:
        m = np.array([r.machines[method.name] / r.m_norm for r in results])
        m_abs = np.array([r.machines[method.name] for r in results], dtype=np.float64)
        q = np.array([r.q[method.name] for r in results])
        row: dict[str, Any] = {
            "method": method.name,
            "kind": method.kind,
            "parameter": method.parameter,
            "m": float(m.mean()),
            "m_std": float(m.std()),
            "m_abs": float(m_abs.mean()),
            "q": float(q.mean()),
            "q_std": float(q.std()),
            "q_per_instance": q.tolist(),
            "m_per_instance": m.tolist(),
        }
        if method.kind == "gpa":
            row["q_relative_error"] = (row["q"] - method.parameter) / method.parameter
        rows.append(row)
    return {
        "settings": {
            "instances": config.instances,
            "tasks": config.tasks,
            "realizations": config.realizations,
            "observe": config.observe,
            "seed": config.seed,
            "capacity": config.capacity,
            "algorithm": config.algorithm,
            "rebalance": config.rebalance,
            "source": source,
        },
        "m_norm_mean": float(np.mean([r.m_norm for r in results])),
        "rows": rows,
        "goals": goals(rows),
    }


def goals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The issue's targets, evaluated on the rows that exist."""
    by_name = {row["method"]: row for row in rows}
    out: dict[str, Any] = {}
    for rho in GOAL_RHOS:
        row = by_name.get(f"gpa-{rho:g}")
        if row is None:
            continue
        error = row["q_relative_error"]
        out[f"gpa-{rho:g}_q_within_30pct"] = {
            "q": row["q"],
            "relative_error": error,
            "met": abs(error) <= GOAL_TOLERANCE,
        }
        baselines = [r for r in rows if r["method"] == "perc-90" or r["kind"] == "cantelli"]
        for base in baselines:
            out[f"gpa-{rho:g}_fewer_machines_than_{base['method']}"] = {
                "gpa_m": row["m"],
                "baseline_m": base["m"],
                "met": row["m"] < base["m"],
            }
    return out
