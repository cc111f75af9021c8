"""A hosted task's lifecycle on its machine (:mod:`cellpilot.borglet.task_lifecycle`): the tables
edge by edge and for their invariants, and whole lifecycles through the one entry point
(:meth:`MachineAgent.advance`), with what each reports to the master."""

from __future__ import annotations

from dataclasses import replace

import pytest
from borglet_plan_builders import task_plan

from cellpilot.borg.lifecycle import TaskEvent, TaskState
from cellpilot.borglet.hosted_task import HostedTask, Limits, ProcessPlan, UnrunnablePlan
from cellpilot.borglet.machine_agent import MachineAgent, MachineProfile
from cellpilot.borglet.step_outcomes import KILL_EXIT_CODE, process_exit
from cellpilot.borglet.task_lifecycle import (
    NO_PROCESS_TASK_PHASES,
    PROCESS_EFFECTS,
    PROCESS_TASK_PHASES,
    Effect,
    Phase,
    PhaseChange,
    PhaseEvent,
    PhaseEventKind,
    phase_step,
)

S, SP, R, ST, D = Phase.STARTING, Phase.STOP_PENDING, Phase.RUNNING, Phase.STOPPING, Phase.DEAD
STARTED, STOP, KILL, EXITED = (
    PhaseEventKind.STARTED,
    PhaseEventKind.STOP_REQUESTED,
    PhaseEventKind.KILL_REQUESTED,
    PhaseEventKind.EXITED,
)
Table = dict[Phase, dict[PhaseEventKind, PhaseChange]]
TABLES: dict[str, Table] = {"process": PROCESS_TASK_PHASES, "no-process": NO_PROCESS_TASK_PHASES}

# ----- the tables, edge by edge -----------------------------------------------------------------

EDGES = [
    ("process", S, STARTED, R, (Effect.REPORT_RUNNING,)),
    ("process", S, STOP, SP, (Effect.REMEMBER_STOP,)),
    ("process", S, KILL, D, (Effect.REPORT_EXIT,)),
    ("process", SP, STARTED, ST, (Effect.KILL,)),
    ("process", SP, KILL, D, (Effect.REPORT_EXIT,)),
    ("process", R, STOP, ST, (Effect.REMEMBER_STOP, Effect.TERMINATE)),
    ("process", R, KILL, ST, (Effect.OVERRIDE_STOP, Effect.KILL)),
    ("process", R, EXITED, D, (Effect.REPORT_EXIT,)),
    ("process", ST, STOP, ST, (Effect.REMEMBER_STOP, Effect.TERMINATE)),
    ("process", ST, KILL, ST, (Effect.OVERRIDE_STOP, Effect.KILL)),
    ("process", ST, EXITED, D, (Effect.REPORT_EXIT,)),
    ("process", D, STARTED, D, (Effect.KILL,)),
    ("process", D, EXITED, D, ()),
    ("no-process", S, STARTED, R, (Effect.REPORT_RUNNING,)),
    ("no-process", S, KILL, D, (Effect.REPORT_EXIT,)),
    ("no-process", R, STOP, D, (Effect.REMEMBER_STOP, Effect.REPORT_EXIT)),
    ("no-process", R, KILL, D, (Effect.REPORT_EXIT,)),
    ("no-process", R, EXITED, D, (Effect.REPORT_EXIT,)),
    ("no-process", D, STOP, D, ()),
]


@pytest.mark.parametrize(
    ("table", "phase", "kind", "expected", "effects"),
    EDGES,
    ids=[f"{t}-{p.value}-{k.value}" for t, p, k, _, _ in EDGES],
)
def test_edges(table: str, phase: Phase, kind: PhaseEventKind, expected: Phase, effects: tuple) -> None:
    step = phase_step(TABLES[table], phase, kind)
    assert step.allowed
    assert (step.before, step.after, step.effects) == (phase, expected, effects)


