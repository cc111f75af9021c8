"""Crash loops back off (Borg §4): restart delays, resets, anti-affinity, and what does not count.

The decisions are driven the way the Borgmaster drives them: a Borglet's report diffed into
mutations (with the restart decision in the record), committed, applied, and the scheduler
offered only the tasks whose backoff has run out. Replaying the log gives the same state.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from borg_builders import Master, job_spec, machine_spec, replay

from cellpilot.borg.decisions import SubmitJob, UpdateJob
from cellpilot.borg.lifecycle import TaskEvent, TaskState
from cellpilot.borg.model import MachineAvailability, ProcessRuntime, SimulatedRuntime
from cellpilot.borg.mutations import MachineStateChanged, TaskScheduled, TaskStateChanged
from cellpilot.borg.pending_reasons import explain
from cellpilot.borg.poll_diff import MachineReport, ReportedEvent, ReportedTask, diff_report
from cellpilot.borg.records import TaskRecord
from cellpilot.borg.restart_backoff import RestartPolicy, avoided_machines, restart_backoff
from cellpilot.borg_wire import checkpoint as checkpoint_codec
from cellpilot.job_vocabulary import PriorityBand
from cellpilot.schedule import Resources
from cellpilot.units import GIB

POLICY = RestartPolicy()
JOB = "alice/web"


@pytest.mark.parametrize(
    ("failures", "delay_ms"),
    [(0, 0), (1, 1_000), (2, 2_000), (3, 4_000), (9, 256_000), (10, 300_000), (60, 300_000)],
    ids=["none", "first", "second", "third", "ninth", "capped", "far-past-the-cap"],
)
def test_the_delay_doubles_from_one_second_up_to_five_minutes(failures: int, delay_ms: int) -> None:
    assert POLICY.delay_ms(failures) == delay_ms


@pytest.mark.parametrize(
    ("previous", "ran_ms", "failures"),
    [
        (0, 0, 1),
        (4, 2_000, 5),
        (4, None, 5),
        (4, POLICY.reset_after_ms - 1, 5),
        (4, POLICY.reset_after_ms, 1),
    ],
    ids=["first-failure", "crashed-at-once", "run-time-unknown", "just-short-of-clean", "ran-cleanly"],
)
def test_failures_in_a_row_count_up_and_a_clean_run_starts_over(
    previous: int, ran_ms: int | None, failures: int
) -> None:
    task = TaskRecord(JOB, 0, Resources(1, 1), 1, failures=previous)
    decision = restart_backoff(POLICY, task, "m0", 50_000, ran_ms)
    assert decision.failures == failures
    assert decision.not_before_ms == 50_000 + POLICY.delay_ms(failures)
    assert decision.avoid_until_ms == 0


@pytest.mark.parametrize(
    ("earlier", "avoided"),
    [
        ((("m0", 45_000), ("m0", 48_000)), True),
        ((("m0", 45_000), ("m1", 48_000)), False),
        ((("m0", 50_000 - POLICY.crash_window_ms - 1), ("m0", 48_000)), False),
    ],
    ids=["third-crash-here", "crashes-spread-over-machines", "first-crash-outside-the-window"],
)
def test_a_third_crash_on_one_machine_within_the_window_avoids_it(
    earlier: tuple[tuple[str, int], ...], avoided: bool
) -> None:
    task = TaskRecord(JOB, 0, Resources(1, 1), 1, failures=2, recent_failures=earlier)
    decision = restart_backoff(POLICY, task, "m0", 50_000, 10)
    assert decision.avoid_until_ms == (50_000 + POLICY.avoid_ms if avoided else 0)


# ---------------------------------------------------------------------- through the master


def _master(machines: int = 2, spec_count: int = 1) -> Master:
    master = Master()
    master.add_machines(*(machine_spec(f"m{i}") for i in range(machines)))
    master.grant("alice", PriorityBand.PRODUCTION)
    master.accept(SubmitJob("s", job_spec(task_count=spec_count)))
    master.schedule()
    return master


def _exit(master: Master, kind: TaskEvent, index: int = 0, ran_ms: int = 100) -> list[TaskStateChanged]:
    """The task's Borglet reports it exited with ``kind`` (at master.now_ms); the master commits the diff."""
    task = master.state.jobs[JOB].tasks[index]
    assert task.state is TaskState.RUNNING
    now = master.now_ms
    machine = master.state.machines[task.machine_id]
    reported = ReportedTask(JOB, index, task.incarnation, TaskState.DEAD, kind, 1, started_ms=now - ran_ms)
    event = ReportedEvent(1, JOB, index, task.incarnation, kind, f"{kind.value} here", event_time_ms=now)
    others = tuple(
        ReportedTask(job.job_id, t.index, t.incarnation, TaskState.RUNNING, started_ms=now - ran_ms)
        for job, t in master.state.tasks_on(task.machine_id)
        if t is not task
    )
    report = MachineReport(task.machine_id, now, machine.desired_version, (reported, *others), (event,))
    mutations = diff_report(master.state, report, policy=POLICY).mutations
    master.commit(mutations)
    return [m for m in mutations if isinstance(m, TaskStateChanged) and m.task_index == index]


