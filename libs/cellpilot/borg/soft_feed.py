"""What the elected master tells its schedulers of its soft state (Borg §3.4, §5.5; GPA §4).

A scheduler's cached copy follows the checkpoint log, but reservations (Borg §5.5: decaying from
the limit toward usage plus a safety margin) and the GPA CPU moments are soft state the master
learns from its polls and never logs. The master keeps, per running task, the version at which
its reservation or moments last moved by more than ``tolerance`` of its limit; a scheduler asks
for everything after the version it last took (:meth:`SoftFeed.changes`), so a quiet cell costs
little, and sets the same numbers in its own copy (:meth:`SoftFeed.take`) — both then judge a
placement alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from cellpilot.borg.records import TaskKey
from cellpilot.schedule import Cell, Resources
from cellpilot.schedule.cell import LIMIT, RESERVATION

TOLERANCE = 0.01  # of the task's limit, per resource; CPU moments of the task's CPU limit


@dataclass(frozen=True)
class TaskSoftState:
    """One running task's soft state as a scheduler takes it."""

    key: TaskKey
    reservation: Resources
    cpu: tuple[float, float] | None = None  # (mean, std) of CPU demand, millicores (GPA)


class SoftFeed:
    """Versions of the running tasks' soft state, for the schedulers to follow."""

    def __init__(self, tolerance: float = TOLERANCE) -> None:
        self.tolerance = tolerance
        self.version = 0
        self._versions: dict[TaskKey, int] = {}
        self._told: dict[TaskKey, np.ndarray] = {}  # reservation (R,) + cpu mean, std
        self.cpu: dict[TaskKey, tuple[float, float]] = {}  # moments a scheduler took

    def forget(self) -> None:
        """The copy was rebuilt: every reservation starts again from its limit."""
        self._told = {}
        self.cpu = {}

    def note(
        self,
        cell: Cell,
        keys: Iterable[TaskKey],
        handles: Iterable[int],
        cpu: Mapping[TaskKey, tuple[float, float]] | None = None,
    ) -> None:
        """The master's copy recomputed these tasks' soft state: bump those that moved."""
        cpu = cpu or {}
        for key, handle in zip(keys, handles, strict=True):
            limit = cell.t_amount[handle, LIMIT]
            moments = cpu.get(key, (-1.0, -1.0))
            now = np.concatenate([cell.t_amount[handle, RESERVATION], moments])
            told = self._told.get(key)
            scale = np.concatenate([limit, [limit[0], limit[0]]])
            if told is None or np.any(np.abs(now - told) > self.tolerance * scale + 1e-9):
                self._told[key] = now
                self.version += 1
                self._versions[key] = self.version

    def changes(
        self, cell: Cell, handle_of: Callable[[TaskKey], int | None], since: int
    ) -> list[TaskSoftState]:
        """The running tasks whose soft state moved after version ``since``."""
        out = []
        gone = []
        for key, version in self._versions.items():
            if version <= since:
                continue
            handle = handle_of(key)
            told = self._told.get(key)
            if handle is None or told is None:
                gone.append(key)
                continue
            reservation = Resources.from_array(cell.t_amount[handle, RESERVATION])
            cpu = (float(told[-2]), float(told[-1])) if told[-2] >= 0 else None
            out.append(TaskSoftState(key, reservation, cpu))
        for key in gone:
            self._versions.pop(key, None)
            self._told.pop(key, None)
        return out

    def take(
        self, cell: Cell, handle_of: Callable[[TaskKey], int | None], entries: Iterable[TaskSoftState]
    ) -> None:
        """A scheduler's copy takes the master's soft state for the tasks it runs too."""
        handles, rows = [], []
        for entry in entries:
            handle = handle_of(entry.key)
            if handle is None or not cell.t_alive[handle]:
                continue
            handles.append(handle)
            rows.append(entry.reservation.array())
            if entry.cpu is not None:
                self.cpu[entry.key] = entry.cpu
        if handles:
            cell.set_reservations(np.array(handles, dtype=np.intp), np.array(rows))
