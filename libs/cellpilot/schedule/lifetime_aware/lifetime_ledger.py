"""Predicted exit times of the VMs on a pool's hosts, kept up to date by repredictions.

LAS and LAVA score a host by the latest *repredicted* exit time of its VMs (§4.2):
a VM that has outlived its first prediction is re-run through the model with its
uptime, which corrects the misprediction (§3). LA-Binary instead keeps the one-shot
prediction made at creation (§2.4, §5.3). The ledger holds both, per VM and per host
(the host's exit time is the maximum over its VMs).

When to repredict. §3 runs the model "when re-evaluating a VM". Here a VM is
re-evaluated lazily, in one batch with the other due VMs, before the next scheduling
decision after (a) it outlived its current predicted exit time, or (b) its uptime grew
by ``growth`` (default 25 %, two of §3's 12.5 % uptime steps) since the last
prediction, and at most every ``min_step`` seconds. Between re-evaluations the
predicted exit time of a VM stays put. Predictors whose answers never change with
uptime (the oracle) are not re-run.
"""

from __future__ import annotations

import heapq

import numpy as np

from cellpilot.array_types import FloatArray, Int64Array
from cellpilot.lifetimes.predictors import LifetimePredictor


class LifetimeLedger:
    """Per VM (trace row) and per host: predicted exit times, current and one-shot."""

    def __init__(
        self,
        predictor: LifetimePredictor,
        created: FloatArray,
        n_hosts: int,
        growth: float = 1.25,
        min_step: float = 600.0,
    ) -> None:
        if growth <= 1.0 or min_step <= 0:
            raise ValueError("growth must be > 1 and min_step > 0")
        self.predictor = predictor
        self.created = np.asarray(created, dtype=np.float64)
        n_vms = self.created.shape[0]
        self.growth = growth
        self.min_step = min_step
        self.exit = np.full(n_vms, np.nan)  # latest predicted exit time
        self.first_exit = np.full(n_vms, np.nan)  # exit predicted at creation (uptime 0)
        self.host_of = np.full(n_vms, -1, dtype=np.int64)
        self.host_vms: list[set[int]] = [set() for _ in range(n_hosts)]
        self._host_exit = np.full(n_hosts, -np.inf)
        self._host_first_exit = np.full(n_hosts, -np.inf)
        self._dirty: set[int] = set()
        self._due: list[tuple[float, int]] = []
        self._check_at = np.full(n_vms, np.inf)
        self.predictions = 0

    # ------------------------------------------------------------------ VMs
    def predict(self, row: int, now: float) -> float:
        """Predicts (or repredicts) the remaining lifetime of VM ``row`` at ``now``; returns it."""
        uptime = max(now - self.created[row], 0.0)
        rows = np.array([row], dtype=np.int64)
        remaining = -1.0
        if np.isnan(self.first_exit[row]):
            remaining = float(self.predictor.remaining(rows, np.zeros(1))[0])
            self.first_exit[row] = self.created[row] + remaining
            self.predictions += 1
        if uptime > 0.0 or remaining < 0.0:
            remaining = float(self.predictor.remaining(rows, np.array([uptime]))[0])
            self.predictions += 1
        self._record(rows, np.array([now + remaining]), np.array([uptime]), now)
        return remaining

    def lifetime_class(self, row: int, now: float) -> int:
        """The LAVA class (§4.3) the predictor gives VM ``row`` at ``now``; -1: the class of its remaining."""
        classify = getattr(self.predictor, "lifetime_classes", None)
        if classify is None:
            return -1
        uptime = max(now - self.created[row], 0.0)
        return int(classify(np.array([row], dtype=np.int64), np.array([uptime]))[0])

    def _record(self, rows: Int64Array, exits: FloatArray, uptimes: FloatArray, now: float) -> None:
        self.exit[rows] = exits
        for r in rows.tolist():
            host = int(self.host_of[r])
            if host >= 0:
                self._dirty.add(host)
        if not self.predictor.repredicts:
            return
        later = self.created[rows] + np.maximum(uptimes * self.growth, uptimes + self.min_step)
        check = np.maximum(np.minimum(exits, later), now + self.min_step)
        self._check_at[rows] = check
        for t, r in zip(check.tolist(), rows.tolist(), strict=True):
            heapq.heappush(self._due, (t, r))

    def refresh(self, now: float) -> int:
        """Repredicts, in one batch, every placed VM due for re-evaluation; returns how many."""
        due: list[int] = []
        while self._due and self._due[0][0] <= now:
            t, r = heapq.heappop(self._due)
            if self.host_of[r] >= 0 and self._check_at[r] == t:
                due.append(r)
        if not due:
            return 0
        rows = np.array(sorted(set(due)), dtype=np.int64)
        uptimes = np.maximum(now - self.created[rows], 0.0)
        remaining = self.predictor.remaining(rows, uptimes)
        self.predictions += int(rows.size)
        self._record(rows, now + remaining, uptimes, now)
        return int(rows.size)

    # ---------------------------------------------------------------- hosts
    def attach(self, row: int, host: int) -> None:
        if np.isnan(self.exit[row]):
            raise ValueError(f"VM {row} has no prediction yet")
        self.detach(row)
        self.host_of[row] = host
        self.host_vms[host].add(row)
        self._host_exit[host] = max(self._host_exit[host], self.exit[row])
        self._host_first_exit[host] = max(self._host_first_exit[host], self.first_exit[row])

    def detach(self, row: int) -> None:
        host = int(self.host_of[row])
        if host < 0:
            return
        self.host_vms[host].discard(row)
        self.host_of[row] = -1
        self._dirty.add(host)

    def _recompute(self) -> None:
        for host in self._dirty:
            rows = np.fromiter(self.host_vms[host], dtype=np.int64, count=len(self.host_vms[host]))
            self._host_exit[host] = float(self.exit[rows].max()) if rows.size else -np.inf
            self._host_first_exit[host] = float(self.first_exit[rows].max()) if rows.size else -np.inf
        self._dirty.clear()

    def host_exit(self) -> FloatArray:
        """Latest predicted exit time per host (max over its VMs); -inf for hosts without VMs."""
        self._recompute()
        return self._host_exit

    def host_first_exit(self) -> FloatArray:
        """Per host, the latest exit time among its VMs' one-shot predictions; -inf when empty."""
        self._recompute()
        return self._host_first_exit
