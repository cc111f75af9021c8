"""The checkpoint's storage encoding: log records and snapshots as ``checkpoint.proto`` bytes.

Part of the conversion edge (docs/architecture.md rule 2), kept apart from the request and
response conversions: a :class:`LogRecord` becomes one ``CheckpointRecord`` (its oneof case is
the mutation kind), a :class:`CellState` one ``CellSnapshot``; decoding either gives back
exactly what was encoded, so a replica that loads a snapshot and the log after it reaches the
state the master had.

A snapshot is stored with its format, the full name of its message: :data:`SNAPSHOT_FORMAT`
is the one written, and :func:`snapshot_in` also reads the first format
(:mod:`cellpilot.borg_wire.snapshot_v1`), the API's statuses, which databases written before
still hold. ``CellSnapshot`` holds only what :meth:`CellState.restore` needs, in the messages the
log records already store, so what the API shows can change without changing what is stored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cellpilot.api.v1 import checkpoint_pb2, job_pb2, machine_pb2, state_pb2
from cellpilot.borg import model as m
from cellpilot.borg import mutations as mu
from cellpilot.borg.cell_state import AppliedRequest, CellState, JobRecord, Leader, MachineRecord, TaskRecord
from cellpilot.borg.lifecycle import JobState, MachineState, TaskEvent, TaskState
from cellpilot.borg_wire import lifetimes as lifetime_convert
from cellpilot.borg_wire import snapshot_v1
from cellpilot.borg_wire.specs import (
    APPLIED_REQUEST_FIELDS,
    LEADER_FIELDS,
    enum_in,
    enum_out,
    job_spec_in,
    job_spec_out,
    machine_spec_in,
    machine_spec_out,
    resources_in,
    resources_out,
    same_named,
    task_event_in,
    task_event_out,
)
from cellpilot.job_vocabulary import PriorityBand
from cellpilot.platform.request_validation import InvalidField
from cellpilot.platform.wire_enums import wire_enum
from cellpilot.schedule import Resources

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
# What a snapshot's job entry holds as the core's job record does.
SNAPSHOT_JOB_PLAIN = ("spec_version", "submitted_ms", "state_since_ms", "fencing_token", "max_disruptions")


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
        msg = quota_set_out(x.user, x.band, x.limit)
    elif isinstance(x, mu.LavaHostsChanged):
        msg = lifetime_convert.hosts_changed_out(x)
    elif isinstance(x, mu.LifetimeModelTrained):
        msg = lifetime_convert.model_out(x)
    else:
        msg = p.LeaderElected(**same_named(x, LEADER_FIELDS))
    return {mu.kind_of(mutation): msg}


def quota_set_out(user: str, band: PriorityBand, limit: Resources) -> checkpoint_pb2.QuotaSet:
    return checkpoint_pb2.QuotaSet(
        user=user, band=enum_out(job_pb2.PriorityBand, band), limit=resources_out(limit)
    )


def quota_set_in(q: checkpoint_pb2.QuotaSet, f: str) -> mu.QuotaSet:
    return mu.QuotaSet(
        q.user, enum_in(PriorityBand, job_pb2.PriorityBand, q.band, f), resources_in(q.limit, f)
    )


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
        return quota_set_in(msg.quota_set, f)
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
SNAPSHOT_FORMAT = checkpoint_pb2.CellSnapshot.DESCRIPTOR.full_name  # "cellpilot.api.v1.CellSnapshot"


# A snapshot holds every task of the cell (100 000 in a 10 000-machine cell): their enums are
# converted through these tables, built once, instead of one lookup per field.
_TASK_STATE_OUT = {s: enum_out(state_pb2.TaskState, s) for s in TaskState}
_TASK_REASON_OUT = {e: task_event_out(e) for e in TaskEvent}
_TASK_STATE_IN = {v: s for s, v in _TASK_STATE_OUT.items()}
_TASK_REASON_IN = {
    (_TASK_REASON_OUT[e], s): task_event_in(_TASK_REASON_OUT[e], s, "") for e in TaskEvent for s in TaskState
}


def _task_out(entry: checkpoint_pb2.SnapshotJob, task: TaskRecord, spec_limits: Resources) -> None:
    stored = entry.tasks.add(
        index=task.index,
        limits=None if task.limits == spec_limits else resources_out(task.limits),
        spec_version=task.spec_version,
        incarnation=task.incarnation,
        state=_TASK_STATE_OUT[task.state],
        reason=_TASK_REASON_OUT[task.reason],
        reason_detail=task.reason_detail,
        machine_id=task.machine_id,
        ports=task.ports,
        restarts=task.restarts,
        state_since_ms=task.state_since_ms,
        failures=task.failures,
        not_before_ms=task.not_before_ms,
        last_failure=task.last_failure,
        last_failure_ms=task.last_failure_ms,
    )
    for machine_id, at_ms in task.recent_failures:
        stored.recent_failures.add(machine_id=machine_id, event_time_ms=at_ms)
    if task.avoid:
        stored.avoided_machines.update(task.avoid)


def _task_in(t: checkpoint_pb2.SnapshotTask, spec: m.JobSpec) -> TaskRecord:
    f = "snapshot.jobs.tasks"
    state = _TASK_STATE_IN.get(t.state) or enum_in(TaskState, state_pb2.TaskState, t.state, f"{f}.state")
    reason = _TASK_REASON_IN.get((t.reason, state)) or task_event_in(t.reason, state, f"{f}.reason")
    return TaskRecord(
        job_id=spec.job_id,
        index=t.index,
        limits=resources_in(t.limits, f"{f}.limits") if t.HasField("limits") else spec.task.limits,
        spec_version=t.spec_version,
        incarnation=t.incarnation,
        state=state,
        reason=reason,
        reason_detail=t.reason_detail,
        machine_id=t.machine_id,
        ports=tuple(t.ports),
        restarts=t.restarts,
        state_since_ms=t.state_since_ms,
        failures=t.failures,
        not_before_ms=t.not_before_ms,
        last_failure=t.last_failure,
        last_failure_ms=t.last_failure_ms,
        recent_failures=tuple((r.machine_id, r.event_time_ms) for r in t.recent_failures),
        avoid=dict(sorted(t.avoided_machines.items())) if t.avoided_machines else {},
    )


def snapshot_out(state: CellState, epoch: int) -> checkpoint_pb2.CellSnapshot:
    """The state as a :data:`SNAPSHOT_FORMAT` message, taken by the master of ``epoch``."""
    snapshot = checkpoint_pb2.CellSnapshot(
        sequence=state.last_sequence, epoch=epoch, event_time_ms=state.event_time_ms
    )
    for job in state.jobs.values():
        entry = snapshot.jobs.add(
            spec=job_spec_out(job.spec),
            state=enum_out(state_pb2.JobState, job.state),
            **same_named(job, SNAPSHOT_JOB_PLAIN),
        )
        spec_limits = job.spec.task.limits
        for task in job.tasks.values():
            _task_out(entry, task, spec_limits)
    machine_state = wire_enum(MachineState, checkpoint_pb2.MachineLifecycle)
    for machine in state.machines.values():
        snapshot.machines.add(
            spec=machine_spec_out(machine.spec),
            state=machine_state.to_wire(machine.state),
            draining=machine.draining,
            state_since_ms=machine.state_since_ms,
        )
    snapshot.quotas.extend(quota_set_out(user, band, limit) for (user, band), limit in state.quotas.items())
    snapshot.applied_requests.extend(
        checkpoint_pb2.AppliedRequest(**same_named(a, APPLIED_REQUEST_FIELDS))
        for a in state.applied_requests.values()
    )
    if state.leader is not None:
        snapshot.leader.CopyFrom(checkpoint_pb2.LeaderElected(**same_named(state.leader, LEADER_FIELDS)))
    snapshot.lava_hosts.extend(lifetime_convert.lava_host_out(h) for h in state.lava_hosts.values())
    if state.lifetime_model is not None:
        snapshot.lifetime_model.CopyFrom(lifetime_convert.model_out(state.lifetime_model))
    return snapshot


def cell_snapshot_in(data: bytes) -> CellState:
    """The state a :data:`SNAPSHOT_FORMAT` snapshot holds."""
    snapshot = checkpoint_pb2.CellSnapshot()
    snapshot.ParseFromString(data)
    f = "snapshot"
    jobs = []
    for entry in snapshot.jobs:
        spec = job_spec_in(entry.spec, f"{f}.jobs.spec")
        tasks = {t.index: _task_in(t, spec) for t in entry.tasks}
        jobs.append(
            JobRecord(
                spec=spec,
                state=enum_in(JobState, state_pb2.JobState, entry.state, f"{f}.jobs.state"),
                tasks=tasks,
                **same_named(entry, SNAPSHOT_JOB_PLAIN),
            )
        )
    machines = [
        MachineRecord(
            machine_spec_in(x.spec, f"{f}.machines.spec"),
            enum_in(MachineState, checkpoint_pb2.MachineLifecycle, x.state, f"{f}.machines.state"),
            x.draining,
            x.state_since_ms,
        )
        for x in snapshot.machines
    ]
    quotas = [quota_set_in(q, f"{f}.quotas") for q in snapshot.quotas]
    applied = [AppliedRequest(**same_named(a, APPLIED_REQUEST_FIELDS)) for a in snapshot.applied_requests]
    leader = Leader(**same_named(snapshot.leader, LEADER_FIELDS)) if snapshot.HasField("leader") else None
    model = snapshot.lifetime_model if snapshot.HasField("lifetime_model") else None
    return CellState.restore(
        jobs,
        machines,
        [(q.user, q.band, q.limit) for q in quotas],
        applied,
        snapshot.sequence,
        snapshot.epoch,
        snapshot.event_time_ms,
        leader,
        [lifetime_convert.lava_host_in(h) for h in snapshot.lava_hosts],
        lifetime_convert.model_in(model) if model is not None else None,
    )


# How each stored format is read (checkpoint_snapshot.format names the row's).
SNAPSHOT_READERS: dict[str, Callable[[bytes], CellState]] = {
    SNAPSHOT_FORMAT: cell_snapshot_in,
    snapshot_v1.FORMAT: snapshot_v1.snapshot_in,
}


def snapshot_in(data: bytes, snapshot_format: str = SNAPSHOT_FORMAT) -> CellState:
    """The state a snapshot of ``snapshot_format`` holds (a stored row names its format)."""
    reader = SNAPSHOT_READERS.get(snapshot_format)
    if reader is None:
        known = ", ".join(sorted(SNAPSHOT_READERS))
        raise InvalidField(
            "snapshot.format", f"unknown snapshot format {snapshot_format!r} (this version reads {known})"
        )
    return reader(data)
