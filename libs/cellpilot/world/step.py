"""The world one step at a time: what every task demands and what its machine lets it use.

One world model drives the Borglet's simulated runtime and the studies. For each event time
asked about, every task's demand is its own usage model (its base: idle CPU, resident
memory, its own age effects) plus its share of its job's demand when the job has one
(:mod:`cellpilot.world.job_demand`: a load balancer splits it among the job's ready
tasks); tasks with measured usage (a real process) take what was measured. Then the machine
enforces (:func:`cellpilot.world.enforcement.enforce_limits`): it shares its CPU (bursting
into spare, latency-sensitive first under contention, Borg §6.2, Autopilot §2.3) and OOM-kills
for memory; a task killed at time s is gone from the next time on. What each task demanded
and did not get is its unmet demand.

:func:`step_world` is vectorised over all tasks of all machines (a fleet-mode Borglet calls it
for thousands of tasks at a time) and loops over the times, which are any ascending event
seconds (the Borglet: every second; a study: whatever grid it replays). No I/O, no state: the
caller applies the :class:`WorldStep`. A study driving one job in a closed loop builds its
table with :meth:`WorldTasks.for_job` each step (the tasks and their readiness as its policy
left them) and reads the served CPU, the unmet demand and the memory of every task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import BoolArray, FloatArray, Int64Array, IntpArray
from cellpilot.world.enforcement import KillReason, MachineCapacity, TaskUsage, enforce_limits
from cellpilot.world.job_demand import JobDemand, split_demand
from cellpilot.world.usage_models import evaluate_usage


@dataclass(frozen=True)
class UsageGroup:
    """Tasks sharing a usage model and parameters (usually one job's tasks): their base usage."""

    model: str
    params: Mapping[str, float]
    rows: IntpArray
    keys: Int64Array  # seed + task index per task (the model's random key), as int64 bits


@dataclass(frozen=True)
class DemandGroup:
    """One job's demand and the tasks of the table that share it.

    At time s a row is routed (takes a share) when ``s >= routed_from_s[row]``: -inf for a
    task the balancer already sends traffic to, the end of its start-up for one it will, inf
    for one it does not. ``other_weight`` is the balancer weight of the job's routed tasks that
    are not in the table (on machines someone else runs), so shares sum to D(t) over the whole
    job, not just over the rows given here.
    """

    demand: JobDemand
    origin_s: float  # the job's origin (submission), event seconds: age effects count from it
    rows: IntpArray
    task_index: Int64Array
    routed_from_s: FloatArray
    other_weight: float = 0.0


@dataclass(frozen=True)
class WorldTasks:
    """The running tasks of all machines, struct-of-arrays, sorted by machine."""

    machine: IntpArray
    priority: Int64Array
    latency_sensitive: BoolArray  # Borg §6.2 appclass: served first under CPU contention
    cpu_limit: FloatArray  # 0 = none
    memory_limit: FloatArray  # 0 = none
    hard_memory_limit: BoolArray
    measured: BoolArray  # usage is measured (a process), not modelled
    start_s: FloatArray  # event time the task started, seconds
    duration_s: FloatArray  # modelled tasks finish after this long; 0 = never
    groups: tuple[UsageGroup, ...]
    memory_capacity: FloatArray  # per machine, bytes
    pressure_fraction: float
    # Rows of machine i are machine_bounds[i] .. machine_bounds[i + 1] - 1.
    machine_bounds: IntpArray
    cpu_capacity: FloatArray | None = None  # per machine, millicores; None = CPU capped at limits
    demands: tuple[DemandGroup, ...] = ()

    @property
    def size(self) -> int:
        return int(self.machine.shape[0])

    @staticmethod
    def bounds(machine: IntpArray, machines: int) -> IntpArray:
        return np.searchsorted(machine, np.arange(machines + 1), side="left").astype(np.intp)

    @classmethod
    def for_job(
        cls,
        demand: JobDemand | None,
        base_model: str,
        base_params: Mapping[str, float],
        task_index: npt.ArrayLike,
        start_s: npt.ArrayLike,
        routed_from_s: npt.ArrayLike,
        *,
        cpu_limit: float,
        memory_limit: float,
        machine: npt.ArrayLike | None = None,
        machine_cpu: npt.ArrayLike | None = None,
        machine_memory: npt.ArrayLike = 1e15,
        hard_memory_limit: bool = True,
        latency_sensitive: bool = True,
        origin_s: float = 0.0,
    ) -> WorldTasks:
        """One job's running tasks (the studies' usual world): ``base_model`` (resolved params) is
        each task's own usage under key ``demand.seed + index``, ``demand`` the job's shared load;
        tasks sorted by ``machine`` (default: each on its own machine, with ``machine_cpu`` and
        ``machine_memory`` per machine or one value for all)."""
        index = np.asarray(task_index, dtype=np.int64).reshape(-1)
        n = index.shape[0]
        where = np.arange(n) if machine is None else np.asarray(machine, dtype=np.intp).reshape(-1)
        if np.any(np.diff(where) < 0):
            raise ValueError("tasks must be sorted by machine")
        machines = int(where.max()) + 1 if n else 0
        seed = demand.seed if demand is not None else 0
        rows = np.arange(n, dtype=np.intp)
        keys = ((np.uint64(seed) + index.astype(np.uint64)) & np.uint64(0xFFFFFFFFFFFFFFFF)).view(np.int64)
        demands: tuple[DemandGroup, ...] = ()
        if demand is not None:
            routed = np.broadcast_to(np.asarray(routed_from_s, dtype=np.float64), (n,)).copy()
            demands = (DemandGroup(demand, origin_s, rows, index, routed),)
        return cls(
            machine=where.astype(np.intp),
            priority=np.zeros(n, dtype=np.int64),
            latency_sensitive=np.full(n, latency_sensitive),
            cpu_limit=np.full(n, float(cpu_limit)),
            memory_limit=np.full(n, float(memory_limit)),
            hard_memory_limit=np.full(n, hard_memory_limit),
            measured=np.zeros(n, dtype=bool),
            start_s=np.broadcast_to(np.asarray(start_s, dtype=np.float64), (n,)).copy(),
            duration_s=np.zeros(n),
            groups=(UsageGroup(base_model, dict(base_params), rows, keys),) if n else (),
            memory_capacity=np.broadcast_to(np.asarray(machine_memory, dtype=np.float64), (machines,)).copy(),
            pressure_fraction=1.0,
            machine_bounds=cls.bounds(where.astype(np.intp), machines),
            cpu_capacity=(
                None
                if machine_cpu is None
                else np.broadcast_to(np.asarray(machine_cpu, dtype=np.float64), (machines,)).copy()
            ),
            demands=demands,
        )


@dataclass(frozen=True)
class MeasuredUsage:
    """Latest metering of measured tasks (zeros on modelled rows)."""

    cpu: FloatArray
    memory: FloatArray
    throttled: BoolArray  # the kernel throttled it since the last metering
    unmet: FloatArray = field(default_factory=lambda: np.zeros(0))  # kernel-throttled CPU, millicores

    @classmethod
    def none(cls, n: int) -> MeasuredUsage:
        return cls(np.zeros(n), np.zeros(n), np.zeros(n, dtype=bool), np.zeros(n))


@dataclass(frozen=True)
class WorldKill:
    row: int
    second: int
    reason: KillReason
    detail: str
    memory_bytes: float


@dataclass(frozen=True)
class WorldStep:
    seconds: Int64Array  # (k,) event seconds processed
    cpu: FloatArray  # (k, n) CPU used: granted to a modelled task, measured for a process
    cpu_demand: FloatArray  # (k, n) CPU asked for (base plus demand share; measured for a process)
    cpu_unmet: FloatArray  # (k, n) demand not served, millicores
    memory: Int64Array  # (k, n)
    throttled: BoolArray  # (k, n) some demand went unserved
    sampled: BoolArray  # (k, n) the task ran at that second (a sample is due)
    finished: tuple[tuple[int, int], ...]  # (row, second) modelled tasks that ran their duration
    kills: tuple[WorldKill, ...]
    # (row, reason): tasks whose usage model or job demand could not be evaluated; they are not
    # sampled and fail, while every other task is sampled and enforced as usual.
    failed: tuple[tuple[int, str], ...]
    memory_pressure: BoolArray  # (machines,) at the last second
    memory_used: FloatArray  # (machines,) at the last second, after kills
    unrouted_cpu: FloatArray  # (k, demand groups) demand no routed task was there to take


def _check_finite(cpu: FloatArray, memory: FloatArray) -> None:
    if not (np.all(np.isfinite(cpu)) and np.all(np.isfinite(memory)) and np.all(memory >= 0)):
        raise ValueError("it gave CPU or memory that is not a finite, non-negative number")


def demand_of(table: WorldTasks, seconds: Int64Array, measured: MeasuredUsage) -> tuple[
    FloatArray, FloatArray, FloatArray, list[tuple[int, str]]
]:  # fmt: skip
    """(CPU (k, n), memory (k, n), unrouted CPU (k, groups), failed rows): what every task asks for."""
    k, n = int(seconds.shape[0]), table.size
    cpu = np.zeros((k, n))
    memory = np.zeros((k, n))
    unrouted = np.zeros((k, len(table.demands)))
    t = seconds.astype(np.float64)
    failed: list[tuple[int, str]] = []
    for group in table.groups:
        try:
            start = table.start_s[group.rows]
            c, m = evaluate_usage(group.model, group.params, 0, group.keys, t[:, None], start)
            _check_finite(c, m.astype(np.float64))
        except Exception as error:  # one job's model must not stop the sampling of every task
            reason = f"usage model {group.model!r} failed: {error}"
            failed += [(row, reason) for row in group.rows.tolist()]
            continue
        cpu[:, group.rows] = c
        memory[:, group.rows] = m
    for g, job in enumerate(table.demands):
        try:
            total_cpu, total_memory = job.demand.total(t, job.origin_s)
            _check_finite(total_cpu, total_memory)
            weights = job.demand.weights(job.task_index)
            routed = t[:, None] >= job.routed_from_s[None, :]
            routed_weight = (routed * weights[None, :]).sum(axis=1) + job.other_weight
            share_cpu, unrouted[:, g] = split_demand(total_cpu, weights, routed, routed_weight)
            share_memory, _ = split_demand(total_memory, weights, routed, routed_weight)
        except Exception as error:
            reason = f"job demand failed: {error}"
            failed += [(row, reason) for row in job.rows.tolist()]
            continue
        cpu[:, job.rows] += share_cpu
        memory[:, job.rows] += share_memory
    cpu[:, table.measured] = measured.cpu[table.measured]
    memory[:, table.measured] = measured.memory[table.measured]
    return cpu, memory, unrouted, failed


def step_world(table: WorldTasks, seconds: Int64Array, measured: MeasuredUsage | None = None) -> WorldStep:
    """Demand, CPU sharing and OOM enforcement for each event second in ``seconds`` (ascending)."""
    k, n = int(seconds.shape[0]), table.size
    measured = measured or MeasuredUsage.none(n)
    machines = int(table.memory_capacity.shape[0])
    cpu, memory, unrouted, failed = demand_of(table, seconds, measured)
    measured_unmet = measured.unmet if measured.unmet.shape == (n,) else np.zeros(n)

    served = cpu.copy()
    unmet = np.zeros((k, n))
    throttled = np.zeros((k, n), dtype=bool)
    throttled[:, table.measured] = measured.throttled[table.measured]
    sampled = np.zeros((k, n), dtype=bool)
    alive = np.ones(n, dtype=bool)
    alive[[row for row, _ in failed]] = False
    finished: list[tuple[int, int]] = []
    kills: list[WorldKill] = []
    capacity = MachineCapacity(table.memory_capacity, table.pressure_fraction, table.cpu_capacity)
    pressure = np.zeros(machines, dtype=bool)
    used = np.zeros(machines)

    for j, second in enumerate(seconds.tolist()):
        age = second - table.start_s
        done = alive & ~table.measured & (table.duration_s > 0) & (age >= table.duration_s)
        for row in np.flatnonzero(done).tolist():
            finished.append((row, second))
        alive &= ~done
        rows = np.flatnonzero(alive & (age >= 0))
        decision = enforce_limits(
            TaskUsage(
                machine=table.machine[rows],
                priority=table.priority[rows],
                cpu_millicores=cpu[j, rows],
                memory_bytes=memory[j, rows],
                cpu_limit_millicores=table.cpu_limit[rows],
                memory_limit_bytes=table.memory_limit[rows],
                hard_memory_limit=table.hard_memory_limit[rows],
                latency_sensitive=table.latency_sensitive[rows],
                cpu_measured=table.measured[rows],
            ),
            capacity,
            now_ms=second * 1000,
        )
        measured_rows = table.measured[rows]
        # A modelled task uses what its machine grants; a process reports what it really used,
        # and its unmet demand is what the kernel says it throttled.
        served[j, rows] = decision.cpu_granted_millicores
        unmet[j, rows] = np.where(measured_rows, measured_unmet[rows], decision.cpu_unmet_millicores)
        throttled[j, rows] |= unmet[j, rows] > 1e-6
        sampled[j, rows] = True
        for kill in decision.kills:
            row = int(rows[kill.task])
            alive[row] = False
            kills.append(WorldKill(row, second, kill.reason, kill.detail, kill.memory_bytes))
        pressure = decision.memory_pressure
        used = decision.memory_after_bytes

    return WorldStep(
        seconds=seconds.astype(np.int64),
        cpu=served,
        cpu_demand=cpu,
        cpu_unmet=unmet,
        memory=np.rint(memory).astype(np.int64),
        throttled=throttled,
        sampled=sampled,
        finished=tuple(finished),
        kills=tuple(kills),
        failed=tuple(failed),
        memory_pressure=np.asarray(pressure, dtype=bool),
        memory_used=np.asarray(used, dtype=np.float64),
        unrouted_cpu=unrouted,
    )
