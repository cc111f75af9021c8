"""Admission checks of what a Borglet will run: usage models, their parameters, commands, environments.

A spec that passes these reaches a Borglet; one that fails is refused at the door with the
field named, at submission and at update alike (the merged spec is checked the same way).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from borg_builders import Master, job_spec, machine_spec

from cellpilot.borg.decisions import SubmitJob, UpdateJob
from cellpilot.borg.model import JobSpec, ProcessRuntime, SimulatedRuntime
from cellpilot.borg.rejection import Code, Rejection
from cellpilot.borg.validation import (
    MAX_ARGS,
    MAX_STRING_BYTES,
    validate_job_spec,
    validate_process,
    validate_simulated,
)
from cellpilot.job_vocabulary import PriorityBand
from cellpilot.world.usage_models import model_names, model_parameters

F = "spec.task.runtime.simulated"
P = "spec.task.runtime.process"


def _with_runtime(runtime: ProcessRuntime | SimulatedRuntime) -> JobSpec:
    spec = job_spec()
    return replace(spec, task=replace(spec.task, runtime=runtime))


BAD_SIMULATED = [
    (SimulatedRuntime("nope"), f"{F}.usage_model", "known models: steady"),
    (SimulatedRuntime(""), f"{F}.usage_model", "required"),
    (SimulatedRuntime("steady", trace_uri="file:///t.csv"), f"{F}.trace_uri", "not supported"),
    (
        SimulatedRuntime("diurnal", (("base_cpu_millicores", 300.0),)),
        f"{F}.params.base_cpu_millicores",
        "cpu_mean_millicores",
    ),
    (SimulatedRuntime("steady", (("cpu_millicores", -1.0),)), f"{F}.params.cpu_millicores", ">= 0"),
    (SimulatedRuntime("diurnal", (("cpu_amplitude", 1.5),)), f"{F}.params.cpu_amplitude", "<= 1"),
    (SimulatedRuntime("spiky", (("spike_seconds", 0.0),)), f"{F}.params.spike_seconds", "> 0"),
    (SimulatedRuntime("steady", (("memory_bytes", float("nan")),)), f"{F}.params.memory_bytes", "finite"),
    (SimulatedRuntime("steady", (("memory_bytes", 1e300),)), f"{F}.params.memory_bytes", "magnitude"),
    (SimulatedRuntime("steady", duration_seconds=-1), f"{F}.duration_seconds", "0.."),
    (SimulatedRuntime("steady", startup_seconds=10**12), f"{F}.startup_seconds", "0.."),
]


@pytest.mark.parametrize(
    ("runtime", "field", "words"),
    BAD_SIMULATED,
    ids=[
        "unknown-model",
        "no-model",
        "trace-replay",
        "unknown-parameter",
        "below-minimum",
        "fraction-above-one",
        "must-be-positive",
        "not-finite",
        "absurdly-large",
        "negative-duration",
        "huge-startup",
    ],
)
def test_a_bad_simulated_runtime_is_refused_naming_the_field(
    runtime: SimulatedRuntime, field: str, words: str
) -> None:
    problem = validate_job_spec(_with_runtime(runtime))
    assert problem is not None
    assert (problem.code, problem.field) == (Code.INVALID_ARGUMENT, field)
    assert words in problem.message


def test_an_unknown_parameter_lists_the_models_parameters() -> None:
    problem = validate_simulated(SimulatedRuntime("leak", (("rate", 1.0),)), "x")
    assert problem is not None
    for name in model_parameters("leak"):
        assert name in problem.message


@pytest.mark.parametrize("model", model_names())
def test_every_model_with_every_parameter_at_its_default_is_accepted(model: str) -> None:
    params = tuple((name, p.default) for name, p in model_parameters(model).items())
    assert validate_simulated(SimulatedRuntime(model, params, seed=3, duration_seconds=60), F) is None


BAD_PROCESS = [
    (ProcessRuntime(""), f"{P}.command", "required"),
    (ProcessRuntime("py\0thon"), f"{P}.command", "NUL"),
    (ProcessRuntime("python3 "), f"{P}.command", "whitespace"),
    (ProcessRuntime("/bin/" + "x" * 5000), f"{P}.command", "at most"),
    (ProcessRuntime("echo", ("ok", "b\0d")), f"{P}.args[1]", "NUL"),
    (ProcessRuntime("echo", ("x" * (MAX_STRING_BYTES + 1),)), f"{P}.args[0]", "at most"),
    (ProcessRuntime("echo", ("a",) * (MAX_ARGS + 1)), f"{P}.args", "arguments"),
    (ProcessRuntime("env", env=(("A-B", "1"),)), f"{P}.env", "not a variable name"),
    (ProcessRuntime("env", env=(("", "1"),)), f"{P}.env", "not a variable name"),
    (ProcessRuntime("env", env=(("A", "x\0y"),)), f"{P}.env.A", "NUL"),
    (ProcessRuntime("env", env=(("CELLPILOT_TASK_INDEX", "7"),)), f"{P}.env.CELLPILOT_TASK_INDEX", "Borglet"),
    (ProcessRuntime("echo", ("x" * 100_000,) * 11), P, "bytes"),
]


@pytest.mark.parametrize(
    ("runtime", "field", "words"),
    BAD_PROCESS,
    ids=[
        "no-command",
        "nul-in-command",
        "command-whitespace",
        "command-too-long",
        "nul-in-arg",
        "arg-too-long",
        "too-many-args",
        "env-name-dash",
        "env-name-empty",
        "nul-in-env",
        "reserved-env",
        "exec-too-big",
    ],
)
def test_a_bad_process_runtime_is_refused_naming_the_field(
    runtime: ProcessRuntime, field: str, words: str
) -> None:
    problem = validate_job_spec(_with_runtime(runtime))
    assert problem is not None
    assert (problem.code, problem.field) == (Code.INVALID_ARGUMENT, field)
    assert words in problem.message


@pytest.mark.parametrize(
    "runtime",
    [
        ProcessRuntime("python3", ("-c", "print('hi')"), (("LOG_LEVEL", "info"), ("_X1", ""))),
        ProcessRuntime("/opt/My App/bin/server"),
    ],
    ids=["args-and-env", "path-with-space"],
)
def test_a_good_process_runtime_is_accepted(runtime: ProcessRuntime) -> None:
    assert validate_process(runtime, P) is None


def _master_with_running_job() -> Master:
    master = Master()
    master.add_machines(machine_spec("m0"))
    master.grant("alice", PriorityBand.PRODUCTION)
    master.accept(SubmitJob("s", job_spec()))
    return master


@pytest.mark.parametrize(
    ("runtime", "field"),
    [
        (SimulatedRuntime("nope"), f"{F}.usage_model"),
        (SimulatedRuntime("steady", (("typo", 1.0),)), f"{F}.params.typo"),
        (ProcessRuntime("env", env=(("BAD NAME", "1"),)), f"{P}.env"),
    ],
    ids=["model", "parameter", "env"],
)
def test_submit_and_update_refuse_the_same_runtime_and_log_nothing(
    runtime: ProcessRuntime | SimulatedRuntime, field: str
) -> None:
    master = _master_with_running_job()
    logged = len(master.log)
    bad = _with_runtime(runtime)
    submitted = master.run(SubmitJob("s2", replace(bad, name="other")))
    updated = master.run(UpdateJob("u", "alice/web", bad, ("task.runtime",)))
    for result in (submitted, updated):
        assert isinstance(result, Rejection)
        assert (result.code, result.field) == (Code.INVALID_ARGUMENT, field)
    assert len(master.log) == logged, "a refused request never reaches the log"