ILLEGAL = [
    ("process", S, EXITED),  # nothing to exit before the process exists
    ("process", R, STARTED),
    ("process", ST, STARTED),
    ("no-process", S, EXITED),
    ("no-process", R, STARTED),
    ("no-process", SP, STARTED),  # a task without a process is never waiting for one
]


@pytest.mark.parametrize(
    ("table", "phase", "kind"), ILLEGAL, ids=[f"{t}-{p.value}-{k.value}" for t, p, k in ILLEGAL]
)
def test_an_event_the_phase_does_not_allow_is_a_result_that_keeps_the_phase(
    table: str, phase: Phase, kind: PhaseEventKind
) -> None:
    step = phase_step(TABLES[table], phase, kind)
    assert not step.allowed
    assert step.after is phase
    assert step.effects == ()
    assert kind.value in step.reason
    assert phase.value in step.reason


# ----- the tables' invariants --------------------------------------------------------------------


@pytest.mark.parametrize("name", TABLES)
def test_every_table_covers_every_phase_and_dead_is_final_and_quiet(name: str) -> None:
    table = TABLES[name]
    assert set(table) == set(Phase)
    for edges in table.values():
        assert all(isinstance(change.phase, Phase) for change in edges.values())
    for kind, change in table[D].items():
        assert change.phase is D
        assert Effect.REPORT_EXIT not in change.effects, kind
        assert Effect.REPORT_RUNNING not in change.effects, kind


@pytest.mark.parametrize("name", TABLES)
def test_every_death_is_reported_once_and_only_a_start_reports_running(name: str) -> None:
    for phase, edges in TABLES[name].items():
        for kind, change in edges.items():
            dies = phase is not D and change.phase is D
            assert (Effect.REPORT_EXIT in change.effects) == dies, (phase, kind)
            starts = change.phase is R and phase is not R
            assert (Effect.REPORT_RUNNING in change.effects) == starts, (phase, kind)


def test_a_task_without_a_process_never_waits_for_one_and_is_never_signalled() -> None:
    reached = {change.phase for edges in NO_PROCESS_TASK_PHASES.values() for change in edges.values()}
    assert reached.isdisjoint({SP, ST})
    assert not NO_PROCESS_TASK_PHASES[SP]
    assert not NO_PROCESS_TASK_PHASES[ST]
    for edges in NO_PROCESS_TASK_PHASES.values():
        for change in edges.values():
            assert PROCESS_EFFECTS.isdisjoint(change.effects)


def test_a_stop_keeps_the_first_reason_and_a_kill_of_the_borglet_replaces_it() -> None:
    for table in TABLES.values():
        for phase in (S, SP, R, ST):
            stop, kill = table[phase].get(STOP), table[phase].get(KILL)
            if stop is not None:
                assert Effect.REMEMBER_STOP in stop.effects
                assert Effect.OVERRIDE_STOP not in stop.effects
            if kill is not None and kill.phase is not D:
                assert kill.effects == (Effect.OVERRIDE_STOP, Effect.KILL)


# ----- whole lifecycles through MachineAgent.advance ---------------------------------------------


def _agent() -> MachineAgent:
    profile = MachineProfile("m1", Limits(1000, 1 << 30), {}, "r", "p", 20000)
    return MachineAgent(profile, 0, first_sequence=1, max_unacked_events=100)


def _process_task() -> HostedTask:
    plan = replace(task_plan(), runtime=ProcessPlan("server"))
    return HostedTask("m1", plan, Phase.STARTING, started_ms=1_000)


def _reported(agent: MachineAgent) -> list[tuple[TaskEvent, int, str, str]]:
    return [(e.kind, e.event_time_ms, e.cause_id, e.detail) for e in agent.events]


