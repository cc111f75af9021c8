"""Validation of what clients send, naming the offending field (INVALID_ARGUMENT).

Every check returns a :class:`Rejection` (or ``None``); nothing here raises on bad input,
so a malformed request can never reach the log or corrupt the state. Field paths are
relative to the request message, e.g. ``spec.task.limits.memory_bytes``.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

from cellpilot.borg.model import (
    AppClass,
    ConstraintKind,
    ConstraintOperator,
    HorizontalSource,
    JobKind,
    JobSpec,
    MachineSpec,
    PriorityBand,
    ProcessRuntime,
    RecommenderKind,
    ScalingMode,
    SimulatedRuntime,
    VerticalScaling,
)
from cellpilot.borg.rejection import Rejection, invalid
from cellpilot.schedule import NUM_PRIORITIES

NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
MACHINE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
MAX_TASKS = 100_000
MAX_PORT = 65_535

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
    elif isinstance(runtime, ProcessRuntime) and not runtime.command:
        return invalid(f"{rf}.process.command", "required")
    elif isinstance(runtime, SimulatedRuntime):
        if not runtime.usage_model and not runtime.trace_uri:
            return invalid(f"{rf}.simulated.usage_model", "a usage model or a trace_uri is required")
        if runtime.duration_seconds < 0:
            return invalid(f"{rf}.simulated.duration_seconds", "must be >= 0")
        if runtime.startup_seconds < 0:
            return invalid(f"{rf}.simulated.startup_seconds", "must be >= 0")
        for name, value in runtime.params:
            if not math.isfinite(value):
                return invalid(f"{rf}.simulated.params", f"{name!r} must be a finite number")
    for i, package in enumerate(spec.task.package_ids):
        if not package:
            return invalid(f"{field}.task.package_ids[{i}]", "must not be empty")
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
