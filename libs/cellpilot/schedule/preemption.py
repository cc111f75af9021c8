"""Choosing victims on the selected machine (Borg §3.2, §2.5).

If the chosen machine lacks room, Borg preempts lower-priority tasks, from lowest to
highest priority, until the task fits; the victims go back to the pending queue
(§3.2). Only tasks the preemptor may preempt are candidates (production never
preempts production, §2.5): the request's ``threshold`` encodes that.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cellpilot.array_types import IntpArray
from cellpilot.schedule.cell import NUM_LEVELS, Cell
from cellpilot.schedule.plugins import FitCheck, Plugin, Request, register


@register("preemptor", "lowest-priority-first")
@dataclass(frozen=True)
class LowestPriorityFirst(Plugin):
    """Evict from the lowest priority up; within a priority, the larger tasks first."""

    def victims(self, cell: Cell, req: Request, machine: int, fits: FitCheck) -> IntpArray | None:
        capacity = cell.capacity[machine][None, :]
        used = cell.below[machine, NUM_LEVELS][None, :]
        if fits(capacity, used, req)[0]:
            return np.empty(0, dtype=np.intp)
        threshold = req.threshold
        candidates = [h for h in cell.machine_tasks[machine] if cell.t_priority[h] < threshold]
        if not candidates:
            return None
        handles = np.array(sorted(candidates), dtype=np.intp)
        safe = np.where(capacity[0] > 0, capacity[0], 1.0)
        size = (cell.t_amount[handles, req.basis] / safe).sum(axis=1)
        order = np.lexsort((handles, -size, cell.t_priority[handles]))
        handles = handles[order]
        freed = np.cumsum(cell.t_amount[handles], axis=0)
        ok = fits(np.repeat(capacity, handles.size, axis=0), used - freed, req)
        if not ok.any():
            return None
        return handles[: int(np.argmax(ok)) + 1]
