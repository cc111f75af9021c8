"""The log replays to the live state; records the tables refuse are invariant errors; restore rebuilds."""

from __future__ import annotations

import pytest
from borg_builders import Master, job_spec, machine_spec, replay
from hypothesis import given, settings
from hypothesis import strategies as st

from cellpilot.borg.cell_state import CellState, InvariantError, JobRecord, MachineRecord, TaskRecord
from cellpilot.borg.decisions import KillJob, SetMachineState, SubmitJob, UpdateJob, rollout_step
from cellpilot.borg.lifecycle import JobState, TaskEvent, TaskState
from cellpilot.borg.model import MachineAvailability
from cellpilot.borg.mutations import (
    JobKilled,
    LogRecord,
    MachineStateChanged,
    TaskScheduled,
    TaskStateChanged,
)
from cellpilot.borg.poll_diff import machines_down
from cellpilot.borg.scheduling_view import SchedulingView
from cellpilot.job_vocabulary import PriorityBand
from cellpilot.schedule import Resources
from cellpilot.units import GIB


def _busy_master() -> Master:
    master = Master()
    master.add_machines(*(machine_spec(f"m{i}") for i in range(3)))
    master.grant("alice", PriorityBand.PRODUCTION)
    master.grant("alice", PriorityBand.BATCH)
    master.accept(SubmitJob("a", job_spec("web", task_count=3)))
    master.accept(SubmitJob("b", job_spec("batch", priority=4, task_count=4, cpu=500)))
    master.schedule()
    return master


def test_job_and_task_states_follow_figure_2() -> None:
    master = _busy_master()
    web = master.state.jobs["alice/web"]
    assert web.state is JobState.RUNNING
    assert web.counts == {TaskState.PENDING: 0, TaskState.RUNNING: 3, TaskState.DEAD: 0}
    master.commit([MachineStateChanged("m0", MachineAvailability.DOWN, "missed 3 polls")])
    lost = [t for t in web.tasks.values() if t.reason is TaskEvent.LOST]
    assert all(t.state is TaskState.PENDING and t.machine_id == "" for t in lost)
    assert master.state.machines["m0"].tasks == set()
    master.accept(KillJob("k", "alice/web"))
    assert web.state is JobState.DEAD
    assert master.state.pending.isdisjoint({t.key for t in web.tasks.values()})


@pytest.mark.parametrize(
    "bad",
    [
        TaskScheduled("alice/web", 0, 9, "m1", (), Resources(1000, GIB)),  # already running
        TaskStateChanged("alice/web", 0, 99, TaskState.PENDING, TaskEvent.OOM),  # stale incarnation
        TaskStateChanged("alice/web", 0, 1, TaskState.DEAD, TaskEvent.OOM),  # OOM leads to PENDING
        JobKilled("bob/nothing"),
        MachineStateChanged("m9", MachineAvailability.DOWN),
    ],
    ids=[
        "schedule-running-task",
        "stale-incarnation",
        "wrong-target-state",
        "unknown-job",
        "unknown-machine",
    ],
)
def test_a_record_the_tables_refuse_is_an_invariant_error(bad: object) -> None:
    master = _busy_master()
    with pytest.raises(InvariantError):
        master.commit([bad])  # type: ignore[list-item]


def test_records_must_be_dense() -> None:
    state = CellState()
    record = LogRecord(2, 1, 0, JobKilled("x"))
    with pytest.raises(InvariantError, match="does not follow"):
        state.apply(record)


def test_replaying_the_log_gives_the_live_state_and_any_prefix_is_a_state() -> None:
    master = _busy_master()
    assert replay(master.log).describe() == master.state.describe()
    prefix = replay(master.log[:5])
    assert prefix.last_sequence == 5


def test_restore_from_parts_equals_the_state_and_keeps_admitted_jobs_over_a_lowered_quota() -> None:
    master = _busy_master()
    master.grant("alice", PriorityBand.PRODUCTION, cores=0.5)  # below what web already uses
    state = master.state
    jobs = [
        JobRecord(
            j.spec,
            j.spec_version,
            j.state,
            j.submitted_ms,
            j.state_since_ms,
            j.fencing_token,
            j.max_disruptions,
            {i: TaskRecord(**vars(t)) for i, t in j.tasks.items()},
        )
        for j in state.jobs.values()
    ]
    machines = [MachineRecord(m.spec, m.state, m.draining, m.state_since_ms) for m in state.machines.values()]
    quotas = [(u, b, limit) for (u, b), limit in state.quotas.items()]
    restored = CellState.restore(
        jobs,
        machines,
        quotas,
        state.applied_requests.values(),
        state.last_sequence,
        state.last_epoch,
        state.event_time_ms,
        state.leader,
    )
    assert restored.describe() == state.describe()
    assert restored.quota_used("alice", PriorityBand.PRODUCTION) == state.quota_used(
        "alice", PriorityBand.PRODUCTION
    )
    tail = Master(state=restored, view=SchedulingView.build(restored), now_ms=master.now_ms)
    tail.accept(KillJob("k", "alice/web"))
    master.accept(KillJob("k", "alice/web"))
    assert tail.state.describe() == master.state.describe()


