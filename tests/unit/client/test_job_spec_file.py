"""YAML job specs: a valid file becomes the right JobSpec; a bad one names its line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from cellpilot.api.v1 import job_pb2
from cellpilot.client.job_spec_file import JobSpecError, parse_job_spec

VALID = """\
name: web
user: alice
priority: 9
app_class: latency-sensitive
latency_sensitivity: moderate
oom_tolerance: intermediate
task_count: 3
limits: {cpu: 500m, memory: 512Mi, disk: 1Gi, ports: 2}
memory_limit: soft
packages: [web-1.2]
labels: {team: search}
constraints:
  - {attribute: arch, op: "==", value: x86_64}
  - {attribute: ssd, op: exists, soft: true}
runtime:
  simulated: {model: diurnal, params: {cpu_mean_millicores: 300}, seed: 7}
autopilot:
  cpu: {mode: on, min: 100m, max: 4, recommender: ml}
  memory: {mode: dry-run}
  horizontal: {mode: on, min_tasks: 1, max_tasks: 20, target_utilization: 0.7, reference_cpu: 400m}
"""


def test_a_complete_spec_maps_every_field() -> None:
    spec = parse_job_spec(VALID)
    assert (spec.name, spec.user, spec.priority, spec.task_count) == ("web", "alice", 9, 3)
    assert spec.app_class == job_pb2.APP_CLASS_LATENCY_SENSITIVE
    assert spec.latency_sensitivity == job_pb2.LATENCY_SENSITIVITY_MODERATE
    assert spec.oom_tolerance == job_pb2.OOM_TOLERANCE_INTERMEDIATE
    limits = spec.task.limits
    assert (limits.cpu_millicores, limits.memory_bytes, limits.disk_bytes, limits.ports) == (
        500,
        2**29,
        2**30,
        2,
    )
    assert spec.task.memory_limit_kind == job_pb2.MEMORY_LIMIT_KIND_SOFT
    assert list(spec.task.package_ids) == ["web-1.2"]
    assert dict(spec.labels) == {"team": "search"}
    assert [c.kind for c in spec.constraints] == [job_pb2.CONSTRAINT_KIND_HARD, job_pb2.CONSTRAINT_KIND_SOFT]
    assert spec.constraints[1].operator == job_pb2.CONSTRAINT_OPERATOR_EXISTS
    assert spec.task.runtime.simulated.usage_model == "diurnal"
    assert dict(spec.task.runtime.simulated.params) == {"cpu_mean_millicores": 300.0}
    cpu = spec.autopilot.cpu
    assert (cpu.mode, cpu.min_limit, cpu.max_limit) == (job_pb2.SCALING_MODE_ON, 100, 4000)
    assert cpu.recommender.kind == job_pb2.RECOMMENDER_KIND_ML
    assert spec.autopilot.memory.mode == job_pb2.SCALING_MODE_DRY_RUN
    assert spec.autopilot.horizontal.target_utilization == pytest.approx(0.7)
    assert spec.autopilot.horizontal.reference_cpu_millicores == 400


@pytest.mark.parametrize(
    ("text", "line", "path", "words"),
    [
        (
            "name: web\nuser: alice\nlimits: {cpu: 1, memory: 1Gi}\npriority: 12\n",
            4,
            "priority",
            "between 0 and 11",
        ),
        ("name: web\nuser: alice\nlimits: {cpu: lots, memory: 1Gi}\n", 3, "limits.cpu", "millicores"),
        ("name: web\nuser: alice\nlimits:\n  cpu: 1\n  memory: 1Qi\n", 5, "limits.memory", "512Mi"),
        (
            "name: web\nuser: alice\nlimits: {cpu: 1, memory: 1Gi}\npriorty: 3\n",
            4,
            "priorty",
            "did you mean 'priority'",
        ),
        ("name: Web!\nuser: alice\nlimits: {cpu: 1, memory: 1Gi}\n", 1, "name", "a-z"),
        ("name: web\nuser: alice\nlimits: {cpu: 1}\n", 3, "limits", "'memory'"),
        ("name: web\nlimits: {cpu: 1, memory: 1Gi}\n", 1, "", "'user'"),
        ("name: web\nuser: alice\nlimits: {cpu: 1, memory: 1Gi}\napp_class: fast\n", 4, "app_class", "batch"),
        (
            "name: web\nuser: alice\nlimits: {cpu: 1, memory: 1Gi}\nautopilot:\n  cpu: {min: 4, max: 1}\n",
            5,
            "autopilot.cpu.min",
            "above max",
        ),
        (
            "name: web\nuser: alice\nlimits: {cpu: 1, memory: 1Gi}\nautopilot:\n  horizontal: {mode: on}\n",
            5,
            "autopilot.horizontal",
            "target_utilization",
        ),
        ("name: web\nuser: alice\nlimits: {cpu: 1, memory: 1Gi\n", 4, "", "not valid YAML"),
        (
            "name: web\nuser: alice\nlimits: {cpu: 1, memory: 1Gi}\nconstraints:\n  - {op: '=='}\n",
            5,
            "constraints[0]",
            "attribute",
        ),
        ("", 0, "", "empty"),
    ],
    ids=[
        "priority-out-of-range",
        "cpu-not-a-quantity",
        "memory-unknown-unit",
        "misspelt-key-suggests",
        "bad-name",
        "limits-need-memory",
        "missing-user",
        "unknown-enum",
        "bounds-inverted",
        "horizontal-needs-target",
        "broken-yaml",
        "constraint-without-attribute",
        "empty-file",
    ],
)
def test_bad_specs_name_the_line_and_field(text: str, line: int, path: str, words: str) -> None:
    with pytest.raises(JobSpecError) as error:
        parse_job_spec(text)
    assert error.value.line == line
    assert error.value.path == path
    assert words in str(error.value)
    if line:
        assert f"line {line}" in str(error.value)


EXAMPLES = sorted((Path(__file__).parents[3] / "examples").glob("*.yaml"))


def test_the_repository_ships_example_job_specs() -> None:
    assert {p.name for p in EXAMPLES} >= {"web.yaml", "batch.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_job_spec_in_the_repository_parses(path: Path) -> None:
    spec = parse_job_spec(path.read_text())
    assert spec.name, "an example must name its job"
    assert spec.user, "an example must name its user"
    assert spec.task_count >= 1


HEAD = "name: web\nuser: alice\nlimits: {cpu: 1, memory: 1Gi}\n"


@pytest.mark.parametrize(
    ("runtime", "line", "path", "words"),
    [
        ("runtime:\n  simulated: {model: nope}\n", 5, "runtime.simulated.model", "known models: steady"),
        (
            "runtime:\n  simulated:\n    model: diurnal\n    params: {base_cpu_millicores: 300}\n",
            7,
            "runtime.simulated.params.base_cpu_millicores",
            "cpu_mean_millicores",
        ),
        (
            "runtime:\n  simulated: {model: diurnal, params: {cpu_amplitude: 3}}\n",
            5,
            "runtime.simulated.params.cpu_amplitude",
            "<= 1",
        ),
        ("runtime:\n  process: {command: ' python3'}\n", 5, "runtime.process.command", "whitespace"),
        (
            "runtime:\n  process:\n    command: env\n    env: {'1BAD': x}\n",
            7,
            "runtime.process.env",
            "not a variable name",
        ),
        (
            "runtime:\n  process:\n    command: env\n    env: {CELLPILOT_TASK_INDEX: '9'}\n",
            7,
            "runtime.process.env.CELLPILOT_TASK_INDEX",
            "set by the Borglet",
        ),
        ("", 1, "", "runtime: required"),
    ],
    ids=[
        "unknown-model",
        "unknown-parameter",
        "parameter-out-of-range",
        "command-whitespace",
        "env-name",
        "env-reserved",
        "no-runtime",
    ],
)
def test_the_servers_admission_checks_run_before_submission_at_the_line(
    runtime: str, line: int, path: str, words: str
) -> None:
    """The CLI runs the Borgmaster's own validation and points at the YAML that set the field."""
    with pytest.raises(JobSpecError) as error:
        parse_job_spec(HEAD + runtime)
    assert (error.value.line, error.value.path) == (line, path)
    assert words in str(error.value)
    assert "spec.task.runtime" in str(error.value), "the message names the API field too"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_passes_the_servers_own_validation(path: Path) -> None:
    """Not only the CLI's parse: the Borgmaster's conversion and admission checks accept it."""
    from cellpilot.borg.validation import validate_job_spec
    from cellpilot.borg_wire.specs import job_spec_in

    spec = job_spec_in(parse_job_spec(path.read_text()))
    assert validate_job_spec(spec) is None


def test_the_demo_workload_passes_the_servers_own_validation() -> None:
    from cellpilot.borg.validation import validate_job_spec
    from cellpilot.borg_wire.specs import job_spec_in
    from cellpilot.demo.workload import DEMO_JOBS

    assert [validate_job_spec(job_spec_in(job.spec)) for job in DEMO_JOBS] == [None] * len(DEMO_JOBS)
