"""A hosted task's lifecycle on its machine, as transition tables: phases, events, effects.

The Borgmaster sees three task states (Borg Figure 2, :mod:`cellpilot.borg.lifecycle`); the
Borglet that runs a task sees more of it. A process is spawned, then runs; a stop is a signal
and a wait for the exit (Borg §2.3: SIGTERM, then SIGKILL after the grace period); a kill that
arrives while the process is still being spawned is carried out once it exists. A task with no
process — a simulated one, or one whose plan this Borglet cannot run — starts and ends at once.

For each phase the tables give the events allowed, the phase they lead to and the effects the
transition asks for: what to remember, what to report to the master, which signal to send.
:meth:`cellpilot.borglet.machine_agent.MachineAgent.advance` is the one entry point that applies
an event; it performs the effects on the task's record and its reports, and leaves the signals
(:data:`PROCESS_EFFECTS`) to the service, which only performs them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from cellpilot.borg.lifecycle import TaskEvent


class Phase(enum.Enum):
    STARTING = "starting"  # its process is being spawned (a task without one leaves at once)
    STOP_PENDING = "stop-pending"  # stopped while being spawned: killed as soon as it is
    RUNNING = "running"
    STOPPING = "stopping"  # a signal was sent; waiting for the process to exit
    DEAD = "dead"


class PhaseEventKind(enum.Enum):
    STARTED = "started"  # the process was spawned, or the simulated task began
    STOP_REQUESTED = "stop-requested"  # the master (or the Borglet's shutdown) stops it, with a grace
    KILL_REQUESTED = "kill-requested"  # the Borglet ends it at once: it failed here, or an OOM kill
    EXITED = "exited"  # the process exited, or the world model ended the simulated task


class Effect(enum.Enum):
    REMEMBER_STOP = "remember-stop"  # keep why it stops; the first reason given wins
    OVERRIDE_STOP = "override-stop"  # this reason replaces any earlier one
    REPORT_RUNNING = "report-running"  # a RUNNING event for the master
    REPORT_EXIT = "report-exit"  # record the exit and its event for the master
    TERMINATE = "terminate"  # SIGTERM, SIGKILL after the grace period (at once with none)
    KILL = "kill"  # SIGKILL now


PROCESS_EFFECTS = frozenset({Effect.TERMINATE, Effect.KILL})  # what the service performs


@dataclass(frozen=True)
class PhaseChange:
    phase: Phase
    effects: tuple[Effect, ...] = ()


P, E, F = Phase, PhaseEventKind, Effect
_DEAD_STAYS_DEAD = {
    E.STOP_REQUESTED: PhaseChange(P.DEAD),
    E.KILL_REQUESTED: PhaseChange(P.DEAD),
    E.EXITED: PhaseChange(P.DEAD),
}

PROCESS_TASK_PHASES: dict[Phase, dict[PhaseEventKind, PhaseChange]] = {
    P.STARTING: {
        E.STARTED: PhaseChange(P.RUNNING, (F.REPORT_RUNNING,)),
        E.STOP_REQUESTED: PhaseChange(P.STOP_PENDING, (F.REMEMBER_STOP,)),
        E.KILL_REQUESTED: PhaseChange(P.DEAD, (F.REPORT_EXIT,)),  # it failed before it ran
    },
    P.STOP_PENDING: {
        E.STARTED: PhaseChange(P.STOPPING, (F.KILL,)),
        E.STOP_REQUESTED: PhaseChange(P.STOP_PENDING, (F.REMEMBER_STOP,)),
        E.KILL_REQUESTED: PhaseChange(P.DEAD, (F.REPORT_EXIT,)),
    },
    P.RUNNING: {
        E.STOP_REQUESTED: PhaseChange(P.STOPPING, (F.REMEMBER_STOP, F.TERMINATE)),
        E.KILL_REQUESTED: PhaseChange(P.STOPPING, (F.OVERRIDE_STOP, F.KILL)),
        E.EXITED: PhaseChange(P.DEAD, (F.REPORT_EXIT,)),
    },
    P.STOPPING: {
        E.STOP_REQUESTED: PhaseChange(P.STOPPING, (F.REMEMBER_STOP, F.TERMINATE)),
        E.KILL_REQUESTED: PhaseChange(P.STOPPING, (F.OVERRIDE_STOP, F.KILL)),
        E.EXITED: PhaseChange(P.DEAD, (F.REPORT_EXIT,)),
    },
    # A process spawned for a task already declared dead must not outlive it.
    P.DEAD: {E.STARTED: PhaseChange(P.DEAD, (F.KILL,)), **_DEAD_STAYS_DEAD},
}

# Simulated tasks, and tasks whose plan this Borglet cannot run: no process, so a stop or a kill
# ends the task at once.
NO_PROCESS_TASK_PHASES: dict[Phase, dict[PhaseEventKind, PhaseChange]] = {
    P.STARTING: {
        E.STARTED: PhaseChange(P.RUNNING, (F.REPORT_RUNNING,)),
        E.STOP_REQUESTED: PhaseChange(P.DEAD, (F.REMEMBER_STOP, F.REPORT_EXIT)),
        E.KILL_REQUESTED: PhaseChange(P.DEAD, (F.REPORT_EXIT,)),  # a plan it cannot run
    },
    P.STOP_PENDING: {},
    P.RUNNING: {
        E.STOP_REQUESTED: PhaseChange(P.DEAD, (F.REMEMBER_STOP, F.REPORT_EXIT)),
        E.KILL_REQUESTED: PhaseChange(P.DEAD, (F.REPORT_EXIT,)),
        E.EXITED: PhaseChange(P.DEAD, (F.REPORT_EXIT,)),
    },
    P.STOPPING: {},
    P.DEAD: dict(_DEAD_STAYS_DEAD),
}
del P, E, F


@dataclass(frozen=True)
class PhaseEvent:
    """What happened to a hosted task, with what the master is told about it.

    ``report`` is the task event reported (Borg Figure 2's vocabulary): the stop's or kill's
    kind, or the exit's; a stop's exit is reported with the first stop reason remembered.
    """

    kind: PhaseEventKind
    cause_id: str
    at_ms: int  # event time
    report: TaskEvent | None = None
    detail: str = ""
    exit_code: int = 0
    grace_seconds: float = 0.0  # STOP_REQUESTED: SIGTERM first, SIGKILL after this long
    memory_bytes: int | None = None  # the task's memory at a kill, when known

    @classmethod
    def started(cls, cause_id: str, at_ms: int, detail: str) -> PhaseEvent:
        return cls(PhaseEventKind.STARTED, cause_id, at_ms, TaskEvent.RUNNING, detail)

    @classmethod
    def stop(
        cls, kind: TaskEvent, grace_seconds: float, cause_id: str, at_ms: int, detail: str = ""
    ) -> PhaseEvent:
        detail = detail or f"stopped by the master ({kind.value})"
        return cls(PhaseEventKind.STOP_REQUESTED, cause_id, at_ms, kind, detail, grace_seconds=grace_seconds)

    @classmethod
    def kill(
        cls,
        kind: TaskEvent,
        exit_code: int,
        detail: str,
        cause_id: str,
        at_ms: int,
        memory_bytes: int | None = None,
    ) -> PhaseEvent:
        return cls(PhaseEventKind.KILL_REQUESTED, cause_id, at_ms, kind, detail, exit_code, 0.0, memory_bytes)

    @classmethod
    def exited(
        cls,
        kind: TaskEvent,
        exit_code: int,
        detail: str,
        cause_id: str,
        at_ms: int,
        memory_bytes: int | None = None,
    ) -> PhaseEvent:
        return cls(PhaseEventKind.EXITED, cause_id, at_ms, kind, detail, exit_code, 0.0, memory_bytes)


@dataclass(frozen=True)
class PhaseStep:
    """The outcome of one event: the phases before and after and the effects asked for, or why
    the event is not allowed in the phase (a result, not an exception)."""

    allowed: bool
    before: Phase
    after: Phase
    effects: tuple[Effect, ...] = ()
    reason: str = ""

    @property
    def process_effects(self) -> tuple[Effect, ...]:
        return tuple(e for e in self.effects if e in PROCESS_EFFECTS)


def phase_step(
    table: dict[Phase, dict[PhaseEventKind, PhaseChange]], phase: Phase, kind: PhaseEventKind
) -> PhaseStep:
    """Look the event up in the table."""
    change = table[phase].get(kind)
    if change is None:
        allowed = ", ".join(k.value for k in table[phase]) or "none"
        return PhaseStep(
            False,
            phase,
            phase,
            reason=f"{kind.value} is not allowed in phase {phase.value} (allowed: {allowed})",
        )
    return PhaseStep(True, phase, change.phase, change.effects)
