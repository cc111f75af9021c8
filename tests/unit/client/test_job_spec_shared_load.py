"""Job spec files with a shared demand and a health check (cellpilot.client.job_spec_file)."""

from __future__ import annotations

import pytest

from cellpilot.client.job_spec_file import JobSpecError, parse_job_spec

HEAD = """
name: web
user: alice
app_class: latency-sensitive
limits: {cpu: 1, memory: 1Gi}
"""


def test_a_shared_demand_model_or_trace_is_read_into_the_runtime() -> None:
    spec = parse_job_spec(
        HEAD
        + """runtime:
  simulated:
    model: steady
    startup_seconds: 60
    demand: {model: weekly, params: {weekend_factor: 0.5}, imbalance: 0.2}
"""
    )
    demand = spec.task.runtime.simulated.demand
    assert (demand.usage_model, dict(demand.params), demand.imbalance) == (
        "weekly",
        {"weekend_factor": 0.5},
        0.2,
    )
    traced = parse_job_spec(
        HEAD
        + """runtime:
  simulated:
    demand: {trace: {step_seconds: 300, cpu_millicores: [100, 250.5], memory_bytes: [1000, 2000]}}
"""
    )
    trace = traced.task.runtime.simulated.demand.trace
    assert (trace.step_seconds, list(trace.cpu_millicores), list(trace.memory_bytes)) == (
        300,
        [100, 250.5],
        [1000, 2000],
    )


def test_a_health_check_is_read_into_the_process_runtime() -> None:
    spec = parse_job_spec(
        HEAD
        + """runtime:
  process:
    command: server
    health_check: {http_url: "http://127.0.0.1:{port}/healthz", interval_ms: 5000, failure_threshold: 4}
"""
    )
    check = spec.task.runtime.process.health_check
    assert (check.http_url, check.interval_ms, check.failure_threshold) == (
        "http://127.0.0.1:{port}/healthz",
        5000,
        4,
    )


@pytest.mark.parametrize(
    ("runtime", "line", "words"),
    [
        ("  simulated:\n    demand: {model: diurnal, params: {cpu_amplitude: 3}}\n", 8, "<= 1"),
        ("  simulated:\n    demand: {modle: steady}\n", 8, "did you mean 'model'"),
        ("  simulated:\n    demand: {trace: {cpu_millicores: [1]}}\n", 8, "step_seconds"),
        (
            "  process:\n    command: server\n    health_check: {http_url: 'http://example.com:80/'}\n",
            9,
            "own machine",
        ),
    ],
    ids=["bad-param", "typo", "trace-without-step", "remote-health-url"],
)
def test_a_bad_demand_or_health_check_names_its_line(runtime: str, line: int, words: str) -> None:
    with pytest.raises(JobSpecError) as error:
        parse_job_spec(HEAD + "runtime:\n" + runtime)
    assert error.value.line == line
    assert words in str(error.value)