SUBMIT = st.tuples(st.just("submit"), st.integers(0, 5), st.integers(1, 4), st.integers(2, 10))
SCHEDULE = st.tuples(st.just("schedule"), st.just(0), st.just(0), st.just(0))
OPERATIONS = st.lists(
    st.one_of(
        SUBMIT,
        SUBMIT,
        SCHEDULE,
        st.tuples(st.just("kill"), st.integers(0, 5), st.just(0), st.just(0)),
        st.tuples(st.just("scale"), st.integers(0, 5), st.integers(1, 5), st.just(0)),
        st.tuples(st.just("grow"), st.integers(0, 5), st.integers(1, 6), st.integers(0, 2)),
        st.tuples(st.just("down"), st.integers(0, 3), st.just(0), st.just(0)),
        st.tuples(st.just("drain"), st.integers(0, 3), st.just(0), st.just(0)),
        SCHEDULE,
    ),
    min_size=4,
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(OPERATIONS)
def test_any_sequence_of_commands_replays_to_the_same_state_and_view(
    ops: list[tuple[str, int, int, int]],
) -> None:
    master = Master()
    master.add_machines(*(machine_spec(f"m{i}", cpu=4000, ram_gib=8) for i in range(4)))
    for band in (PriorityBand.PRODUCTION, PriorityBand.BATCH):
        master.grant("alice", band, cores=50, ram_gib=100)
    for n, (op, a, b, c) in enumerate(ops):
        job_id = f"alice/j{a}"
        if op == "submit":
            master.run(SubmitJob(f"r{n}", job_spec(f"j{a}", priority=c, task_count=b, cpu=1500, ram_gib=1)))
        elif op == "kill":
            master.run(KillJob(f"r{n}", job_id))
        elif op in ("scale", "grow") and job_id in master.state.jobs:
            spec = master.state.jobs[job_id].spec
            if op == "scale":
                master.run(UpdateJob(f"r{n}", job_id, job_spec(task_count=b), ("task_count",)))
            else:
                new = job_spec(ram_gib=b)
                master.run(UpdateJob(f"r{n}", job_id, new, ("task.limits.memory_bytes",), max_disruptions=c))
            del spec
        elif op == "down":
            master.commit(machines_down(master.state, {f"m{a}": 5}, threshold=3))
        elif op == "drain":
            master.run(SetMachineState(f"r{n}", f"m{a}", MachineAvailability.DRAINING))
        else:
            master.commit(rollout_step(master.state))
            master.schedule()
    live = master.state.describe()
    assert replay(master.log).describe() == live
    # The scheduling view that followed the changes equals one rebuilt from the state.
    rebuilt = SchedulingView.build(master.state)
    followed = master.view.cell
    for machine_id, index in rebuilt.cell.machine_index.items():
        other = followed.machine_index[machine_id]
        assert set(map(_task_name, rebuilt.cell.tasks_on(index), [rebuilt.cell] * 99)) == set(
            map(_task_name, followed.tasks_on(other), [followed] * 99)
        )
    # Invariants: a running task is on an up machine that lists it; limits never exceed prod capacity.
    for job, task in master.state.iter_tasks():
        if task.state is TaskState.RUNNING:
            machine = master.state.machines[task.machine_id]
            assert task.key in machine.tasks
            assert machine.availability is not MachineAvailability.DOWN
        else:
            assert task.machine_id == ""
        assert (task.key in master.state.pending) == (task.state is TaskState.PENDING)
        assert job.state is not JobState.DEAD or task.state is TaskState.DEAD
    assert master.state.schedulable_pending_count() == len(master.state.schedulable_pending())


def _task_name(handle: int, cell: object) -> str:
    return cell.spec(handle).task_id  # type: ignore[attr-defined]
