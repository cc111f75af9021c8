"""Horizontal autoscaling study: Autopilot §3.3 against the Kubernetes HPA, a clairvoyant bound
and fixed task counts, each driving one job in a closed loop through the simulated world.

Every decision step (default 1 minute) of several simulated days:

1. the world runs the job's tasks over the step (:func:`cellpilot.world.step.step_world`,
   sampled every ``sample_s``): the job's demand (:mod:`cellpilot.world.job_demand`) is
   split by the load balancer among the *ready* tasks — a task takes traffic only
   ``startup_s`` after it started — and each task gets at most its CPU limit (or, with
   ``machine_cpu_millicores``, what its machine has spare, :mod:`cellpilot.world.enforcement`);
2. the decider sees what a real one would (the tasks' served CPU, how many are ready) and
   returns a task count; new tasks start now, surplus tasks (the youngest first) stop now.

Deciders:

* ``autopilot-cpu``: :class:`~cellpilot.recommend.horizontal.CpuHorizontalRecommender`, the
  CPU-utilisation source (5-minute averaging, max over a 72 h horizon) and the four
  stabilisers, all at the API's defaults (:class:`cellpilot.autopilot.decisions.HorizontalConfig`:
  deferred downscaling 48 h, slow decay halving per hour every 5 minutes, small changes of
  10 % ignored, at most 25 % of the tasks initialising);
* ``autopilot-target-size``: the target-size source with the same stabilisers; the owner's
  function f is the job's offered load (a monitored request-rate signal, here the demand
  measured at the balancer over the last step) over one task's load at the target
  utilisation;
* ``hpa``: :mod:`cellpilot.evaluate.hpa`, the Kubernetes HPA controller with its documented
  defaults (15 s syncs, stabilisation windows, scaling policies);
* ``bound``: clairvoyant; knows the demand ahead and keeps the fewest tasks that serve every
  sample of the next step at the target utilisation, started early enough to be ready;
* ``fixed-peak`` / ``fixed-mean``: the count that serves the horizon's peak (or mean) demand at
  the target utilisation, all along.

Every decider aims at the same target utilisation r* of the task's CPU limit by default, and
"tasks for a load" is the same function everywhere (:func:`~cellpilot.recommend.horizontal.raw_task_count`).

With a sweep (``config.sweep``), the HPA and Autopilot's CPU source are also replayed at every
setting of their knobs (HPA: target and scale-down window; Autopilot §3.3: r*, horizon and
deferred downscaling), one row per workload, decider and setting; those rows place Autopilot
against the HPA's task-hours/overload frontier (:mod:`cellpilot.evaluate.horizontal_frontiers`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from cellpilot.autopilot.decisions import HorizontalConfig
from cellpilot.evaluate.horizontal_config import (
    MAX_TASKS,
    TASK_BASE,
    HorizontalStudyConfig,
    Setting,
    Workload,
    synthetic_workloads,
)
from cellpilot.evaluate.horizontal_deciders import (
    Observation,
    bound_count,
    demand_outlook,
    fixed_count,
    hpa_config,
    make_decider,
)
from cellpilot.evaluate.horizontal_frontiers import frontier_goals, frontier_report
from cellpilot.evaluate.horizontal_metrics import series_metrics
from cellpilot.evaluate.hpa import HpaConfig, HpaRules
from cellpilot.evaluate.sharding import IN_PROCESS, ShardRunner, counting_shards
from cellpilot.world.step import WorldTasks, step_world

FloatArray = npt.NDArray[np.float64]


@dataclass
class Replay:
    """The per-sample series of one replay, and the count after each decision."""

    seconds: FloatArray
    running: FloatArray
    ready: FloatArray
    demand: FloatArray
    served: FloatArray
    unmet: FloatArray
    decisions: FloatArray  # (steps,) the count requested at the end of each step
    changes: int


def replay(
    config: HorizontalStudyConfig,
    workload: Workload,
    decider_name: str,
    seed: int,
    setting: Setting | None = None,
) -> Replay:
    """One job under one decider at ``setting`` (default: the decider's default setting), in
    event time from 0 over ``config.days``."""
    demand = workload.demand(seed)
    outlook = demand_outlook(config, demand)
    decider = make_decider(decider_name, config, outlook, setting)
    first = (
        fixed_count(config, outlook, decider_name.removeprefix("fixed-"))
        if decider_name.startswith("fixed-")
        else bound_count(config, outlook, 0)
    )
    # Every decider starts with the count the first minutes need, ready at time 0.
    start_s = np.full(first, -float(config.startup_s))
    index = np.arange(first, dtype=np.int64)
    next_index = first
    per_step = config.step_s // config.sample_s
    samples = config.steps * per_step
    out = {name: np.zeros(samples) for name in ("seconds", "running", "ready", "demand", "served", "unmet")}
    decisions = np.zeros(config.steps)
    changes = 0
    base_model, base_params = TASK_BASE
    for step in range(config.steps):
        now = step * config.step_s
        seconds = now + np.arange(0, config.step_s, config.sample_s, dtype=np.int64)
        ready_from = start_s + config.startup_s
        table = WorldTasks.for_job(
            demand, base_model, base_params, index, start_s, ready_from,
            cpu_limit=config.task_cpu_limit, memory_limit=1e15, machine_cpu=config.machine_cpu_millicores,
        )  # fmt: skip
        world = step_world(table, seconds)
        if world.failed:
            raise ValueError(f"workload {workload.name}: {world.failed[0][1]}")
        unrouted = world.unrouted_cpu.sum(axis=1)
        rows = slice(step * per_step, (step + 1) * per_step)
        ready_at = seconds[:, None] >= ready_from[None, :]
        out["seconds"][rows] = seconds
        out["running"][rows] = index.shape[0]
        out["ready"][rows] = ready_at.sum(axis=1)
        out["demand"][rows] = world.cpu_demand.sum(axis=1) + unrouted
        out["served"][rows] = world.cpu.sum(axis=1)
        out["unmet"][rows] = world.cpu_unmet.sum(axis=1) + unrouted
        end = now + config.step_s
        ready_all_step = ready_from <= now
        observation = Observation(
            now_s=end,
            running=int(index.shape[0]),
            ready=int(ready_all_step.sum()),
            initialising=int(np.sum(ready_from > end)),
            usage=float(world.cpu.sum(axis=1).mean()),
            ready_usage=float(world.cpu[:, ready_all_step].sum(axis=1).mean()),
            offered_load=float(out["demand"][rows].mean()),
        )
        target = min(max(1, decider.decide(observation)), MAX_TASKS)
        decisions[step] = target
        running = index.shape[0]
        if target != running:
            changes += 1
        if target > running:
            added = target - running
            index = np.concatenate([index, np.arange(next_index, next_index + added, dtype=np.int64)])
            start_s = np.concatenate([start_s, np.full(added, float(end))])
            next_index += added
        elif target < running:  # the youngest (least ready) tasks stop first
            keep = np.sort(np.argsort(start_s, kind="stable")[:target])
            index, start_s = index[keep], start_s[keep]
    return Replay(**out, decisions=decisions, changes=changes)


def replay_metrics(config: HorizontalStudyConfig, workload: Workload, result: Replay) -> dict[str, Any]:
    return series_metrics(
        result.seconds,
        config.sample_s,
        result.running,
        result.ready,
        result.served,
        result.unmet,
        config.task_cpu_limit,
        result.changes,
        workload.step_at_s,
        workload.step_level_millicores,
        config.task_capacity,
    )


@dataclass(frozen=True)
class Shard:
    workload: int
    decider: str
    seed: int
    setting: Setting = ()  # empty: the decider's default setting


PLOT_POINTS = 2000


def run_shard(config: HorizontalStudyConfig, shard: Shard) -> dict[str, Any]:
    """One (workload, decider, setting, seed) replay: its metrics, and its series for the plots
    (first seed, default setting)."""
    workload = config.workloads[shard.workload]
    result = replay(config, workload, shard.decider, shard.seed, shard.setting or None)
    out: dict[str, Any] = {"metrics": replay_metrics(config, workload, result)}
    if shard.seed == config.seed and not shard.setting:
        stride = max(1, result.seconds.shape[0] // PLOT_POINTS)
        out["series"] = {
            "hours": result.seconds[::stride] / 3600.0,
            "running": result.running[::stride],
            "ready": result.ready[::stride],
            "demand_tasks": result.demand[::stride] / (config.target_utilisation * config.task_cpu_limit),
        }
    return out


def shards(config: HorizontalStudyConfig) -> list[Shard]:
    """Every replay: each workload, seed and decider at its default setting (``setting`` empty),
    then at each other setting of the sweep."""
    return [
        Shard(w, decider, config.seed + s, () if i == 0 else setting)
        for w in range(len(config.workloads))
        for s in range(config.seeds)
        for decider in config.deciders
        for i, setting in enumerate(config.settings(decider))
    ]


def run_study(
    config: HorizontalStudyConfig,
    progress: Callable[[int], None] | None = None,
    runner: ShardRunner = IN_PROCESS,
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(summary: rows per workload, decider and setting, goals, the frontier check, settings;
    plot series per workload and decider at its default setting).

    ``rows`` hold the means over seeds; the row of a decider's default setting has ``default``
    true (one per workload and decider, what the per-workload tables use); ``goals`` are the
    frontier check's (:func:`~cellpilot.evaluate.horizontal_frontiers.frontier_goals`)."""
    plan = shards(config)
    results = runner.map(run_shard, config, plan, on_done=counting_shards(progress))
    by_key: dict[tuple[int, str, Setting], list[dict[str, Any]]] = {}
    series: dict[str, dict[str, Any]] = {}
    for shard, result in zip(plan, results, strict=True):
        setting = shard.setting or config.default_setting(shard.decider)
        by_key.setdefault((shard.workload, shard.decider, setting), []).append(result["metrics"])
        if "series" in result:
            series.setdefault(config.workloads[shard.workload].name, {})[shard.decider] = result["series"]
    rows = [
        {
            "workload": config.workloads[w].name,
            "decider": decider,
            "setting": dict(setting),
            "default": i == 0,
            **_mean_over_seeds(by_key[(w, decider, setting)]),
        }
        for w in range(len(config.workloads))
        for decider in config.deciders
        for i, setting in enumerate(config.settings(decider))
    ]
    frontier = frontier_report(rows)
    summary = {
        "rows": rows,
        "goals": frontier_goals(frontier),
        "frontier": frontier,
        "settings": settings(config),
    }
    return summary, series


def _mean_over_seeds(metrics: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in metrics[0]:
        values = [m[key] for m in metrics]
        out[key] = None if any(v is None for v in values) else float(np.mean(values))
    return out


def settings(config: HorizontalStudyConfig) -> dict[str, Any]:
    defaults = HorizontalConfig()
    return {
        "days": config.days,
        "seeds": config.seeds,
        "seed": config.seed,
        "step_s": config.step_s,
        "sample_s": config.sample_s,
        "startup_s": config.startup_s,
        "target_utilisation": config.target_utilisation,
        "task_cpu_limit_millicores": config.task_cpu_limit,
        "deciders": config.deciders,
        "machine_cpu_millicores": config.machine_cpu_millicores,
        "autopilot_defaults": {
            "horizon_h": defaults.horizon_ms / 3_600_000,
            "statistic": defaults.statistic.value,
            "deferred_downscaling_h": defaults.deferred_downscaling_ms / 3_600_000,
            "slow_decay_half_period_h": defaults.slow_decay_half_period_ms / 3_600_000,
            "small_change_fraction": defaults.small_change_fraction,
            "max_initializing_fraction": defaults.max_initializing_fraction,
        },
        "hpa": hpa_settings(hpa_config(config)),
        "sweep": (
            None
            if config.sweep is None
            else {
                "hpa_targets": config.sweep.hpa_targets,
                "hpa_windows_s": config.sweep.hpa_windows_s,
                "autopilot_targets": config.sweep.autopilot_targets,
                "autopilot_horizons_h": config.sweep.autopilot_horizons_h,
                "autopilot_deferrals_h": config.sweep.autopilot_deferrals_h,
            }
        ),
        "workloads": [
            {
                "name": w.name,
                "model": w.model or "trace",
                "params": dict(w.params),
                "trace_points": len(w.trace) if w.trace is not None else 0,
            }
            for w in config.workloads
        ],
    }


def with_workloads(
    config: HorizontalStudyConfig, names: Sequence[str], traces: Sequence[Workload]
) -> HorizontalStudyConfig:
    """The config restricted to the named synthetic workloads (all when empty) plus the traces."""
    synthetic = synthetic_workloads(config.days)
    known = {w.name: w for w in synthetic}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"--workloads: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    chosen = tuple(known[n] for n in names) if names else synthetic
    return replace(config, workloads=chosen + tuple(traces))


def hpa_settings(config: HpaConfig) -> dict[str, Any]:
    """The HPA's settings as the study's summary reports them."""

    def rules(r: HpaRules) -> dict[str, Any]:
        return {
            "stabilisation_window_s": r.stabilisation_window_s,
            "select": r.select,
            "policies": [{"kind": p.kind, "value": p.value, "period_s": p.period_s} for p in r.policies],
        }

    return {
        "tolerance": config.tolerance,
        "downscale_window_s": config.downscale_window_s,
        "upscale_window_s": config.scale_up.stabilisation_window_s,
        "sync_period_s": config.sync_period_s,
        "min_replicas": config.min_replicas,
        "max_replicas": config.max_replicas,
        "scale_up": rules(config.scale_up),
        "scale_down": rules(config.scale_down),
    }
