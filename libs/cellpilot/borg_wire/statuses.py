"""The Borgmaster's state on the v1 wire: job, task and machine statuses, events, quotas, pending reports.

Outbound conversions take the master's soft state (usage, readiness, last contact,
reservations: :class:`cellpilot.borg.soft_state.SoftState`) alongside the logical state, which
is logged; a snapshot stores neither.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, TypeVar

from cellpilot.api.v1 import (
    borgmaster_pb2,
    job_pb2,
    machine_pb2,
    state_pb2,
)
from cellpilot.borg.cell_state import CellState, JobRecord, Leader, MachineRecord, TaskRecord
from cellpilot.borg.changes import (
    Change,
    JobChange,
    TaskChange,
)
from cellpilot.borg.lifecycle import TaskState
from cellpilot.borg.pending_reasons import PendingReport
from cellpilot.borg.soft_state import NO_SOFT, SoftState
from cellpilot.borg_wire.specs import (
    LEADER_FIELDS,
    LOGGED,
    enum_out,
    job_spec_out,
    machine_spec_out,
    resources_out,
    same_named,
    task_event_out,
)
from cellpilot.job_vocabulary import (
    PriorityBand,
)
from cellpilot.schedule import RESOURCE_NAMES, Resources

E = TypeVar("E", bound=Enum)


# ---------------------------------------------------------------------- statuses
# What a task's and a job's status hold as their records do (the first snapshot format stored
# the statuses: cellpilot.borg_wire.snapshot_v1 reads them back).
TASK_STATUS_PLAIN = (
    "incarnation",
    "reason_detail",
    "machine_id",
    "restarts",
    "spec_version",
    "state_since_ms",
    "failures",
    "last_failure",
    "last_failure_ms",
)
JOB_STATUS_PLAIN = ("spec_version", "submitted_ms", "state_since_ms", "fencing_token", "max_disruptions")


def task_status_out(
    job: JobRecord, task: TaskRecord, soft: SoftState = NO_SOFT, reservation: Resources | None = None
) -> state_pb2.TaskStatus:
    running = task.state is TaskState.RUNNING
    return state_pb2.TaskStatus(
        job_id=job.job_id,
        task_index=task.index,
        state=enum_out(state_pb2.TaskState, task.state),
        reason=task_event_out(task.reason),
        limits=resources_out(task.limits),
        reservation=resources_out(reservation if running else None),
        usage=resources_out(soft.task_usage.get(task.key) if running else None),
        ports=task.ports,
        # Ready only once this incarnation's Borglet said so: a rescheduled task is initialising
        # again (Autopilot §3.3), whatever its previous incarnation last reported.
        ready=task.started and soft.task_ready.get(task.key, False),
        next_restart_ms=task.not_before_ms,
        **same_named(task, TASK_STATUS_PLAIN),
        avoided_machines=[
            state_pb2.AvoidedMachine(machine_id=m, until_ms=until) for m, until in sorted(task.avoid.items())
        ],
        recent_failures=[
            state_pb2.TaskFailure(machine_id=m, event_time_ms=at) for m, at in task.recent_failures
        ],
    )


def job_status_out(
    job: JobRecord,
    include_tasks: bool = False,
    soft: SoftState = NO_SOFT,
    reservations: Mapping[tuple[str, int], Resources] | None = None,
) -> state_pb2.JobStatus:
    counts = job.task_counts()
    status = state_pb2.JobStatus(
        job_id=job.job_id,
        spec=job_spec_out(job.spec),
        state=enum_out(state_pb2.JobState, job.state),
        task_counts=state_pb2.TaskCounts(
            pending=counts[TaskState.PENDING], running=counts[TaskState.RUNNING], dead=counts[TaskState.DEAD]
        ),
        **same_named(job, JOB_STATUS_PLAIN),
    )
    if include_tasks:
        reservations = reservations or {}
        status.tasks.extend(
            task_status_out(job, t, soft, reservations.get(t.key)) for t in job.visible_tasks()
        )
    return status


def machine_out(
    state: CellState,
    machine: MachineRecord,
    soft: SoftState = NO_SOFT,
    reservation: Callable[[str, int], Resources | None] | None = None,
) -> machine_pb2.Machine:
    """The machine with its allocation (the sum of its tasks' limits) and, given the scheduler's
    ``reservation`` of each task (the master's soft state, Borg §5.5), what it has reserved: a
    task without an estimate yet reserves its limits."""
    allocated = [0.0] * 4
    reserved = [0.0] * 4
    for job, task in state.tasks_on(machine.machine_id):
        estimate = reservation(job.job_id, task.index) if reservation is not None else None
        for i, (limit, held) in enumerate(
            zip(task.limits.array(), (estimate or task.limits).array(), strict=True)
        ):
            allocated[i] += float(limit)
            reserved[i] += float(held)
    message = machine_pb2.Machine(
        spec=machine_spec_out(machine.spec),
        state=enum_out(machine_pb2.MachineState, machine.availability),
        allocated=resources_out(Resources(*allocated)),
        usage=resources_out(soft.machine_usage.get(machine.machine_id)),
        task_count=len(machine.tasks),
        cached_package_ids=soft.cached_packages.get(machine.machine_id, ()),
        last_contact_ms=soft.last_contact_ms.get(machine.machine_id, 0),
        state_since_ms=machine.state_since_ms,
    )
    if reservation is not None:  # soft state: not part of a snapshot
        message.reserved.CopyFrom(resources_out(Resources(*reserved)))
    return message


def quota_out(state: CellState, user: str, band: PriorityBand) -> state_pb2.Quota:
    return state_pb2.Quota(
        user=user,
        band=enum_out(job_pb2.PriorityBand, band),
        limit=resources_out(state.quotas.get((user, band), Resources())),
        used=resources_out(state.quota_used(user, band)),
    )


def leader_out(leader: Leader | None) -> state_pb2.LeaderInfo | None:
    if leader is None:
        return None
    return state_pb2.LeaderInfo(**same_named(leader, LEADER_FIELDS))


# ---------------------------------------------------------------------- events
def change_out(change: Change) -> state_pb2.BorgEvent:
    if isinstance(change, TaskChange):
        task = state_pb2.TaskEvent(
            kind=task_event_out(change.kind),
            state=enum_out(state_pb2.TaskState, change.state),
            limits=resources_out(change.limits),
            usage=resources_out(change.usage),
            **same_named(change, ("job_id", "task_index", "incarnation", "machine_id", "detail", *LOGGED)),
        )
        return state_pb2.BorgEvent(task=task)
    if isinstance(change, JobChange):
        job = state_pb2.JobEvent(
            kind=enum_out(state_pb2.JobEventKind, change.kind),
            state=enum_out(state_pb2.JobState, change.state),
            **same_named(change, ("job_id", "spec_version", *LOGGED)),
        )
        if change.spec is not None:
            job.spec.CopyFrom(job_spec_out(change.spec))
        return state_pb2.BorgEvent(job=job)
    machine = machine_pb2.MachineEvent(
        kind=enum_out(machine_pb2.MachineEventKind, change.kind),
        state=enum_out(machine_pb2.MachineState, change.state),
        **same_named(change, ("machine_id", "detail", *LOGGED)),
    )
    return state_pb2.BorgEvent(machine=machine)


def task_change_out(change: TaskChange) -> state_pb2.TaskEvent:
    return change_out(change).task


# ---------------------------------------------------------------------- why pending
PENDING_REPORT_PLAIN = (
    "job_id",
    "task_index",
    "summary",
    "machines_total",
    "machines_feasible",
    "evaluated_at_ms",
    "next_restart_ms",
)


def pending_report_out(report: PendingReport) -> borgmaster_pb2.WhyPendingResponse:
    response = borgmaster_pb2.WhyPendingResponse(
        job_state=enum_out(state_pb2.JobState, report.job_state),
        task_state=enum_out(state_pb2.TaskState, report.task_state),
        **same_named(report, PENDING_REPORT_PLAIN),
        avoided_machines=[
            state_pb2.AvoidedMachine(machine_id=m, until_ms=until) for m, until in report.avoided_machines
        ],
    )
    for constraint, count in report.constraint_exclusions:
        response.constraint_exclusions.append(
            borgmaster_pb2.ConstraintExclusion(
                constraint=job_pb2.Constraint(
                    attribute=constraint.attribute,
                    value=constraint.value,
                    operator=enum_out(job_pb2.ConstraintOperator, constraint.operator),
                    kind=enum_out(job_pb2.ConstraintKind, constraint.kind),
                ),
                machines_excluded=count,
            )
        )
    # Resource enum: RESOURCE_CPU = 1 .. RESOURCE_PORTS = 4, in RESOURCE_NAMES order.
    pb_resource: dict[str, Any] = dict(zip(RESOURCE_NAMES, (1, 2, 3, 4), strict=True))
    for shortage in report.resource_exclusions:
        response.resource_exclusions.append(
            borgmaster_pb2.ResourceExclusion(
                resource=pb_resource[shortage.resource],
                machines_excluded=shortage.machines_excluded,
                max_available=int(shortage.max_available),
            )
        )
    if report.fitting_limits is not None:
        response.fitting_limits.CopyFrom(resources_out(report.fitting_limits))
    return response
