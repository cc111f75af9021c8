"""The cell state as struct-of-arrays, with incremental updates that keep caches valid.

One row per machine; per machine and per priority level we keep *cumulative* sums
of what tasks hold, so that "resources available to a task of priority p, counting
those held by tasks it may preempt" (Borg §3.2) is one fancy-indexing lookup:

``below[m, p, k]`` = sum of channel ``k`` over the tasks on machine ``m`` whose
priority is strictly lower than ``p``; ``below[m, NUM_PRIORITIES]`` is the total.

Channels: the task's limits (4 dimensions), its reservation (4, §5.5), the mean and
variance of its instantaneous CPU usage (GPA §4) and a task count.

Every change to a machine bumps its ``version``: the scheduler's score cache (§3.4)
compares versions to know which cached feasibility and scores are stale. Reservation
and usage-statistics updates bump it only when the totals moved by more than
``invalidation_tolerance`` of the capacity ("ignoring small changes in resource
quantities reduces cache invalidations", §3.4).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray, IntpArray
from cellpilot.schedule.constraints import AttributeTable
from cellpilot.schedule.model import CellMachine, PlacementTask
from cellpilot.schedule.priority import NUM_PRIORITIES, is_prod
from cellpilot.schedule.reservation import ReclamationParams, next_reservation
from cellpilot.schedule.resources import CPU, EPSILON, NUM_RESOURCES, RESOURCE_NAMES, Resources

LIMIT = slice(0, NUM_RESOURCES)
RESERVATION = slice(NUM_RESOURCES, 2 * NUM_RESOURCES)
CPU_MEAN = 2 * NUM_RESOURCES
CPU_VAR = CPU_MEAN + 1
COUNT = CPU_VAR + 1
NUM_CHANNELS = COUNT + 1
NUM_LEVELS = NUM_PRIORITIES

_cell_ids = itertools.count(1)


def placement_basis(priority: int) -> slice:
    """Prod tasks are placed against limits, non-prod against reservations (§5.5)."""
    return LIMIT if is_prod(priority) else RESERVATION


@dataclass(frozen=True)
class ResizeOutcome:
    ok: bool
    reason: str = ""


class Cell:
    """Machines, tasks and allocs of one Borg cell, held in numpy arrays."""

    def __init__(
        self, machine_hint: int = 64, task_hint: int = 1024, invalidation_tolerance: float = 0.02
    ) -> None:
        self.uid = next(_cell_ids)
        self.invalidation_tolerance = invalidation_tolerance
        m = max(machine_hint, 1)
        self.n_machines = 0  # high-water mark of machine ids
        self.capacity = np.zeros((m, NUM_RESOURCES))
        self.inv_capacity = np.zeros((m, NUM_RESOURCES))  # 1 / capacity, 0 where capacity is 0
        self.alive = np.zeros(m, dtype=bool)
        self.version = np.zeros(m, dtype=np.int64)
        self.below = np.zeros((m, NUM_LEVELS + 1, NUM_CHANNELS))
        self._bumped_at = np.zeros((m, NUM_CHANNELS))
        self.rack = np.full(m, -1, dtype=np.int32)
        self.power = np.full(m, -1, dtype=np.int32)
        self.attributes = AttributeTable(m)
        self.machine_names: list[str] = []
        self.machine_index: dict[str, int] = {}
        self.machine_tasks: list[set[int]] = []  # top-level tasks and allocs per machine
        self.rack_names: dict[str, int] = {}
        self.power_names: dict[str, int] = {}
        self.packages: dict[str, set[int]] = {}
        self.machine_epoch = 0  # bumped when machines are added (pools must rescan)
        self.score_epoch = 0  # bumped when cell-wide scoring inputs change
        # Anticipated task shape (mean limits), used by the stranding-aware scorer.
        self.anticipated_shape = np.ones(NUM_RESOURCES)
        self._limit_sum = np.zeros(NUM_RESOURCES)
        self._task_total = 0

        t = max(task_hint, 1)
        self.t_alive = np.zeros(t, dtype=bool)
        self.t_machine = np.full(t, -1, dtype=np.int32)
        self.t_priority = np.zeros(t, dtype=np.int16)
        self.t_job = np.full(t, -1, dtype=np.int32)
        self.t_alloc = np.full(t, -1, dtype=np.int32)  # enclosing alloc, -1 for top level
        self.t_amount = np.zeros((t, NUM_CHANNELS))  # the task's channel vector
        self.t_inner = np.zeros((t, NUM_RESOURCES))  # for allocs: limits of tasks inside
        self.t_started = np.zeros(t)
        self.t_updated = np.zeros(t)
        self.t_spec: list[PlacementTask | None] = [None] * t
        self.task_handle: dict[str, int] = {}
        self._free: list[int] = list(range(t - 1, -1, -1))
        self.alloc_sets: dict[str, set[int]] = {}
        self.alloc_members: dict[int, set[int]] = {}

        self.job_codes: dict[str, int] = {}
        self.job_machine_counts: list[dict[int, int]] = []
        self.job_rack_counts: list[npt.NDArray[np.int32]] = []  # per job, tasks per rack
        self.job_power_counts: list[npt.NDArray[np.int32]] = []  # per job, tasks per power domain
        self._scratch = np.zeros(m)

    # ------------------------------------------------------------------ machines
    def add_machine(self, spec: CellMachine) -> int:
        if spec.name in self.machine_index:
            raise ValueError(f"machine {spec.name!r} already in the cell")
        m = self.n_machines
        if m == self.capacity.shape[0]:
            self._grow_machines(2 * m)
        self.n_machines += 1
        self.capacity[m] = spec.capacity.array()
        cap = self.capacity[m]
        self.inv_capacity[m] = np.divide(1.0, cap, out=np.zeros(NUM_RESOURCES), where=cap > 0)
        self.alive[m] = True
        self.version[m] += 1
        self.rack[m] = self.rack_names.setdefault(spec.rack, len(self.rack_names))
        self.power[m] = self.power_names.setdefault(spec.power_domain, len(self.power_names))
        for name, value in spec.attributes:
            self.attributes.set(m, name, value)
        self.machine_names.append(spec.name)
        self.machine_index[spec.name] = m
        self.machine_tasks.append(set())
        self.machine_epoch += 1
        return m

    def add_machines(self, specs: Sequence[CellMachine]) -> list[int]:
        needed = self.n_machines + len(specs)
        if needed > self.capacity.shape[0]:
            self._grow_machines(max(needed, 2 * self.capacity.shape[0]))
        return [self.add_machine(s) for s in specs]

    def remove_machine(self, machine: int) -> list[PlacementTask]:
        """Takes a machine out of the cell; its tasks come back to be rescheduled (§3.3)."""
        self._check_machine(machine)
        evicted: list[PlacementTask] = []
        for handle in sorted(self.machine_tasks[machine]):
            if self.t_alive[handle]:
                evicted += self.unbind(handle)
        self.alive[machine] = False
        self.version[machine] += 1
        self.attributes.clear(machine)
        for holders in self.packages.values():
            holders.discard(machine)
        del self.machine_index[self.machine_names[machine]]
        return evicted

    def set_attribute(self, machine: int, name: str, value: str | float) -> None:
        self._check_machine(machine)
        self.attributes.set(machine, name, value)
        self.version[machine] += 1

    def alive_machines(self) -> IntpArray:
        return np.flatnonzero(self.alive[: self.n_machines])

    def machine_spec_capacity(self, machine: int) -> Resources:
        return Resources.from_array(self.capacity[machine])

    def _check_machine(self, machine: int) -> None:
        if not (0 <= machine < self.n_machines and self.alive[machine]):
            raise KeyError(f"no live machine {machine}")

    def _grow_machines(self, size: int) -> None:
        def grow(a: np.ndarray, fill: float | int | bool) -> np.ndarray:
            out = np.full((size, *a.shape[1:]), fill, dtype=a.dtype)
            out[: a.shape[0]] = a
            return out

        self.capacity = grow(self.capacity, 0.0)
        self.inv_capacity = grow(self.inv_capacity, 0.0)
        self.alive = grow(self.alive, False)
        self.version = grow(self.version, 0)
        self._scratch = grow(self._scratch, 0.0)
        self.below = grow(self.below, 0.0)
        self._bumped_at = grow(self._bumped_at, 0.0)
        self.rack = grow(self.rack, -1)
        self.power = grow(self.power, -1)
        self.attributes.grow(size)

    # ------------------------------------------------------------------ jobs
    def job_code(self, job: str) -> int:
        code = self.job_codes.get(job)
        if code is None:
            code = self.job_codes[job] = len(self.job_codes)
            self.job_machine_counts.append({})
            self.job_rack_counts.append(np.zeros(len(self.rack_names), dtype=np.int32))
            self.job_power_counts.append(np.zeros(len(self.power_names), dtype=np.int32))
        return code

    def job_counts(self, job: int, machines: IntpArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """Tasks of ``job`` on each of ``machines``, in its rack and in its power domain."""
        counts = self.job_machine_counts[job]
        if counts:
            keys = np.fromiter(counts.keys(), dtype=np.intp, count=len(counts))
            self._scratch[keys] = np.fromiter(counts.values(), dtype=np.float64, count=len(counts))
            on_machine = self._scratch[machines]
            self._scratch[keys] = 0.0
        else:
            on_machine = np.zeros(machines.shape[0])
        racks = self._domain_counts(self.job_rack_counts, job, len(self.rack_names))
        powers = self._domain_counts(self.job_power_counts, job, len(self.power_names))
        return (
            on_machine,
            racks[self.rack[machines]].astype(np.float64),
            powers[self.power[machines]].astype(np.float64),
        )

    @staticmethod
    def _domain_counts(arrays: list[npt.NDArray[np.int32]], job: int, size: int) -> npt.NDArray[np.int32]:
        counts = arrays[job]
        if counts.shape[0] < size:
            grown = np.zeros(size, dtype=np.int32)
            grown[: counts.shape[0]] = counts
            arrays[job] = counts = grown
        return counts

    # ------------------------------------------------------------------ tasks
    def task_amount(self, spec: PlacementTask, reservation: FloatArray | None = None) -> FloatArray:
        shape = spec.shape
        limits = shape.limits.array()
        amount = np.empty(NUM_CHANNELS)
        amount[LIMIT] = limits
        if reservation is None:
            reservation = limits if spec.reservation is None else np.minimum(spec.reservation.array(), limits)
        amount[RESERVATION] = reservation
        if shape.cpu_mean is None:
            amount[CPU_MEAN], amount[CPU_VAR] = limits[CPU], 0.0
        else:
            amount[CPU_MEAN], amount[CPU_VAR] = shape.cpu_mean, (shape.cpu_std or 0.0) ** 2
        amount[COUNT] = 1.0
        return amount

    def bind(
        self,
        spec: PlacementTask,
        machine: int,
        now: float,
        alloc: int | None = None,
        amount: FloatArray | None = None,
    ) -> int:
        """Records ``spec`` as running on ``machine`` (inside ``alloc`` if given); returns its handle.

        Binding does not check fit: the scheduler does, and a restored checkpoint may
        legitimately be over-committed on reservations. ``amount`` is the task's channel
        vector when the caller already has it (it must equal :meth:`task_amount`).
        """
        self._check_machine(machine)
        if spec.task_id in self.task_handle:
            raise ValueError(f"task {spec.task_id} is already bound")
        shape = spec.shape
        if shape.alloc_set is not None:
            if alloc is None or alloc not in self.alloc_sets.get(shape.alloc_set, set()):
                raise ValueError(f"task {spec.task_id} must run in an alloc of set {shape.alloc_set!r}")
            if int(self.t_machine[alloc]) != machine:
                raise ValueError("a task runs on its alloc's machine")
        elif alloc is not None:
            raise ValueError("only tasks of an alloc set run inside allocs")
        if not self._free:
            self._grow_tasks(2 * self.t_alive.shape[0])
        h = self._free.pop()
        if amount is None:
            amount = self.task_amount(spec)
        self.t_alive[h] = True
        self.t_machine[h] = machine
        self.t_priority[h] = shape.priority
        self.t_amount[h] = amount
        self.t_inner[h] = 0.0
        self.t_started[h] = now
        self.t_updated[h] = now
        self.t_spec[h] = spec
        self.task_handle[spec.task_id] = h
        job = self.job_code(spec.job)
        self.t_job[h] = job
        self._count(self.job_machine_counts[job], machine, 1)
        self._domain_counts(self.job_rack_counts, job, len(self.rack_names))[self.rack[machine]] += 1
        self._domain_counts(self.job_power_counts, job, len(self.power_names))[self.power[machine]] += 1
        if alloc is not None:
            self.t_alloc[h] = alloc
            self.t_inner[alloc] += amount[LIMIT]
            self.alloc_members[alloc].add(h)
        else:
            self.t_alloc[h] = -1
            self.below[machine, shape.priority + 1 :] += amount
            self.machine_tasks[machine].add(h)
            self._limit_sum += amount[LIMIT]
            self._task_total += 1
        if shape.is_alloc:
            self.alloc_sets.setdefault(spec.job, set()).add(h)
            self.alloc_members[h] = set()
        for package in shape.packages:
            self.packages.setdefault(package, set()).add(machine)
        self.version[machine] += 1
        self._bumped_at[machine] = self.below[machine, NUM_LEVELS]
        return h

    def unbind(self, handle: int) -> list[PlacementTask]:
        """Removes a task (and, for an alloc, the tasks inside it); returns their specs."""
        if not (0 <= handle < self.t_alive.shape[0] and self.t_alive[handle]):
            raise KeyError(f"no live task {handle}")
        removed: list[PlacementTask] = []
        for member in sorted(self.alloc_members.get(handle, ())):
            removed += self.unbind(member)
        spec = self.t_spec[handle]
        assert spec is not None
        machine = int(self.t_machine[handle])
        amount = self.t_amount[handle]
        alloc = int(self.t_alloc[handle])
        job = int(self.t_job[handle])
        self._count(self.job_machine_counts[job], machine, -1)
        self.job_rack_counts[job][self.rack[machine]] -= 1
        self.job_power_counts[job][self.power[machine]] -= 1
        if alloc >= 0:
            self.t_inner[alloc] -= amount[LIMIT]
            self.alloc_members[alloc].discard(handle)
        else:
            self.below[machine, int(self.t_priority[handle]) + 1 :] -= amount
            self.machine_tasks[machine].discard(handle)
            self._limit_sum -= amount[LIMIT]
            self._task_total -= 1
        if spec.shape.is_alloc:
            self.alloc_sets[spec.job].discard(handle)
            del self.alloc_members[handle]
        self.t_alive[handle] = False
        self.t_machine[handle] = -1
        self.t_spec[handle] = None
        del self.task_handle[spec.task_id]
        self._free.append(handle)
        self.version[machine] += 1
        self._bumped_at[machine] = self.below[machine, NUM_LEVELS]
        removed.append(spec)
        return removed

    def resize(self, handle: int, limits: Resources) -> ResizeOutcome:
        """Changes a running task's limits if it still fits where it is (§2.3 updates).

        When it does not, nothing changes and the caller stops and reschedules it.
        """
        spec = self.spec(handle)
        new = limits.array()
        old = self.t_amount[handle, LIMIT].copy()
        machine = int(self.t_machine[handle])
        resv = self.t_amount[handle, RESERVATION]
        new_resv = np.minimum(resv + np.maximum(new - old, 0.0), new)
        alloc = int(self.t_alloc[handle])
        if spec.shape.is_alloc and np.any(self.t_inner[handle] > new + EPSILON):
            return ResizeOutcome(False, "alloc would be smaller than the tasks inside it")
        if alloc >= 0:
            free = self.t_amount[alloc, LIMIT] - self.t_inner[alloc] + old
            need = new
        else:
            basis = placement_basis(spec.priority)
            mine = old if basis == LIMIT else resv
            free = self.capacity[machine] - self.below[machine, NUM_LEVELS, basis] + mine
            need = new if basis == LIMIT else new_resv
        short = np.flatnonzero(need > free + EPSILON)
        if short.size:
            names = ", ".join(RESOURCE_NAMES[r] for r in short)
            return ResizeOutcome(False, f"no longer fits on its machine ({names})")
        delta = np.zeros(NUM_CHANNELS)
        delta[LIMIT] = new - old
        delta[RESERVATION] = new_resv - resv
        if spec.shape.cpu_mean is None:
            delta[CPU_MEAN] = new[CPU] - old[CPU]
        self._apply_delta(handle, delta)
        self.version[machine] += 1
        new_shape = replace(spec.shape, limits=limits)
        self.t_spec[handle] = replace(spec, shape=new_shape)
        return ResizeOutcome(True)

    def _apply_delta(self, handle: int, delta: FloatArray) -> None:
        self.t_amount[handle] += delta
        alloc = int(self.t_alloc[handle])
        if alloc >= 0:
            self.t_inner[alloc] += delta[LIMIT]
            return
        machine = int(self.t_machine[handle])
        self.below[machine, int(self.t_priority[handle]) + 1 :] += delta
        self._limit_sum += delta[LIMIT]

    def update_usage(
        self,
        handles: npt.ArrayLike,
        usage: npt.ArrayLike,
        now: float,
        params: ReclamationParams | None = None,
    ) -> None:
        """Recomputes the reservations of ``handles`` from their usage (§5.5)."""
        h = np.asarray(handles, dtype=np.intp)
        if h.size == 0:
            return
        if not self.t_alive[h].all():
            raise KeyError("update_usage on a task that is not running")
        use = np.asarray(usage, dtype=np.float64).reshape(h.size, NUM_RESOURCES)
        old = self.t_amount[h, RESERVATION]
        new = next_reservation(
            old, self.t_amount[h, LIMIT], use, self.t_started[h], self.t_updated[h], now, params
        )
        self.t_updated[h] = now
        delta = np.zeros((h.size, NUM_CHANNELS))
        delta[:, RESERVATION] = new - old
        self._apply_deltas(h, delta)

    def set_reservations(self, handles: npt.ArrayLike, reservations: npt.ArrayLike) -> None:
        """Sets the reservations of ``handles`` as another copy of the cell computed them (§5.5):
        a scheduler's cached copy takes the elected master's, so both judge fits alike."""
        h = np.asarray(handles, dtype=np.intp)
        if h.size == 0:
            return
        if not self.t_alive[h].all():
            raise KeyError("set_reservations on a task that is not running")
        rows = np.asarray(reservations, dtype=np.float64).reshape(h.size, NUM_RESOURCES)
        delta = np.zeros((h.size, NUM_CHANNELS))
        delta[:, RESERVATION] = np.minimum(rows, self.t_amount[h, LIMIT]) - self.t_amount[h, RESERVATION]
        self._apply_deltas(h, delta)

    def set_cpu_stats(self, handles: npt.ArrayLike, mean: npt.ArrayLike, std: npt.ArrayLike) -> None:
        """Sets the measured mean and std of instantaneous CPU usage (for the GPA fit test)."""
        h = np.asarray(handles, dtype=np.intp)
        if h.size == 0:
            return
        delta = np.zeros((h.size, NUM_CHANNELS))
        delta[:, CPU_MEAN] = np.asarray(mean, dtype=np.float64) - self.t_amount[h, CPU_MEAN]
        delta[:, CPU_VAR] = np.asarray(std, dtype=np.float64) ** 2 - self.t_amount[h, CPU_VAR]
        self._apply_deltas(h, delta)

    def _apply_deltas(self, h: IntpArray, delta: FloatArray) -> None:
        self.t_amount[h] += delta
        top = self.t_alloc[h] < 0
        inner = ~top
        if inner.any():
            np.add.at(self.t_inner, self.t_alloc[h[inner]], delta[inner][:, LIMIT])
        h, delta = h[top], delta[top]
        if h.size == 0:
            return
        touched, row = np.unique(self.t_machine[h].astype(np.intp), return_inverse=True)
        level_delta = np.zeros((touched.size, NUM_LEVELS + 1, NUM_CHANNELS))
        np.add.at(level_delta, (row, self.t_priority[h].astype(np.intp) + 1), delta)
        self.below[touched] += np.cumsum(level_delta, axis=1)
        self._maybe_bump(touched)

    def _maybe_bump(self, machines: IntpArray) -> None:
        total = self.below[machines, NUM_LEVELS]
        cap = self.capacity[machines]
        scale = np.empty((machines.size, NUM_CHANNELS))
        scale[:, LIMIT] = cap
        scale[:, RESERVATION] = cap
        scale[:, CPU_MEAN] = cap[:, CPU]
        scale[:, CPU_VAR] = cap[:, CPU] ** 2
        scale[:, COUNT] = 0.0
        moved = np.abs(total - self._bumped_at[machines]) > self.invalidation_tolerance * scale + EPSILON
        bump = machines[moved.any(axis=1)]
        self.version[bump] += 1
        self._bumped_at[bump] = self.below[bump, NUM_LEVELS]

    def publish_anticipated_shape(
        self, extra_sum: FloatArray | None = None, extra_count: int = 0, tolerance: float = 0.05
    ) -> None:
        """Sets the mean task shape the stranding-aware scorer plans for.

        It is the mean limit vector of running tasks plus ``extra`` (e.g. the pending
        queue). Cached scores depend on it, so it is republished (invalidating them)
        only when some dimension moved by more than ``tolerance``.
        """
        total = self._limit_sum.copy()
        count = self._task_total
        if extra_sum is not None:
            total += extra_sum
            count += extra_count
        if count == 0:
            return
        shape = np.maximum(total / count, EPSILON)
        change = np.abs(shape - self.anticipated_shape) / np.maximum(self.anticipated_shape, EPSILON)
        if np.any(change > tolerance):
            self.anticipated_shape = shape
            self.score_epoch += 1

    # ------------------------------------------------------------------ queries
    def spec(self, handle: int) -> PlacementTask:
        spec = self.t_spec[handle] if 0 <= handle < len(self.t_spec) else None
        if spec is None:
            raise KeyError(f"no live task {handle}")
        return spec

    def tasks_on(self, machine: int) -> list[int]:
        """Top-level tasks and allocs on ``machine`` (tasks inside allocs are not listed)."""
        return sorted(self.machine_tasks[machine])

    def running_tasks(self) -> IntpArray:
        return np.flatnonzero(self.t_alive)

    def used(self, machine: int, basis: slice) -> FloatArray:
        return self.below[machine, NUM_LEVELS, basis].copy()

    def nbytes(self) -> int:
        arrays = (
            self.capacity, self.inv_capacity, self.alive, self.version, self.below, self._bumped_at,
            self.rack, self.power, self.t_alive, self.t_machine, self.t_priority, self.t_job,
            self.t_alloc, self.t_amount, self.t_inner, self.t_started, self.t_updated,
        )  # fmt: skip
        return sum(a.nbytes for a in arrays) + self.attributes.nbytes()

    @staticmethod
    def _count(counts: dict[int, int], key: int, delta: int) -> None:
        value = counts.get(key, 0) + delta
        if value:
            counts[key] = value
        else:
            counts.pop(key, None)

    def _grow_tasks(self, size: int) -> None:
        old = self.t_alive.shape[0]

        def grow(a: np.ndarray, fill: float | int | bool) -> np.ndarray:
            out = np.full((size, *a.shape[1:]), fill, dtype=a.dtype)
            out[:old] = a
            return out

        self.t_alive = grow(self.t_alive, False)
        self.t_machine = grow(self.t_machine, -1)
        self.t_priority = grow(self.t_priority, 0)
        self.t_job = grow(self.t_job, -1)
        self.t_alloc = grow(self.t_alloc, -1)
        self.t_amount = grow(self.t_amount, 0.0)
        self.t_inner = grow(self.t_inner, 0.0)
        self.t_started = grow(self.t_started, 0.0)
        self.t_updated = grow(self.t_updated, 0.0)
        self.t_spec += [None] * (size - old)
        self._free = list(range(size - 1, old - 1, -1)) + self._free
