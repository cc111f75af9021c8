"""A warm copy of the cell, as every Borgmaster replica and every scheduler keeps one (Borg §3.1, §3.4).

Borg §3.1: each replica keeps an in-memory copy of the cell's state; §3.4: a scheduler operates on
a cached copy of it. A :class:`CellCopy` is that copy: the logical state the checkpoint log gives
(:class:`CellState`), the scheduling view that follows it (:class:`SchedulingView`), and the
recent changes of the records applied (for the event stream and a task's recent events). It
changes only through :meth:`CellCopy.load` (a snapshot) and :meth:`CellCopy.apply` (log records
in order); the elected master's core (:mod:`cellpilot.borg.master_core`) and the scheduler's
copy (:mod:`cellpilot.borg.scheduler_copy`) build on it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from cellpilot.borg.cell_state import CellState
from cellpilot.borg.changes import Change, TaskChange
from cellpilot.borg.mutations import LogRecord
from cellpilot.borg.records import TaskKey
from cellpilot.borg.scheduling_view import SchedulingView


class RecentChanges:
    """The changes of the last ``limit`` applied records, by log position (for the publisher)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.first_seq = 1
        self._items: list[list[Change]] = []

    def append(self, seq: int, changes: list[Change]) -> None:
        if self.limit <= 0:
            return
        if not self._items or seq != self.first_seq + len(self._items):
            self.first_seq, self._items = seq, []
        self._items.append(changes)
        if len(self._items) > 2 * self.limit:
            drop = len(self._items) - self.limit
            self.first_seq += drop
            del self._items[:drop]

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self._items) - 1

    def since(self, seq: int, limit: int = 2_000) -> list[tuple[int, list[Change]]]:
        """Records after ``seq`` (from the oldest kept if ``seq`` is older)."""
        start = max(seq + 1 - self.first_seq, 0)
        chunk = self._items[start : start + limit]
        return [(self.first_seq + start + i, changes) for i, changes in enumerate(chunk)]


class CellCopy:
    """The state, its scheduling view and the recent changes, kept in step with the log."""

    def __init__(self, view: SchedulingView, recent_changes: int = 0, recent_task_events: int = 0) -> None:
        self.state = CellState()
        self.view = view
        self.recent = RecentChanges(recent_changes)
        self.recent_task_events = recent_task_events
        self.task_events: dict[TaskKey, deque[TaskChange]] = {}
        self.loaded_snapshot_seq = 0  # the snapshot the state was last loaded from (0: none)
        self.records_since_snapshot = 0

    def load(self, state: CellState, snapshot_seq: int) -> None:
        """Starts from a snapshot's state (bounded recovery, Borg §3.1)."""
        self.state = state
        self.recent = RecentChanges(self.recent.limit)
        self.task_events = {}
        self.loaded_snapshot_seq = snapshot_seq
        self.view.rebuild(state)

    def apply(self, records: Iterable[LogRecord]) -> list[tuple[int, list[Change]]]:
        """Applies committed records in order; returns each one's changes."""
        applied = []
        for record in records:
            changes = self.state.apply(record)
            self.view.observe(self.state, changes)
            self.recent.append(record.sequence, changes)
            self.records_since_snapshot += 1
            if self.recent_task_events:
                for change in changes:
                    if isinstance(change, TaskChange):
                        key = (change.job_id, change.task_index)
                        events = self.task_events.get(key)
                        if events is None:
                            events = self.task_events[key] = deque(maxlen=self.recent_task_events)
                        events.append(change)
            applied.append((record.sequence, changes))
        return applied

    def discard_speculation(self) -> None:
        """Rebuilds the view from the state: whatever was bound in it but never committed goes."""
        self.view.rebuild(self.state)
