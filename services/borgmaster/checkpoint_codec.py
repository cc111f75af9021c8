"""The checkpoint's storage encoding: log records and snapshots as ``checkpoint.proto`` bytes.

Part of the service's conversion edge (docs/architecture.md rule 2), kept apart from the request and
response conversions of :mod:`convert`: a :class:`LogRecord` becomes one
``CheckpointRecord`` (its oneof case is the mutation kind), a :class:`CellState` one
``Snapshot``; decoding either gives back exactly what was encoded, so a replica that loads
a snapshot and the log after it reaches the state the master had.
"""

from __future__ import annotations

from typing import Any

from cellpilot.api.v1 import checkpoint_pb2, job_pb2, machine_pb2, state_pb2
from cellpilot.borg import model as m
from cellpilot.borg import mutations as mu
from cellpilot.borg.cell_state import AppliedRequest, CellState, JobRecord, Leader, MachineRecord, TaskRecord
from cellpilot.borg.lifecycle import JobState, MachineState, TaskState
from cellpilot.job_vocabulary import PriorityBand
from cellpilot.platform.request_validation import InvalidField
from cellpilot_services.borgmaster import lifetime_convert
from cellpilot_services.borgmaster.convert import (
    JOB_STATUS_PLAIN,
    LEADER_FIELDS,
    TASK_STATUS_PLAIN,
    enum_in,
    enum_out,
    job_spec_in,
    job_spec_out,
    job_status_out,
    leader_out,
    machine_out,
    machine_spec_in,
    machine_spec_out,
    quota_out,
    resources_in,
    resources_out,
    same_named,
    task_event_in,
    task_event_out,
    task_status_out,
)

# What a checkpoint record and the log record, and the mutations and their messages, hold alike.
RECORD_PLAIN = (
    "sequence",
    "epoch",
    "event_time_ms",
    "request_id",
    "cause_id",
    "request_method",
    "request_digest",
)
TASK_INCARNATION = ("job_id", "task_index", "incarnation")
JOB_UPDATED_PLAIN = ("job_id", "spec_version", "fencing_token", "max_disruptions", "hold_released")
BACKOFF_FIELDS = ("failures", "not_before_ms", "failed_at_ms", "machine_id", "avoid_until_ms")
APPLIED_REQUEST_FIELDS = ("request_id", "sequence", "job_id", "method", "digest")


def mutation_out(mutation: mu.Mutation) -> dict[str, Any]:
    """The oneof case of ``CheckpointRecord`` for a mutation, as constructor keyword arguments."""
    p = checkpoint_pb2
    x: Any = mutation
    if isinstance(x, mu.JobSubmitted):
        msg: Any = p.JobSubmitted(
            job_id=x.job_id, spec=job_spec_out(x.spec), state=enum_out(state_pb2.JobState, x.state)
        )
    elif isinstance(x, mu.JobUpdated):
        msg = p.JobUpdated(spec=job_spec_out(x.spec), **same_named(x, JOB_UPDATED_PLAIN))
    elif isinstance(x, mu.JobKilled):
        msg = p.JobKilled(job_id=x.job_id)
    elif isinstance(x, mu.JobStateChanged):
        msg = p.JobStateChanged(job_id=x.job_id, state=enum_out(state_pb2.JobState, x.state))
    elif isinstance(x, mu.TaskScheduled):
        msg = p.TaskScheduled(
            machine_id=x.machine_id,
            ports=x.ports,
            limits=resources_out(x.limits),
            **same_named(x, TASK_INCARNATION),
        )
    elif isinstance(x, mu.TaskStateChanged):
        msg = p.TaskStateChanged(
            state=enum_out(state_pb2.TaskState, x.state),
            reason=task_event_out(x.reason),
            detail=x.detail,
            **same_named(x, TASK_INCARNATION),
        )
        if x.usage is not None:
            msg.usage.CopyFrom(resources_out(x.usage))
        if x.backoff is not None:
            msg.backoff.CopyFrom(p.RestartBackoff(**same_named(x.backoff, BACKOFF_FIELDS)))
    elif isinstance(x, mu.MachineRegistered):
        msg = p.MachineRegistered(spec=machine_spec_out(x.spec))
    elif isinstance(x, mu.MachineStateChanged):
        msg = p.MachineStateChanged(
            machine_id=x.machine_id, state=enum_out(machine_pb2.MachineState, x.state), detail=x.detail
        )
    elif isinstance(x, mu.QuotaSet):
        msg = p.QuotaSet(
            user=x.user, band=enum_out(job_pb2.PriorityBand, x.band), limit=resources_out(x.limit)
        )
    elif isinstance(x, mu.LavaHostsChanged):
        msg = lifetime_convert.hosts_changed_out(x)
    elif isinstance(x, mu.LifetimeModelTrained):
        msg = lifetime_convert.model_out(x)
    else:
        msg = p.LeaderElected(**same_named(x, LEADER_FIELDS))
    return {mu.kind_of(mutation): msg}


