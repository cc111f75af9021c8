"""The one place the Borglet's protobuf messages meet its plain dataclasses (docs/architecture.md rule 2).

Requests become :class:`TaskPlan` objects, validated on the way in: a bad field raises
:class:`InvalidField` naming it (StartTask answers INVALID_ARGUMENT). In a poll's desired
set, a task whose plan cannot be read becomes an :class:`UnrunnablePlan` instead, so it fails
alone and the rest of the set is applied (:func:`desired_plans`). Records, events and sample
arrays become replies and Kafka messages on the way out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cellpilot.api.v1 import borglet_pb2, job_pb2, machine_pb2, resources_pb2, state_pb2, usage_pb2
from cellpilot.borg.health_checks import resolve, validate_health_check
from cellpilot.borg.lifecycle import TaskEvent, TaskState
from cellpilot.borg.model import HealthCheck, SharedDemand
from cellpilot.borg.validation import demand_in
from cellpilot.borglet.hosted_task import (
    BorgletEvent,
    HostedTask,
    Limits,
    ProcessPlan,
    SimulatedPlan,
    TaskKey,
    TaskPlan,
    UnrunnablePlan,
)
from cellpilot.borglet.machine_agent import MachineProfile
from cellpilot.borglet.task_lifecycle import Phase
from cellpilot.platform.request_validation import InvalidField
from cellpilot.world.job_demand import DemandError, JobDemand
from cellpilot.world.step import WorldStep, WorldTasks
from cellpilot.world.usage_models import resolve_params


@dataclass(frozen=True)
class RuntimeDefaults:
    runtime: str = "simulated"  # for a spec without a runtime: "simulated" or "process"
    usage_model: str = "steady"
    allow_process: bool = True


EVENT_KINDS: dict[TaskEvent, state_pb2.TaskEventKind.ValueType] = {
    TaskEvent.RUNNING: state_pb2.TASK_EVENT_KIND_RUNNING,
    TaskEvent.OOM: state_pb2.TASK_EVENT_KIND_OOM,
    TaskEvent.EVICTED: state_pb2.TASK_EVENT_KIND_EVICTED,
    TaskEvent.PREEMPTED: state_pb2.TASK_EVENT_KIND_PREEMPTED,
    TaskEvent.FINISHED: state_pb2.TASK_EVENT_KIND_FINISHED,
    TaskEvent.FAILED: state_pb2.TASK_EVENT_KIND_FAILED,
    TaskEvent.KILLED: state_pb2.TASK_EVENT_KIND_KILLED,
    TaskEvent.UPDATED: state_pb2.TASK_EVENT_KIND_UPDATED,
}
TASK_STATES: dict[TaskState, state_pb2.TaskState.ValueType] = {
    TaskState.PENDING: state_pb2.TASK_STATE_PENDING,
    TaskState.RUNNING: state_pb2.TASK_STATE_RUNNING,
    TaskState.DEAD: state_pb2.TASK_STATE_DEAD,
}
# Stop reasons the master may give (StopTaskRequest.reason); unspecified reads as KILLED.
STOP_REASONS: dict[state_pb2.TaskEventKind.ValueType, TaskEvent] = {
    state_pb2.TASK_EVENT_KIND_UNSPECIFIED: TaskEvent.KILLED,
    state_pb2.TASK_EVENT_KIND_KILLED: TaskEvent.KILLED,
    state_pb2.TASK_EVENT_KIND_PREEMPTED: TaskEvent.PREEMPTED,
    state_pb2.TASK_EVENT_KIND_EVICTED: TaskEvent.EVICTED,
}


def limits(resources: resources_pb2.Resources, field: str) -> Limits:
    for name in ("cpu_millicores", "memory_bytes", "disk_bytes", "ports"):
        if getattr(resources, name) < 0:
            raise InvalidField(f"{field}.{name}", "must be >= 0")
    return Limits(resources.cpu_millicores, resources.memory_bytes, resources.disk_bytes, resources.ports)


def resources(value: Limits) -> resources_pb2.Resources:
    return resources_pb2.Resources(
        cpu_millicores=value.cpu_millicores,
        memory_bytes=value.memory_bytes,
        disk_bytes=value.disk_bytes,
        ports=value.ports,
    )


def hard_memory_limit(kind: int, field: str) -> bool:
    if kind not in (
        job_pb2.MEMORY_LIMIT_KIND_UNSPECIFIED,
        job_pb2.MEMORY_LIMIT_KIND_HARD,
        job_pb2.MEMORY_LIMIT_KIND_SOFT,
    ):
        raise InvalidField(field, f"unknown memory limit kind {kind}")
    return kind != job_pb2.MEMORY_LIMIT_KIND_SOFT


def _runtime(spec: job_pb2.RuntimeSpec, field: str, defaults: RuntimeDefaults) -> ProcessPlan | SimulatedPlan:
    which = spec.WhichOneof("runtime") or defaults.runtime
    if which == "process":
        if not defaults.allow_process:
            raise InvalidField(f"{field}.process", "this Borglet does not run process tasks")
        process = spec.process
        if not process.command:
            raise InvalidField(f"{field}.process.command", "must name an executable")
        check = None
        if process.HasField("health_check"):
            h = process.health_check
            core = HealthCheck(
                h.http_url,
                tuple(h.command),
                h.interval_ms,
                h.timeout_ms,
                h.failure_threshold,
                h.initial_delay_ms,
            )
            problem = validate_health_check(core, f"{field}.process.health_check")
            if problem is not None:
                raise InvalidField(*problem)
            check = resolve(core)
        return ProcessPlan(process.command, tuple(process.args), tuple(sorted(process.env.items())), check)
    simulated = spec.simulated
    if simulated.trace_uri:
        raise InvalidField(
            f"{field}.simulated.trace_uri", "trace replay is not supported by this Borglet; use usage_model"
        )
    if simulated.duration_seconds < 0 or simulated.startup_seconds < 0:
        name = "duration_seconds" if simulated.duration_seconds < 0 else "startup_seconds"
        raise InvalidField(f"{field}.simulated.{name}", "must be >= 0")
    model = simulated.usage_model or defaults.usage_model
    try:
        params = resolve_params(model, dict(simulated.params))
    except ValueError as error:
        name = "usage_model" if "unknown usage model" in str(error) else "params"
        raise InvalidField(f"{field}.simulated.{name}", str(error)) from error
    return SimulatedPlan(
        usage_model=model,
        params=tuple(sorted(params.items())),
        seed=simulated.seed,
        duration_seconds=simulated.duration_seconds,
        startup_seconds=simulated.startup_seconds,
        demand=_demand(simulated, f"{field}.simulated.demand") if simulated.HasField("demand") else None,
    )


def _demand(simulated: job_pb2.SimulatedRuntime, field: str) -> JobDemand:
    d = simulated.demand
    shared = SharedDemand(
        usage_model=d.usage_model,
        params=tuple(sorted(d.params.items())),
        trace_step_seconds=d.trace.step_seconds,
        trace_cpu_millicores=tuple(d.trace.cpu_millicores),
        trace_memory_bytes=tuple(d.trace.memory_bytes),
        imbalance=d.imbalance,
    )
    try:
        return demand_in(shared, simulated.seed)
    except DemandError as error:
        raise InvalidField(f"{field}.{error.field}" if error.field else field, error.message) from error


def latency_sensitive(task: borglet_pb2.TaskAssignment) -> bool:
    """The task's appclass (Borg §6.2); a master that does not say: prod bands are latency-sensitive."""
    if task.app_class == job_pb2.APP_CLASS_BATCH:
        return False
    if task.app_class == job_pb2.APP_CLASS_LATENCY_SENSITIVE:
        return True
    return task.band in (job_pb2.PRIORITY_BAND_MONITORING, job_pb2.PRIORITY_BAND_PRODUCTION)


