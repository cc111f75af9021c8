"""What the elected Borgmaster decides for each client command: mutations to log, or a refusal.

``handle(state, command, now_ms, fit)`` is pure: it reads the state and returns either a
:class:`Rejection` (naming the field) or the mutations that carry the command out. The
service appends them to the checkpoint log before applying or acknowledging them (Borg
§3.1), so a refusal never touches the state and an acceptance survives failover.

* Submit: validation, quota admission through the scheduling core (Borg §2.5: jobs over
  quota are rejected at submission), and the Autopilot hold for jobs with vertical or
  horizontal scaling ON or DRY_RUN (Autopilot §3.1: new jobs wait for the first
  recommendation).
* Update: a new spec version; scale-down kills the surplus tasks; running tasks change in
  place when the change needs no restart and still fits their machine — or fits once
  lower-priority neighbours there are preempted (Autopilot §2.3: a resize evicts before
  it moves; production never preempts production, Borg §2.5) — otherwise they are
  rescheduled, rolling, at most ``max_disruptions`` of the job's tasks down at a time
  (Borg §2.3: updates are rolling with a cap on disruptions; changes that would exceed it
  wait — :func:`rollout_step` continues them).
* Kill, machine registration and draining, quotas.

Requests are idempotent (Borg §4): a request id already applied returns the first answer
and produces no mutation — if it comes with the same method and payload (a retry). The same
id with another method or payload is refused naming ``request_id``: answering it with the
first request's reply would acknowledge a change that was never made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from cellpilot.borg.cell_state import AppliedRequest, CellState, JobRecord, TaskRecord, schedule_job
from cellpilot.borg.lifecycle import JobState, MachineState, TaskEvent, TaskState
from cellpilot.borg.model import JobSpec, MachineAvailability, MachineSpec, needs_restart, runs_same
from cellpilot.borg.mutations import (
    JobKilled,
    JobSubmitted,
    JobUpdated,
    MachineRegistered,
    MachineStateChanged,
    Mutation,
    QuotaSet,
    TaskStateChanged,
)
from cellpilot.borg.rejection import Code, Rejection, invalid
from cellpilot.borg.validation import NAME, merge_update, validate_job_spec, validate_machine_spec
from cellpilot.job_vocabulary import PriorityBand
from cellpilot.schedule import Rejected, Resources


class InPlaceFit(Protocol):
    """Whether a running task can take a new spec on its machine (the scheduling view): the
    lower-priority neighbours to preempt for it (none if it fits), or None if it must move."""

    def in_place_room(
        self, job: JobRecord, task: TaskRecord, new_spec: JobSpec, scratch: dict[tuple[str, int], np.ndarray]
    ) -> tuple[tuple[str, int], ...] | None: ...


# ---------------------------------------------------------------------- commands
@dataclass(frozen=True)
class ClientCommand:
    """What every client command carries: its request id, and a digest of the request's payload
    (everything but the id, as the client sent it; the service computes it), which with
    :attr:`method` tells a retry from another request reusing the id."""

    request_id: str
    payload_digest: str = field(default="", kw_only=True)

    @property
    def method(self) -> str:
        """The RPC this command is, e.g. ``SubmitJob``."""
        return type(self).__name__


@dataclass(frozen=True)
class SubmitJob(ClientCommand):
    spec: JobSpec


@dataclass(frozen=True)
class UpdateJob(ClientCommand):
    job_id: str
    spec: JobSpec
    update_mask: tuple[str, ...] = ()
    expected_spec_version: int = 0
    fencing_token: int = 0
    release_hold: bool = False
    max_disruptions: int = 0


@dataclass(frozen=True)
class KillJob(ClientCommand):
    job_id: str


@dataclass(frozen=True)
class RegisterMachine(ClientCommand):
    spec: MachineSpec


@dataclass(frozen=True)
class SetMachineState(ClientCommand):
    machine_id: str
    state: MachineAvailability
    detail: str = ""


@dataclass(frozen=True)
class SetQuota(ClientCommand):
    user: str
    band: PriorityBand
    limit: Resources


Command = SubmitJob | UpdateJob | KillJob | RegisterMachine | SetMachineState | SetQuota


@dataclass(frozen=True)
class Accepted:
    """The mutations to commit (possibly none), or the earlier answer to a retried request."""

    mutations: tuple[Mutation, ...]
    subject: str = ""  # the job or machine the command is about
    already_applied: AppliedRequest | None = None


Result = Accepted | Rejection


def handle(state: CellState, command: Command, now_ms: int, fit: InPlaceFit | None = None) -> Result:
    """Decides a client command against the current state."""
    del now_ms  # decisions depend on the state only; event time is stamped on the log record
    if command.request_id:
        applied = state.applied_requests.get(command.request_id)
        if applied is not None:
            return _replay(applied, command)
    if isinstance(command, SubmitJob):
        return _submit(state, command)
    if isinstance(command, UpdateJob):
        return _update(state, command, fit)
    if isinstance(command, KillJob):
        return _kill(state, command)
    if isinstance(command, RegisterMachine):
        return _register(state, command)
    if isinstance(command, SetMachineState):
        return _set_machine_state(state, command)
    return _set_quota(state, command)


def _replay(applied: AppliedRequest, command: Command) -> Result:
    """The first answer again for a retry; a refusal naming ``request_id`` for a reuse."""
    first = f"{applied.method or 'a request'}{f' of job {applied.job_id}' if applied.job_id else ''}"
    where = f"(log position {applied.sequence})"
    if applied.method and applied.method != command.method:
        return Rejection(
            Code.ALREADY_EXISTS,
            "request_id",
            f"{command.request_id!r} was first used for {first} {where}, not {command.method}; "
            "use a new request id",
        )
    if applied.digest and command.payload_digest and applied.digest != command.payload_digest:
        return Rejection(
            Code.ALREADY_EXISTS,
            "request_id",
            f"{command.request_id!r} was first used for {first} {where} with a different payload; "
            "use a new request id",
        )
    return Accepted((), applied.job_id, applied)


def _over_quota(verdict: Rejected, field: str) -> Rejection:
    return Rejection(Code.RESOURCE_EXHAUSTED, field, verdict.reason)


def _check_alloc_set(state: CellState, spec: JobSpec) -> Rejection | None:
    if not spec.alloc_set_job_id:
        return None
    target = state.job(spec.alloc_set_job_id)
    if target is None or not target.live or not target.spec.is_alloc_set:
        return invalid("spec.alloc_set_job_id", f"{spec.alloc_set_job_id!r} is not a live alloc set")
    return None


def _submit(state: CellState, cmd: SubmitJob) -> Result:
    spec = cmd.spec
    problem = validate_job_spec(spec) or _check_alloc_set(state, spec)
    if problem:
        return problem
    existing = state.job(spec.job_id)
    if existing is not None and existing.live:
        return Rejection(Code.ALREADY_EXISTS, "spec.name", f"job {spec.job_id} already exists")
    verdict = state.quota_book.check(schedule_job(spec))
    if isinstance(verdict, Rejected):
        return _over_quota(verdict, "spec")
    held = spec.autopilot.active
    job_state = JobState.HELD_FOR_AUTOPILOT if held else JobState.PENDING
    return Accepted((JobSubmitted(spec.job_id, spec, job_state),), spec.job_id)


def _update(state: CellState, cmd: UpdateJob, fit: InPlaceFit | None) -> Result:
    job = state.job(cmd.job_id)
    if job is None:
        return Rejection(Code.NOT_FOUND, "job_id", f"no job {cmd.job_id!r}")
    if not job.live:
        return Rejection(Code.FAILED_PRECONDITION, "job_id", f"job {cmd.job_id} is dead")
    if cmd.expected_spec_version and cmd.expected_spec_version != job.spec_version:
        return Rejection(
            Code.FAILED_PRECONDITION,
            "expected_spec_version",
            f"the job is at spec version {job.spec_version}, not {cmd.expected_spec_version}",
        )
    if cmd.fencing_token < 0:
        return invalid("fencing_token", "must be >= 0")
    if cmd.fencing_token and cmd.fencing_token < job.fencing_token:
        return Rejection(
            Code.FAILED_PRECONDITION,
            "fencing_token",
            f"token {cmd.fencing_token} is older than the job's {job.fencing_token} (a deposed actuator)",
        )
    if cmd.max_disruptions < 0:
        return invalid("policy.max_disruptions", "must be >= 0")
    if not cmd.update_mask and not cmd.release_hold:
        return invalid("update_mask", "names no field to update (and release_hold is not set)")
    merged = merge_update(job.spec, cmd.spec, cmd.update_mask)
    if isinstance(merged, Rejection):
        return merged
    problem = validate_job_spec(merged)
    if problem:
        return problem
    release = cmd.release_hold and job.state is JobState.HELD_FOR_AUTOPILOT
    if merged == job.spec and not release and cmd.fencing_token <= job.fencing_token:
        return Accepted((), job.job_id)  # nothing would change: no new spec version
    verdict = state.quota_book.check(schedule_job(merged), replacing=job.job_id)
    if isinstance(verdict, Rejected):
        return _over_quota(verdict, "spec")
    version = job.spec_version + 1
    mutations: list[Mutation] = [
        JobUpdated(job.job_id, merged, version, cmd.fencing_token, cmd.max_disruptions, release)
    ]
    for task in _live_tasks(job):
        if task.index >= merged.task_count:
            mutations.append(_stop(task, TaskState.DEAD, TaskEvent.KILLED, "scaled down"))
    outdated: list[TaskRecord] = []
    if not runs_same(job.spec, merged):
        restart = needs_restart(job.spec, merged)
        scratch: dict[tuple[str, int], np.ndarray] = {}
        for task in _running(job, below=merged.task_count):
            current = task.spec_version == job.spec_version
            room = fit.in_place_room(job, task, merged, scratch) if current and not restart and fit else None
            victims = [state.task(key) for key in room or ()]
            if room is None or any(v is None or v.state is not TaskState.RUNNING for v in victims):
                outdated.append(task)
                continue
            why = f"preempted to resize {job.job_id}/{task.index} in place (priority {merged.priority})"
            mutations += [_stop(v, TaskState.PENDING, TaskEvent.PREEMPTED, why) for v in victims if v]
            mutations.append(
                TaskStateChanged(
                    job.job_id, task.index, task.incarnation, TaskState.RUNNING, TaskEvent.UPDATED
                )
            )
    else:
        outdated = [t for t in _running(job, below=merged.task_count) if t.spec_version < job.spec_version]
    mutations += _roll(job, outdated, cmd.max_disruptions, version, merged.task_count)
    return Accepted(tuple(mutations), job.job_id)


def _live_tasks(job: JobRecord) -> list[TaskRecord]:
    return [t for t in sorted(job.tasks.values(), key=lambda t: t.index) if t.state is not TaskState.DEAD]


def _running(job: JobRecord, below: int) -> list[TaskRecord]:
    return [t for t in _live_tasks(job) if t.state is TaskState.RUNNING and t.index < below]


def _stop(task: TaskRecord, state: TaskState, reason: TaskEvent, detail: str) -> TaskStateChanged:
    return TaskStateChanged(task.job_id, task.index, task.incarnation, state, reason, detail)


def _roll(
    job: JobRecord, outdated: list[TaskRecord], cap: int, version: int, task_count: int
) -> list[Mutation]:
    """Reschedules outdated tasks, keeping at most ``cap`` of the job's tasks down (0: no cap)."""
    if not outdated:
        return []
    budget = len(outdated)
    if cap > 0:
        down = sum(
            1
            for t in job.tasks.values()
            if t.index < task_count and t.state is TaskState.PENDING and t.incarnation > 0
        )
        budget = max(cap - down, 0)
    return [
        _stop(t, TaskState.PENDING, TaskEvent.EVICTED, f"rolling update to spec version {version}")
        for t in outdated[:budget]
    ]


