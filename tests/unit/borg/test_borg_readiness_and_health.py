"""Readiness and health checks (Borg §2.6, Autopilot §3.3), and admission of what they and a job's
shared demand name: the health-check rules, the Borgmaster's view of readiness through poll
reports (a rescheduled task is initialising again), the Borglet's readiness of its tasks."""

from __future__ import annotations

from dataclasses import replace

import pytest
from borg_builders import Master, job_spec, machine_spec

from cellpilot.api.v1 import borglet_pb2, job_pb2
from cellpilot.borg.decisions import SubmitJob
from cellpilot.borg.health_checks import HealthState, record_check, resolve, validate_health_check
from cellpilot.borg.lifecycle import TaskEvent, TaskState
from cellpilot.borg.model import HealthCheck, JobSpec, ProcessRuntime, SharedDemand, SimulatedRuntime
from cellpilot.borg.mutations import TaskStateChanged
from cellpilot.borg.poll_diff import MachineReport, ReportedTask, diff_report
from cellpilot.borg.rejection import Rejection
from cellpilot.borg.soft_state import SoftState
from cellpilot.borg.validation import validate_job_spec
from cellpilot.borg_wire.statuses import task_status_out
from cellpilot.borglet.hosted_task import HostedTask, Limits, ProcessPlan, SimulatedPlan, TaskPlan
from cellpilot.borglet.task_lifecycle import Phase
from cellpilot.job_vocabulary import PriorityBand
from cellpilot_services.borglet import convert as borglet_convert

P = "spec.task.runtime.process.health_check"
D = "spec.task.runtime.simulated.demand"


def _with_runtime(runtime: ProcessRuntime | SimulatedRuntime) -> JobSpec:
    spec = job_spec()
    return replace(spec, task=replace(spec.task, runtime=runtime))


@pytest.mark.parametrize(
    ("check", "field", "words"),
    [
        (HealthCheck(), P, "exactly one"),
        (HealthCheck(http_url="http://127.0.0.1:80/", command=("true",)), P, "exactly one"),
        (HealthCheck(http_url="https://127.0.0.1:80/"), f"{P}.http_url", "http://"),
        (HealthCheck(http_url="http://10.0.0.7:80/"), f"{P}.http_url", "own machine"),
        (HealthCheck(http_url="http://localhost/healthz"), f"{P}.http_url", "port"),
        (HealthCheck(http_url="http://127.0.0.1:{port}/a b"), f"{P}.http_url", "whitespace"),
        (HealthCheck(command=("",)), f"{P}.command[0]", "non-empty"),
        (HealthCheck(command=("true",), interval_ms=-1), f"{P}.interval_ms", "0.."),
        (HealthCheck(command=("true",), failure_threshold=-2), f"{P}.failure_threshold", "0.."),
        (HealthCheck(command=("true",), interval_ms=500, timeout_ms=900), f"{P}.timeout_ms", "longer"),
    ],
    ids=[
        "neither",
        "both",
        "https",
        "other-host",
        "no-port",
        "whitespace",
        "empty-command",
        "negative-interval",
        "negative-threshold",
        "timeout-over-interval",
    ],
)
def test_a_bad_health_check_is_refused_at_admission_naming_the_field(
    check: HealthCheck, field: str, words: str
) -> None:
    problem = validate_job_spec(_with_runtime(ProcessRuntime("server", health_check=check)))
    assert problem is not None
    assert problem.field == field
    assert words in problem.message


@pytest.mark.parametrize(
    "check",
    [HealthCheck(http_url="http://127.0.0.1:{port}/healthz"), HealthCheck(command=("test", "-f", "ready"))],
    ids=["http", "command"],
)
def test_a_good_health_check_is_accepted(check: HealthCheck) -> None:
    assert validate_health_check(check, P) is None
    assert validate_job_spec(_with_runtime(ProcessRuntime("server", health_check=check))) is None


