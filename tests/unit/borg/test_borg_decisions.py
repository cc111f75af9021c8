"""Client commands: validation naming the field, quota admission, the Autopilot hold, idempotency, updates."""

from __future__ import annotations

from dataclasses import replace

import pytest
from borg_builders import Master, job_spec, machine_spec, replay

from cellpilot.borg.decisions import (
    Accepted,
    KillJob,
    RegisterMachine,
    SetMachineState,
    SetQuota,
    SubmitJob,
    UpdateJob,
    handle,
    rollout_step,
)
from cellpilot.borg.lifecycle import JobState, TaskEvent, TaskState
from cellpilot.borg.model import (
    AutopilotConfig,
    Constraint,
    HorizontalScaling,
    JobSpec,
    MachineAvailability,
    ProcessRuntime,
    VerticalScaling,
)
from cellpilot.borg.mutations import JobSubmitted, TaskStateChanged
from cellpilot.borg.rejection import Code, Rejection
from cellpilot.job_vocabulary import AppClass, ConstraintKind, ConstraintOperator, PriorityBand, ScalingMode
from cellpilot.schedule import Resources
from cellpilot.units import GIB


def _master(machines: int = 2, quota_cores: float = 100) -> Master:
    master = Master()
    master.add_machines(*(machine_spec(f"m{i}") for i in range(machines)))
    for band in (PriorityBand.PRODUCTION, PriorityBand.BATCH, PriorityBand.MONITORING):
        master.grant("alice", band, cores=quota_cores)
    return master


def _with_task(spec: JobSpec, **changes: object) -> JobSpec:
    return replace(spec, task=replace(spec.task, **changes))


BAD_SPECS = [
    (replace(job_spec(), name=""), "spec.name"),
    (replace(job_spec(), name="Web Server"), "spec.name"),
    (replace(job_spec(), user=""), "spec.user"),
    (replace(job_spec(), user="a/b"), "spec.user"),
    (replace(job_spec(), priority=12), "spec.priority"),
    (replace(job_spec(), priority=-1), "spec.priority"),
    (replace(job_spec(priority=9), band=PriorityBand.BATCH), "spec.band"),
    (replace(job_spec(), app_class=AppClass.UNSPECIFIED), "spec.app_class"),
    (replace(job_spec(), task_count=0), "spec.task_count"),
    (_with_task(job_spec(), limits=Resources(0, GIB)), "spec.task.limits.cpu_millicores"),
    (_with_task(job_spec(), limits=Resources(100, 0)), "spec.task.limits.memory_bytes"),
    (_with_task(job_spec(), runtime=None), "spec.task.runtime"),
    (_with_task(job_spec(), runtime=ProcessRuntime("")), "spec.task.runtime.process.command"),
    (
        job_spec(constraints=(Constraint("arch", ConstraintOperator.UNSPECIFIED, "x"),)),
        "spec.constraints[0].operator",
    ),
    (
        job_spec(constraints=(Constraint("ram", ConstraintOperator.LESS_THAN, "lots"),)),
        "spec.constraints[0].value",
    ),
    (
        job_spec(
            constraints=(Constraint("arch", ConstraintOperator.EQUAL, "x", ConstraintKind.UNSPECIFIED),)
        ),
        "spec.constraints[0].kind",
    ),
    (
        job_spec(autopilot=AutopilotConfig(cpu=VerticalScaling(ScalingMode.ON, min_limit=5, max_limit=2))),
        "spec.autopilot.cpu.min_limit",
    ),
    (
        job_spec(autopilot=AutopilotConfig(horizontal=HorizontalScaling(ScalingMode.ON))),
        "spec.autopilot.horizontal.target_utilization",
    ),
]


@pytest.mark.parametrize(("spec", "field"), BAD_SPECS, ids=[f for _, f in BAD_SPECS])
def test_a_bad_submission_names_the_field_and_changes_nothing(spec: JobSpec, field: str) -> None:
    master = _master()
    before = master.state.describe()
    result = master.run(SubmitJob("r1", spec))
    assert isinstance(result, Rejection)
    assert result.code is Code.INVALID_ARGUMENT
    assert result.field == field
    assert master.state.describe() == before