def rollout_step(state: CellState) -> list[Mutation]:
    """Continues rolling updates: reschedules outdated tasks while the disruption cap allows."""
    mutations: list[Mutation] = []
    for job_id in sorted(state.rolling):
        job = state.jobs[job_id]
        if not job.live:
            continue
        outdated = [t for t in _running(job, below=job.spec.task_count) if t.spec_version < job.spec_version]
        mutations += _roll(job, outdated, job.max_disruptions, job.spec_version, job.spec.task_count)
    return mutations


def draining_machines(state: CellState) -> list[str]:
    return [
        machine_id
        for machine_id, machine in sorted(state.machines.items())
        if machine.draining and machine.state is MachineState.UP
    ]


def drain_step(
    state: CellState, max_evictions: int, order: Callable[[list[TaskRecord]], list[TaskRecord]] | None = None
) -> list[Mutation]:
    """Evicts tasks from DRAINING machines, a few per call, so they leave gradually.

    ``order`` ranks the tasks of every draining machine together (LARS, LAVA §4.4, orders them
    across all hosts being drained); without it, machine by machine in task order.
    """
    tasks = [task for machine_id in draining_machines(state) for _, task in state.tasks_on(machine_id)]
    if order is not None:
        tasks = order(tasks)
    return [
        _stop(task, TaskState.PENDING, TaskEvent.EVICTED, f"machine {task.machine_id} is draining")
        for task in tasks[:max_evictions]
    ]