def test_a_failed_task_is_not_rescheduled_before_its_backoff_runs_out() -> None:
    master = _master()
    (failed,) = _exit(master, TaskEvent.FAILED)
    assert failed.backoff is not None
    task = master.state.jobs[JOB].tasks[0]
    assert (task.state, task.failures, task.not_before_ms) == (
        TaskState.PENDING,
        1,
        failed.backoff.not_before_ms,
    )
    assert task.last_failure == "failed: failed here"
    master.now_ms = task.not_before_ms - 1
    assert master.schedule().placed == 0
    report = explain(master.view, master.state, JOB, 0, master.now_ms)
    assert report.next_restart_ms == task.not_before_ms
    assert "backing off after 1 failure" in report.summary
    master.now_ms = task.not_before_ms
    assert master.schedule().placed == 1
    assert master.state.next_restart_ms(master.now_ms) == 0


@pytest.mark.parametrize("kind", [TaskEvent.OOM, TaskEvent.FAILED], ids=["oom", "error-exit"])
def test_a_task_crashing_at_once_restarts_a_logarithmic_number_of_times(kind: TaskEvent) -> None:
    """60 s of event time, restarting as soon as allowed: 1+2+4+8+16+32 s of waits fit 6 restarts."""
    master = _master(machines=8)
    start = master.now_ms
    records_before = len(master.log)
    while master.now_ms < start + 60_000:
        task = master.state.jobs[JOB].tasks[0]
        if task.state is TaskState.RUNNING:
            _exit(master, kind, ran_ms=10)
        else:
            master.now_ms = max(master.now_ms, task.not_before_ms)
            master.schedule()
    task = master.state.jobs[JOB].tasks[0]
    assert task.incarnation <= 7, task.incarnation
    assert task.failures >= 6
    assert len(master.log) - records_before <= 3 * task.incarnation


@pytest.mark.parametrize(
    "mutation",
    [
        lambda m: MachineStateChanged(m, MachineAvailability.DOWN, "missed 5 polls"),
        lambda m: TaskStateChanged(JOB, 0, 1, TaskState.PENDING, TaskEvent.EVICTED, "drain"),
        lambda m: TaskStateChanged(JOB, 0, 1, TaskState.PENDING, TaskEvent.PREEMPTED, "by bob/x/0"),
        lambda m: TaskStateChanged(JOB, 0, 1, TaskState.PENDING, TaskEvent.LOST, "missing from a report"),
    ],
    ids=["machine-down", "evicted", "preempted", "missing-from-report"],
)
def test_what_is_not_the_tasks_fault_neither_counts_nor_delays(mutation: object) -> None:
    master = _master()
    task = master.state.jobs[JOB].tasks[0]
    task.failures = 4  # even after earlier failures
    master.commit([mutation(task.machine_id)])  # type: ignore[operator]
    assert task.state is TaskState.PENDING
    assert (task.failures, task.not_before_ms) == (4, 0)
    assert master.schedule().placed == 1, "rescheduled on the next pass"


def test_lost_after_a_machine_goes_down_is_rescheduled_at_once_by_the_poll_diff() -> None:
    master = _master()
    task = master.state.jobs[JOB].tasks[0]
    machine = master.state.machines[task.machine_id]
    report = MachineReport(task.machine_id, master.now_ms, machine.desired_version + 1)
    (lost,) = diff_report(master.state, report, policy=POLICY).mutations
    assert isinstance(lost, TaskStateChanged)
    assert (lost.reason, lost.backoff) == (TaskEvent.LOST, None)


