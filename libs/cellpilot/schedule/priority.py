"""Priorities, priority bands and who may preempt whom (Borg §2.5).

Borg priorities are small positive integers grouped into non-overlapping bands;
in decreasing order: monitoring, production, batch and best effort (§2.5). The
paper gives no numbers, so we use the twelve levels of the public Google cluster
trace (which Borg §2.1 points to): 0–1 best effort ("free"), 2–8 batch,
9–10 production, 11 monitoring. "Prod" means the monitoring and production bands
(§2.5), the rest is "non-prod".

Preemption: a task may evict only strictly lower-priority tasks, and tasks in the
production band never preempt one another, to avoid preemption cascades (§2.5).
We apply the same rule inside the monitoring band. Monitoring may still preempt
production, which is lower.
"""

from __future__ import annotations

import numpy as np

from cellpilot.job_vocabulary import PriorityBand as Band

NUM_PRIORITIES = 12

# First priority level of each band.
BAND_START: dict[Band, int] = {Band.BEST_EFFORT: 0, Band.BATCH: 2, Band.PRODUCTION: 9, Band.MONITORING: 11}

_BAND_OF_LEVEL = np.array(
    [Band.BEST_EFFORT] * 2 + [Band.BATCH] * 7 + [Band.PRODUCTION] * 2 + [Band.MONITORING], dtype=np.int8
)
PROD_BANDS = frozenset({Band.PRODUCTION, Band.MONITORING})
# Bands whose members never preempt each other (§2.5: production; we add monitoring).
NON_PREEMPTING_BANDS = frozenset({Band.PRODUCTION, Band.MONITORING})


def check_priority(priority: int) -> None:
    if not 0 <= priority < NUM_PRIORITIES:
        raise ValueError(f"priority must be in [0, {NUM_PRIORITIES - 1}], got {priority}")


def band_of(priority: int) -> Band:
    check_priority(priority)
    return Band(int(_BAND_OF_LEVEL[priority]))


def is_prod(priority: int) -> bool:
    """Monitoring and production bands are "prod" (§2.5)."""
    return band_of(priority) in PROD_BANDS


def preemption_threshold(priority: int) -> int:
    """Tasks with a priority strictly below this level may be preempted by ``priority``."""
    band = band_of(priority)
    if band in NON_PREEMPTING_BANDS:
        return BAND_START[band]
    return priority


def may_preempt(preemptor: int, victim: int) -> bool:
    check_priority(victim)
    return victim < preemption_threshold(preemptor)


def prod_levels() -> range:
    """Priority levels that form the prod bands."""
    return range(BAND_START[Band.PRODUCTION], NUM_PRIORITIES)