def _kill(state: CellState, cmd: KillJob) -> Result:
    job = state.job(cmd.job_id)
    if job is None:
        return Rejection(Code.NOT_FOUND, "job_id", f"no job {cmd.job_id!r}")
    if not job.live:
        return Accepted((), job.job_id)  # declarative: already dead
    mutations: list[Mutation] = []
    if job.spec.is_alloc_set:
        # The tasks running inside its allocs lose their allocs (Borg §2.4).
        for other in state.jobs.values():
            if other.live and other.spec.alloc_set_job_id == job.job_id:
                mutations += [
                    _stop(t, TaskState.PENDING, TaskEvent.EVICTED, f"alloc set {job.job_id} killed")
                    for t in _running(other, below=other.spec.task_count)
                ]
    mutations.append(JobKilled(job.job_id))
    return Accepted(tuple(mutations), job.job_id)


def _register(state: CellState, cmd: RegisterMachine) -> Result:
    problem = validate_machine_spec(cmd.spec)
    if problem:
        return problem
    existing = state.machines.get(cmd.spec.machine_id)
    if existing is not None and existing.spec == cmd.spec and existing.state is MachineState.UP:
        return Accepted((), cmd.spec.machine_id)  # nothing changes
    return Accepted((MachineRegistered(cmd.spec),), cmd.spec.machine_id)