def test_a_task_crashing_three_times_on_one_machine_moves_off_it_and_why_pending_says_so() -> None:
    master = _master(machines=2)
    first = master.state.jobs[JOB].tasks[0].machine_id
    other = "m1" if first == "m0" else "m0"
    # Keep it on its machine: the other one is drained while it crashes three times.
    master.commit([MachineStateChanged(other, MachineAvailability.DRAINING, "hold")])
    for _ in range(3):
        assert master.state.jobs[JOB].tasks[0].machine_id == first
        _exit(master, TaskEvent.FAILED, ran_ms=10)
        master.now_ms = master.state.jobs[JOB].tasks[0].not_before_ms
        if master.state.jobs[JOB].tasks[0].avoid:
            break
        master.schedule()
    task = master.state.jobs[JOB].tasks[0]
    assert set(task.avoid) == {first}
    assert avoided_machines(task, master.now_ms) == ((first, task.avoid[first]),)
    # Only the avoided machine takes tasks: the task stays pending, and why-pending says why.
    assert master.schedule().placed == 0
    report = explain(master.view, master.state, JOB, 0, master.now_ms)
    assert report.avoided_machines == ((first, task.avoid[first]),)
    assert "avoided after crashing there: 1" in report.summary
    # The other machine comes back: the task moves there.
    master.commit([MachineStateChanged(other, MachineAvailability.UP, "back")])
    assert master.schedule().placed == 1
    assert master.state.jobs[JOB].tasks[0].machine_id == other
    # Once the avoidance expires the machine is a candidate again.
    assert avoided_machines(task, task.avoid[first]) == ()


def test_a_new_binary_clears_the_backoff() -> None:
    master = _master()
    _exit(master, TaskEvent.FAILED)
    task = master.state.jobs[JOB].tasks[0]
    assert (task.failures, task.not_before_ms > 0) == (1, True)
    spec = master.state.jobs[JOB].spec
    fixed = replace(spec, task=replace(spec.task, runtime=ProcessRuntime("/bin/true")))
    master.accept(UpdateJob("u", JOB, fixed, ("task.runtime",)))
    assert (task.failures, task.not_before_ms, task.avoid) == (0, 0, {})
    assert master.schedule().placed == 1


def test_the_backoff_is_in_the_log_replays_and_survives_a_snapshot() -> None:
    master = _master(machines=3, spec_count=2)
    for _ in range(4):
        for index in (0, 1):
            task = master.state.jobs[JOB].tasks[index]
            if task.state is TaskState.RUNNING:
                _exit(master, TaskEvent.OOM if index else TaskEvent.FAILED, index=index, ran_ms=5)
        master.now_ms = max(t.not_before_ms for t in master.state.jobs[JOB].tasks.values())
        master.schedule()
    assert any(t.failures >= 3 for t in master.state.jobs[JOB].tasks.values())
    for record in master.log:  # every record round-trips through the storage encoding
        assert checkpoint_codec.record_in(checkpoint_codec.record_out(record).SerializeToString()) == record
    # Replaying with no policy at hand gives the same state: the decisions are in the records.
    assert replay(master.log).describe() == master.state.describe()
    for cut in range(1, len(master.log), 3):
        state = replay(master.log[:cut])
        restored = checkpoint_codec.snapshot_in(checkpoint_codec.snapshot_out(state, 1).SerializeToString())
        assert restored.describe() == state.describe()
        restored.apply_all(master.log[cut:])
        assert restored.describe() == master.state.describe()


def test_scheduled_restarts_carry_a_new_incarnation_and_backing_off_tasks_wait() -> None:
    master = _master(machines=1, spec_count=2)
    (failed,) = _exit(master, TaskEvent.FAILED, index=0)
    _exit(master, TaskEvent.FINISHED, index=1)
    assert failed.backoff is not None
    assert master.state.jobs[JOB].tasks[1].state is TaskState.DEAD
    waiting = failed.backoff.not_before_ms - 1
    assert master.view.plan(master.state, master.now_ms, event_now_ms=waiting).mutations == ()
    assert master.state.next_restart_ms(waiting) == failed.backoff.not_before_ms
    later = master.view.plan(master.state, master.now_ms, event_now_ms=failed.backoff.not_before_ms)
    (scheduled,) = later.mutations
    assert isinstance(scheduled, TaskScheduled)
    assert (scheduled.task_index, scheduled.incarnation) == (0, 2)


def test_a_simulated_runtime_job_is_the_default_builder() -> None:
    assert isinstance(job_spec().task.runtime, SimulatedRuntime)
    assert job_spec().task.limits == Resources(1000, GIB)