@pytest.mark.parametrize(
    ("cpu_mode", "memory_mode", "horizontal_mode", "held"),
    [
        (ScalingMode.OFF, ScalingMode.OFF, ScalingMode.OFF, False),
        (ScalingMode.UNSPECIFIED, ScalingMode.UNSPECIFIED, ScalingMode.UNSPECIFIED, False),
        (ScalingMode.ON, ScalingMode.OFF, ScalingMode.OFF, True),
        (ScalingMode.OFF, ScalingMode.DRY_RUN, ScalingMode.OFF, True),
        (ScalingMode.OFF, ScalingMode.OFF, ScalingMode.ON, True),
    ],
    ids=["off", "unspecified", "cpu-on", "memory-dry-run", "horizontal-on"],
)
def test_autopiloted_jobs_wait_for_the_first_recommendation(
    cpu_mode: ScalingMode, memory_mode: ScalingMode, horizontal_mode: ScalingMode, held: bool
) -> None:
    master = _master()
    autopilot = AutopilotConfig(
        VerticalScaling(cpu_mode),
        VerticalScaling(memory_mode),
        HorizontalScaling(horizontal_mode, target_utilization=0.5),
    )
    master.accept(SubmitJob("r1", job_spec(autopilot=autopilot)))
    job = master.state.jobs["alice/web"]
    assert job.state is (JobState.HELD_FOR_AUTOPILOT if held else JobState.PENDING)
    plan = master.schedule()
    assert plan.placed == (0 if held else 2), "held jobs are not scheduled"
    if held:
        master.accept(UpdateJob("r2", "alice/web", job.spec, release_hold=True, fencing_token=3))
        assert job.state is JobState.PENDING
        assert job.fencing_token == 3
        assert master.schedule().placed == 2


@pytest.mark.parametrize(
    ("priority", "task_count", "cores", "admitted"),
    [(9, 10, 1.0, True), (9, 11, 1.0, False), (5, 11, 1.0, False), (0, 500, 1.0, True)],
    ids=["exactly-at-quota", "one-task-over", "batch-band-over", "priority-zero-is-unlimited"],
)
def test_quota_admission_at_submission(priority: int, task_count: int, cores: float, admitted: bool) -> None:
    master = _master(quota_cores=10)  # 10 cores at prod and batch
    result = master.run(SubmitJob("r1", job_spec(priority=priority, task_count=task_count, cpu=cores * 1000)))
    if admitted:
        assert isinstance(result, Accepted)
    else:
        assert isinstance(result, Rejection)
        assert result.code is Code.RESOURCE_EXHAUSTED
        assert "cpu" in result.message
        assert "alice/web" not in master.state.jobs


def test_retrying_a_request_id_returns_the_first_answer_and_applies_nothing_twice() -> None:
    master = _master()
    first = master.accept(SubmitJob("same-id", job_spec()))
    position = master.state.last_sequence
    again = master.accept(SubmitJob("same-id", job_spec()))
    assert again.mutations == ()
    assert again.already_applied is not None
    assert again.already_applied.sequence == position
    assert again.subject == first.subject == "alice/web"
    assert master.state.last_sequence == position
    other = master.run(SubmitJob("another-id", job_spec()))
    assert isinstance(other, Rejection)
    assert other.code is Code.ALREADY_EXISTS


REUSES = {
    "kill": KillJob("sub-1", "alice/web", payload_digest="k"),
    "update": UpdateJob("sub-1", "alice/web", job_spec(task_count=3), ("task_count",), payload_digest="u"),
    "register-machine": RegisterMachine("sub-1", machine_spec("m9"), payload_digest="r"),
    "submit-other-payload": SubmitJob("sub-1", job_spec(task_count=2), payload_digest="other"),
}


@pytest.mark.parametrize("reuse", REUSES.values(), ids=REUSES.keys())
def test_a_request_id_reused_for_another_method_or_payload_is_refused_naming_it(
    reuse: KillJob | UpdateJob | RegisterMachine | SubmitJob,
) -> None:
    master = _master()
    master.accept(SubmitJob("sub-1", job_spec(), payload_digest="submit-web"))
    before = master.state.describe()
    for state in (master.state, replay(master.log)):  # the ids live in the log: a new master knows them
        refused = handle(state, reuse, master.now_ms, master.view)
        assert isinstance(refused, Rejection)
        assert (refused.code, refused.field) == (Code.ALREADY_EXISTS, "request_id")
        assert "'sub-1' was first used for SubmitJob of job alice/web" in refused.message
        if reuse.method == "SubmitJob":
            assert "different payload" in refused.message
    assert master.state.describe() == before, "nothing was applied"


def test_the_same_request_again_is_a_retry_and_gets_the_first_answer_after_replay() -> None:
    master = _master()
    first = master.accept(SubmitJob("sub-1", job_spec(), payload_digest="submit-web"))
    position = master.state.last_sequence
    retried = handle(replay(master.log), SubmitJob("sub-1", job_spec(), payload_digest="submit-web"), 0)
    assert isinstance(retried, Accepted)
    assert retried.mutations == ()
    assert retried.subject == first.subject
    assert retried.already_applied is not None
    assert retried.already_applied.sequence == position


