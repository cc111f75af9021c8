"""Why a lifetime-aware policy gains or loses empty hosts: measurements taken during a replay.

LAVA's claim (§4.3) is that its adaptation to mispredictions (repredictions, residual
VMs, class changes at deadlines) keeps a weak model from costing empty hosts. These
figures show where that holds and where it does not, per run:

* **Per-class mispredictions** (§4.3 lifetime classes): each placement's predicted
  class (from the predicted remaining lifetime the policy used) against the class of
  the VM's true remaining lifetime: the share under- and over-predicted per predicted
  class, and how long underpredicted VMs stay past their class's upper bound.
* **Host class changes** (§4.3, Figure 5b/5c): LAVA's down- and up-reclassifications
  and open-to-recycling transitions, per host and day.
* **Placement reasons** (§4.3's preference order): how many VMs went to a recycling
  host of a longer class (gap fillers), an open host of their class, any other
  non-empty host (the fallback), or an empty host.
* **Empty-host time lost per cause**: at every empty-host sample, a non-empty host
  whose VMs have *all* outlived the exit time predicted when they were placed would
  be empty had those predictions held. Its share of the pool, averaged over samples,
  is the empty-host percentage the run lost to underpredictions; it is split by the
  placement reason of the host's latest-exiting VM (the one holding it), and by whether
  that VM's predicted class was below its true class (a class miss) or right (a miss
  within the class). ``sparse_hosts_pp`` is the share of hosts that are non-empty but
  under 20 % allocated (cores and memory): occupied hosts doing little.

Nothing here changes a decision; the simulator feeds it what it already knows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from cellpilot.lifetimes.lifetime_classes import LIFETIME_CLASS_UPPER, NUM_LIFETIME_CLASSES, lifetime_class
from cellpilot.lifetimes.vm_table import DAY, VmTrace
from cellpilot.schedule.lifetime_aware.host_pool import CORES, MEMORY, HostPool
from cellpilot.schedule.lifetime_aware.lifetime_scores import HOUR

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Placement reasons (LAVA's preference order, §4.3); policies without host states use ANY.
GAP_FILLER, OPEN_SAME, FALLBACK, EMPTY_HOST, ANY = range(5)
REASON_NAMES = ("gap_filler", "open_same_class", "non_empty_fallback", "empty_host", "any")
SPARSE_BELOW = 0.2


def placement_reason(rank: int, open_same_rank: int) -> int:
    """Maps a LAVA preference rank (:func:`~cellpilot.schedule.lifetime_aware.lava.lava_ranks`:
    recycling hosts below ``open_same_rank``, then open same class, fallback, empty) to a reason."""
    if rank < open_same_rank:
        return GAP_FILLER
    return (OPEN_SAME, FALLBACK, EMPTY_HOST)[rank - open_same_rank]


class ReplayDiagnostics:
    """Collects the figures of the module doc during one replay."""

    def __init__(self, trace: VmTrace, n_hosts: int, warmup: float) -> None:
        n = len(trace)
        self.deleted = trace.deleted
        self.warmup = warmup
        self.predicted_exit = np.full(n, np.nan)  # at the (latest) placement
        self.predicted_class = np.full(n, -1, dtype=np.int64)
        self.reason = np.full(n, ANY, dtype=np.int64)
        self.class_miss = np.zeros(n, dtype=bool)  # predicted class below the true one at placement
        self.n_hosts = n_hosts
        self.reasons = np.zeros(len(REASON_NAMES), dtype=np.int64)
        # rows: predicted class at placement; columns: true remaining class
        self.confusion = np.zeros((NUM_LIFETIME_CLASSES, NUM_LIFETIME_CLASSES), dtype=np.int64)
        self.overstay_hours: list[float] = []
        self.samples = 0
        self.lost = np.zeros((len(REASON_NAMES), 2))  # host-samples: reason x (class miss, within class)
        self.sparse = 0
        self.state_mix = np.zeros((3, NUM_LIFETIME_CLASSES + 1))  # LAVA state x (class + 1)
        # host-seconds of occupancy each placement added, by reason x (under, right, over)
        self.extension = np.zeros((len(REASON_NAMES), 3))
        self.end = float(trace.horizon)

    def placed(
        self, row: int, now: float, remaining: float, reason: int, host_rows: set[int], klass: int = -1
    ) -> None:
        """Before VM ``row`` joins a host that holds ``host_rows``; ``klass``: the class the policy
        used for it (-1: the class of ``remaining``)."""
        self.reason[row] = reason
        self.reasons[reason] += 1
        held = max((float(self.deleted[r]) for r in host_rows), default=now)
        start = max(held, now, self.warmup)
        stop = min(float(self.deleted[row]), self.end)
        verdict = 1
        predicted = klass if klass >= 0 else (-1 if np.isnan(remaining) else int(lifetime_class(remaining)))
        if predicted >= 0:
            actual = int(lifetime_class(self.deleted[row] - now))
            verdict = 0 if predicted < actual else (2 if predicted > actual else 1)
        self.extension[reason, verdict] += max(stop - start, 0.0)
        if np.isnan(remaining):
            return
        self.predicted_exit[row] = now + remaining
        true_remaining = float(self.deleted[row] - now)
        true_class = int(lifetime_class(true_remaining))
        self.predicted_class[row] = predicted
        self.class_miss[row] = predicted < true_class
        self.confusion[predicted, true_class] += 1
        upper = float(LIFETIME_CLASS_UPPER[predicted])
        if predicted < NUM_LIFETIME_CLASSES - 1 and true_remaining > upper:
            self.overstay_hours.append((true_remaining - upper) / HOUR)

    def sample(
        self, now: float, pool: HostPool, state: IntArray | None = None, klass: IntArray | None = None
    ) -> None:
        """One empty-host sample; ``state`` and ``klass``: LAVA's host states and classes, if any."""
        if now < self.warmup:
            return
        self.samples += 1
        if state is not None and klass is not None:
            np.add.at(self.state_mix, (state, klass + 1), 1)
        share = pool.used[:, [CORES, MEMORY]] / pool.capacity[:, [CORES, MEMORY]]
        self.sparse += int(np.sum((pool.vm_count > 0) & np.all(share < SPARSE_BELOW, axis=1)))
        for host in np.flatnonzero(pool.vm_count > 0).tolist():
            rows = np.fromiter(pool.vms[host], dtype=np.int64, count=len(pool.vms[host]))
            predicted = self.predicted_exit[rows]
            if np.any(np.isnan(predicted)) or np.any(predicted >= now):
                continue
            holder = rows[int(np.argmax(self.deleted[rows]))]
            self.lost[self.reason[holder], 0 if self.class_miss[holder] else 1] += 1

    def summary(self, days: float) -> dict[str, Any]:
        """Plain data for the run's summary row (``days``: measured span, for per-day rates)."""
        placed = self.confusion.sum(axis=1)
        under = np.array([self.confusion[c, c + 1 :].sum() for c in range(NUM_LIFETIME_CLASSES)])
        over = np.array([self.confusion[c, :c].sum() for c in range(NUM_LIFETIME_CLASSES)])
        per = max(self.samples, 1) * self.n_hosts / 100.0  # host-samples per percentage point
        overstay = np.asarray(self.overstay_hours)
        occupancy = max(self.n_hosts * (self.end - self.warmup), 1e-9)
        out: dict[str, Any] = {
            "placements_by_reason": dict(zip(REASON_NAMES, self.reasons.tolist(), strict=True)),
            "class_confusion_at_placement": self.confusion.tolist(),
            "underpredicted_share_by_class": np.divide(under, np.maximum(placed, 1)).round(4).tolist(),
            "overpredicted_share_by_class": np.divide(over, np.maximum(placed, 1)).round(4).tolist(),
            "underpredicted_vms": int(overstay.size),
            "overstay_hours_median": float(np.median(overstay)) if overstay.size else 0.0,
            "overstay_hours_p90": float(np.quantile(overstay, 0.9)) if overstay.size else 0.0,
            "lost_empty_pp_total": float(self.lost.sum() / per),
            "lost_empty_pp_class_miss": {
                REASON_NAMES[r]: round(float(self.lost[r, 0] / per), 3) for r in range(len(REASON_NAMES))
            },
            "lost_empty_pp_within_class": {
                REASON_NAMES[r]: round(float(self.lost[r, 1] / per), 3) for r in range(len(REASON_NAMES))
            },
            "sparse_hosts_pp": float(self.sparse / per),
            "lava_hosts_pp_by_state_and_class": {
                name: [round(float(v / per), 2) for v in self.state_mix[i, 1:]]
                for i, name in enumerate(("empty", "open", "recycling"))
                if i > 0 and self.state_mix[i].sum()
            },
            "occupied_pp_by_reason": {
                REASON_NAMES[r]: {
                    v: round(float(100.0 * self.extension[r, i] / occupancy), 3)
                    for i, v in enumerate(("class_under", "class_right", "class_over"))
                }
                for r in range(len(REASON_NAMES))
                if self.reasons[r]
            },
            "days_measured": days,
        }
        return out


def per_host_day(count: int, hosts: int, seconds: float) -> float:
    return count / max(hosts * seconds / DAY, 1e-12)