@pytest.mark.parametrize(
    ("demand", "field", "words"),
    [
        (SharedDemand(), f"{D}.usage_model", "required"),
        (SharedDemand("nope"), f"{D}.usage_model", "unknown"),
        (SharedDemand("diurnal", (("cpu_amplitude", 2.0),)), f"{D}.params.cpu_amplitude", "<= 1"),
        (SharedDemand("steady", (("typo", 1.0),)), f"{D}.params.typo", "no parameter"),
        (SharedDemand("steady", imbalance=9.0), f"{D}.imbalance", "0.."),
        (
            SharedDemand(trace_step_seconds=300, trace_cpu_millicores=(1.0, -1.0)),
            f"{D}.trace.cpu_millicores[1]",
            "0..",
        ),
        (SharedDemand(trace_step_seconds=0, trace_cpu_millicores=(1.0,)), f"{D}.trace.step_seconds", "(0,"),
        (
            SharedDemand("steady", trace_step_seconds=60, trace_cpu_millicores=(1.0,)),
            f"{D}.trace",
            "not both",
        ),
    ],
    ids=[
        "no-model",
        "unknown-model",
        "bad-param",
        "unknown-param",
        "imbalance",
        "negative",
        "no-step",
        "both",
    ],
)
def test_a_bad_shared_demand_is_refused_at_admission_naming_the_field(
    demand: SharedDemand, field: str, words: str
) -> None:
    problem = validate_job_spec(_with_runtime(SimulatedRuntime("steady", demand=demand)))
    assert problem is not None
    assert problem.field == field
    assert words in problem.message


def test_a_shared_demand_is_submitted_and_kept_in_the_spec() -> None:
    demand = SharedDemand("diurnal", (("cpu_mean_millicores", 2000.0),), imbalance=0.2)
    trace = SharedDemand(
        trace_step_seconds=300, trace_cpu_millicores=(100.0, 200.0), trace_memory_bytes=(1, 2)
    )
    for shared in (demand, trace):
        master = Master()
        master.grant("alice", PriorityBand.PRODUCTION)
        result = master.run(SubmitJob("s", _with_runtime(SimulatedRuntime("steady", demand=shared))))
        assert not isinstance(result, Rejection), result
        runtime = master.state.jobs["alice/web"].spec.task.runtime
        assert isinstance(runtime, SimulatedRuntime)
        assert runtime.demand == shared


def test_a_task_is_ready_after_its_first_passing_check_and_fails_after_the_threshold() -> None:
    check = resolve(HealthCheck(command=("probe",), failure_threshold=3, initial_delay_ms=5_000))
    state = HealthState()
    # Failures during the start-up period do not count.
    verdict = record_check(check, state, False, "refused", age_seconds=2.0)
    assert (verdict.state.ready, verdict.state.failures, verdict.fail_task) == (False, 0, False)
    verdict = record_check(check, verdict.state, True, "200", age_seconds=6.0)
    assert (verdict.state.ready, verdict.state.failures) == (True, 0)
    for failures in (1, 2):
        verdict = record_check(check, verdict.state, False, "timed out", age_seconds=10.0 + failures)
        assert (verdict.state.failures, verdict.fail_task) == (failures, False)
    verdict = record_check(check, verdict.state, False, "timed out", age_seconds=13.0)
    assert verdict.fail_task
    assert "3 times in a row" in verdict.detail
    assert "timed out" in verdict.detail


def _running(master: Master) -> tuple[str, int]:
    task = master.state.jobs["alice/web"].tasks[0]
    return task.machine_id, task.incarnation


def test_the_masters_task_view_is_ready_only_once_this_incarnation_reported_ready() -> None:
    master = Master()
    master.add_machines(machine_spec("m0"), machine_spec("m1"))
    master.grant("alice", PriorityBand.PRODUCTION)
    master.accept(SubmitJob("s", job_spec(task_count=1)))
    master.schedule()
    machine, incarnation = _running(master)
    soft = SoftState()

    def report(ready: bool) -> None:
        version = master.state.machines[machine].desired_version
        reported = ReportedTask("alice/web", 0, incarnation, TaskState.RUNNING, ready=ready, started_ms=1)
        diff = diff_report(master.state, MachineReport(machine, 2_000_000, version, (reported,)))
        master.commit(diff.mutations)
        soft.task_ready.update(diff.ready)

    def view() -> bool:
        job = master.state.jobs["alice/web"]
        return task_status_out(job, job.tasks[0], soft).ready

    report(False)
    assert not view()  # running, initialising
    report(True)
    assert view()
    # It fails and is rescheduled: the new incarnation is initialising until its Borglet says so.
    master.commit([TaskStateChanged("alice/web", 0, incarnation, TaskState.PENDING, TaskEvent.FAILED, "x")])
    master.schedule()
    machine, incarnation = _running(master)
    assert master.state.jobs["alice/web"].tasks[0].state is TaskState.RUNNING
    assert not view()
    report(True)
    assert view()