def test_kill_kills_every_task_releases_quota_and_a_dead_name_can_be_reused() -> None:
    master = _master(quota_cores=2)
    master.accept(SubmitJob("r1", job_spec(task_count=2)))
    master.schedule()
    incarnations = [t.incarnation for t in master.state.jobs["alice/web"].tasks.values()]
    master.accept(KillJob("r2", "alice/web"))
    job = master.state.jobs["alice/web"]
    assert job.state is JobState.DEAD
    assert all(t.state is TaskState.DEAD and t.reason is TaskEvent.KILLED for t in job.tasks.values())
    assert all(not m.tasks for m in master.state.machines.values())
    assert master.state.quota_used("alice", PriorityBand.PRODUCTION) == Resources()
    assert master.accept(KillJob("r3", "alice/web")).mutations == (), "killing a dead job changes nothing"
    master.accept(SubmitJob("r4", job_spec(task_count=2)))
    reborn = master.state.jobs["alice/web"]
    assert reborn.spec_version == 1
    assert [t.incarnation for t in reborn.tasks.values()] == incarnations, "incarnations carry over"


def _running_job(master: Master, **kwargs: object) -> JobSpec:
    spec = job_spec(**kwargs)  # type: ignore[arg-type]
    master.accept(SubmitJob(f"submit-{spec.job_id}", spec))
    assert master.schedule().placed == spec.task_count
    return spec


@pytest.mark.parametrize(
    ("mask", "new", "field"),
    [
        (("name",), job_spec(name="other"), "update_mask"),
        (("task.limits.gpu",), job_spec(), "update_mask"),
        ((), job_spec(), "update_mask"),
        (("task_count",), job_spec(task_count=0), "spec.task_count"),
        (("priority",), job_spec(priority=42), "spec.priority"),
    ],
    ids=["immutable-name", "unknown-path", "empty-mask", "zero-tasks", "bad-priority"],
)
def test_a_bad_update_names_the_field(mask: tuple[str, ...], new: JobSpec, field: str) -> None:
    master = _master()
    _running_job(master)
    result = master.run(UpdateJob("u1", "alice/web", new, mask))
    assert isinstance(result, Rejection)
    assert (result.code, result.field) == (Code.INVALID_ARGUMENT, field)


def test_update_preconditions_version_and_fencing_token() -> None:
    master = _master()
    _running_job(master)
    bigger = job_spec(task_count=3)
    stale = master.run(UpdateJob("u1", "alice/web", bigger, ("task_count",), expected_spec_version=7))
    assert isinstance(stale, Rejection)
    assert stale.field == "expected_spec_version"
    master.accept(
        UpdateJob("u2", "alice/web", bigger, ("task_count",), expected_spec_version=1, fencing_token=5)
    )
    deposed = master.run(
        UpdateJob("u3", "alice/web", job_spec(task_count=4), ("task_count",), fencing_token=4)
    )
    assert isinstance(deposed, Rejection)
    assert deposed.code is Code.FAILED_PRECONDITION
    assert master.state.jobs["alice/web"].spec.task_count == 3
    missing = master.run(UpdateJob("u4", "bob/nothing", bigger, ("task_count",)))
    assert isinstance(missing, Rejection)
    assert missing.code is Code.NOT_FOUND


def test_scale_down_kills_the_highest_indices_and_scale_up_adds_pending_tasks() -> None:
    master = _master()
    _running_job(master, task_count=4, cpu=500)
    master.accept(UpdateJob("u1", "alice/web", job_spec(task_count=2), ("task_count",)))
    job = master.state.jobs["alice/web"]
    assert [t.state for t in job.visible_tasks()] == [TaskState.RUNNING] * 2
    assert [job.tasks[i].state for i in (2, 3)] == [TaskState.DEAD] * 2
    assert job.task_counts()[TaskState.DEAD] == 0, "counts cover tasks 0 .. task_count-1"
    master.accept(UpdateJob("u2", "alice/web", job_spec(task_count=3), ("task_count",)))
    assert job.tasks[2].state is TaskState.PENDING
    assert job.tasks[2].incarnation == 1, "a resubmitted index keeps its incarnation"


def _grow(master: Master, memory_gib: float, cap: int) -> Accepted:
    spec = master.state.jobs["alice/web"].spec
    new = _with_task(spec, limits=replace(spec.task.limits, ram=memory_gib * GIB))
    return master.accept(UpdateJob("", "alice/web", new, ("task.limits.memory_bytes",), max_disruptions=cap))


def _evictions(result: Accepted) -> list[int]:
    return [
        m.task_index
        for m in result.mutations
        if isinstance(m, TaskStateChanged) and m.reason is TaskEvent.EVICTED
    ]


