"""The scheduler's copy of the cell (Borg §3.4), kept in step with the Borgmaster's state.

Borg §3.4: the scheduler operates on a cached copy of the cell state; it does a pass over
the pending queue, tells the master its assignments, and the master applies them unless
they are out of date. Here the copy is a :class:`cellpilot.schedule.Cell` that follows the
changes :meth:`CellState.apply` returns (:meth:`SchedulingView.observe`). A scheduling pass
(:meth:`plan`) places tasks into that copy at once — the scheduling core binds as it goes —
and returns the assignments and preemptions as log mutations; when they are committed and
applied, observing them is a no-op. If the commit fails the master steps down and the
copy is rebuilt from the state (:meth:`rebuild`).

This module adapts our API model to the scheduling core: machine attributes become
constraint columns (with ``has:<name>`` for EXISTS and ``num:<name>`` for numeric
comparisons, which the core's operators express only through those), and machines that
are down or draining carry ``cellpilot.schedulable = 0``, which every task's shape
excludes with a hard constraint. Every machine also carries its id as
``cellpilot.machine_id``: a task that crashed repeatedly on a machine gets a hard
``not-in`` constraint on it until its avoidance expires (Borg §4, :mod:`restart_backoff`),
and a task still backing off after a failure is not offered to the scheduler at all.

With the GPA fit test on (a profile with ``gpa_rho > 0``), the view also learns each running
task's CPU demand moments from the master's poll samples (:meth:`observe_cpu`,
:mod:`cellpilot.schedule.cpu_demand`) and hands them to the cell before every pass
(``Cell.set_cpu_stats``); a pending non-prod task of a job with measured tasks is offered with
its job's pooled moments (GPA §2, §4). Like reservations, the moments are soft state: a new
master starts without them (tasks count at their CPU limits) and re-learns them.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace

import numpy as np

from cellpilot.borg.cell_state import CellState, JobRecord, TaskRecord
from cellpilot.borg.changes import Change, MachineChange, TaskChange
from cellpilot.borg.lifecycle import JobState, TaskEvent, TaskState
from cellpilot.borg.model import Constraint, JobSpec, MachineSpec
from cellpilot.borg.mutations import Mutation, TaskScheduled, TaskStateChanged
from cellpilot.borg.proposals import ProposedPlacement
from cellpilot.borg.restart_backoff import avoided_machines
from cellpilot.borg.soft_feed import SoftFeed, TaskSoftState
from cellpilot.job_vocabulary import AppClass, ConstraintKind, ConstraintOperator
from cellpilot.schedule import (
    Cell,
    CellMachine,
    Placement,
    PlacementConstraint,
    PlacementTask,
    Profile,
    Resources,
    Scheduler,
    SchedulerConfig,
    TaskShape,
    default_profile,
    priority_round_robin,
)
from cellpilot.schedule.cell import COUNT, LIMIT, NUM_LEVELS, RESERVATION, placement_basis
from cellpilot.schedule.cpu_demand import CpuDemandMoments, CpuLearning, OverflowMeter, pooled_moments
from cellpilot.schedule.plugins import Request
from cellpilot.schedule.resources import EPSILON, PORTS

SCHEDULABLE = "cellpilot.schedulable"
ONLY_SCHEDULABLE = PlacementConstraint(SCHEDULABLE, "!=", "0", hard=True)
MACHINE_ID = "cellpilot.machine_id"
CPU_STATS_QUANTUM = 5.0  # millicores: pooled job moments are rounded up to this (stable shapes, §3.4)


def schedule_constraint(c: Constraint) -> PlacementConstraint:
    """One API constraint in the scheduling core's terms (see the module docstring)."""
    hard = c.kind is not ConstraintKind.SOFT
    op = c.operator
    if op is ConstraintOperator.EQUAL:
        return PlacementConstraint(c.attribute, "==", c.value, hard)
    if op is ConstraintOperator.NOT_EQUAL:
        return PlacementConstraint(c.attribute, "!=", c.value, hard)
    if op is ConstraintOperator.LESS_THAN:
        return PlacementConstraint(f"num:{c.attribute}", "<", float(c.value), hard)
    if op is ConstraintOperator.GREATER_THAN:
        return PlacementConstraint(f"num:{c.attribute}", ">", float(c.value), hard)
    if op is ConstraintOperator.EXISTS:
        return PlacementConstraint(f"has:{c.attribute}", "==", "1", hard)
    if op is ConstraintOperator.NOT_EXISTS:
        return PlacementConstraint(f"has:{c.attribute}", "!=", "1", hard)
    raise ValueError(f"constraint operator {op.value} cannot be evaluated")