def _identity_problem(task: borglet_pb2.TaskAssignment, field: str) -> InvalidField | None:
    """Why an assignment names no task a report could refer to (None if it names one)."""
    if not task.job_id:
        return InvalidField(f"{field}.job_id", "must not be empty")
    if task.task_index < 0:
        return InvalidField(f"{field}.task_index", "must be >= 0")
    if task.incarnation < 0:
        return InvalidField(f"{field}.incarnation", "must be >= 0")
    return None


def _assigned(task: borglet_pb2.TaskAssignment) -> dict[str, Any]:
    """The fields of a plan that every plan copies from its assignment, runnable or not."""
    return {
        "job_id": task.job_id,
        "task_index": task.task_index,
        "incarnation": task.incarnation,
        "priority": task.priority,
        "band": task.band,
        "ports": tuple(task.ports),
        "spec_version": task.spec_version,
    }


def task_plan(task: borglet_pb2.TaskAssignment, field: str, defaults: RuntimeDefaults) -> TaskPlan:
    problem = _identity_problem(task, field)
    if problem is not None:
        raise problem
    spec = task.spec
    return TaskPlan(
        limits=limits(spec.limits, f"{field}.spec.limits"),
        hard_memory_limit=hard_memory_limit(spec.memory_limit_kind, f"{field}.spec.memory_limit_kind"),
        runtime=_runtime(spec.runtime, f"{field}.spec.runtime", defaults),
        package_ids=tuple(spec.package_ids),
        latency_sensitive=latency_sensitive(task),
        **_assigned(task),
    )


