"""Job specs as YAML files: parsed into the v1 ``JobSpec`` with errors that point at the line.

Example (every key except ``name``, ``user`` and ``limits`` is optional)::

    name: web
    user: alice
    priority: 9                    # 0-11 (best effort 0-1, batch 2-8, production 9-10, monitoring 11)
    app_class: latency-sensitive   # or batch
    latency_sensitivity: high      # high (S_p95) or moderate (S_p90), Autopilot §3.2.2
    oom_tolerance: low             # low, intermediate or minimal
    task_count: 3
    limits: {cpu: 500m, memory: 512Mi, disk: 1Gi, ports: 1}
    memory_limit: hard             # or soft
    packages: [web-server-1.2]
    labels: {team: search}
    constraints:
      - {attribute: arch, op: "==", value: x86_64}            # hard unless soft: true
    runtime:
      simulated: {model: diurnal, params: {cpu_mean_millicores: 300}, seed: 7}
      # a job-level load shared by the ready tasks (the model above is then each task's base):
      #   simulated: {model: steady, params: {cpu_millicores: 50}, startup_seconds: 60,
      #               demand: {model: diurnal, params: {cpu_mean_millicores: 2000}}}
      # or: process: {command: python3, args: [-c, "..."], env: {LOG_LEVEL: info},
      #               health_check: {http_url: "http://127.0.0.1:{port}/healthz", interval_ms: 10000}}
    autopilot:
      cpu: {mode: on, min: 100m, max: 4, recommender: auto}
      memory: {mode: dry-run}
      horizontal: {mode: on, min_tasks: 1, max_tasks: 20, target_utilization: 0.7,
                   reference_cpu: 500m}   # r* is a share of this fixed per-task size (needed
                                          # with vertical CPU on, or the two loops never settle)

CPU quantities are cores (``0.5``, ``2``) or millicores (``500m``); memory and disk are bytes
or ``Ki/Mi/Gi/Ti`` (binary) and ``K/M/G/T`` (decimal) suffixed numbers.

After parsing, the spec goes through the Borgmaster's own admission checks
(:func:`cellpilot.borg.validation.validate_job_spec`, after the Borgmaster's own conversion), so
a file the server would refuse — an unknown usage model or parameter, a command exec cannot
run — is reported here, at its line, before anything is sent.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml

from cellpilot.api.v1 import job_pb2, resources_pb2
from cellpilot.borg.validation import validate_job_spec
from cellpilot.borg_wire.specs import job_spec_in
from cellpilot.platform.request_validation import InvalidField

# Where each API field of the spec came from: its path relative to JobSpec (as the Borgmaster's
# validation names it, without the leading "spec.") -> the YAML node that set it.
Locations = dict[str, "_Node"]
N = TypeVar("N", int, float)


@dataclass(frozen=True)
class JobSpecError(Exception):
    """A problem in a job spec file: where (line, column, field path) and what."""

    path: str
    line: int
    column: int
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}, column {self.column}" if self.line else "the file"
        field = f" ({self.path})" if self.path else ""
        return f"{where}{field}: {self.message}"


class _Node:
    """A YAML node with its position, so every error can name its line."""

    def __init__(self, node: yaml.Node, path: str) -> None:
        self.node = node
        self.path = path

    def error(self, message: str) -> JobSpecError:
        mark = self.node.start_mark
        return JobSpecError(self.path, mark.line + 1, mark.column + 1, message)

    def scalar(self) -> str:
        if not isinstance(self.node, yaml.ScalarNode):
            raise self.error("expected a single value")
        return str(self.node.value)

    def mapping(self, allowed: set[str]) -> dict[str, _Node]:
        if not isinstance(self.node, yaml.MappingNode):
            raise self.error("expected a mapping of keys to values")
        result: dict[str, _Node] = {}
        for key_node, value_node in self.node.value:
            key = str(key_node.value)
            child = _Node(value_node, f"{self.path}.{key}" if self.path else key)
            if key not in allowed:
                close = difflib.get_close_matches(key, sorted(allowed), n=1)
                hint = (
                    f"; did you mean {close[0]!r}?"
                    if close
                    else f"; known keys: {', '.join(sorted(allowed))}"
                )
                raise _Node(key_node, child.path).error(f"unknown key {key!r}{hint}")
            if key in result:
                raise _Node(key_node, child.path).error(f"key {key!r} appears twice")
            result[key] = child
        return result

    def sequence(self) -> list[_Node]:
        if not isinstance(self.node, yaml.SequenceNode):
            raise self.error("expected a list")
        return [_Node(item, f"{self.path}[{i}]") for i, item in enumerate(self.node.value)]

    def integer(self, low: int, high: int) -> int:
        return self._bounded(int, "a whole number", low, high)

    def number(self, low: float, high: float) -> float:
        return self._bounded(float, "a number", low, high)

    def _bounded(self, parse: Callable[[str], N], expected: str, low: N, high: N) -> N:
        text = self.scalar()
        try:
            value = parse(text)
        except ValueError:
            raise self.error(f"expected {expected}, got {text!r}") from None
        if not low <= value <= high:
            raise self.error(f"must be between {low} and {high}, got {value}")
        return value

    def boolean(self) -> bool:
        text = self.scalar().lower()
        if text in ("true", "yes", "on"):
            return True
        if text in ("false", "no", "off"):
            return False
        raise self.error(f"expected true or false, got {text!r}")

    def choice(self, options: Mapping[str, int]) -> Any:  # an enum ValueType of the generated code
        text = self.scalar().lower().replace("_", "-")
        if text not in options:
            raise self.error(f"must be one of {', '.join(options)}, got {text!r}")
        return options[text]

    def name(self) -> str:
        text = self.scalar()
        if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{0,62}", text):
            raise self.error(
                "must be 1-63 characters of a-z, 0-9, '.', '_' or '-', starting with a letter or digit"
            )
        return text


_MEMORY_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
                 "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}  # fmt: skip
MAX_CPU_MILLICORES = 10_000_000  # 10 000 cores: beyond any machine
MAX_BYTES = 2**50  # 1 PiB


def _millicores(node: _Node) -> int:
    text = node.scalar().strip().lower()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(m?)", text)
    if match is None:
        raise node.error(f"expected cores (e.g. 0.5, 2) or millicores (e.g. 500m), got {text!r}")
    value = float(match.group(1)) * (1 if match.group(2) else 1000)
    if value > MAX_CPU_MILLICORES:
        raise node.error(f"{text} is more CPU than any machine has")
    return round(value)


def _bytes(node: _Node) -> int:
    text = node.scalar().strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGTkmgt]i?)?[Bb]?", text)
    if match is None:
        raise node.error(f"expected bytes or a size like 512Mi or 2Gi, got {text!r}")
    value = float(match.group(1)) * _MEMORY_UNITS[(match.group(2) or "").lower()]
    if value > MAX_BYTES:
        raise node.error(f"{text} is larger than 1 PiB")
    return round(value)


def _options(enum: Any, prefix: str) -> dict[str, int]:
    return {
        name.removeprefix(prefix).lower().replace("_", "-"): value
        for name, value in enum.items()
        if not name.endswith("_UNSPECIFIED")
    }


APP_CLASSES = _options(job_pb2.AppClass, "APP_CLASS_")
SENSITIVITIES = _options(job_pb2.LatencySensitivity, "LATENCY_SENSITIVITY_")
OOM_TOLERANCES = _options(job_pb2.OomTolerance, "OOM_TOLERANCE_")
MEMORY_LIMIT_KINDS = _options(job_pb2.MemoryLimitKind, "MEMORY_LIMIT_KIND_")
SCALING_MODES = _options(job_pb2.ScalingMode, "SCALING_MODE_")
RECOMMENDERS = _options(job_pb2.RecommenderKind, "RECOMMENDER_KIND_")
STATISTICS = _options(job_pb2.HorizontalStatistic, "HORIZONTAL_STATISTIC_")
SOURCES = _options(job_pb2.HorizontalSource, "HORIZONTAL_SOURCE_")
OPERATORS = {"==": job_pb2.CONSTRAINT_OPERATOR_EQUAL, "!=": job_pb2.CONSTRAINT_OPERATOR_NOT_EQUAL,
             "<": job_pb2.CONSTRAINT_OPERATOR_LESS_THAN, ">": job_pb2.CONSTRAINT_OPERATOR_GREATER_THAN,
             "exists": job_pb2.CONSTRAINT_OPERATOR_EXISTS,
             "not-exists": job_pb2.CONSTRAINT_OPERATOR_NOT_EXISTS}  # fmt: skip


def _limits(node: _Node, where: Locations) -> resources_pb2.Resources:
    fields = node.mapping({"cpu", "memory", "disk", "ports"})
    for required in ("cpu", "memory"):
        if required not in fields:
            raise node.error(f"limits need {required!r}")
    where["task.limits"] = node
    for key, api in (
        ("cpu", "cpu_millicores"),
        ("memory", "memory_bytes"),
        ("disk", "disk_bytes"),
        ("ports", "ports"),
    ):
        if key in fields:
            where[f"task.limits.{api}"] = fields[key]
    return resources_pb2.Resources(
        cpu_millicores=_millicores(fields["cpu"]),
        memory_bytes=_bytes(fields["memory"]),
        disk_bytes=_bytes(fields["disk"]) if "disk" in fields else 0,
        ports=fields["ports"].integer(0, 1000) if "ports" in fields else 0,
    )


def _constraint(node: _Node, index: int, where: Locations) -> job_pb2.Constraint:
    fields = node.mapping({"attribute", "op", "value", "soft"})
    where[f"constraints[{index}]"] = node
    for key, api in (("attribute", "attribute"), ("op", "operator"), ("value", "value"), ("soft", "kind")):
        if key in fields:
            where[f"constraints[{index}].{api}"] = fields[key]
    if "attribute" not in fields or "op" not in fields:
        raise node.error("a constraint needs 'attribute' and 'op'")
    op = fields["op"].choice(OPERATORS)
    needs_value = op not in (job_pb2.CONSTRAINT_OPERATOR_EXISTS, job_pb2.CONSTRAINT_OPERATOR_NOT_EXISTS)
    if needs_value and "value" not in fields:
        raise node.error(f"op {fields['op'].scalar()!r} needs a 'value'")
    soft = fields["soft"].boolean() if "soft" in fields else False
    return job_pb2.Constraint(
        attribute=fields["attribute"].scalar(),
        operator=op,
        value=fields["value"].scalar() if "value" in fields else "",
        kind=job_pb2.CONSTRAINT_KIND_SOFT if soft else job_pb2.CONSTRAINT_KIND_HARD,
    )


# YAML keys whose API field has another name.
_SIMULATED_API = {"model": "usage_model", "trace": "trace_uri"}
_VERTICAL_API = {"min": "min_limit", "max": "max_limit", "custom_recommender": "recommender.custom_name"}


def _runtime(node: _Node, where: Locations) -> job_pb2.RuntimeSpec:
    fields = node.mapping({"simulated", "process"})
    if len(fields) != 1:
        raise node.error("runtime needs exactly one of 'simulated' or 'process'")
    where["task.runtime"] = node
    if "process" in fields:
        p = fields["process"].mapping({"command", "args", "env", "health_check"})
        if "command" not in p:
            raise fields["process"].error("a process runtime needs a 'command'")
        where["task.runtime.process"] = fields["process"]
        where["task.runtime.process.command"] = p["command"]
        env = {}
        if "env" in p:
            where["task.runtime.process.env"] = p["env"]
            for name, value in p["env"].mapping(set(_keys(p["env"]))).items():
                env[name] = value.scalar()
                where[f"task.runtime.process.env.{name}"] = value
        args = []
        if "args" in p:
            where["task.runtime.process.args"] = p["args"]
            for i, arg in enumerate(p["args"].sequence()):
                args.append(arg.scalar())
                where[f"task.runtime.process.args[{i}]"] = arg
        process = job_pb2.ProcessRuntime(command=p["command"].scalar(), args=args, env=env)
        if "health_check" in p:
            process.health_check.CopyFrom(_health_check(p["health_check"], where))
        return job_pb2.RuntimeSpec(process=process)
    s = fields["simulated"].mapping(
        {"model", "params", "seed", "duration_seconds", "startup_seconds", "trace", "demand"}
    )
    where["task.runtime.simulated"] = fields["simulated"]
    for key, node_of_key in s.items():
        where[f"task.runtime.simulated.{_SIMULATED_API.get(key, key)}"] = node_of_key
    simulated = job_pb2.SimulatedRuntime(
        usage_model=s["model"].scalar() if "model" in s else "steady",
        params=_params(s["params"], "task.runtime.simulated.params", where) if "params" in s else {},
        trace_uri=s["trace"].scalar() if "trace" in s else "",
        seed=s["seed"].integer(0, 2**63 - 1) if "seed" in s else 0,
        duration_seconds=s["duration_seconds"].integer(0, 10**9) if "duration_seconds" in s else 0,
        startup_seconds=s["startup_seconds"].integer(0, 10**6) if "startup_seconds" in s else 0,
    )
    if "demand" in s:
        simulated.demand.CopyFrom(_demand(s["demand"], where))
    return job_pb2.RuntimeSpec(simulated=simulated)


def _params(node: _Node, prefix: str, where: Locations) -> dict[str, float]:
    params = {}
    for name, value in node.mapping(set(_keys(node))).items():
        params[name] = value.number(-1e18, 1e18)
    for key_node, _ in node.node.value:  # a misnamed parameter: point at its name
        name = str(key_node.value)
        where[f"{prefix}.{name}"] = _Node(key_node, f"{node.path}.{name}")
    return params


def _numbers(node: _Node) -> list[float]:
    return [item.number(-1e18, 1e18) for item in node.sequence()]


def _demand(node: _Node, where: Locations) -> job_pb2.SharedDemand:
    """``demand: {model: diurnal, params: {...}, imbalance: 0.1}`` or ``{trace: {step_seconds: 300,
    cpu_millicores: [...], memory_bytes: [...]}}``: the job's load, shared by its ready tasks."""
    prefix = "task.runtime.simulated.demand"
    d = node.mapping({"model", "params", "trace", "imbalance"})
    where[prefix] = node
    for key, child in d.items():
        where[f"{prefix}.{_SIMULATED_API.get(key, key) if key == 'model' else key}"] = child
    demand = job_pb2.SharedDemand(
        usage_model=d["model"].scalar() if "model" in d else "",
        params=_params(d["params"], f"{prefix}.params", where) if "params" in d else {},
        imbalance=d["imbalance"].number(0.0, 1e6) if "imbalance" in d else 0.0,
    )
    if "trace" in d:
        t = d["trace"].mapping({"step_seconds", "cpu_millicores", "memory_bytes"})
        for key, child in t.items():
            where[f"{prefix}.trace.{key}"] = child
        if "step_seconds" not in t or "cpu_millicores" not in t:
            raise d["trace"].error("a demand trace needs step_seconds and cpu_millicores")
        demand.trace.CopyFrom(
            job_pb2.DemandTrace(
                step_seconds=t["step_seconds"].integer(1, 10**7),
                cpu_millicores=_numbers(t["cpu_millicores"]),
                memory_bytes=[round(v) for v in _numbers(t["memory_bytes"])] if "memory_bytes" in t else [],
            )
        )
    return demand


