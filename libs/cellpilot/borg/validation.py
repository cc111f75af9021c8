"""Validation of what clients send, naming the offending field (INVALID_ARGUMENT).

Every check returns a :class:`Rejection` (or ``None``); nothing here raises on bad input,
so a malformed request can never reach the log or corrupt the state. Field paths are
relative to the request message, e.g. ``spec.task.limits.memory_bytes``.

Admission checks everything a Borglet will interpret (Borg §2.3: a job's tasks run what its
spec names), so that one typo fails at the door instead of on every machine the task lands
on: the simulated runtime's usage model and each of its parameters against the model
registry (:mod:`cellpilot.world.usage_models`), and a process runtime's command, arguments
and environment as the Borglet's process runtime will hand them to ``exec``, a process's
health check (:mod:`cellpilot.borg.health_checks`), and a job's shared demand (its model and
parameters, or its trace: :mod:`cellpilot.world.job_demand`). What can still
go wrong on a machine (a command missing there) fails that task, not the machine's poll.
The CLI runs the same :func:`validate_job_spec` before it sends a spec.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

import numpy as np

from cellpilot.borg.health_checks import validate_health_check
from cellpilot.borg.model import (
    JobSpec,
    MachineSpec,
    ProcessRuntime,
    SharedDemand,
    SimulatedRuntime,
    VerticalScaling,
)
from cellpilot.borg.rejection import Rejection, invalid
from cellpilot.job_vocabulary import (
    AppClass,
    ConstraintKind,
    ConstraintOperator,
    HorizontalSource,
    JobKind,
    PriorityBand,
    RecommenderKind,
    ScalingMode,
)
from cellpilot.schedule import NUM_PRIORITIES
from cellpilot.world.job_demand import DemandError, DemandSeries, JobDemand
from cellpilot.world.usage_models import model_names, model_parameters, resolve_params

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
MACHINE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
MAX_TASKS = 100_000
MAX_PORT = 65_535

# What a process runtime may hand to exec (the Borglet's process runtime runs the command with
# these arguments and this environment). Linux caps one argument or environment string at
# 128 KiB (MAX_ARG_STRLEN) and all of them together at ARG_MAX (2 MiB by default); the
# Borglet adds a few variables of its own (PATH, HOME, CELLPILOT_TASK_*); a task gets half.
MAX_COMMAND_BYTES = 4_096  # PATH_MAX
MAX_STRING_BYTES = 128 * 1024
MAX_ARGS = 4_096
MAX_ENV = 1_024
MAX_EXEC_BYTES = 1 << 20
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,255}$")
# The Borglet sets CELLPILOT_TASK_* and CELLPILOT_MACHINE_ID for every task: a job cannot.
RESERVED_ENV_PREFIX = "CELLPILOT_"
# A simulated task's durations and parameters (seconds; the models' units): beyond these no
# model means anything, and numbers this large overflow the Borglet's integer usage.
MAX_SIMULATED_SECONDS = 10**9
MAX_PARAM_MAGNITUDE = 1e18
MAX_PACKAGE_ID_BYTES = 256

# UpdateJob's update_mask paths (borgmaster.proto) and the JobSpec fields they replace.
UPDATABLE_PATHS: dict[str, tuple[str, ...]] = {
    "task_count": ("task_count",),
    "priority": ("priority",),
    "band": ("band",),
    "app_class": ("app_class",),
    "latency_sensitivity": ("latency_sensitivity",),
    "oom_tolerance": ("oom_tolerance",),
    "task": ("task",),
    "task.limits": ("task", "limits"),
    "task.limits.cpu_millicores": ("task", "limits", "cpu"),
    "task.limits.memory_bytes": ("task", "limits", "ram"),
    "task.limits.disk_bytes": ("task", "limits", "disk"),
    "task.limits.ports": ("task", "limits", "ports"),
    "task.memory_limit_kind": ("task", "memory_limit_kind"),
    "task.runtime": ("task", "runtime"),
    "task.package_ids": ("task", "package_ids"),
    "constraints": ("constraints",),
    "autopilot": ("autopilot",),
    "autopilot.cpu": ("autopilot", "cpu"),
    "autopilot.memory": ("autopilot", "memory"),
    "autopilot.horizontal": ("autopilot", "horizontal"),
    "labels": ("labels",),
}
IMMUTABLE_PATHS = ("name", "user", "kind", "alloc_set_job_id")


def _set_path(obj: Any, path: tuple[str, ...], source: Any) -> Any:
    """``obj`` with the attribute at ``path`` taken from ``source`` (frozen dataclasses)."""
    head = path[0]
    if len(path) == 1:
        return replace(obj, **{head: getattr(source, head)})
    return replace(obj, **{head: _set_path(getattr(obj, head), path[1:], getattr(source, head))})


def merge_update(
    old: JobSpec, new: JobSpec, mask: tuple[str, ...], prefix: str = "spec"
) -> JobSpec | Rejection:
    """The spec after an update that takes the fields named in ``mask`` from ``new``."""
    merged = old
    for path in mask:
        if path in IMMUTABLE_PATHS:
            return invalid("update_mask", f"{prefix}.{path} cannot be changed by an update")
        target = UPDATABLE_PATHS.get(path)
        if target is None:
            known = ", ".join(sorted(UPDATABLE_PATHS))
            return invalid("update_mask", f"unknown path {path!r}; updatable paths: {known}")
        merged = _set_path(merged, target, new)
    return merged


def validate_vertical(v: VerticalScaling, field: str) -> Rejection | None:
    if v.min_limit < 0:
        return invalid(f"{field}.min_limit", "must be >= 0")
    if v.max_limit < 0:
        return invalid(f"{field}.max_limit", "must be >= 0")
    if v.min_limit and v.max_limit and v.min_limit > v.max_limit:
        return invalid(f"{field}.min_limit", f"{v.min_limit} is above max_limit {v.max_limit}")
    if v.recommender is RecommenderKind.CUSTOM and not v.custom_name:
        return invalid(f"{field}.recommender.custom_name", "required when the recommender kind is CUSTOM")
    if v.recommender is not RecommenderKind.CUSTOM and v.custom_name:
        return invalid(f"{field}.recommender.custom_name", "only allowed when the recommender kind is CUSTOM")
    return None


def validate_autopilot(spec: JobSpec, field: str) -> Rejection | None:
    a = spec.autopilot
    for name, vertical in (("cpu", a.cpu), ("memory", a.memory)):
        problem = validate_vertical(vertical, f"{field}.{name}")
        if problem:
            return problem
    h, hf = a.horizontal, f"{field}.horizontal"
    for name in ("min_tasks", "max_tasks", "averaging_window_seconds", "horizon_seconds"):
        if getattr(h, name) < 0:
            return invalid(f"{hf}.{name}", "must be >= 0")
    for name in ("deferred_downscaling_seconds", "slow_decay_half_period_seconds"):
        if getattr(h, name) < 0:
            return invalid(f"{hf}.{name}", "must be >= 0")
    if h.max_tasks and h.min_tasks > h.max_tasks:
        return invalid(f"{hf}.min_tasks", f"{h.min_tasks} is above max_tasks {h.max_tasks}")
    for name in ("small_change_fraction", "max_initializing_fraction"):
        value = getattr(h, name)
        if not (math.isfinite(value) and 0.0 <= value <= 1.0):
            return invalid(f"{hf}.{name}", "must be a fraction in [0, 1]")
    if h.mode is not ScalingMode.OFF and h.mode is not ScalingMode.UNSPECIFIED:
        if h.source is HorizontalSource.TARGET_SIZE:
            if not h.target_size_recommender:
                return invalid(f"{hf}.target_size_recommender", "required when the source is TARGET_SIZE")
        elif not (math.isfinite(h.target_utilization) and 0.0 < h.target_utilization <= 1.0):
            return invalid(f"{hf}.target_utilization", "must be in (0, 1] when the source is CPU_UTILIZATION")
        elif a.cpu.mode is ScalingMode.ON and h.reference_cpu_millicores <= 0:
            return invalid(
                f"{hf}.reference_cpu_millicores",
                "required (> 0) when vertical CPU scaling is ON too: CPU utilisation measured against "
                "a limit Autopilot keeps changing does not converge; give the per-task size r* is a "
                "fraction of",
            )
    if h.reference_cpu_millicores < 0:
        return invalid(f"{hf}.reference_cpu_millicores", "must be >= 0")
    return None


def validate_runtime(runtime: ProcessRuntime | SimulatedRuntime, field: str) -> Rejection | None:
    """What a Borglet will run: ``field`` is the path of the ``RuntimeSpec``."""
    if isinstance(runtime, ProcessRuntime):
        return validate_process(runtime, f"{field}.process")
    return validate_simulated(runtime, f"{field}.simulated")


def _bad_string(text: str, limit: int) -> str:
    """Why ``text`` cannot be one exec string ("" if it can)."""
    if "\0" in text:
        return "must not contain a NUL byte"
    if len(text.encode()) > limit:
        return f"must be at most {limit} bytes"
    return ""


def validate_process(runtime: ProcessRuntime, field: str) -> Rejection | None:
    """A command line and environment the Borglet's process runtime can exec."""
    command = runtime.command
    if not command:
        return invalid(f"{field}.command", "required: an executable path, or a name on the task's PATH")
    problem = _bad_string(command, MAX_COMMAND_BYTES)
    if problem:
        return invalid(f"{field}.command", problem)
    if command != command.strip():
        return invalid(f"{field}.command", "has leading or trailing whitespace; put arguments in args")
    if len(runtime.args) > MAX_ARGS:
        return invalid(f"{field}.args", f"at most {MAX_ARGS} arguments, got {len(runtime.args)}")
    total = len(command.encode()) + 1
    for i, arg in enumerate(runtime.args):
        problem = _bad_string(arg, MAX_STRING_BYTES)
        if problem:
            return invalid(f"{field}.args[{i}]", problem)
        total += len(arg.encode()) + 1
    if len(runtime.env) > MAX_ENV:
        return invalid(f"{field}.env", f"at most {MAX_ENV} variables, got {len(runtime.env)}")
    for name, value in runtime.env:
        if not ENV_NAME.match(name):
            return invalid(f"{field}.env", f"{name!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if name.startswith(RESERVED_ENV_PREFIX):
            return invalid(
                f"{field}.env.{name}", f"names starting with {RESERVED_ENV_PREFIX} are set by the Borglet"
            )
        problem = _bad_string(value, MAX_STRING_BYTES)
        if problem:
            return invalid(f"{field}.env.{name}", problem)
        total += len(name.encode()) + len(value.encode()) + 2
    if total > MAX_EXEC_BYTES:
        return invalid(
            field, f"the command line and environment take {total} bytes; at most {MAX_EXEC_BYTES}"
        )
    if runtime.health_check is not None:
        problem_at = validate_health_check(runtime.health_check, f"{field}.health_check")
        if problem_at:
            return invalid(*problem_at)
    return None


def demand_in(demand: SharedDemand, seed: int) -> JobDemand:
    """The core model of a job's shared demand; a ``DemandError`` names the bad field."""
    trace = None
    if demand.has_trace:
        try:
            trace = DemandSeries(
                demand.trace_step_seconds, np.asarray(demand.trace_cpu_millicores),
                np.asarray(demand.trace_memory_bytes),
            )  # fmt: skip
        except DemandError as error:
            raise DemandError(f"trace.{error.field}", error.message) from error
    return JobDemand.build(demand.usage_model, dict(demand.params), trace, demand.imbalance, seed)


def validate_demand(demand: SharedDemand, seed: int, field: str) -> Rejection | None:
    """A job demand a Borglet can evaluate: a known model with its parameters, or a valid trace."""
    for name, value in demand.params:
        if not math.isfinite(value) or abs(value) > MAX_PARAM_MAGNITUDE:
            return invalid(
                f"{field}.params.{name}",
                f"must be a finite number of magnitude at most {MAX_PARAM_MAGNITUDE:g}",
            )
    try:
        demand_in(demand, seed)
    except DemandError as error:
        return invalid(f"{field}.{error.field}" if error.field else field, error.message)
    return None


def validate_simulated(runtime: SimulatedRuntime, field: str) -> Rejection | None:
    """A usage model of the registry, with parameters it has, in their ranges."""
    known = model_names()
    if runtime.trace_uri:
        return invalid(
            f"{field}.trace_uri", "trace replay is not supported by the Borglet; name a usage_model instead"
        )
    model = runtime.usage_model
    if not model:
        return invalid(f"{field}.usage_model", f"required: one of {', '.join(known)}")
    if model not in known:
        return invalid(
            f"{field}.usage_model", f"unknown usage model {model!r}; known models: {', '.join(known)}"
        )
    allowed = model_parameters(model)
    for name, value in runtime.params:
        pf = f"{field}.params.{name}"
        if name not in allowed:
            return invalid(
                pf, f"usage model {model!r} has no parameter {name!r}; its parameters: {', '.join(allowed)}"
            )
        if not math.isfinite(value) or abs(value) > MAX_PARAM_MAGNITUDE:
            return invalid(pf, f"must be a finite number of magnitude at most {MAX_PARAM_MAGNITUDE:g}")
        try:
            resolve_params(model, {name: value})
        except ValueError as error:
            return invalid(pf, str(error))
    for name in ("duration_seconds", "startup_seconds"):
        value = getattr(runtime, name)
        if not 0 <= value <= MAX_SIMULATED_SECONDS:
            return invalid(f"{field}.{name}", f"must be in 0..{MAX_SIMULATED_SECONDS}, got {value}")
    if runtime.demand is not None:
        return validate_demand(runtime.demand, runtime.seed, f"{field}.demand")
    return None


def validate_job_spec(spec: JobSpec, field: str = "spec") -> Rejection | None:
    """The checks that need no state (Borg §2.3 job properties, §2.5 priorities)."""
    if not spec.name:
        return invalid(f"{field}.name", "required")
    if not NAME.match(spec.name):
        return invalid(f"{field}.name", "must match [a-z0-9][a-z0-9._-]* (at most 128 characters)")
    if not spec.user:
        return invalid(f"{field}.user", "required")
    if not NAME.match(spec.user):
        return invalid(f"{field}.user", "must match [a-z0-9][a-z0-9._-]* (at most 128 characters)")
    if not 0 <= spec.priority < NUM_PRIORITIES:
        return invalid(f"{field}.priority", f"must be in 0..{NUM_PRIORITIES - 1}, got {spec.priority}")
    if spec.band is not PriorityBand.UNSPECIFIED and spec.band is not spec.effective_band:
        return invalid(
            f"{field}.band",
            f"priority {spec.priority} is in band {spec.effective_band.name}, not {spec.band.name}",
        )
    if spec.app_class is AppClass.UNSPECIFIED:
        return invalid(f"{field}.app_class", "required: LATENCY_SENSITIVE or BATCH")
    if not 1 <= spec.task_count <= MAX_TASKS:
        return invalid(f"{field}.task_count", f"must be in 1..{MAX_TASKS}, got {spec.task_count}")
    limits = spec.task.limits
    lf = f"{field}.task.limits"
    if limits.cpu <= 0:
        return invalid(f"{lf}.cpu_millicores", "must be > 0")
    if limits.ram <= 0:
        return invalid(f"{lf}.memory_bytes", "must be > 0")
    if limits.ports > MAX_PORT:
        return invalid(f"{lf}.ports", f"must be at most {MAX_PORT}")
    runtime = spec.task.runtime
    rf = f"{field}.task.runtime"
    if spec.kind is JobKind.ALLOC_SET:
        if runtime is not None:
            return invalid(rf, "must be empty for an alloc set")
        if spec.alloc_set_job_id:
            return invalid(f"{field}.alloc_set_job_id", "an alloc set cannot run inside another alloc set")
    elif runtime is None:
        return invalid(rf, "required: process or simulated")
    else:
        problem = validate_runtime(runtime, rf)
        if problem:
            return problem
    for i, package in enumerate(spec.task.package_ids):
        if not package:
            return invalid(f"{field}.task.package_ids[{i}]", "must not be empty")
        if "\0" in package or len(package.encode()) > MAX_PACKAGE_ID_BYTES:
            return invalid(
                f"{field}.task.package_ids[{i}]", f"must be at most {MAX_PACKAGE_ID_BYTES} bytes, without NUL"
            )
    for i, c in enumerate(spec.constraints):
        cf = f"{field}.constraints[{i}]"
        if not c.attribute:
            return invalid(f"{cf}.attribute", "required")
        if c.operator is ConstraintOperator.UNSPECIFIED:
            return invalid(f"{cf}.operator", "required")
        if c.kind is ConstraintKind.UNSPECIFIED:
            return invalid(f"{cf}.kind", "required: HARD or SOFT")
        if c.operator in (ConstraintOperator.LESS_THAN, ConstraintOperator.GREATER_THAN):
            try:
                number = float(c.value)
            except ValueError:
                return invalid(f"{cf}.value", f"{c.value!r} is not a number")
            if not math.isfinite(number):
                return invalid(f"{cf}.value", "must be finite")
    for key, _ in spec.labels:
        if not key:
            return invalid(f"{field}.labels", "label keys must not be empty")
    return validate_autopilot(spec, f"{field}.autopilot")


def validate_machine_spec(spec: MachineSpec, field: str = "spec") -> Rejection | None:
    if not spec.machine_id:
        return invalid(f"{field}.machine_id", "required")
    if not MACHINE_ID.match(spec.machine_id):
        return invalid(
            f"{field}.machine_id", "must match [A-Za-z0-9][A-Za-z0-9._:-]* (at most 128 characters)"
        )
    host, _, port = spec.borglet_address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) <= MAX_PORT:
        return invalid(f"{field}.borglet_address", f"must be host:port, got {spec.borglet_address!r}")
    if spec.capacity.cpu <= 0:
        return invalid(f"{field}.capacity.cpu_millicores", "must be > 0")
    if spec.capacity.ram <= 0:
        return invalid(f"{field}.capacity.memory_bytes", "must be > 0")
    if not 0 <= spec.first_port <= MAX_PORT:
        return invalid(f"{field}.first_port", f"must be in 0..{MAX_PORT}")
    if spec.capacity.ports and spec.first_port == 0:
        return invalid(f"{field}.first_port", "required when capacity.ports > 0")
    if spec.first_port + spec.capacity.ports - 1 > MAX_PORT:
        return invalid(f"{field}.capacity.ports", f"the port range would pass {MAX_PORT}")
    for key, _ in spec.attributes:
        if not key:
            return invalid(f"{field}.attributes", "attribute names must not be empty")
    return None
