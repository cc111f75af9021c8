"""The Borglet service's small pieces: event clock, request conversion and validation, sample
batching, settings parsing (the pure per-machine logic is tested in test_borglet_machine_state)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from borglet_plan_builders import task_plan

from cellpilot.api.v1 import borglet_pb2, job_pb2, resources_pb2, state_pb2
from cellpilot.borg.lifecycle import TaskEvent
from cellpilot.borglet.hosted_task import HostedTask, SimulatedPlan, UnrunnablePlan
from cellpilot.borglet.task_lifecycle import Phase
from cellpilot.platform.request_validation import InvalidField
from cellpilot.world.step import WorldStep, WorldTasks
from cellpilot_services.borglet import convert
from cellpilot_services.borglet.convert import RuntimeDefaults, SampleChunk
from cellpilot_services.borglet.event_clock import ClockAnchor, EventClock
from cellpilot_services.borglet.settings import BorgletSettings
from cellpilot_services.borglet.task_sandbox import MINIMAL_PATH

DEFAULTS = RuntimeDefaults()


# ----- event clock ---------------------------------------------------------------------------


def test_event_clock_runs_speedup_times_faster_than_the_wall() -> None:
    wall = [100.0]
    clock = EventClock(speedup=60, start_ms=1_000_000, monotonic=lambda: wall[0])
    assert clock.now_ms() == 1_000_000
    wall[0] += 2.5
    assert clock.now_ms() == 1_000_000 + 150_000
    assert clock.wall_seconds_until(1_000_000 + 210_000) == pytest.approx(1.0)
    assert clock.wall_seconds_until(0) == 0.0
    with pytest.raises(ValueError, match="speedup"):
        EventClock(speedup=0)


@pytest.mark.parametrize(
    ("start_ms", "not_before_ms", "expected"),
    [(1_000, None, 1_000), (1_000, 5_000, 5_000), (9_000, 5_000, 9_000)],
    ids=["no-anchor", "resumes-after-the-last-boot", "never-backwards-from-a-later-start"],
)
def test_event_clock_starts_no_earlier_than_its_anchor(
    start_ms: int, not_before_ms: int | None, expected: int
) -> None:
    assert EventClock(speedup=60, start_ms=start_ms, not_before_ms=not_before_ms).start_ms == expected


def test_clock_anchor_keeps_the_event_time_across_boots_and_names_a_damaged_file(tmp_path: Path) -> None:
    anchor = ClockAnchor(tmp_path / "borglet" / "clock-r0.json")
    assert anchor.load() is None, "no boot wrote one yet"
    anchor.save(1_795_559_100_000)
    assert anchor.load() == 1_795_559_100_000
    assert not list(tmp_path.rglob("*.partial")), "written whole, then renamed"
    anchor.path.write_text("{not json")
    with pytest.raises(ValueError, match=r"clock-r0\.json: not a Borglet clock anchor"):
        anchor.load()


# ----- conversion and validation ----------------------------------------------------------------


def _assignment(**spec_fields: object) -> borglet_pb2.TaskAssignment:
    return borglet_pb2.TaskAssignment(
        job_id="u/j", task_index=2, incarnation=3, priority=4, spec=job_pb2.TaskSpec(**spec_fields)
    )


@pytest.mark.parametrize(
    ("assignment", "field"),
    [
        (borglet_pb2.TaskAssignment(task_index=0), "task.job_id"),
        (borglet_pb2.TaskAssignment(job_id="u/j", task_index=-1), "task.task_index"),
        (_assignment(limits=resources_pb2.Resources(memory_bytes=-1)), "task.spec.limits.memory_bytes"),
        (
            _assignment(runtime=job_pb2.RuntimeSpec(process=job_pb2.ProcessRuntime())),
            "task.spec.runtime.process.command",
        ),
        (
            _assignment(runtime=job_pb2.RuntimeSpec(simulated=job_pb2.SimulatedRuntime(usage_model="nope"))),
            "task.spec.runtime.simulated.usage_model",
        ),
        (
            _assignment(
                runtime=job_pb2.RuntimeSpec(simulated=job_pb2.SimulatedRuntime(params={"bogus": 1.0}))
            ),
            "task.spec.runtime.simulated.params",
        ),
        (
            _assignment(runtime=job_pb2.RuntimeSpec(simulated=job_pb2.SimulatedRuntime(trace_uri="x.csv"))),
            "task.spec.runtime.simulated.trace_uri",
        ),
        (_assignment(memory_limit_kind=9), "task.spec.memory_limit_kind"),
    ],
    ids=[
        "no-job",
        "negative-index",
        "negative-limit",
        "no-command",
        "unknown-model",
        "unknown-param",
        "trace",
        "kind",
    ],
)
def test_invalid_assignments_name_the_field(assignment: borglet_pb2.TaskAssignment, field: str) -> None:
    with pytest.raises(InvalidField) as error:
        convert.task_plan(assignment, "task", DEFAULTS)
    assert error.value.field == field


def test_assignment_defaults_to_the_default_runtime_and_hard_limit() -> None:
    plan = convert.task_plan(_assignment(), "task", DEFAULTS)
    assert isinstance(plan.runtime, SimulatedPlan)
    assert plan.runtime.usage_model == "steady"
    assert plan.hard_memory_limit
    soft = convert.task_plan(_assignment(memory_limit_kind=job_pb2.MEMORY_LIMIT_KIND_SOFT), "task", DEFAULTS)
    assert not soft.hard_memory_limit
    with pytest.raises(InvalidField):
        convert.task_plan(
            _assignment(runtime=job_pb2.RuntimeSpec(process=job_pb2.ProcessRuntime(command="x"))),
            "task",
            RuntimeDefaults(allow_process=False),
        )


def test_a_dead_task_reports_its_exit_and_its_event_the_kind() -> None:
    record = HostedTask("m1", task_plan(), Phase.DEAD, started_ms=5, exit_kind=TaskEvent.OOM, exit_code=-9)
    report = convert.task_report(record, now_ms=100)
    assert report.state == state_pb2.TASK_STATE_DEAD
    assert report.exit_reason == state_pb2.TASK_EVENT_KIND_OOM
    assert report.exit_code == -9
    assert not report.ready


def _chunk(machine: list[int], seconds: list[int], sampled: list[list[bool]]) -> SampleChunk:
    m = np.array(machine, dtype=np.intp)
    n, k = len(machine), len(seconds)
    table = WorldTasks(
        machine=m,
        priority=np.zeros(n, dtype=np.int64),
        latency_sensitive=np.ones(n, dtype=bool),
        cpu_limit=np.zeros(n),
        memory_limit=np.zeros(n),
        hard_memory_limit=np.zeros(n, dtype=bool),
        measured=np.zeros(n, dtype=bool),
        start_s=np.zeros(n),
        duration_s=np.zeros(n),
        groups=(),
        memory_capacity=np.ones(2),
        pressure_fraction=1.0,
        machine_bounds=WorldTasks.bounds(m, 2),
    )
    cpu = np.arange(k * n, dtype=np.float64).reshape(k, n)
    result = WorldStep(
        seconds=np.array(seconds, dtype=np.int64),
        cpu=cpu,
        cpu_demand=cpu * 2,
        cpu_unmet=cpu,
        memory=np.arange(k * n, dtype=np.int64).reshape(k, n) * 10,
        throttled=np.zeros((k, n), dtype=bool),
        sampled=np.array(sampled, dtype=bool),
        finished=(),
        kills=(),
        failed=(),
        memory_pressure=np.zeros(2, dtype=bool),
        memory_used=np.zeros(2),
        unrouted_cpu=np.zeros((k, 0)),
    )
    identities = [(f"u/j{i}", i, 1) for i in range(n)]
    return SampleChunk(table, identities, result)


def test_sample_batches_are_per_machine_in_time_order_split_and_sequenced() -> None:
    chunks = [
        _chunk([0, 0, 1], [100, 101], [[True, True, True], [True, False, True]]),
        _chunk([0, 0, 1], [102], [[True, True, True]]),
    ]
    sequences = {"a": 50, "b": 70}
    batches = convert.sample_batches(chunks, ["a", "b"], sequences, max_samples=4)
    by_machine: dict[str, list[borglet_pb2.PollResponse]] = {}
    for machine_id, batch in batches:
        assert batch.machine_id == machine_id
        by_machine.setdefault(machine_id, []).append(batch)
    a = [(s.job_id, s.event_time_ms) for b in by_machine["a"] for s in b.samples]
    assert a == [
        ("u/j0", 100_000),
        ("u/j1", 100_000),
        ("u/j0", 101_000),
        ("u/j0", 102_000),
        ("u/j1", 102_000),
    ]
    assert [len(b.samples) for b in by_machine["a"]] == [4, 1]
    assert [b.batch_sequence for b in by_machine["a"]] == [50, 51]
    assert [(s.event_time_ms, s.memory_bytes) for b in by_machine["b"] for s in b.samples] == [
        (100_000, 20),
        (101_000, 50),
        (102_000, 20),
    ]
    # Every sample carries the task's unmet CPU demand of its second (the chunk's cpu_unmet).
    assert [s.cpu_unmet_millicores for b in by_machine["b"] for s in b.samples] == [2.0, 5.0, 2.0]
    assert sequences == {"a": 52, "b": 71}


# ----- settings ------------------------------------------------------------------------------------


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELLPILOT_BORGLET_BORGMASTER_ADDRESSES", "h1:1, h2:2")
    monkeypatch.setenv("CELLPILOT_BORGLET_ATTRIBUTES", "arch=arm, zone=b")
    monkeypatch.setenv("CELLPILOT_BORGLET_FLEET_SIZE", "3")
    monkeypatch.setenv("CELLPILOT_REPLICA_INDEX", "2")
    settings = BorgletSettings()
    assert settings.borgmaster_addresses == ["h1:1", "h2:2"]
    assert settings.attributes == {"arch": "arm", "zone": "b"}
    assert settings.resolved_machine_ids() == ["machine-r2-0000", "machine-r2-0001", "machine-r2-0002"]
    assert settings.task_base_env == {"PATH": MINIMAL_PATH}  # nothing inherited from the Borglet
    monkeypatch.setenv("CELLPILOT_BORGLET_MACHINE_IDS", "x,y")
    assert BorgletSettings().resolved_machine_ids() == ["x", "y"]


def test_one_unreadable_task_in_a_desired_set_becomes_an_unrunnable_plan_and_the_rest_run() -> None:
    good = _assignment()
    bad_model = borglet_pb2.TaskAssignment(
        job_id="u/bad",
        task_index=0,
        incarnation=4,
        spec=job_pb2.TaskSpec(
            runtime=job_pb2.RuntimeSpec(simulated=job_pb2.SimulatedRuntime(usage_model="nope"))
        ),
    )
    no_job = borglet_pb2.TaskAssignment(task_index=1)
    twice = _assignment()
    desired = borglet_pb2.DesiredTasks(version=7, tasks=[good, bad_model, no_job, twice])
    result = convert.desired_plans(desired, DEFAULTS)
    assert [(p.job_id, p.task_index, p.incarnation) for p in result.plans] == [("u/j", 2, 3), ("u/bad", 0, 4)]
    assert isinstance(result.plans[0].runtime, SimulatedPlan)
    unrunnable = result.plans[1].runtime
    assert isinstance(unrunnable, UnrunnablePlan)
    assert "desired.tasks[1].spec.runtime.simulated.usage_model" in unrunnable.reason
    assert [s.split(":")[0] for s in result.skipped] == ["desired.tasks[2].job_id", "desired.tasks[3]"]