def unrunnable_plan(task: borglet_pb2.TaskAssignment, reason: str) -> TaskPlan:
    """The plan of a task this Borglet cannot run: enough of it to report the task FAILED."""
    try:
        task_limits = limits(task.spec.limits, "limits")
    except InvalidField:
        task_limits = Limits()
    return TaskPlan(
        limits=task_limits, hard_memory_limit=True, runtime=UnrunnablePlan(reason), **_assigned(task)
    )


@dataclass(frozen=True)
class DesiredPlans:
    plans: tuple[TaskPlan, ...]
    skipped: tuple[str, ...]  # entries naming no usable task (or one named twice), with the reason


def desired_plans(desired: borglet_pb2.DesiredTasks, defaults: RuntimeDefaults) -> DesiredPlans:
    """Every task of a poll's desired set as a plan; one bad task never spoils the others.

    A task whose spec cannot be read or run here becomes an :class:`UnrunnablePlan` (reported
    FAILED with the reason). An entry that names no task (no job id, a negative index) or
    names one a second time cannot be reported and is skipped, with its reason.
    """
    plans: list[TaskPlan] = []
    skipped: list[str] = []
    seen: set[TaskKey] = set()
    for i, task in enumerate(desired.tasks):
        field = f"desired.tasks[{i}]"
        problem = _identity_problem(task, field)
        if problem is not None:
            skipped.append(str(problem))
            continue
        if (task.job_id, task.task_index) in seen:
            skipped.append(f"{field}: names {task.job_id}/{task.task_index} a second time")
            continue
        seen.add((task.job_id, task.task_index))
        try:
            plans.append(task_plan(task, field, defaults))
        except InvalidField as error:
            plans.append(unrunnable_plan(task, f"invalid task plan: {error}"))
    return DesiredPlans(tuple(plans), tuple(skipped))


def task_report(record: HostedTask, now_ms: int) -> borglet_pb2.TaskReport:
    plan = record.plan
    report = borglet_pb2.TaskReport(
        job_id=plan.job_id,
        task_index=plan.task_index,
        incarnation=plan.incarnation,
        state=state_pb2.TASK_STATE_RUNNING if record.alive else state_pb2.TASK_STATE_DEAD,
        limits=resources(plan.limits),
        usage=resources_pb2.Resources(
            cpu_millicores=round(record.cpu_millicores), memory_bytes=record.memory_bytes
        ),
        cpu_throttled=record.cpu_throttled,
        cpu_unmet_millicores=round(record.cpu_unmet_millicores),
        ready=task_ready(record, now_ms),
        restarts=record.restarts,
        started_ms=record.started_ms,
        spec_version=plan.spec_version,
    )
    if not record.alive and record.exit_kind is not None:
        report.exit_reason = EVENT_KINDS[record.exit_kind]
        report.exit_code = record.exit_code
    return report


def task_ready(record: HostedTask, now_ms: int) -> bool:
    """Ready (Autopilot §3.3: no longer initialising): a simulated task after its start-up period;
    a process after its first passing health check (Borg §2.6), or once running if it has none."""
    if record.phase is not Phase.RUNNING:
        return False
    runtime = record.plan.runtime
    if isinstance(runtime, SimulatedPlan):
        return now_ms - record.started_ms >= runtime.startup_seconds * 1000
    if isinstance(runtime, ProcessPlan) and runtime.health_check is not None:
        return record.health.ready
    return True