def _set_machine_state(state: CellState, cmd: SetMachineState) -> Result:
    machine = state.machines.get(cmd.machine_id)
    if machine is None:
        return Rejection(Code.NOT_FOUND, "machine_id", f"no machine {cmd.machine_id!r}")
    if cmd.state not in (MachineAvailability.UP, MachineAvailability.DRAINING):
        return invalid("state", "must be UP or DRAINING (DOWN is the master's call)")
    if machine.state is MachineState.DOWN:
        return Rejection(
            Code.FAILED_PRECONDITION,
            "machine_id",
            f"machine {cmd.machine_id} is down; it returns when it answers a poll",
        )
    if machine.availability is cmd.state:
        return Accepted((), cmd.machine_id)
    return Accepted((MachineStateChanged(cmd.machine_id, cmd.state, cmd.detail),), cmd.machine_id)


def _set_quota(state: CellState, cmd: SetQuota) -> Result:
    if not cmd.user:
        return invalid("user", "required")
    if not NAME.match(cmd.user):
        return invalid("user", "must match [a-z0-9][a-z0-9._-]*")
    if cmd.band is PriorityBand.UNSPECIFIED:
        return invalid("band", "required")
    return Accepted((QuotaSet(cmd.user, cmd.band, cmd.limit),), cmd.user)
