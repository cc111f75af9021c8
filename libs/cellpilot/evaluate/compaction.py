"""Cell compaction (Borg §5.1): how small a cell can a workload be packed into?

Borg §5.1: remove machines – chosen at random, to keep the cell heterogeneous – until
the workload no longer fits, re-packing it from scratch each time; up to 0.2 % of
tasks may stay pending (very "picky" ones); repeat with different seeds (11 in the
paper) and report the 90th percentile of the machine counts, with min and max.

We search the smallest fitting prefix of a seeded random machine order: first a
probe at the size the workload's demand suggests, then galloping and bisection
(assuming that more machines never hurt, which holds up to packing noise). Packing
uses :func:`cellpilot.schedule.profile.packing_profile` – preemption cost, soft
constraints, then the policy under test – and by default examines every machine
(relaxed randomisation off) so that the comparison isolates the scoring policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cellpilot.evaluate.sharding import IN_PROCESS, ShardRunner
from cellpilot.schedule.cell import Cell
from cellpilot.schedule.model import CellMachine, PlacementTask
from cellpilot.schedule.profile import packing_profile
from cellpilot.schedule.scheduler import Scheduler, SchedulerConfig
from cellpilot.schedule.scorers import PACKING_SCORERS
from cellpilot.workloads.cell_workload import MACHINE_MIXES, generate_jobs, generate_machines, workload_tasks


@dataclass(frozen=True)
class CompactionConfig:
    machines: int = 200
    tasks: int = 2000
    fill: float = 0.7  # workload CPU limits / original cell CPU capacity
    mix: str = "heterogeneous"
    workload_seed: int = 0
    seeds: int = 11  # Borg §5.1: 11 trials per cell
    policies: tuple[str, ...] = PACKING_SCORERS
    pending_allowance: float = 0.002  # Borg §5.1: up to 0.2 % of tasks may stay pending
    reclaimed: bool = True  # non-prod tasks use their reservations (§5.5)
    relaxed_randomization: bool = False
    gpa_rho: float = 0.0
    percentile: float = 90.0

    def __post_init__(self) -> None:
        if self.mix not in MACHINE_MIXES:
            raise ValueError(f"mix must be one of {sorted(MACHINE_MIXES)}")
        unknown = [p for p in self.policies if p not in PACKING_SCORERS]
        if unknown or not self.policies:
            raise ValueError(f"policies must be among {PACKING_SCORERS}, got {list(self.policies)}")
        if self.machines < 1 or self.tasks < 1 or self.seeds < 1:
            raise ValueError("machines, tasks and seeds must be >= 1")
        if not 0.0 < self.fill <= 1.0:
            raise ValueError(f"fill must be in (0, 1], got {self.fill}")


@dataclass(frozen=True)
class Workload:
    machines: list[CellMachine]
    tasks: list[PlacementTask]
    name: str = "synthetic"
    notes: dict[str, Any] = field(default_factory=dict)


def synthetic_workload(config: CompactionConfig) -> Workload:
    rng = np.random.default_rng(config.workload_seed)
    machines = generate_machines(config.machines, rng, config.mix)
    jobs = generate_jobs(machines, config.tasks, rng, config.fill)
    tasks = workload_tasks(jobs, reclaimed=config.reclaimed)
    return Workload(machines, tasks, config.mix, {"jobs": len(jobs)})


def pack_workload(
    machines: Sequence[CellMachine],
    tasks: Sequence[PlacementTask],
    policy: str,
    config: CompactionConfig,
    seed: int,
) -> int:
    """Packs ``tasks`` from scratch onto ``machines``; returns how many stay pending."""
    cell = Cell(machine_hint=len(machines), task_hint=len(tasks))
    cell.add_machines(list(machines))
    scheduler_config = SchedulerConfig(
        relaxed_randomization=config.relaxed_randomization, max_cached_entries=4 * len(machines) * 64
    )
    scheduler = Scheduler(
        packing_profile(policy, config.gpa_rho), scheduler_config, np.random.default_rng(seed)
    )
    result = scheduler.schedule(cell, tasks, now=0.0)
    return len(result.pending)


def demand_estimate(machines: Sequence[CellMachine], tasks: Sequence[PlacementTask]) -> int:
    """Machines needed if the cell's capacity could be used perfectly (a lower-bound guess)."""
    cap = np.sum([m.capacity.array() for m in machines], axis=0)
    need = np.zeros_like(cap)
    for task in tasks:
        basis = task.shape.limits if task.shape.prod or task.reservation is None else task.reservation
        need += basis.array()
    fraction = float(np.max(np.divide(need, cap, out=np.zeros_like(cap), where=cap > 0)))
    return max(1, min(len(machines), math.ceil(fraction * len(machines))))


