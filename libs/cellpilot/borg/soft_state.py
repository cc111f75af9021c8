"""The master's soft state (Borg §3.3): what Borglet polls refresh every few seconds and the log
does not record — each task's usage and readiness, each machine's usage, last contact and cached
packages, and the cell's event time.

A new master starts without it and re-learns it from its first polls; a snapshot stores none
of it. :meth:`SoftState.refresh` is the one rule that turns a machine's report into it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cellpilot.borg.records import TaskKey
from cellpilot.schedule import Resources


@dataclass
class SoftState:
    """What polls refresh every few seconds and the log does not record."""

    task_usage: dict[TaskKey, Resources] = field(default_factory=dict)
    task_ready: dict[TaskKey, bool] = field(default_factory=dict)
    machine_usage: dict[str, Resources] = field(default_factory=dict)
    last_contact_ms: dict[str, int] = field(default_factory=dict)
    # The newest event time any Borglet reported: the cell's one clock (restart backoffs,
    # reclamation and lifetimes are judged by it), sped up in a simulated fleet.
    latest_event_ms: int = 0
    cached_packages: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def is_fresh_second(self, machine_id: str, event_time_ms: int) -> bool:
        """Whether a report at ``event_time_ms`` is of a new event-second for the machine (a
        fresh CPU-demand sample, GPA §4) rather than a repeat of the last one."""
        return event_time_ms // 1000 > self.last_contact_ms.get(machine_id, 0) // 1000


NO_SOFT = SoftState()
