"""Fuzzing the YAML job spec parser: thousands of malformed files give a JobSpecError, never a crash.

Three kinds of input (about 2 300 per run, a few seconds): arbitrary text, well-formed YAML
documents built from the spec's own keys with wrong shapes and hostile values, and
character-level mutations of a valid spec.
"""

from __future__ import annotations

import random

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cellpilot.api.v1 import job_pb2
from cellpilot.client.job_spec_file import JobSpecError, parse_job_spec

VALID = """\
name: web
user: alice
priority: 9
app_class: latency-sensitive
task_count: 3
limits: {cpu: 500m, memory: 512Mi, disk: 1Gi, ports: 2}
memory_limit: soft
packages: [web-1.2]
labels: {team: search}
constraints:
  - {attribute: arch, op: "==", value: x86_64}
runtime:
  simulated: {model: diurnal, params: {cpu_mean_millicores: 300}, seed: 7}
autopilot:
  cpu: {mode: on, min: 100m, max: 4, recommender: ml}
  memory: {mode: dry-run}
  horizontal: {mode: on, min_tasks: 1, max_tasks: 20, target_utilization: 0.7, reference_cpu: 500m}
"""

KEYS = [
    "name", "user", "priority", "app_class", "latency_sensitivity", "oom_tolerance", "task_count",
    "limits", "memory_limit", "packages", "labels", "constraints", "runtime", "autopilot", "alloc_set",
    "cpu", "memory", "disk", "ports", "attribute", "op", "value", "soft", "simulated", "process",
    "command", "args", "env", "model", "params", "seed", "duration_seconds", "startup_seconds", "trace",
    "horizontal", "mode", "min", "max", "recommender", "custom_recommender", "min_tasks", "max_tasks",
    "target_utilization", "source", "statistic", "nmae", "",
]  # fmt: skip
HOSTILE_SCALARS: list[object] = [
    "500m", "0.5", "1Gi", "2Ti", "9" * 40, "1e309", "-1", "nan", "inf", "-.inf", "on", "off", "dry-run",
    "custom", "==", "exists", "x86_64", "", " ", "\x00", "\ud800", "a" * 300, "~", "*a", "&a", "- x",
    0, -1, 12, 2**63, -(2**70), 0.5, float("inf"), float("nan"), 1e-320, True, False, None,
]  # fmt: skip


def _document(rng: random.Random, depth: int = 0) -> object:
    """A random YAML value: the spec's own keys, wrong shapes, hostile scalars.

    Built from a seed with ``random`` rather than with recursive strategies, so a run affords
    a thousand documents in a few seconds.
    """
    roll = rng.random()
    if depth >= 4 or roll < 0.45:
        return rng.choice(HOSTILE_SCALARS)
    if roll < 0.6:
        return [_document(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(KEYS): _document(rng, depth + 1) for _ in range(rng.randint(0, 6))}


def _parse_cleanly(text: str) -> None:
    outcome: job_pb2.JobSpec | JobSpecError
    try:
        outcome = parse_job_spec(text)
    except JobSpecError as error:  # anything else escapes and fails the test
        outcome = error
    if isinstance(outcome, JobSpecError):
        assert str(outcome)
        assert outcome.line >= 0
        assert outcome.column >= 0
    else:
        assert outcome.name
        assert outcome.user


def _dump(document: object) -> str | None:
    try:
        dumper = yaml.CSafeDumper if yaml.__with_libyaml__ else yaml.SafeDumper
        return yaml.dump(document, Dumper=dumper, allow_unicode=True)
    except (yaml.YAMLError, UnicodeEncodeError):
        return None


@settings(max_examples=1000, deadline=None)
@given(st.text(max_size=80))
def test_arbitrary_text_is_a_clean_error(text: str) -> None:
    _parse_cleanly(text)


@settings(max_examples=800, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_wrongly_shaped_yaml_documents_are_a_clean_error(seed: int, top_mapping: bool) -> None:
    rng = random.Random(seed)
    document = _document(rng, 1 if top_mapping else 0)
    if top_mapping:  # the usual shape: a mapping of the spec's keys
        document = {rng.choice(KEYS): _document(rng, 1) for _ in range(rng.randint(1, 10))}
    text = _dump(document)
    if text is not None:
        _parse_cleanly(text)


# Short, so one parse is cheap, but touching every kind of node the parser reads.
COMPACT = """\
name: web
user: alice
limits: {cpu: 500m, memory: 1Gi}
constraints: [{attribute: arch, op: "==", value: x86_64}]
runtime: {simulated: {params: {cpu_noise: 0.3}, seed: 7}}
autopilot: {cpu: {mode: on, min: 100m}, horizontal: {target_utilization: 0.7, reference_cpu: 1}}
"""


@st.composite
def _mutations(draw: st.DrawFn) -> str:
    text = COMPACT
    for _ in range(draw(st.integers(1, 4))):
        position = draw(st.integers(0, len(text)))
        edit = draw(st.sampled_from(["delete", "insert", "replace"]))
        insert = draw(st.sampled_from([*list(":{}[],-#&*!|>'\"%@` \t\n"), "�", "\\", "0", "x"]))
        if edit == "delete":
            text = text[:position] + text[position + draw(st.integers(1, 8)) :]
        elif edit == "insert":
            text = text[:position] + insert + text[position:]
        else:
            text = text[:position] + insert + text[position + 1 :]
    return text


@settings(max_examples=500, deadline=None)
@given(_mutations())
def test_mutated_valid_specs_are_a_clean_error_or_a_spec(text: str) -> None:
    _parse_cleanly(text)


def test_the_unmutated_specs_parse() -> None:
    assert parse_job_spec(VALID).task.limits.cpu_millicores == 500
    assert parse_job_spec(COMPACT).autopilot.cpu.min_limit == 100