def compact(workload: Workload, policy: str, config: CompactionConfig, seed: int) -> dict[str, Any]:
    """The smallest number of machines (a random subset for ``seed``) the workload fits on."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(workload.machines))
    allowed = math.floor(config.pending_allowance * len(workload.tasks))
    packs = 0

    def fits(k: int) -> bool:
        nonlocal packs
        packs += 1
        subset = [workload.machines[i] for i in order[:k]]
        return pack_workload(subset, workload.tasks, policy, config, seed) <= allowed

    n = len(workload.machines)
    if not fits(n):
        return {"machines": None, "packs": packs, "fits_original": False}
    guess = demand_estimate(workload.machines, workload.tasks)
    if guess < n and fits(guess):
        low, high = 0, guess  # low does not fit (0 machines), high fits
    else:
        low, high, step = guess, n, max(1, n // 50)
        probe = guess + step
        while probe < n:
            if fits(probe):
                high = probe
                break
            low, step = probe, step * 2
            probe = low + step
    while high - low > 1:
        mid = (low + high) // 2
        if fits(mid):
            high = mid
        else:
            low = mid
    return {"machines": high, "packs": packs, "fits_original": True}


def compact_shard(context: tuple[Workload, CompactionConfig], shard: tuple[str, int]) -> int | None:
    """One shard: one policy and seed compacted; the machines it needs (``None``: does not fit)."""
    workload, config = context
    policy, seed = shard
    machines = compact(workload, policy, config, seed)["machines"]
    return None if machines is None else int(machines)


def run_compaction(
    config: CompactionConfig,
    workload: Workload | None = None,
    progress: Callable[[str, int], None] | None = None,
    *,
    runner: ShardRunner = IN_PROCESS,
) -> dict[str, Any]:
    """Compacts the workload with every policy and seed (one shard each); returns the summary."""
    workload = workload or synthetic_workload(config)
    shards = [(policy, seed) for policy in config.policies for seed in range(config.seeds)]
    done = dict.fromkeys(config.policies, 0)

    def finished(index: int) -> None:
        policy = shards[index][0]
        done[policy] += 1
        if progress is not None:
            progress(policy, done[policy])

    outcomes = runner.map(compact_shard, (workload, config), shards, on_done=finished)
    rows: list[dict[str, Any]] = []
    for k, policy in enumerate(config.policies):
        machines = outcomes[k * config.seeds : (k + 1) * config.seeds]
        sizes = [m for m in machines if m is not None]
        failed = len(machines) - len(sizes)
        row: dict[str, Any] = {"policy": policy, "seeds": config.seeds, "did_not_fit": failed}
        if sizes:
            p = float(np.percentile(sizes, config.percentile, method="higher"))
            row.update(
                {
                    "machines": p,
                    "machines_min": min(sizes),
                    "machines_max": max(sizes),
                    "fraction_of_original": p / len(workload.machines),
                    "per_seed": sizes,
                }
            )
        rows.append(row)
    return {
        "settings": {
            "workload": workload.name,
            "original_machines": len(workload.machines),
            "tasks": len(workload.tasks),
            "fill": config.fill,
            "seeds": config.seeds,
            "percentile": config.percentile,
            "pending_allowance": config.pending_allowance,
            "reclaimed": config.reclaimed,
            "relaxed_randomization": config.relaxed_randomization,
            "workload_seed": config.workload_seed,
            **workload.notes,
        },
        "rows": rows,
        "goals": compaction_goals(rows),
    }


def compaction_goals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    by_policy = {row["policy"]: row.get("machines") for row in rows}
    hybrid = by_policy.get("hybrid")
    out: dict[str, Any] = {}
    for other in ("best-fit", "worst-fit"):
        if hybrid is not None and by_policy.get(other) is not None:
            out[f"hybrid_fewer_machines_than_{other}"] = {
                "hybrid": hybrid,
                other: by_policy[other],
                "met": hybrid < by_policy[other],
            }
    return out