def machine_attributes(spec: MachineSpec, schedulable: bool) -> dict[str, str | float]:
    attributes: dict[str, str | float] = {
        SCHEDULABLE: "1" if schedulable else "0",
        MACHINE_ID: spec.machine_id,
    }
    for name, value in spec.attributes:
        attributes[name] = value
        attributes[f"has:{name}"] = "1"
        try:
            number = float(value)
        except ValueError:
            continue
        if np.isfinite(number):
            attributes[f"num:{name}"] = number
    return attributes


def schedule_machine(spec: MachineSpec, schedulable: bool) -> CellMachine:
    return CellMachine.build(
        spec.machine_id,
        spec.capacity,
        rack=spec.rack or "rack-0",
        power_domain=spec.power_domain or "power-0",
        attributes=machine_attributes(spec, schedulable),
    )


def task_shape(spec: JobSpec) -> TaskShape:
    """The scheduling equivalence class of a job's tasks (Borg §3.4)."""
    app = AppClass.LATENCY_SENSITIVE if spec.app_class is AppClass.LATENCY_SENSITIVE else AppClass.BATCH
    return TaskShape(
        priority=spec.priority,
        limits=spec.task.limits,
        app_class=app,
        constraints=(ONLY_SCHEDULABLE, *(schedule_constraint(c) for c in spec.constraints)),
        packages=spec.task.package_ids,
        alloc_set=spec.alloc_set_job_id or None,
        is_alloc=spec.is_alloc_set,
    )


def task_id(job_id: str, index: int) -> str:
    return f"{job_id}/{index}"


@dataclass(frozen=True)
class Plan:
    """A scheduling pass's outcome: assignments and preemptions to commit, and what stays pending."""

    mutations: tuple[Mutation, ...]
    placed: int
    preempted: int
    unschedulable: int
    machines: frozenset[str]  # machines whose desired task set changes


def allocate_ports(spec: MachineSpec, taken: set[int], count: int) -> tuple[int, ...] | None:
    """The lowest free port numbers of the machine's range (Borg §2.3 footnote 2)."""
    if count <= 0:
        return ()
    ports: list[int] = []
    for port in range(spec.first_port, spec.first_port + int(spec.capacity.ports)):
        if port not in taken:
            ports.append(port)
            if len(ports) == count:
                return tuple(ports)
    return None