_HEALTH_NUMBERS = ("interval_ms", "timeout_ms", "initial_delay_ms")


def _health_check(node: _Node, where: Locations) -> job_pb2.HealthCheck:
    """``health_check: {http_url: "http://127.0.0.1:{port}/healthz", interval_ms: 10000, ...}`` or
    ``{command: [test, -f, ready], ...}`` (Borg §2.6)."""
    prefix = "task.runtime.process.health_check"
    h = node.mapping({"http_url", "command", "failure_threshold", *_HEALTH_NUMBERS})
    where[prefix] = node
    for key, child in h.items():
        where[f"{prefix}.{key}"] = child
    check = job_pb2.HealthCheck(
        http_url=h["http_url"].scalar() if "http_url" in h else "",
        command=[item.scalar() for item in h["command"].sequence()] if "command" in h else [],
        failure_threshold=h["failure_threshold"].integer(0, 10**6) if "failure_threshold" in h else 0,
    )
    for name in _HEALTH_NUMBERS:
        if name in h:
            setattr(check, name, h[name].integer(0, 10**12))
    return check


def _keys(node: _Node) -> list[str]:
    if not isinstance(node.node, yaml.MappingNode):
        raise node.error("expected a mapping of keys to values")
    return [str(k.value) for k, _ in node.node.value]


