"""The first snapshot format: a ``checkpoint.proto`` ``Snapshot`` built from the API's statuses.

Snapshots were first stored as the API's ``JobStatus`` (with its ``TaskStatus`` list),
``Machine`` and ``Quota`` messages, so a change to what the API shows changed what was stored,
and derived fields (task counts, allocation, quota used) were stored with them. The store now
writes :data:`cellpilot.borg_wire.checkpoint.SNAPSHOT_FORMAT`; rows written before still hold
this format (``checkpoint_snapshot.format`` names it) and :func:`snapshot_in` still reads them.

What this format cannot say: a machine's drain flag while it is down (``Machine.state`` is one
of UP, DRAINING, DOWN), so a draining machine that went down loads as not draining.

:func:`snapshot_out` is kept to compare the formats (``bench/bench_snapshot_formats.py``) and to
test the reader on every kind of state; nothing stores what it writes.
"""

from __future__ import annotations

from cellpilot.api.v1 import checkpoint_pb2, job_pb2, machine_pb2, state_pb2
from cellpilot.borg import model as m
from cellpilot.borg.cell_state import AppliedRequest, CellState, JobRecord, Leader, MachineRecord, TaskRecord
from cellpilot.borg.lifecycle import JobState, MachineState, TaskState
from cellpilot.borg_wire import lifetimes as lifetime_convert
from cellpilot.borg_wire.specs import (
    APPLIED_REQUEST_FIELDS,
    LEADER_FIELDS,
    enum_in,
    job_spec_in,
    machine_spec_in,
    resources_in,
    same_named,
    task_event_in,
)
from cellpilot.borg_wire.statuses import (
    JOB_STATUS_PLAIN,
    TASK_STATUS_PLAIN,
    job_status_out,
    leader_out,
    machine_out,
    quota_out,
    task_status_out,
)
from cellpilot.job_vocabulary import PriorityBand

FORMAT = checkpoint_pb2.Snapshot.DESCRIPTOR.full_name  # "cellpilot.api.v1.Snapshot"


def snapshot_out(state: CellState, epoch: int) -> checkpoint_pb2.Snapshot:
    snapshot = checkpoint_pb2.Snapshot(
        sequence=state.last_sequence, epoch=epoch, event_time_ms=state.event_time_ms
    )
    for job in state.jobs.values():
        status = job_status_out(job)
        status.tasks.extend(task_status_out(job, t) for t in job.tasks.values())
        snapshot.jobs.append(status)
    snapshot.machines.extend(machine_out(state, machine) for machine in state.machines.values())
    snapshot.quotas.extend(quota_out(state, user, band) for user, band in state.quotas)
    snapshot.applied_requests.extend(
        checkpoint_pb2.AppliedRequest(**same_named(a, APPLIED_REQUEST_FIELDS))
        for a in state.applied_requests.values()
    )
    leader = leader_out(state.leader)
    if leader is not None:
        snapshot.leader.CopyFrom(leader)
    snapshot.lava_hosts.extend(lifetime_convert.lava_host_out(h) for h in state.lava_hosts.values())
    if state.lifetime_model is not None:
        snapshot.lifetime_model.CopyFrom(lifetime_convert.model_out(state.lifetime_model))
    return snapshot


def snapshot_in(data: bytes) -> CellState:
    snapshot = checkpoint_pb2.Snapshot()
    snapshot.ParseFromString(data)
    f = "snapshot"
    jobs = []
    for status in snapshot.jobs:
        spec = job_spec_in(status.spec)
        tasks = {}
        for t in status.tasks:
            task_state = enum_in(TaskState, state_pb2.TaskState, t.state, f)
            tasks[t.task_index] = TaskRecord(
                job_id=t.job_id,
                index=t.task_index,
                limits=resources_in(t.limits, f),
                state=task_state,
                reason=task_event_in(t.reason, task_state, f),
                ports=tuple(t.ports),
                not_before_ms=t.next_restart_ms,
                recent_failures=tuple((r.machine_id, r.event_time_ms) for r in t.recent_failures),
                avoid={a.machine_id: a.until_ms for a in t.avoided_machines},
                **same_named(t, TASK_STATUS_PLAIN),
            )
        jobs.append(
            JobRecord(
                spec=spec,
                state=enum_in(JobState, state_pb2.JobState, status.state, f),
                tasks=tasks,
                **same_named(status, JOB_STATUS_PLAIN),
            )
        )
    machines = []
    for machine in snapshot.machines:
        availability = enum_in(m.MachineAvailability, machine_pb2.MachineState, machine.state, f)
        lifecycle = MachineState.DOWN if availability is m.MachineAvailability.DOWN else MachineState.UP
        machines.append(
            MachineRecord(
                machine_spec_in(machine.spec),
                lifecycle,
                availability is m.MachineAvailability.DRAINING,
                machine.state_since_ms,
            )
        )
    quotas = [
        (q.user, enum_in(PriorityBand, job_pb2.PriorityBand, q.band, f), resources_in(q.limit, f))
        for q in snapshot.quotas
    ]
    applied = [AppliedRequest(**same_named(a, APPLIED_REQUEST_FIELDS)) for a in snapshot.applied_requests]
    leader = Leader(**same_named(snapshot.leader, LEADER_FIELDS)) if snapshot.HasField("leader") else None
    model = snapshot.lifetime_model if snapshot.HasField("lifetime_model") else None
    return CellState.restore(
        jobs,
        machines,
        quotas,
        applied,
        snapshot.sequence,
        snapshot.epoch,
        snapshot.event_time_ms,
        leader,
        [lifetime_convert.lava_host_in(h) for h in snapshot.lava_hosts],
        lifetime_convert.model_in(model) if model is not None else None,
    )
