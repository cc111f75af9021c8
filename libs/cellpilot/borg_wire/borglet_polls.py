"""The Borglet's poll messages in the Borgmaster's terms (Borg §3.3): the desired set the master
sends with each poll, and the machine's full-state report it answers with."""

from __future__ import annotations

from collections.abc import Iterable

from cellpilot.api.v1 import borglet_pb2, job_pb2, state_pb2
from cellpilot.borg.cell_state import JobRecord, TaskRecord
from cellpilot.borg.lifecycle import TaskState
from cellpilot.borg.link_shards import ReportDigest
from cellpilot.borg.poll_diff import MachineReport, ReportedEvent, ReportedTask
from cellpilot.borg_wire.specs import (
    enum_in,
    enum_out,
    resources_in,
    task_event_in,
    task_spec_out,
)


def desired_out(version: int, tasks: Iterable[tuple[JobRecord, TaskRecord]]) -> borglet_pb2.DesiredTasks:
    desired = borglet_pb2.DesiredTasks(version=version)
    for job, task in tasks:
        desired.tasks.append(
            borglet_pb2.TaskAssignment(
                job_id=job.job_id,
                task_index=task.index,
                incarnation=task.incarnation,
                priority=job.spec.priority,
                band=enum_out(job_pb2.PriorityBand, job.spec.effective_band),
                # The kind the Borglet enforces: soft for Autopilot-managed memory (§4.1).
                spec=task_spec_out(job.spec.task, task.limits, job.spec.effective_memory_limit_kind),
                ports=task.ports,
                spec_version=task.spec_version,
                app_class=enum_out(job_pb2.AppClass, job.spec.app_class),
            )
        )
    return desired


def report_in(response: borglet_pb2.PollResponse) -> MachineReport:
    f = "poll"
    tasks = []
    for t in response.tasks:
        state = enum_in(TaskState, state_pb2.TaskState, t.state, f)
        exit_reason = None
        if state is TaskState.DEAD and t.exit_reason:
            exit_reason = task_event_in(t.exit_reason, TaskState.PENDING, f)
        usage = resources_in(t.usage, f) if t.HasField("usage") else None
        tasks.append(
            ReportedTask(
                t.job_id,
                t.task_index,
                t.incarnation,
                state,
                exit_reason,
                t.exit_code,
                usage,
                t.ready,
                t.started_ms,
                float(max(t.cpu_unmet_millicores, 0)),
            )
        )
    events = []
    for e in response.events:
        ev = e.event
        usage = resources_in(ev.usage, f) if ev.HasField("usage") else None
        kind = task_event_in(ev.kind, TaskState.PENDING, f)
        events.append(
            ReportedEvent(
                e.sequence, ev.job_id, ev.task_index, ev.incarnation, kind, ev.detail, usage, ev.event_time_ms
            )
        )
    return MachineReport(
        response.machine_id,
        response.event_time_ms,
        response.desired_version,
        tuple(tasks),
        tuple(events),
        resources_in(response.usage, f"{f}.usage"),
        tuple(response.cached_package_ids),
    )


def digest_in(response: borglet_pb2.PollResponse, acked_sequence: int = 0) -> ReportDigest:
    """``report_digest(report_in(response), acked_sequence)`` read straight off the message: the
    fields the digest holds, without building every task's usage. A link shard digests every
    poll and converts only what it forwards (Borg §3.3). InvalidField as report_in's."""
    f = "poll"
    tasks = []
    for t in response.tasks:
        state = enum_in(TaskState, state_pb2.TaskState, t.state, f)
        exit_reason = None
        if state is TaskState.DEAD and t.exit_reason:
            exit_reason = task_event_in(t.exit_reason, TaskState.PENDING, f)
        tasks.append((t.job_id, t.task_index, t.incarnation, state, exit_reason, t.ready))
    return ReportDigest(
        response.desired_version,
        frozenset(tasks),
        tuple(sorted(e.sequence for e in response.events if e.sequence > acked_sequence)),
    )