def _record(runtime: ProcessPlan | SimulatedPlan, phase: Phase = Phase.RUNNING) -> HostedTask:
    plan = TaskPlan("u/j", 0, 1, 9, 2, Limits(), True, runtime)
    return HostedTask("m0", plan, phase, started_ms=1_000_000)


def test_the_borglet_reports_readiness_after_start_up_or_the_first_passing_check() -> None:
    simulated = _record(SimulatedPlan("steady", (), startup_seconds=30))
    assert not borglet_convert.task_ready(simulated, 1_029_999)
    assert borglet_convert.task_ready(simulated, 1_030_000)
    checked = _record(ProcessPlan("server", health_check=resolve(HealthCheck(command=("probe",)))))
    assert not borglet_convert.task_ready(checked, 9_000_000)
    checked.health = HealthState(ready=True)
    assert borglet_convert.task_ready(checked, 9_000_000)
    assert borglet_convert.task_ready(_record(ProcessPlan("server")), 1_000_000)
    assert not borglet_convert.task_ready(_record(ProcessPlan("server"), Phase.STOPPING), 1_000_000)


@pytest.mark.parametrize(
    ("app_class", "band", "latency_sensitive"),
    [
        (job_pb2.APP_CLASS_LATENCY_SENSITIVE, job_pb2.PRIORITY_BAND_BATCH, True),
        (job_pb2.APP_CLASS_BATCH, job_pb2.PRIORITY_BAND_PRODUCTION, False),
        (job_pb2.APP_CLASS_UNSPECIFIED, job_pb2.PRIORITY_BAND_PRODUCTION, True),
        (job_pb2.APP_CLASS_UNSPECIFIED, job_pb2.PRIORITY_BAND_BEST_EFFORT, False),
    ],
    ids=["ls", "batch", "prod-band", "best-effort-band"],
)
def test_the_borglet_serves_latency_sensitive_tasks_by_app_class_else_band(
    app_class: int, band: int, latency_sensitive: bool
) -> None:
    task = borglet_pb2.TaskAssignment(job_id="u/j", app_class=app_class, band=band)  # type: ignore[arg-type]
    assert borglet_convert.latency_sensitive(task) is latency_sensitive


def test_health_checks_and_shared_demands_survive_the_masters_conversion_both_ways() -> None:
    from cellpilot.borg_wire.specs import runtime_in, runtime_out

    process = job_pb2.RuntimeSpec(
        process=job_pb2.ProcessRuntime(
            command="server",
            health_check=job_pb2.HealthCheck(
                http_url="http://127.0.0.1:{port}/",
                interval_ms=5,
                timeout_ms=4,
                failure_threshold=2,
                initial_delay_ms=3,
            ),
        )
    )
    simulated = job_pb2.RuntimeSpec(
        simulated=job_pb2.SimulatedRuntime(
            usage_model="steady",
            demand=job_pb2.SharedDemand(
                usage_model="",
                imbalance=0.3,
                trace=job_pb2.DemandTrace(step_seconds=60, cpu_millicores=[1, 2], memory_bytes=[3, 4]),
            ),
        )
    )
    for message in (process, simulated):
        assert runtime_out(runtime_in(message)) == message
    core = runtime_in(process)
    assert isinstance(core, ProcessRuntime)
    assert core.health_check == HealthCheck("http://127.0.0.1:{port}/", (), 5, 4, 2, 3)