def _vertical(
    node: _Node, quantity: Callable[[_Node], int], prefix: str, where: Locations
) -> job_pb2.VerticalScalingConfig:
    fields = node.mapping({"mode", "min", "max", "recommender", "custom_recommender"})
    where[prefix] = node
    for key, node_of_key in fields.items():
        where[f"{prefix}.{_VERTICAL_API.get(key, key)}"] = node_of_key
    config = job_pb2.VerticalScalingConfig(
        mode=fields["mode"].choice(SCALING_MODES) if "mode" in fields else job_pb2.SCALING_MODE_ON,
        min_limit=quantity(fields["min"]) if "min" in fields else 0,
        max_limit=quantity(fields["max"]) if "max" in fields else 0,
    )
    if config.min_limit and config.max_limit and config.min_limit > config.max_limit:
        raise fields["min"].error("min is above max")
    if "recommender" in fields:
        config.recommender.kind = fields["recommender"].choice(RECOMMENDERS)
        if config.recommender.kind == job_pb2.RECOMMENDER_KIND_CUSTOM:
            if "custom_recommender" not in fields:
                raise fields["recommender"].error("recommender 'custom' needs 'custom_recommender: NAME'")
            config.recommender.custom_name = fields["custom_recommender"].name()
    return config


_HORIZONTAL_KEYS = {"mode", "min_tasks", "max_tasks", "source", "target_utilization", "statistic",
                    "averaging_window_seconds", "horizon_seconds", "target_size_recommender",
                    "deferred_downscaling_seconds", "slow_decay_half_period_seconds",
                    "small_change_fraction", "max_initializing_fraction", "reference_cpu"}  # fmt: skip