def test_a_process_stopped_with_a_grace_period_reports_running_then_the_stop() -> None:
    agent, task = _agent(), _process_task()
    started = agent.advance(task, PhaseEvent.started("c-start", 1_000, "pid 42"))
    assert (started.after, started.process_effects) == (R, ())
    stopping = agent.advance(task, PhaseEvent.stop(TaskEvent.PREEMPTED, 30.0, "c-stop", 2_000))
    assert (stopping.after, stopping.process_effects) == (ST, (Effect.TERMINATE,))
    assert task.alive
    # The process exits after SIGTERM: the exit is the stop's, dated when it was asked for.
    agent.advance(task, process_exit(task, -15, 0, 0, now_ms=9_000))
    assert task.phase is D
    assert (task.exit_kind, task.exit_code, task.exit_ms) == (TaskEvent.PREEMPTED, -15, 2_000)
    assert _reported(agent) == [
        (TaskEvent.RUNNING, 1_000, "c-start", "pid 42"),
        (TaskEvent.PREEMPTED, 2_000, "c-stop", "stopped by the master (preempted)"),
    ]
    assert task.exit_sequence == agent.events[-1].sequence
    assert agent.events[-1].state is TaskState.PENDING  # preempted tasks are rescheduled (Figure 2)


def test_a_stop_while_the_process_is_spawned_kills_it_once_it_exists_and_it_never_ran() -> None:
    agent, task = _agent(), _process_task()
    pending = agent.advance(task, PhaseEvent.stop(TaskEvent.KILLED, 0.0, "c-kill", 1_100, "replaced"))
    assert (pending.after, pending.process_effects) == (SP, ())
    spawned = agent.advance(task, PhaseEvent.started("c-start", 1_000, "pid 7"))
    assert (spawned.after, spawned.process_effects) == (ST, (Effect.KILL,))
    agent.advance(task, process_exit(task, KILL_EXIT_CODE, 0, 0, now_ms=1_200))
    assert _reported(agent) == [(TaskEvent.KILLED, 1_100, "c-kill", "replaced")]


def test_the_first_stop_reason_wins_and_a_failure_here_replaces_it() -> None:
    agent, task = _agent(), _process_task()
    agent.advance(task, PhaseEvent.started("c0", 1_000, "pid 1"))
    agent.advance(task, PhaseEvent.stop(TaskEvent.EVICTED, 60.0, "c1", 2_000))
    again = agent.advance(task, PhaseEvent.stop(TaskEvent.KILLED, 0.0, "c2", 3_000))
    assert again.process_effects == (Effect.TERMINATE,)  # signalled again, reason kept
    assert (task.stop_kind, task.stop_cause, task.stop_ms) == (TaskEvent.EVICTED, "c1", 2_000)
    failed = agent.advance(task, PhaseEvent.kill(TaskEvent.FAILED, -1, "health check failed", "c3", 4_000))
    assert failed.process_effects == (Effect.KILL,)
    agent.advance(task, process_exit(task, KILL_EXIT_CODE, 0, 0, now_ms=5_000))
    assert (task.exit_kind, task.exit_detail, task.exit_ms) == (
        TaskEvent.FAILED,
        "health check failed",
        4_000,
    )


def test_a_process_that_cannot_be_started_fails_alone_and_a_late_spawn_is_killed() -> None:
    agent, task = _agent(), _process_task()
    agent.advance(task, PhaseEvent.kill(TaskEvent.FAILED, -1, "could not start: ENOENT", "c", 1_000))
    assert (task.phase, task.exit_kind, task.exit_code) == (D, TaskEvent.FAILED, -1)
    late = agent.advance(task, PhaseEvent.started("c", 1_000, "pid 9"))
    assert (late.allowed, late.after, late.process_effects) == (True, D, (Effect.KILL,))
    assert [e.kind for e in agent.events] == [TaskEvent.FAILED]  # never reported running


