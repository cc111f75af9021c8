"""Borg's specs on the v1 wire: enums, resources, job and machine specs (docs/architecture.md rule 2).

The one place where the API's spec messages meet the Borg core's plain data, shared by the
Borgmaster, the checkpoint codec, the job-spec file format and the CLI. Inbound conversions
raise :class:`InvalidField` (naming the field) for values the core's types cannot hold
(negative resources, unknown enum numbers); everything else the core validates.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from enum import Enum
from typing import Any, TypeVar

from google.protobuf.message import Message

from cellpilot.api.v1 import (
    job_pb2,
    machine_pb2,
    resources_pb2,
    state_pb2,
)
from cellpilot.borg import model as m
from cellpilot.borg.lifecycle import TaskEvent, TaskState
from cellpilot.job_vocabulary import (
    AppClass,
    ConstraintKind,
    ConstraintOperator,
    HorizontalSource,
    HorizontalStatistic,
    JobKind,
    LatencySensitivity,
    MemoryLimitKind,
    OomTolerance,
    PriorityBand,
    RecommenderKind,
    ScalingMode,
)
from cellpilot.platform.request_validation import InvalidField
from cellpilot.platform.wire_enums import UnknownWireValueError, wire_enum
from cellpilot.schedule import Resources

E = TypeVar("E", bound=Enum)


# ---------------------------------------------------------------------- enums
def enum_in(core: type[E], wrapper: Any, value: int, field: str) -> E:
    """The core member of an API enum value (same name, without the API's prefix)."""
    try:
        return wire_enum(core, wrapper).to_core(value)
    except UnknownWireValueError as error:
        raise InvalidField(field, str(error)) from None


def enum_out(wrapper: Any, member: Enum) -> Any:
    """The API enum value of a core enum member (same name, without the API's prefix)."""
    return wire_enum(type(member), wrapper).to_wire(member)


def task_event_out(event: TaskEvent) -> Any:
    kind = TaskEvent.FAILED if event is TaskEvent.FAILED_FOR_GOOD else event
    return enum_out(state_pb2.TaskEventKind, kind)


def task_event_in(value: int, state: TaskState, field: str) -> TaskEvent:
    event = enum_in(TaskEvent, state_pb2.TaskEventKind, value, field)
    if event is TaskEvent.FAILED and state is TaskState.DEAD:
        return TaskEvent.FAILED_FOR_GOOD
    return event


# ---------------------------------------------------------------------- fields named alike
def same_named(source: Any, names: Iterable[str]) -> dict[str, Any]:
    """``source``'s fields ``names``, as keyword arguments for the other side's type: a core
    record and its message name these fields alike and hold them alike (numbers, strings)."""
    return {name: getattr(source, name) for name in names}


# Where every change stands in the log (TaskEvent, JobEvent and MachineEvent alike).
LOGGED = ("event_time_ms", "log_sequence", "cause_id")
LEADER_FIELDS = ("replica_id", "address", "epoch")
# A request already applied (the checkpoint's AppliedRequest and the core's alike).
APPLIED_REQUEST_FIELDS = ("request_id", "sequence", "job_id", "method", "digest")


# ---------------------------------------------------------------------- resources
PB_RESOURCE_FIELDS = ("cpu_millicores", "memory_bytes", "disk_bytes", "ports")


def resources_in(msg: resources_pb2.Resources, field: str) -> Resources:
    cpu, ram, disk, ports = msg.cpu_millicores, msg.memory_bytes, msg.disk_bytes, msg.ports
    if cpu < 0 or ram < 0 or disk < 0 or ports < 0:
        for name in PB_RESOURCE_FIELDS:
            if getattr(msg, name) < 0:
                raise InvalidField(f"{field}.{name}", "must be >= 0")
    return Resources(float(cpu), float(ram), float(disk), float(ports))


def resources_out(r: Resources | None) -> resources_pb2.Resources:
    if r is None:
        return resources_pb2.Resources()
    return resources_pb2.Resources(
        cpu_millicores=round(r.cpu),
        memory_bytes=round(r.ram),
        disk_bytes=round(r.disk),
        ports=round(r.ports),
    )


# ---------------------------------------------------------------------- specs
def _vertical_in(msg: job_pb2.VerticalScalingConfig, f: str) -> m.VerticalScaling:
    return m.VerticalScaling(
        enum_in(ScalingMode, job_pb2.ScalingMode, msg.mode, f"{f}.mode"),
        msg.min_limit,
        msg.max_limit,
        enum_in(RecommenderKind, job_pb2.RecommenderKind, msg.recommender.kind, f"{f}.recommender.kind"),
        msg.recommender.custom_name,
    )


def _vertical_out(v: m.VerticalScaling) -> job_pb2.VerticalScalingConfig:
    return job_pb2.VerticalScalingConfig(
        mode=enum_out(job_pb2.ScalingMode, v.mode),
        min_limit=v.min_limit,
        max_limit=v.max_limit,
        recommender=job_pb2.RecommenderRef(
            kind=enum_out(job_pb2.RecommenderKind, v.recommender), custom_name=v.custom_name
        ),
    )


HORIZONTAL_PLAIN = (
    "min_tasks",
    "max_tasks",
    "target_utilization",
    "averaging_window_seconds",
    "horizon_seconds",
    "target_size_recommender",
    "deferred_downscaling_seconds",
    "slow_decay_half_period_seconds",
    "small_change_fraction",
    "max_initializing_fraction",
    "reference_cpu_millicores",
)


def _horizontal_in(msg: job_pb2.HorizontalScalingConfig, f: str) -> m.HorizontalScaling:
    return m.HorizontalScaling(
        mode=enum_in(ScalingMode, job_pb2.ScalingMode, msg.mode, f"{f}.mode"),
        source=enum_in(HorizontalSource, job_pb2.HorizontalSource, msg.source, f"{f}.source"),
        statistic=enum_in(HorizontalStatistic, job_pb2.HorizontalStatistic, msg.statistic, f"{f}.statistic"),
        **same_named(msg, HORIZONTAL_PLAIN),
    )


def _horizontal_out(h: m.HorizontalScaling) -> job_pb2.HorizontalScalingConfig:
    return job_pb2.HorizontalScalingConfig(
        mode=enum_out(job_pb2.ScalingMode, h.mode),
        source=enum_out(job_pb2.HorizontalSource, h.source),
        statistic=enum_out(job_pb2.HorizontalStatistic, h.statistic),
        **same_named(h, HORIZONTAL_PLAIN),
    )


HEALTH_CHECK_PLAIN = ("http_url", "interval_ms", "timeout_ms", "failure_threshold", "initial_delay_ms")


def health_check_in(msg: job_pb2.HealthCheck) -> m.HealthCheck:
    return m.HealthCheck(command=tuple(msg.command), **same_named(msg, HEALTH_CHECK_PLAIN))


def health_check_out(check: m.HealthCheck) -> job_pb2.HealthCheck:
    return job_pb2.HealthCheck(command=check.command, **same_named(check, HEALTH_CHECK_PLAIN))


def demand_in(msg: job_pb2.SharedDemand) -> m.SharedDemand:
    t = msg.trace
    params = tuple(sorted(msg.params.items()))
    return m.SharedDemand(
        msg.usage_model, params, t.step_seconds, tuple(t.cpu_millicores), tuple(t.memory_bytes), msg.imbalance
    )


def demand_out(d: m.SharedDemand) -> job_pb2.SharedDemand:
    out = job_pb2.SharedDemand(usage_model=d.usage_model, params=dict(d.params), imbalance=d.imbalance)
    if d.has_trace:
        out.trace.step_seconds = d.trace_step_seconds
        out.trace.cpu_millicores.extend(d.trace_cpu_millicores)
        out.trace.memory_bytes.extend(d.trace_memory_bytes)
    return out


SIMULATED_PLAIN = ("usage_model", "trace_uri", "seed", "duration_seconds", "startup_seconds")


def runtime_in(msg: job_pb2.RuntimeSpec) -> m.Runtime:
    case = msg.WhichOneof("runtime")
    if case == "process":
        p = msg.process
        check = health_check_in(p.health_check) if p.HasField("health_check") else None
        return m.ProcessRuntime(p.command, tuple(p.args), tuple(sorted(p.env.items())), check)
    if case == "simulated":
        s = msg.simulated
        return m.SimulatedRuntime(
            params=tuple(sorted(s.params.items())),
            demand=demand_in(s.demand) if s.HasField("demand") else None,
            **same_named(s, SIMULATED_PLAIN),
        )
    return None


def runtime_out(runtime: m.Runtime) -> job_pb2.RuntimeSpec:
    if isinstance(runtime, m.ProcessRuntime):
        process = job_pb2.ProcessRuntime(command=runtime.command, args=runtime.args, env=dict(runtime.env))
        if runtime.health_check is not None:
            process.health_check.CopyFrom(health_check_out(runtime.health_check))
        return job_pb2.RuntimeSpec(process=process)
    if isinstance(runtime, m.SimulatedRuntime):
        simulated = job_pb2.SimulatedRuntime(
            params=dict(runtime.params), **same_named(runtime, SIMULATED_PLAIN)
        )
        if runtime.demand is not None:
            simulated.demand.CopyFrom(demand_out(runtime.demand))
        return job_pb2.RuntimeSpec(simulated=simulated)
    return job_pb2.RuntimeSpec()


def task_spec_in(msg: job_pb2.TaskSpec, f: str) -> m.TaskSpec:
    return m.TaskSpec(
        resources_in(msg.limits, f"{f}.limits"),
        enum_in(MemoryLimitKind, job_pb2.MemoryLimitKind, msg.memory_limit_kind, f"{f}.memory_limit_kind"),
        runtime_in(msg.runtime),
        tuple(msg.package_ids),
    )


def task_spec_out(
    spec: m.TaskSpec, limits: Resources | None = None, memory_limit_kind: MemoryLimitKind | None = None
) -> job_pb2.TaskSpec:
    return job_pb2.TaskSpec(
        limits=resources_out(limits or spec.limits),
        memory_limit_kind=enum_out(job_pb2.MemoryLimitKind, memory_limit_kind or spec.memory_limit_kind),
        runtime=runtime_out(spec.runtime),
        package_ids=spec.package_ids,
    )


def job_spec_in(msg: job_pb2.JobSpec, f: str = "spec") -> m.JobSpec:
    constraints = tuple(
        m.Constraint(
            c.attribute,
            enum_in(
                ConstraintOperator, job_pb2.ConstraintOperator, c.operator, f"{f}.constraints[{i}].operator"
            ),
            c.value,
            enum_in(ConstraintKind, job_pb2.ConstraintKind, c.kind, f"{f}.constraints[{i}].kind"),
        )
        for i, c in enumerate(msg.constraints)
    )
    a = msg.autopilot
    return m.JobSpec(
        name=msg.name,
        user=msg.user,
        priority=msg.priority,
        task=task_spec_in(msg.task, f"{f}.task"),
        task_count=msg.task_count,
        band=enum_in(PriorityBand, job_pb2.PriorityBand, msg.band, f"{f}.band"),
        app_class=enum_in(AppClass, job_pb2.AppClass, msg.app_class, f"{f}.app_class"),
        latency_sensitivity=enum_in(
            LatencySensitivity,
            job_pb2.LatencySensitivity,
            msg.latency_sensitivity,
            f"{f}.latency_sensitivity",
        ),
        oom_tolerance=enum_in(OomTolerance, job_pb2.OomTolerance, msg.oom_tolerance, f"{f}.oom_tolerance"),
        kind=enum_in(JobKind, job_pb2.JobKind, msg.kind, f"{f}.kind"),
        constraints=constraints,
        autopilot=m.AutopilotConfig(
            _vertical_in(a.cpu, f"{f}.autopilot.cpu"),
            _vertical_in(a.memory, f"{f}.autopilot.memory"),
            _horizontal_in(a.horizontal, f"{f}.autopilot.horizontal"),
        ),
        alloc_set_job_id=msg.alloc_set_job_id,
        labels=tuple(sorted(msg.labels.items())),
    )


def job_spec_out(spec: m.JobSpec) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name=spec.name,
        user=spec.user,
        priority=spec.priority,
        band=enum_out(job_pb2.PriorityBand, spec.band),
        app_class=enum_out(job_pb2.AppClass, spec.app_class),
        latency_sensitivity=enum_out(job_pb2.LatencySensitivity, spec.latency_sensitivity),
        oom_tolerance=enum_out(job_pb2.OomTolerance, spec.oom_tolerance),
        kind=enum_out(job_pb2.JobKind, spec.kind),
        task_count=spec.task_count,
        task=task_spec_out(spec.task),
        constraints=[
            job_pb2.Constraint(
                attribute=c.attribute,
                operator=enum_out(job_pb2.ConstraintOperator, c.operator),
                value=c.value,
                kind=enum_out(job_pb2.ConstraintKind, c.kind),
            )
            for c in spec.constraints
        ],
        autopilot=job_pb2.AutopilotConfig(
            cpu=_vertical_out(spec.autopilot.cpu),
            memory=_vertical_out(spec.autopilot.memory),
            horizontal=_horizontal_out(spec.autopilot.horizontal),
        ),
        alloc_set_job_id=spec.alloc_set_job_id,
        labels=dict(spec.labels),
    )


def payload_digest(request: Message) -> str:
    """A digest of a mutating request without its ``request_id``, as the client sent it: a
    retry carries the same bytes, so the same digest; another request reusing the id does not."""
    payload = type(request)()
    payload.CopyFrom(request)
    payload.ClearField("request_id")  # type: ignore[arg-type]
    return hashlib.sha256(payload.SerializeToString(deterministic=True)).hexdigest()[:32]


MACHINE_SPEC_PLAIN = ("machine_id", "borglet_address", "rack", "power_domain", "first_port")


def machine_spec_in(msg: machine_pb2.MachineSpec, f: str = "spec") -> m.MachineSpec:
    return m.MachineSpec(
        capacity=resources_in(msg.capacity, f"{f}.capacity"),
        attributes=tuple(sorted(msg.attributes.items())),
        **same_named(msg, MACHINE_SPEC_PLAIN),
    )


def machine_spec_out(spec: m.MachineSpec) -> machine_pb2.MachineSpec:
    return machine_pb2.MachineSpec(
        capacity=resources_out(spec.capacity),
        attributes=dict(spec.attributes),
        **same_named(spec, MACHINE_SPEC_PLAIN),
    )
