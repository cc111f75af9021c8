"""One step of event time for every running task of every hosted machine: the Borglet's side of
the world model (:mod:`cellpilot.world.step`).

The Borglet samples each task once per event-second (Autopilot §3.2.1: r_i[τ], about one
sample a second) and enforces limits on every sample. A fleet-mode Borglet does this for
thousands of tasks, several event-seconds per wall second when sped up, so the work is one
vectorised call per batch of seconds: :func:`build_table` turns the running tasks into the
world's struct-of-arrays table — simulated tasks grouped by usage model (their base load) and
by job (their share of the job's demand, split among the tasks the job's load balancer routes
to: the service's load balancer view), process tasks with their latest metering — and
:func:`run_ticks` steps the world: demand, CPU sharing on each machine (bursting into spare,
latency-sensitive first), OOM enforcement, second by second.

No I/O and no mutation of Borglet state: it runs off the event loop on a snapshot and the
caller applies the result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import Int64Array
from cellpilot.borglet.hosted_task import HostedTask, SimulatedPlan
from cellpilot.world.job_demand import JobDemand
from cellpilot.world.step import (
    DemandGroup,
    MeasuredUsage,
    UsageGroup,
    WorldStep,
    WorldTasks,
    step_world,
)

_U64 = (1 << 64) - 1
NEVER = float("inf")


@dataclass(frozen=True)
class JobRouting:
    """One job as its load balancer sees it."""

    origin_s: float  # the job's submission, event seconds (age effects of its demand count from it)
    ready: frozenset[int]  # indices of the tasks it routes to


@dataclass(frozen=True)
class MachineShape:
    """What the world needs of each hosted machine (arrays indexed like the machines)."""

    cpu_millicores: npt.NDArray[np.float64]
    memory_bytes: npt.NDArray[np.float64]
    pressure_fraction: float


def _demand_groups(
    rows: Sequence[HostedTask], routing: Mapping[str, JobRouting] | None
) -> tuple[DemandGroup, ...]:
    """Per job with a shared demand: its running rows here, and which the balancer routes to."""
    jobs: dict[str, tuple[JobDemand, list[int]]] = {}
    for row, record in enumerate(rows):
        runtime = record.plan.runtime
        if isinstance(runtime, SimulatedPlan) and runtime.demand is not None:
            jobs.setdefault(record.plan.job_id, (runtime.demand, []))[1].append(row)
    groups = []
    for job_id, (demand, members) in jobs.items():
        records = [rows[r] for r in members]
        index = np.array([r.plan.task_index for r in records], dtype=np.int64)
        if routing is None:
            # No naming service to read: this Borglet's own tasks share the demand once ready.
            origin = min(r.started_ms for r in records) / 1000.0
            starts = np.array([r.started_ms / 1000.0 for r in records])
            startup = np.array([_startup(r) for r in records], dtype=np.float64)
            routed_from, other = starts + startup, 0.0
        else:
            view = routing.get(job_id)
            ready = view.ready if view is not None else frozenset()
            origin = view.origin_s if view is not None else min(r.started_ms for r in records) / 1000.0
            routed_from = np.where(np.isin(index, list(ready)), -NEVER, NEVER)
            elsewhere = sorted(ready - set(index.tolist()))
            other = float(demand.weights(elsewhere).sum()) if elsewhere else 0.0
        groups.append(
            DemandGroup(
                demand=demand,
                origin_s=origin,
                rows=np.array(members, dtype=np.intp),
                task_index=index,
                routed_from_s=np.asarray(routed_from, dtype=np.float64),
                other_weight=other,
            )
        )
    return tuple(groups)


def _startup(record: HostedTask) -> float:
    runtime = record.plan.runtime
    return float(runtime.startup_seconds) if isinstance(runtime, SimulatedPlan) else 0.0


def build_table(
    rows: Sequence[HostedTask],
    machine_index: Sequence[int],
    machines: MachineShape,
    routing: Mapping[str, JobRouting] | None,
) -> WorldTasks:
    """The world's table of ``rows`` (running tasks, sorted by machine); ``routing`` None: no
    load-balancer view (a Borglet with no Borgmaster), each job's tasks here share its demand."""
    n = len(rows)
    machine = np.array(machine_index, dtype=np.intp)
    usage: dict[tuple[str, tuple[tuple[str, float], ...]], tuple[list[int], list[int]]] = {}
    duration = np.zeros(n)
    measured = np.zeros(n, dtype=bool)
    for row, record in enumerate(rows):
        runtime = record.plan.runtime
        if isinstance(runtime, SimulatedPlan):
            duration[row] = runtime.duration_seconds
            members, keys = usage.setdefault((runtime.usage_model, runtime.params), ([], []))
            members.append(row)
            keys.append((runtime.seed + record.plan.task_index) & _U64)
        else:
            measured[row] = True
    return WorldTasks(
        machine=machine,
        priority=np.array([r.plan.priority for r in rows], dtype=np.int64),
        latency_sensitive=np.array([r.plan.latency_sensitive for r in rows], dtype=bool),
        cpu_limit=np.array([r.plan.limits.cpu_millicores for r in rows], dtype=np.float64),
        memory_limit=np.array([r.plan.limits.memory_bytes for r in rows], dtype=np.float64),
        hard_memory_limit=np.array([r.plan.hard_memory_limit for r in rows], dtype=bool),
        measured=measured,
        start_s=np.array([r.started_ms / 1000.0 for r in rows], dtype=np.float64),
        duration_s=duration,
        groups=tuple(
            UsageGroup(
                model=model,
                params=dict(params),
                rows=np.array(members, dtype=np.intp),
                keys=np.array(keys, dtype=np.uint64).view(np.int64),
            )
            for (model, params), (members, keys) in usage.items()
        ),
        memory_capacity=machines.memory_bytes,
        pressure_fraction=machines.pressure_fraction,
        machine_bounds=WorldTasks.bounds(machine, int(machines.memory_bytes.shape[0])),
        cpu_capacity=machines.cpu_millicores,
        demands=_demand_groups(rows, routing),
    )


def run_ticks(table: WorldTasks, seconds: Int64Array, measured: MeasuredUsage) -> WorldStep:
    """Sample and enforce for each event-second in ``seconds`` (ascending)."""
    return step_world(table, seconds, measured)