def test_a_simulated_task_stops_at_once_with_the_kill_exit_code() -> None:
    agent = _agent()
    task = HostedTask("m1", task_plan(), Phase.STARTING, started_ms=0)
    agent.advance(task, PhaseEvent.started("c0", 0, "simulated"))
    stop = agent.advance(task, PhaseEvent.stop(TaskEvent.PREEMPTED, 30.0, "c1", 500))
    assert (stop.after, stop.process_effects) == (D, ())
    assert (task.exit_kind, task.exit_code, task.exit_ms) == (TaskEvent.PREEMPTED, KILL_EXIT_CODE, 500)
    ignored = agent.advance(task, PhaseEvent.kill(TaskEvent.OOM, KILL_EXIT_CODE, "late", "c2", 600))
    assert ignored.allowed
    assert ignored.effects == ()
    assert [e.kind for e in agent.events] == [TaskEvent.RUNNING, TaskEvent.PREEMPTED]


def test_an_oom_kill_of_a_simulated_task_reports_its_memory_at_the_kill() -> None:
    agent = _agent()
    task = HostedTask("m1", task_plan(), Phase.RUNNING, started_ms=0)
    agent.advance(task, PhaseEvent.kill(TaskEvent.OOM, KILL_EXIT_CODE, "OOM: hard", "c", 700, 123_456))
    assert (task.phase, task.memory_bytes) == (D, 123_456)
    assert agent.events[-1].memory_bytes == 123_456


def test_an_unrunnable_plan_uses_the_table_without_a_process() -> None:
    plan = replace(task_plan(), runtime=UnrunnablePlan("unknown runtime"))
    assert HostedTask("m1", plan, Phase.STARTING, 0).phases is NO_PROCESS_TASK_PHASES
    assert _process_task().phases is PROCESS_TASK_PHASES


def test_an_event_the_phase_does_not_allow_changes_nothing_on_the_task() -> None:
    agent, task = _agent(), _process_task()
    step = agent.advance(task, PhaseEvent.exited(TaskEvent.FINISHED, 0, "exit code 0", "c", 5))
    assert not step.allowed
    assert (task.phase, task.exit_kind, list(agent.events)) == (S, None, [])


# ----- what a process's exit means ---------------------------------------------------------------

EXITS = [
    # (exit code, kernel OOM kills, expected kind, detail contains, cause)
    (0, 0, TaskEvent.FINISHED, "exit code 0", "exit:u/j/0#1"),
    (3, 0, TaskEvent.FAILED, "exit code 3", "exit:u/j/0#1"),
    (KILL_EXIT_CODE, 1, TaskEvent.OOM, "memory.max 1048576 B", "oom:m1:u/j/0#1:kernel"),
    (0, 1, TaskEvent.FINISHED, "exit code 0", "exit:u/j/0#1"),  # exit 0 is no OOM kill
]


@pytest.mark.parametrize(
    ("code", "ooms", "kind", "detail", "cause"), EXITS, ids=["ok", "failed", "oom", "ok-oom"]
)
def test_what_a_process_exit_means(code: int, ooms: int, kind: TaskEvent, detail: str, cause: str) -> None:
    plan = replace(task_plan(), runtime=ProcessPlan("server"), limits=Limits(memory_bytes=1 << 20))
    task = HostedTask("m1", plan, Phase.RUNNING, started_ms=0, memory_bytes=1_000)
    event = process_exit(task, code, ooms, memory_peak=2_000, now_ms=77)
    assert (event.kind, event.report, event.exit_code, event.cause_id, event.at_ms) == (
        EXITED,
        kind,
        code,
        cause,
        77,
    )
    assert detail in event.detail
    assert event.memory_bytes == (2_000 if kind is TaskEvent.OOM else None)


def test_a_kernel_oom_kill_under_a_soft_limit_names_the_machine_short_of_memory() -> None:
    plan = replace(task_plan(), runtime=ProcessPlan("server"), hard_memory_limit=False)
    task = HostedTask("m1", plan, Phase.RUNNING, started_ms=0)
    event = process_exit(task, KILL_EXIT_CODE, 2, memory_peak=0, now_ms=1)
    assert (
        event.detail
        == "OOM: machine out of memory: killed by the kernel's OOM killer (cgroup memory.events oom_kill 2)"
    )