def _horizontal(node: _Node, where: Locations) -> job_pb2.HorizontalScalingConfig:
    f = node.mapping(_HORIZONTAL_KEYS)
    where["autopilot.horizontal"] = node
    for key, value in f.items():
        where[f"autopilot.horizontal.{key}"] = value
    h = job_pb2.HorizontalScalingConfig(
        mode=f["mode"].choice(SCALING_MODES) if "mode" in f else job_pb2.SCALING_MODE_ON
    )
    for key in ("min_tasks", "max_tasks"):
        if key in f:
            setattr(h, key, f[key].integer(0, 100_000))
    for key in ("averaging_window_seconds", "horizon_seconds", "deferred_downscaling_seconds",
                "slow_decay_half_period_seconds"):  # fmt: skip
        if key in f:
            setattr(h, key, f[key].integer(1, 10**8))
    for key, low in (
        ("target_utilization", 0.01),
        ("small_change_fraction", 0.0),
        ("max_initializing_fraction", 0.0),
    ):
        if key in f:
            setattr(h, key, f[key].number(low, 1.0))
    if "source" in f:
        h.source = f["source"].choice(SOURCES)
    if "statistic" in f:
        h.statistic = f["statistic"].choice(STATISTICS)
    if "target_size_recommender" in f:
        h.target_size_recommender = f["target_size_recommender"].name()
    if "reference_cpu" in f:  # the per-task size r* is a fraction of (e.g. 500m)
        h.reference_cpu_millicores = _millicores(f["reference_cpu"])
    if h.min_tasks and h.max_tasks and h.min_tasks > h.max_tasks:
        raise f["min_tasks"].error("min_tasks is above max_tasks")
    if (
        h.source != job_pb2.HORIZONTAL_SOURCE_TARGET_SIZE
        and h.mode != job_pb2.SCALING_MODE_OFF
        and not h.target_utilization
    ):
        raise node.error(
            "horizontal scaling on CPU utilisation needs target_utilization (r*, Autopilot §3.3)"
        )
    return h