def reported_event(event: BorgletEvent) -> borglet_pb2.ReportedEvent:
    return borglet_pb2.ReportedEvent(
        sequence=event.sequence,
        event=state_pb2.TaskEvent(
            job_id=event.job_id,
            task_index=event.task_index,
            incarnation=event.incarnation,
            kind=EVENT_KINDS[event.kind],
            state=TASK_STATES[event.state],
            machine_id=event.machine_id,
            event_time_ms=event.event_time_ms,
            cause_id=event.cause_id,
            detail=event.detail,
            limits=resources(event.limits),
            usage=resources_pb2.Resources(
                cpu_millicores=round(event.cpu_millicores), memory_bytes=event.memory_bytes
            ),
        ),
    )


def poll_response(
    machine_id: str,
    now_ms: int,
    desired_version: int,
    records: Iterable[HostedTask],
    events: Iterable[BorgletEvent],
    capacity: Limits,
    memory_pressure: bool,
    packages: Iterable[str],
) -> borglet_pb2.PollResponse:
    reports = [task_report(record, now_ms) for record in records]
    live = [r for r in reports if r.state == state_pb2.TASK_STATE_RUNNING]
    return borglet_pb2.PollResponse(
        machine_id=machine_id,
        event_time_ms=now_ms,
        desired_version=desired_version,
        tasks=reports,
        events=[reported_event(event) for event in events],
        capacity=resources(capacity),
        usage=resources_pb2.Resources(
            cpu_millicores=sum(r.usage.cpu_millicores for r in live),
            memory_bytes=sum(r.usage.memory_bytes for r in live),
        ),
        memory_pressure=memory_pressure,
        cached_package_ids=sorted(packages),
    )


def machine_spec(profile: MachineProfile, borglet_address: str) -> machine_pb2.MachineSpec:
    return machine_pb2.MachineSpec(
        machine_id=profile.machine_id,
        borglet_address=borglet_address,
        capacity=resources(profile.capacity),
        attributes=dict(profile.attributes),
        rack=profile.rack,
        power_domain=profile.power_domain,
        first_port=profile.first_port,
    )


@dataclass(frozen=True)
class SampleChunk:
    """Samples of one batch of event-seconds: the table they were taken on and the result."""

    table: WorldTasks
    identities: Sequence[tuple[str, int, int]]  # (job id, task index, incarnation) per row
    result: WorldStep


def sample_batches(
    chunks: Sequence[SampleChunk],
    machine_ids: Sequence[str],
    next_sequence: dict[str, int],
    max_samples: int,
) -> list[tuple[str, usage_pb2.UsageSampleBatch]]:
    """Per machine, its samples in event-time order, in batches of at most ``max_samples``."""
    batches: dict[str, list[usage_pb2.UsageSampleBatch]] = {}
    for chunk in chunks:
        result = chunk.result
        times = (result.seconds * 1000).tolist()
        cpu, memory, unmet = result.cpu.tolist(), result.memory.tolist(), result.cpu_unmet.tolist()
        throttled, sampled = result.throttled.tolist(), result.sampled.tolist()
        bounds = chunk.table.machine_bounds.tolist()
        for machine_index in range(len(bounds) - 1):
            lo, hi = bounds[machine_index], bounds[machine_index + 1]
            if lo == hi:
                continue
            machine_id = machine_ids[machine_index]
            own = batches.setdefault(machine_id, [])
            for j, time_ms in enumerate(times):
                cpu_j, memory_j, throttled_j, sampled_j = cpu[j], memory[j], throttled[j], sampled[j]
                unmet_j = unmet[j]
                for row in range(lo, hi):
                    if not sampled_j[row]:
                        continue
                    if not own or len(own[-1].samples) >= max_samples:
                        own.append(usage_pb2.UsageSampleBatch(machine_id=machine_id))
                    job_id, task_index, incarnation = chunk.identities[row]
                    own[-1].samples.add(
                        job_id=job_id,
                        task_index=task_index,
                        incarnation=incarnation,
                        event_time_ms=time_ms,
                        cpu_millicores=cpu_j[row],
                        memory_bytes=memory_j[row],
                        cpu_throttled=throttled_j[row],
                        cpu_unmet_millicores=unmet_j[row],
                    )
    out = []
    for machine_id, machine_batches in batches.items():
        for batch in machine_batches:
            batch.batch_sequence = next_sequence[machine_id]
            next_sequence[machine_id] += 1
            out.append((machine_id, batch))
    return out