@pytest.mark.parametrize(
    ("memory_gib", "cap", "in_place", "evicted_now"),
    [(2.0, 0, 4, 0), (6.0, 0, 0, 4), (6.0, 1, 0, 1), (6.0, 3, 0, 3)],
    ids=["fits-in-place", "no-cap-moves-all", "cap-1", "cap-3"],
)
def test_an_update_that_no_longer_fits_reschedules_within_the_disruption_cap(
    memory_gib: float, cap: int, in_place: int, evicted_now: int
) -> None:
    master = Master()
    master.add_machines(*(machine_spec(f"m{i}", ram_gib=8) for i in range(4)))
    master.add_machines(*(machine_spec(f"spare{i}", ram_gib=8) for i in range(4)))
    for i in range(4):
        master.accept(SetMachineState("", f"spare{i}", MachineAvailability.DRAINING))
    master.grant("alice", PriorityBand.PRODUCTION)
    master.grant("bob", PriorityBand.PRODUCTION)
    _running_job(master, name="tenant", user="bob", ram_gib=4, task_count=4)
    _running_job(master, task_count=4)
    job = master.state.jobs["alice/web"]
    # Set-up check: the default profile spreads a job's tasks, one 1 GiB task next to each 4 GiB tenant.
    assert sorted(t.machine_id for t in job.tasks.values()) == ["m0", "m1", "m2", "m3"]
    for i in range(4):
        master.accept(SetMachineState("", f"spare{i}", MachineAvailability.UP))

    result = _grow(master, memory_gib, cap)
    updated = [
        m for m in result.mutations if isinstance(m, TaskStateChanged) and m.reason is TaskEvent.UPDATED
    ]
    assert len(updated) == in_place  # 4 + 2 GiB fits an 8 GiB machine; 4 + 6 GiB does not
    assert len(_evictions(result)) == evicted_now
    limit = cap or 4
    for _ in range(8):  # the rollout continues as the moved tasks run again
        master.commit(rollout_step(master.state))
        down = [t for t in job.tasks.values() if t.state is TaskState.PENDING]
        assert len(down) <= limit, "never more tasks down than the cap"
        master.schedule()
    assert all(t.state is TaskState.RUNNING and t.spec_version == 2 for t in job.tasks.values())
    assert all(t.limits.ram == memory_gib * GIB for t in job.tasks.values())
    assert master.state.rolling == set()


def test_a_priority_only_update_is_done_in_place_without_disruption() -> None:
    master = _master()
    _running_job(master, priority=9)
    result = master.accept(
        UpdateJob("u", "alice/web", job_spec(priority=10), ("priority",), max_disruptions=1)
    )
    assert _evictions(result) == []
    job = master.state.jobs["alice/web"]
    assert all(t.state is TaskState.RUNNING and t.spec_version == 2 for t in job.tasks.values())


def test_a_new_binary_restarts_every_task_rolling() -> None:
    master = _master()
    _running_job(master, task_count=3)
    new = _with_task(job_spec(task_count=3), runtime=ProcessRuntime("/bin/sleep", ("100",)))
    result = master.accept(UpdateJob("u", "alice/web", new, ("task.runtime",), max_disruptions=1))
    assert _evictions(result) == [0]


def test_machines_register_drain_and_quota_is_set() -> None:
    master = Master()
    bad = master.run(RegisterMachine("r", replace(machine_spec(), borglet_address="nowhere")))
    assert isinstance(bad, Rejection)
    assert bad.field == "spec.borglet_address"
    master.accept(RegisterMachine("r1", machine_spec("m0")))
    assert master.accept(RegisterMachine("r2", machine_spec("m0"))).mutations == (), "same spec: no-op"
    master.accept(SetMachineState("r3", "m0", MachineAvailability.DRAINING, "maintenance"))
    assert master.state.machines["m0"].availability is MachineAvailability.DRAINING
    down = master.run(SetMachineState("r4", "m0", MachineAvailability.DOWN))
    assert isinstance(down, Rejection)
    assert down.field == "state"
    band = master.run(SetQuota("r5", "alice", PriorityBand.UNSPECIFIED, Resources()))
    assert isinstance(band, Rejection)
    assert band.field == "band"


def test_a_draining_machine_takes_no_new_tasks() -> None:
    master = _master(machines=2)
    master.accept(SetMachineState("d", "m0", MachineAvailability.DRAINING))
    master.accept(SubmitJob("s", job_spec(task_count=3, cpu=500)))
    master.schedule()
    machines = {t.machine_id for t in master.state.jobs["alice/web"].tasks.values()}
    assert machines == {"m1"}


def test_submissions_are_recorded_with_their_hold_state() -> None:
    master = _master()
    result = master.accept(SubmitJob("s", job_spec()))
    (mutation,) = result.mutations
    assert isinstance(mutation, JobSubmitted)
    assert mutation.state is JobState.PENDING
    assert master.log[-1].request_id == "s"