_TOP_KEYS = {"name", "user", "priority", "app_class", "latency_sensitivity", "oom_tolerance", "task_count",
             "limits", "memory_limit", "packages", "labels", "constraints", "runtime", "autopilot",
             "alloc_set"}  # fmt: skip


def parse_job_spec(text: str) -> job_pb2.JobSpec:
    """Parse and validate one job spec document; raises :class:`JobSpecError` naming line and field."""
    spec, where = _parse(text)
    check_job_spec(spec, where)
    return spec


def check_job_spec(spec: job_pb2.JobSpec, where: Locations | None = None) -> None:
    """The Borgmaster's admission checks (one implementation), reported at the YAML node."""
    where = where or {}
    try:
        problem = validate_job_spec(job_spec_in(spec, "spec"))
    except InvalidField as error:
        field, message = error.field, error.message
    else:
        if problem is None:
            return
        field, message = problem.field, problem.message
    relative = field.removeprefix("spec.").removeprefix("spec")
    node = _closest(where, relative)
    if node is None:
        raise JobSpecError("", 0, 0, f"{field}: {message}")
    # The field's own node: name the API field after the message; an ancestor's: before it.
    exact = where.get(relative) is node
    raise node.error(f"{message} ({field})" if exact else f"{field}: {message}")


def _closest(where: Locations, path: str) -> _Node | None:
    """The node of ``path``, or of its nearest recorded ancestor (``a.b[2].c`` -> ``a.b[2]`` -> ``a.b``)."""
    while path:
        if path in where:
            return where[path]
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return where.get("")