class SchedulingView:
    """A :class:`Cell` mirroring the running tasks, plus the scheduler and its caches."""

    def __init__(
        self,
        profile: Profile | None = None,
        config: SchedulerConfig | None = None,
        seed: int = 0,
        cpu_learning: CpuLearning | None = None,
    ) -> None:
        self.profile = profile or default_profile()
        self.config = config or SchedulerConfig()
        self.seed = seed
        self.stale = False
        self._shapes: dict[JobSpec, TaskShape] = {}
        self._shape_of_object: dict[int, tuple[JobSpec, TaskShape]] = {}  # id(spec) -> (spec, shape)
        self._specs: dict[str, MachineSpec] = {}
        self.cell = Cell()
        self.scheduler = Scheduler(self.profile, self.config, np.random.default_rng(seed))
        self.cpu_moments: CpuDemandMoments[tuple[str, int]] = CpuDemandMoments(cpu_learning)
        self.cpu_overflow = OverflowMeter(self.cpu_moments.learning.overflow_window)
        self._job_cpu: dict[str, tuple[float, float]] = {}  # pooled (mean, std) per job
        self.feed = SoftFeed()  # the master's soft state for its schedulers (soft_feed.py)
        self.generation = 0  # rebuilds so far: a scheduler re-takes the whole feed after one

    # ------------------------------------------------------------------ building
    @classmethod
    def build(
        cls,
        state: CellState,
        profile: Profile | None = None,
        config: SchedulerConfig | None = None,
        seed: int = 0,
    ) -> SchedulingView:
        view = cls(profile, config, seed)
        view.rebuild(state)
        return view

    def rebuild(self, state: CellState) -> None:
        """Recreates the copy from the state (after a failed commit, or a machine's spec changed)."""
        self.cell = Cell(machine_hint=max(len(state.machines), 1), task_hint=1024)
        self.scheduler = Scheduler(self.profile, self.config, np.random.default_rng(self.seed))
        self._specs = {}
        self.feed.forget()
        self.generation += 1
        for machine_id in sorted(state.machines):
            machine = state.machines[machine_id]
            self.cell.add_machine(schedule_machine(machine.spec, machine.schedulable))
            self._specs[machine_id] = machine.spec
        now = state.event_time_ms / 1000.0
        running = [(j, t) for j, t in state.iter_tasks() if t.state is TaskState.RUNNING]
        # Allocs first, so the tasks running inside them find them (Borg §2.4).
        running.sort(key=lambda jt: (not jt[0].spec.is_alloc_set, jt[0].job_id, jt[1].index))
        for job, task in running:
            self._bind(job, task, now)
        self.cpu_moments.retain((job.job_id, task.index) for job, task in running)
        self.stale = False

    def shape(self, spec: JobSpec) -> TaskShape:
        """The equivalence class of ``spec``'s tasks (Borg §3.4), computed once per spec.

        Looked up by the spec object first (a job's tasks share one), so following a log of many
        records does not hash a whole job spec for every task; equal specs of other jobs still
        share one shape through the by-value table."""
        known = self._shape_of_object.get(id(spec))
        if known is not None and known[0] is spec:
            return known[1]
        shape = self._shapes.get(spec)
        if shape is None:
            if len(self._shapes) > 100_000:
                self._shapes.clear()
                self._shape_of_object.clear()
            shape = self._shapes[spec] = task_shape(spec)
        self._shape_of_object[id(spec)] = (spec, shape)
        return shape

    def task_shape(self, job: JobRecord, task: TaskRecord, now_ms: int) -> TaskShape:
        """The task's shape: its job's, plus a hard constraint off the machines it avoids at ``now_ms``."""
        shape = self.shape(job.spec)
        avoided = avoided_machines(task, now_ms)
        if not avoided:
            return shape
        off = PlacementConstraint(MACHINE_ID, "not-in", tuple(m for m, _ in avoided), hard=True)
        return replace(shape, constraints=(*shape.constraints, off))

    def _task_spec(self, job: JobRecord, task: TaskRecord, now_ms: int) -> PlacementTask:
        shape = self.task_shape(job, task, now_ms)
        pooled = self._job_cpu.get(job.job_id)
        if pooled is not None and not shape.prod and not shape.is_alloc:
            mean, std = (float(np.ceil(v / CPU_STATS_QUANTUM) * CPU_STATS_QUANTUM) for v in pooled)
            shape = replace(shape, cpu_mean=mean, cpu_std=std)
        return PlacementTask(job.job_id, task.index, job.spec.user, shape)

    def _bind(self, job: JobRecord, task: TaskRecord, now: float) -> None:
        machine = self.cell.machine_index.get(task.machine_id)
        if machine is None:
            self.stale = True
            return
        spec = PlacementTask(job.job_id, task.index, job.spec.user, self.shape(job.spec))
        if task.limits != job.spec.task.limits:
            spec = replace(spec, shape=replace(spec.shape, limits=task.limits))
        alloc = None
        if spec.shape.alloc_set is not None:
            need = spec.shape.limits.array()
            for handle in sorted(self.cell.alloc_sets.get(spec.shape.alloc_set, ())):
                free = self.cell.t_amount[handle, LIMIT] - self.cell.t_inner[handle]
                if int(self.cell.t_machine[handle]) == machine and np.all(free >= need - EPSILON):
                    alloc = handle
                    break
            if alloc is None:
                self.stale = True
                return
        self.cell.bind(spec, machine, now, alloc=alloc)

    # ------------------------------------------------------------------ following the state
    def observe(self, state: CellState, changes: Iterable[Change]) -> None:
        """Follows applied changes: binds scheduled tasks, unbinds stopped ones, tracks machines."""
        for change in changes:
            if isinstance(change, MachineChange):
                self._observe_machine(state, change)
            elif isinstance(change, TaskChange):
                self._observe_task(state, change)

    def _observe_machine(self, state: CellState, change: MachineChange) -> None:
        machine = state.machines[change.machine_id]
        index = self.cell.machine_index.get(change.machine_id)
        if index is None:
            self.cell.add_machine(schedule_machine(machine.spec, machine.schedulable))
            self._specs[change.machine_id] = machine.spec
            return
        if self._specs.get(change.machine_id) != machine.spec:
            self.stale = True  # capacity or attributes changed: rebuild before the next pass
            return
        self.cell.set_attribute(index, SCHEDULABLE, "1" if machine.schedulable else "0")

    def _observe_task(self, state: CellState, change: TaskChange) -> None:
        tid = task_id(change.job_id, change.task_index)
        handle = self.cell.task_handle.get(tid)
        now = change.event_time_ms / 1000.0
        if change.kind is TaskEvent.SCHEDULED:
            job = state.jobs[change.job_id]
            task = job.tasks[change.task_index]
            if handle is None:
                self._bind(job, task, now)
            elif self.cell.machine_names[int(self.cell.t_machine[handle])] != change.machine_id:
                self.stale = True
        elif change.kind is TaskEvent.UPDATED and change.state is TaskState.RUNNING:
            job = state.jobs[change.job_id]
            task = job.tasks[change.task_index]
            # Learned CPU moments (GPA) are not part of the job's shape: only a new shape rebinds.
            unmeasured = (
                replace(self.cell.spec(handle).shape, cpu_mean=None, cpu_std=None)
                if handle is not None
                else None
            )
            if handle is not None and unmeasured != self.shape(job.spec):
                for member in self.cell.unbind(handle)[:-1]:  # tasks inside a resized alloc
                    member_job = state.jobs[member.job]
                    self._bind(member_job, member_job.tasks[member.index], now)
                self._bind(job, task, now)
        elif change.state is not TaskState.RUNNING and handle is not None:
            self.cell.unbind(handle)
            self.cpu_moments.forget((change.job_id, change.task_index))  # it stopped running

    def reconcile(self, state: CellState, keys: Iterable[tuple[str, int]]) -> None:
        """Makes the bindings of ``keys`` match the state: a scheduler's speculative placements
        the master refused are unbound, the victims it chose but the master spared are bound
        again (Borg §3.4: refused assignments are reconsidered in the next pass). Tasks in or
        of allocs are left to a rebuild."""
        now = state.event_time_ms / 1000.0
        for key in keys:
            job = state.jobs.get(key[0])
            task = None if job is None else job.tasks.get(key[1])
            handle = self.handle_of(key)
            running_on = task.machine_id if task is not None and task.state is TaskState.RUNNING else ""
            bound_on = self.cell.machine_names[int(self.cell.t_machine[handle])] if handle is not None else ""
            if running_on == bound_on:
                continue
            if job is not None and (job.spec.is_alloc_set or job.spec.alloc_set_job_id):
                self.stale = True
                return
            if handle is not None:
                self.cell.unbind(handle)
            if running_on and job is not None and task is not None:
                self._bind(job, task, now)
            else:
                self.cpu_moments.forget(key)

    # ------------------------------------------------------------------ scheduling
    def plan(
        self,
        state: CellState,
        now_ms: int,
        max_tasks: int = 10_000,
        event_now_ms: int | None = None,
        skip: Collection[tuple[str, int]] = (),
    ) -> Plan:
        """One pass over the pending queue, high to low priority, round-robin across users (§3.2).

        ``event_now_ms`` is the cell's event time (default ``now_ms``): tasks backing off after a
        failure until later are left pending, and avoidances that have expired are dropped.
        ``skip``: pending tasks already placed in this copy by a proposal still in flight (a
        scheduler plans its next pass while the master judges the last one). The pass takes the
        first ``max_tasks`` of the queue's order and builds the placement requests of those only.
        """
        if self.stale:
            self.rebuild(state)
        if self.uses_gpa:
            self.refresh_cpu_stats()
        event_now = now_ms if event_now_ms is None else event_now_ms
        queue = [
            (job, task)
            for job, task in state.schedulable_pending(event_now)
            if not skip or (job.job_id, task.index) not in skip
        ]
        this_pass = priority_round_robin(queue, lambda jt: (jt[0].spec.priority, jt[0].spec.user))[:max_tasks]
        pending = [self._task_spec(job, task, event_now) for job, task in this_pass]
        if not pending:
            return Plan((), 0, 0, 0, frozenset())
        result = self.scheduler.schedule(self.cell, pending, now_ms / 1000.0)
        mutations: list[Mutation] = []
        touched: set[str] = set()
        taken: dict[str, set[int]] = {}
        for placement in result.placements:
            committed = self._committed(state, placement, taken)
            if committed is None:
                self.stale = True  # the speculative binding and evictions are undone by a rebuild
                continue
            mutations += committed
            touched |= {placement.machine_name, *self._victim_machines(state, placement)}
        placed = sum(1 for m in mutations if isinstance(m, TaskScheduled))
        preempted = len(mutations) - placed
        unschedulable = len(result.unschedulable) + len(queue) - len(pending)
        return Plan(tuple(mutations), placed, preempted, unschedulable, frozenset(touched))

    def accept(
        self, state: CellState, proposed: ProposedPlacement, now_ms: int, event_now_ms: int
    ) -> tuple[Mutation, ...] | str:
        """A scheduler's proposed placement, if it is still appropriate (Borg §3.4): the log
        mutations that carry it out (the master's own victims and ports), bound in this copy;
        otherwise why it is stale (nothing changes then).

        The task must still be the pending incarnation the scheduler saw, of the spec version
        it saw, not backing off, and the machine still up, schedulable and not avoided by it;
        then the very check a pass makes (:meth:`Scheduler.place_on`) decides whether it still
        fits there.
        """
        job = state.jobs.get(proposed.job_id)
        task = None if job is None else job.tasks.get(proposed.task_index)
        if job is None or task is None or job.state not in (JobState.PENDING, JobState.RUNNING):
            return "the job is gone, held or dead"
        if task.state is not TaskState.PENDING or task.incarnation != proposed.incarnation:
            return "the task is no longer pending"
        if job.spec_version != proposed.spec_version:
            return "the job was updated since"
        if task.not_before_ms > event_now_ms:
            return "the task is backing off"
        machine = state.machines.get(proposed.machine_id)
        index = self.cell.machine_index.get(proposed.machine_id)
        if machine is None or index is None or not machine.schedulable:
            return "the machine is down, draining or gone"
        if self.stale:
            self.rebuild(state)
        spec = self._task_spec(job, task, event_now_ms)
        placement = self.scheduler.place_on(self.cell, spec, index, now_ms / 1000.0)
        if not isinstance(placement, Placement):
            return placement.reason
        committed = self._committed(state, placement, {})
        if committed is None:
            self.stale = True
            return "no free ports on the machine"
        return tuple(committed)

    def _committed(
        self, state: CellState, placement: Placement, taken: dict[str, set[int]]
    ) -> list[Mutation] | None:
        """The log mutations of a placement bound in this copy: its victims preempted, then the
        task scheduled with ports from the machine's range (``taken``: the ports given out so
        far in this pass, per machine). None when the machine has no ports left."""
        job = state.jobs[placement.task.job]
        task = job.tasks[placement.task.index]
        machine_id = placement.machine_name
        victims = [state.task((v.job, v.index)) for v in placement.preempted]
        for victim in victims:
            if victim is not None and victim.machine_id:
                taken.setdefault(victim.machine_id, state.ports_in_use(victim.machine_id))
                taken[victim.machine_id].difference_update(victim.ports)
        wanted = int(job.spec.task.limits.ports)
        ports: tuple[int, ...] = ()
        if wanted > 0:  # the machine's ports in use are listed only for a task that asks for some
            ports_taken = taken.setdefault(machine_id, state.ports_in_use(machine_id))
            allocated = allocate_ports(state.machines[machine_id].spec, ports_taken, wanted)
            if allocated is None:
                return None
            ports = allocated
            ports_taken.update(ports)
        mutations: list[Mutation] = [
            TaskStateChanged(
                victim.job_id,
                victim.index,
                victim.incarnation,
                TaskState.PENDING,
                TaskEvent.PREEMPTED,
                f"preempted by {placement.task.task_id} (priority {job.spec.priority})",
            )
            for victim in victims
            if victim is not None and victim.state is TaskState.RUNNING
        ]
        mutations.append(
            TaskScheduled(
                job.job_id, task.index, task.incarnation + 1, machine_id, ports, job.spec.task.limits
            )
        )
        return mutations

    @staticmethod
    def _victim_machines(state: CellState, placement: Placement) -> set[str]:
        machines = set()
        for v in placement.preempted:
            victim = state.task((v.job, v.index))
            if victim is not None and victim.machine_id:
                machines.add(victim.machine_id)
        return machines

    # ------------------------------------------------------------------ in-place updates
    def fits_in_place(
        self, job: JobRecord, task: TaskRecord, new_spec: JobSpec, scratch: dict[tuple[str, int], np.ndarray]
    ) -> bool:
        """Whether a running task still fits where it runs with the new spec (Borg §2.3 updates).

        ``scratch`` accumulates the growth already granted on each machine during one
        decision, so that several tasks growing on one machine are checked together.
        """
        handle = self.cell.task_handle.get(task_id(job.job_id, task.index))
        if handle is None:
            return False
        machine = int(self.cell.t_machine[handle])
        shape = self.shape(new_spec)
        rows = np.array([machine], dtype=np.intp)
        if not all(self.cell.attributes.satisfies(c, rows)[0] for c in shape.hard_constraints):
            return False
        old = self.cell.t_amount[handle]
        new = shape.limits.array()
        alloc = int(self.cell.t_alloc[handle])
        if alloc >= 0:
            key = (f"alloc:{alloc}", LIMIT.start)
            free = self.cell.t_amount[alloc, LIMIT] - self.cell.t_inner[alloc] + old[LIMIT]
            need, mine = new, old[LIMIT]
        else:
            basis = placement_basis(shape.priority)
            key = (self.cell.machine_names[machine], int(basis.start or 0))
            free = self.cell.capacity[machine] - self.cell.below[machine, NUM_LEVELS, basis] + old[basis]
            mine = old[basis]
            if basis == RESERVATION:
                need = np.minimum(old[RESERVATION] + np.maximum(new - old[LIMIT], 0.0), new)
            else:
                need = new
        granted = scratch.get(key, np.zeros_like(need))
        if np.any(need > free - granted + EPSILON):
            return False
        scratch[key] = granted + np.maximum(need - mine, 0.0)
        return True

    def in_place_room(
        self, job: JobRecord, task: TaskRecord, new_spec: JobSpec, scratch: dict[tuple[str, int], np.ndarray]
    ) -> tuple[tuple[str, int], ...] | None:
        """The neighbours to preempt so a running task takes ``new_spec`` where it runs
        (Autopilot §2.3: a resize that no longer fits evicts lower-priority tasks first).

        ``()``: it fits as it is (:meth:`fits_in_place`). Otherwise the profile's preemptor
        picks victims on the task's machine among the tasks its new priority may preempt
        (production never preempts production, Borg §2.5), as a scheduling pass would for a
        new task there; ``None`` when even that leaves no room (the task has to move), when it
        runs inside an alloc, or when another task of this decision already grew or made room
        on the machine (conservative: the earlier grant and evictions are not combined).
        """
        if self.fits_in_place(job, task, new_spec, scratch):
            return ()
        handle = self.cell.task_handle.get(task_id(job.job_id, task.index))
        if handle is None or int(self.cell.t_alloc[handle]) >= 0:
            return None
        machine = int(self.cell.t_machine[handle])
        name = self.cell.machine_names[machine]
        if any(key[0] == name for key in scratch):
            return None
        shape = self.shape(new_spec)
        rows = np.array([machine], dtype=np.intp)
        if not all(self.cell.attributes.satisfies(c, rows)[0] for c in shape.hard_constraints):
            return None
        req = Request.compile(shape)
        own = self.cell.t_amount[handle]
        profile = self.scheduler.profile

        def fits_without_the_task(capacity: np.ndarray, used: np.ndarray, r: Request) -> np.ndarray:
            return profile.fits(capacity, used - own, r)

        victims = profile.preemptor.victims(self.cell, req, machine, fits_without_the_task)
        if victims is None:
            return None
        basis = placement_basis(shape.priority)
        scratch[(name, int(basis.start or 0))] = np.maximum(req.amount[basis] - own[basis], 0.0)
        return tuple((spec.job, spec.index) for spec in (self.cell.spec(int(v)) for v in victims))

    def update_usage(self, usage: Mapping[tuple[str, int], Resources], now_ms: int) -> None:
        """Reservations follow measured usage (Borg §5.5); ports stay held while a task runs."""
        bound = self.cell.task_handle
        handles, rows, keys = [], [], []
        for (job_id, index), used in usage.items():
            handle = bound.get(task_id(job_id, index))
            if handle is None:
                continue
            handles.append(handle)
            rows.append((used.cpu, used.ram, used.disk, 0.0))
            keys.append((job_id, index))
        if handles:
            at = np.array(handles, dtype=np.intp)
            amounts = np.array(rows, dtype=np.float64)
            amounts[:, PORTS] = self.cell.t_amount[at, LIMIT][:, PORTS]
            self.cell.update_usage(at, amounts, now_ms / 1000.0)
            self.feed.note(self.cell, keys, handles, self.cpu_moments.known() if self.uses_gpa else None)

    def handle_of(self, key: tuple[str, int]) -> int | None:
        return self.cell.task_handle.get(task_id(*key))

    def soft_changes(self, since: int) -> list[TaskSoftState]:
        """The running tasks whose reservation or CPU moments moved after feed version ``since``."""
        return self.feed.changes(self.cell, self.handle_of, since)

    def take_soft(self, entries: Iterable[TaskSoftState]) -> None:
        """Sets the master's reservations and CPU moments in this copy (a scheduler's)."""
        self.feed.take(self.cell, self.handle_of, entries)

    @property
    def uses_gpa(self) -> bool:
        return self.profile.resource_fit.gpa_rho > 0

    def observe_cpu(self, machines: Iterable[tuple[Mapping[tuple[str, int], float], float]]) -> None:
        """One poll cycle's fresh machine samples: per machine, its running tasks' CPU demand
        (served + unmet, millicores) and its CPU capacity (GPA §4; module docstring)."""
        keys: list[tuple[str, int]] = []
        demand: list[float] = []
        sums: list[float] = []
        capacities: list[float] = []
        for tasks, capacity in machines:
            if not tasks:
                continue
            keys.extend(tasks)
            demand.extend(tasks.values())
            sums.append(sum(tasks.values()))
            capacities.append(capacity)
        bound = self.cell.task_handle
        if keys:
            kept = [i for i, k in enumerate(keys) if task_id(*k) in bound]  # samples of bound tasks only
            self.cpu_moments.observe([keys[i] for i in kept], np.maximum(np.array(demand)[kept], 0.0))
            self.cpu_overflow.observe(sums, capacities)
        # Only bound tasks learn; a task's moments are forgotten when it stops running
        # (:meth:`observe`, :meth:`reconcile`) and a rebuild keeps those of the running ones.

    def forget_cpu(self) -> None:
        """Drops the learned moments and overflow counts (a master stepping down)."""
        self.cpu_moments.clear()
        self.cpu_overflow.clear()
        self._job_cpu = {}

    def cpu_stats(self) -> dict[tuple[str, int], tuple[float, float]]:
        """(mean, std) of CPU demand of every running task measured often enough (learned from
        this copy's polls, or taken from the master's feed in a scheduler's copy)."""
        known = {**self.feed.cpu, **self.cpu_moments.known()}
        return {k: v for k, v in known.items() if task_id(*k) in self.cell.task_handle}

    def tasks_running(self) -> int:
        return int(np.count_nonzero(self.cell.t_alive))

    def machines_in_use(self) -> int:
        """Machines holding at least one running task or alloc."""
        return int(np.count_nonzero(self.cell.below[: self.cell.n_machines, NUM_LEVELS, COUNT] > 0))

    def refresh_cpu_stats(self) -> None:
        """Running tasks' learned moments into the cell, their jobs' pooled moments for the
        running tasks not measured yet and for pending ones (GPA §2, §4)."""
        known = self.cpu_stats()
        by_job: dict[str, list[tuple[float, float]]] = {}
        for (job_id, _), task_moments in known.items():
            by_job.setdefault(job_id, []).append(task_moments)
        self._job_cpu = {}
        for job_id, tasks in by_job.items():
            mean, var = pooled_moments([m for m, _ in tasks], [s * s for _, s in tasks])
            self._job_cpu[job_id] = (mean, float(np.sqrt(var)))
        handles: list[int] = []
        means: list[float] = []
        stds: list[float] = []
        for handle in self.cell.running_tasks().tolist():
            spec = self.cell.spec(handle)
            if spec.shape.is_alloc:
                continue
            stats = known.get((spec.job, spec.index)) or self._job_cpu.get(spec.job)
            if stats is not None:
                handles.append(handle)
                means.append(stats[0])
                stds.append(stats[1])
        if handles:
            self.cell.set_cpu_stats(np.array(handles, dtype=np.intp), means, stds)

    def reservation(self, job_id: str, index: int) -> Resources | None:
        handle = self.cell.task_handle.get(task_id(job_id, index))
        if handle is None:
            return None
        return Resources.from_array(self.cell.t_amount[handle, RESERVATION])
