"""The state one hosted machine keeps: its tasks, its unacknowledged events, its master fence.

A fleet-mode Borglet holds one :class:`MachineAgent` per simulated machine; a per-machine
Borglet holds one. Nothing here does I/O: a task's phase changes through :meth:`MachineAgent.advance`
(the tables of :mod:`cellpilot.borglet.task_lifecycle`), which leaves the signals to the service's
fleet (``cellpilot_services.borglet.fleet``); the fleet spawns the processes and sends them.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from cellpilot.borg.lifecycle import TaskEvent
from cellpilot.borglet.desired_set import KnownTask
from cellpilot.borglet.hosted_task import BorgletEvent, HostedTask, Limits, TaskKey, state_after
from cellpilot.borglet.step_outcomes import KILL_EXIT_CODE
from cellpilot.borglet.task_lifecycle import Effect, PhaseEvent, PhaseEventKind, PhaseStep, phase_step

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MachineProfile:
    """What a hosted machine is (registered with the Borgmaster as a MachineSpec)."""

    machine_id: str
    capacity: Limits
    attributes: Mapping[str, str]
    rack: str
    power_domain: str
    first_port: int


class MachineAgent:
    def __init__(
        self, profile: MachineProfile, index: int, first_sequence: int, max_unacked_events: int
    ) -> None:
        self.profile = profile
        self.index = index
        self.tasks: dict[TaskKey, HostedTask] = {}
        self.events: deque[BorgletEvent] = deque()
        # Sequences start at a per-boot value (the boot's event time in µs) rather than 1, so a
        # restarted Borglet never reuses a sequence the master already acknowledged.
        self.next_sequence = first_sequence
        self.acked_sequence = 0
        self.max_unacked_events = max_unacked_events
        self.dropped_events = 0
        self.highest_epoch = 0  # fencing: the newest master epoch seen
        self.desired_version = 0
        self.desired: dict[TaskKey, int] | None = None  # key -> incarnation, from the last set
        self.memory_pressure = False
        self.packages: set[str] = set()

    @property
    def machine_id(self) -> str:
        return self.profile.machine_id

    def admit_epoch(self, epoch: int) -> str | None:
        """Fence: refuse (with the reason) an epoch older than the newest seen; remember newer ones."""
        if epoch < self.highest_epoch:
            return (
                f"master epoch {epoch} is older than epoch {self.highest_epoch} already seen by "
                f"{self.machine_id}: a newer master has taken over"
            )
        self.highest_epoch = epoch
        return None

    def record_event(
        self, record: HostedTask, kind: TaskEvent, now_ms: int, cause_id: str, detail: str = ""
    ) -> BorgletEvent:
        plan = record.plan
        event = BorgletEvent(
            sequence=self.next_sequence,
            machine_id=self.machine_id,
            job_id=plan.job_id,
            task_index=plan.task_index,
            incarnation=plan.incarnation,
            kind=kind,
            state=state_after(kind),
            event_time_ms=now_ms,
            cause_id=cause_id,
            detail=detail,
            limits=plan.limits,
            cpu_millicores=record.cpu_millicores,
            memory_bytes=record.memory_bytes,
        )
        self.next_sequence += 1
        self.events.append(event)
        while len(self.events) > self.max_unacked_events:
            self.events.popleft()
            self.dropped_events += 1
            if self.dropped_events in (1, 10, 100) or self.dropped_events % 1000 == 0:
                log.warning(
                    "dropping unacknowledged events: no master has polled for a long time",
                    extra={"machine_id": self.machine_id, "dropped": self.dropped_events},
                )
        log.info(
            "task event",
            extra={
                "cause_id": cause_id,
                "machine_id": self.machine_id,
                "task": plan.name,
                "kind": kind.value,
                "event_time_ms": now_ms,
                "detail": detail,
            },
        )
        return event

    def advance(self, task: HostedTask, event: PhaseEvent) -> PhaseStep:
        """Apply one event to one of its tasks: the task's table gives the next phase and the
        effects; this performs those on the task and its reports and returns the step, whose
        :attr:`~PhaseStep.process_effects` (signals) the caller performs. An event the phase
        does not allow changes nothing (the step says why)."""
        step = phase_step(task.phases, task.phase, event.kind)
        if not step.allowed:
            return step
        if event.memory_bytes is not None:
            task.memory_bytes = event.memory_bytes
        for effect in step.effects:
            if effect is Effect.OVERRIDE_STOP or (effect is Effect.REMEMBER_STOP and task.stop_kind is None):
                task.stop_kind, task.stop_detail = event.report, event.detail
                task.stop_cause, task.stop_ms = event.cause_id, event.at_ms
            elif effect is Effect.REPORT_RUNNING:
                self.record_event(task, TaskEvent.RUNNING, event.at_ms, event.cause_id, event.detail)
            elif effect is Effect.REPORT_EXIT:
                self._exit(task, event)
        task.phase = step.after
        return step

    def _exit(self, task: HostedTask, event: PhaseEvent) -> None:
        if event.kind is PhaseEventKind.STOP_REQUESTED:  # stopped at once: as the first stop says
            kind, code, detail = task.stop_kind, KILL_EXIT_CODE, task.stop_detail
        else:
            kind, code, detail = event.report, event.exit_code, event.detail
        assert kind is not None
        task.exit_kind, task.exit_code, task.exit_detail, task.exit_ms = kind, code, detail, event.at_ms
        task.exit_sequence = self.record_event(task, kind, event.at_ms, event.cause_id, detail).sequence

    def acknowledge(self, sequence: int) -> None:
        """The master recorded every event up to ``sequence``: forget them."""
        self.acked_sequence = max(self.acked_sequence, sequence)
        while self.events and self.events[0].sequence <= self.acked_sequence:
            self.events.popleft()

    def forget_settled(self) -> None:
        """Drop dead tasks whose exit the master has acknowledged and no longer wants here."""
        for key, record in list(self.tasks.items()):
            if record.alive or record.exit_sequence > self.acked_sequence:
                continue
            if self.desired is not None and self.desired.get(key) == record.plan.incarnation:
                continue
            del self.tasks[key]

    def known_tasks(self) -> list[KnownTask]:
        return [
            KnownTask(key, record.plan.incarnation, record.plan.spec_version, record.alive)
            for key, record in self.tasks.items()
        ]