def _parse(text: str) -> tuple[job_pb2.JobSpec, Locations]:
    try:
        document = yaml.compose(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line, column = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        raise JobSpecError("", line, column, f"not valid YAML: {getattr(error, 'problem', error)}") from None
    if document is None:
        raise JobSpecError("", 0, 0, "the file is empty")
    root = _Node(document, "")
    f = root.mapping(_TOP_KEYS)
    for required in ("name", "user", "limits"):
        if required not in f:
            raise root.error(f"missing required key {required!r}")
    where: Locations = {"": root}
    api_names = {"memory_limit": "task.memory_limit_kind", "packages": "task.package_ids",
                 "alloc_set": "alloc_set_job_id"}  # fmt: skip
    for key, node in f.items():
        where[api_names.get(key, key)] = node
    spec = job_pb2.JobSpec(
        name=f["name"].name(),
        user=f["user"].name(),
        priority=f["priority"].integer(0, 11) if "priority" in f else 2,
        task_count=f["task_count"].integer(0, 100_000) if "task_count" in f else 1,
        app_class=f["app_class"].choice(APP_CLASSES) if "app_class" in f else job_pb2.APP_CLASS_BATCH,
    )
    if "latency_sensitivity" in f:
        spec.latency_sensitivity = f["latency_sensitivity"].choice(SENSITIVITIES)
    if "oom_tolerance" in f:
        spec.oom_tolerance = f["oom_tolerance"].choice(OOM_TOLERANCES)
    spec.task.limits.CopyFrom(_limits(f["limits"], where))
    if "memory_limit" in f:
        spec.task.memory_limit_kind = f["memory_limit"].choice(MEMORY_LIMIT_KINDS)
    if "packages" in f:
        for i, package in enumerate(f["packages"].sequence()):
            spec.task.package_ids.append(package.scalar())
            where[f"task.package_ids[{i}]"] = package
    if "runtime" in f:
        spec.task.runtime.CopyFrom(_runtime(f["runtime"], where))
    if "labels" in f:
        for key, value in f["labels"].mapping(set(_keys(f["labels"]))).items():
            spec.labels[key] = value.scalar()
    if "constraints" in f:
        spec.constraints.extend(_constraint(c, i, where) for i, c in enumerate(f["constraints"].sequence()))
    if "alloc_set" in f:
        spec.alloc_set_job_id = f["alloc_set"].scalar()
    if "autopilot" in f:
        a = f["autopilot"].mapping({"cpu", "memory", "horizontal"})
        if "cpu" in a:
            spec.autopilot.cpu.CopyFrom(_vertical(a["cpu"], _millicores, "autopilot.cpu", where))
        if "memory" in a:
            spec.autopilot.memory.CopyFrom(_vertical(a["memory"], _bytes, "autopilot.memory", where))
        if "horizontal" in a:
            spec.autopilot.horizontal.CopyFrom(_horizontal(a["horizontal"], where))
    return spec, where