def record_out(record: mu.LogRecord) -> checkpoint_pb2.CheckpointRecord:
    return checkpoint_pb2.CheckpointRecord(
        **same_named(record, RECORD_PLAIN), **mutation_out(record.mutation)
    )


def mutation_in(msg: checkpoint_pb2.CheckpointRecord) -> mu.Mutation:
    case = msg.WhichOneof("mutation")
    f = "record"
    if case == "job_submitted":
        x = msg.job_submitted
        return mu.JobSubmitted(
            x.job_id, job_spec_in(x.spec), enum_in(JobState, state_pb2.JobState, x.state, f)
        )
    if case == "job_updated":
        u = msg.job_updated
        return mu.JobUpdated(spec=job_spec_in(u.spec), **same_named(u, JOB_UPDATED_PLAIN))
    if case == "job_killed":
        return mu.JobKilled(msg.job_killed.job_id)
    if case == "job_state_changed":
        j = msg.job_state_changed
        return mu.JobStateChanged(j.job_id, enum_in(JobState, state_pb2.JobState, j.state, f))
    if case == "task_scheduled":
        t = msg.task_scheduled
        return mu.TaskScheduled(
            machine_id=t.machine_id,
            ports=tuple(t.ports),
            limits=resources_in(t.limits, f),
            **same_named(t, TASK_INCARNATION),
        )
    if case == "task_state_changed":
        c = msg.task_state_changed
        state = enum_in(TaskState, state_pb2.TaskState, c.state, f)
        usage = resources_in(c.usage, f) if c.HasField("usage") else None
        reason = task_event_in(c.reason, state, f)
        backoff = (
            mu.RestartBackoff(**same_named(c.backoff, BACKOFF_FIELDS)) if c.HasField("backoff") else None
        )
        return mu.TaskStateChanged(
            state=state,
            reason=reason,
            detail=c.detail,
            usage=usage,
            backoff=backoff,
            **same_named(c, TASK_INCARNATION),
        )
    if case == "machine_registered":
        return mu.MachineRegistered(machine_spec_in(msg.machine_registered.spec))
    if case == "machine_state_changed":
        s = msg.machine_state_changed
        return mu.MachineStateChanged(
            s.machine_id, enum_in(m.MachineAvailability, machine_pb2.MachineState, s.state, f), s.detail
        )
    if case == "quota_set":
        q = msg.quota_set
        return mu.QuotaSet(
            q.user, enum_in(PriorityBand, job_pb2.PriorityBand, q.band, f), resources_in(q.limit, f)
        )
    if case == "leader_elected":
        return mu.LeaderElected(**same_named(msg.leader_elected, LEADER_FIELDS))
    if case == "lava_hosts_changed":
        return lifetime_convert.hosts_changed_in(msg.lava_hosts_changed)
    if case == "lifetime_model_trained":
        return lifetime_convert.model_in(msg.lifetime_model_trained)
    raise InvalidField("record", f"unknown mutation {case!r}")


def record_in(data: bytes) -> mu.LogRecord:
    msg = checkpoint_pb2.CheckpointRecord()
    msg.ParseFromString(data)
    return mu.LogRecord(mutation=mutation_in(msg), **same_named(msg, RECORD_PLAIN))


# ---------------------------------------------------------------------- snapshots
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
