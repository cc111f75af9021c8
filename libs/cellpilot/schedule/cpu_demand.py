"""What a master learns about CPU demand from its Borglet polls: the inputs and the check of GPA.

The GPA fit test (GPA §4, :mod:`cellpilot.schedule.gpa`) needs every task's mean and standard
deviation of *instantaneous* CPU usage. A Borglet samples each task every event-second and
answers each poll with the latest sample (usage served, plus the demand it could not serve
because the machine was full). One such sample per task per poll is exactly the kind of
statistic GPA is built on: the Google trace's instantaneous usage is one random 1-second sample
per 5-minute window (GPA §3), and a few tens to a hundred of them estimate the moments about as
well as full knowledge does (GPA §5.5). So the master needs no extra pipeline: it folds each
poll's sample into running moments (:class:`CpuDemandMoments`), which are soft state like the
reservations (Borg §5.5) and are re-learned after a failover.

The moments use Welford's recurrence in variance form with weight ``1 / min(n, window)``:
exact running moments for the first ``window`` samples, then exponential forgetting with that
effective window, so a task whose load drifts is followed (GPA §3.4 finds usage stable over
hours, not forever). A task not yet measured is predicted from its job's measured tasks, as
GPA §2 suggests ("comparing the task to previously submitted tasks belonging to the same
job"): the mixture of their distributions (:func:`pooled_moments`).

:class:`OverflowMeter` counts, per machine sample, whether the machine's CPU demand exceeded
its capacity — with the Borglets' CPU sharing (:func:`cellpilot.world.enforcement.share_cpu`)
that is exactly "some task's demand went unserved because the machine was full" — giving the
observed overflow frequency q that GPA §5 compares with the requested rho.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import BoolArray, FloatArray

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class CpuLearning:
    """How the moments are learned: the effective window and the samples needed to trust them."""

    window: int = 100  # samples; GPA §5.5: about 100 observations do as well as clairvoyance
    min_samples: int = 20  # below this a task is predicted from its job (or counts at its limit)
    overflow_window: int = 20_000  # machine samples behind the recent overflow rate

    def __post_init__(self) -> None:
        if self.window < 2 or self.min_samples < 2 or self.overflow_window < 1:
            raise ValueError("window and min_samples must be >= 2 and overflow_window >= 1")


def welford_step(
    count: npt.ArrayLike, mean: npt.ArrayLike, var: npt.ArrayLike, sample: npt.ArrayLike, window: int
) -> tuple[npt.NDArray[np.int64], FloatArray, FloatArray]:
    """One sample into (count, mean, population variance), weight 1 / min(count + 1, window)."""
    n = np.asarray(count, dtype=np.int64) + 1
    alpha = 1.0 / np.minimum(n, window)
    diff = np.asarray(sample, dtype=np.float64) - np.asarray(mean, dtype=np.float64)
    step = alpha * diff
    new_var = (1.0 - alpha) * (np.asarray(var, dtype=np.float64) + diff * step)
    return n, np.asarray(mean, dtype=np.float64) + step, new_var


def pooled_moments(means: npt.ArrayLike, variances: npt.ArrayLike) -> tuple[float, float]:
    """Mean and variance of a task drawn at random from tasks with these moments (a mixture)."""
    mu = np.asarray(means, dtype=np.float64)
    var = np.asarray(variances, dtype=np.float64)
    if mu.size == 0:
        raise ValueError("no moments to pool")
    mean = float(mu.mean())
    return mean, float(var.mean() + ((mu - mean) ** 2).mean())


class CpuDemandMoments(Generic[K]):
    """Running moments of each task's CPU demand, keyed by task (e.g. ``(job_id, index)``)."""

    def __init__(self, learning: CpuLearning | None = None) -> None:
        self.learning = learning or CpuLearning()
        self._row: dict[K, int] = {}
        self._free: list[int] = []
        self.count = np.zeros(64, dtype=np.int64)
        self.mean = np.zeros(64)
        self.var = np.zeros(64)

    def __len__(self) -> int:
        return len(self._row)

    def _rows(self, keys: Sequence[K]) -> npt.NDArray[np.intp]:
        rows = np.empty(len(keys), dtype=np.intp)
        for i, key in enumerate(keys):
            row = self._row.get(key)
            if row is None:
                if not self._free:
                    old = self.count.shape[0]
                    self.count = np.concatenate([self.count, np.zeros(old, dtype=np.int64)])
                    self.mean = np.concatenate([self.mean, np.zeros(old)])
                    self.var = np.concatenate([self.var, np.zeros(old)])
                    self._free = list(range(2 * old - 1, old - 1, -1))
                row = self._row[key] = self._free.pop()
                self.count[row], self.mean[row], self.var[row] = 0, 0.0, 0.0
            rows[i] = row
        return rows

    def observe(self, keys: Sequence[K], demand: npt.ArrayLike) -> None:
        """One sample per key (keys distinct), CPU demand in millicores."""
        x = np.asarray(demand, dtype=np.float64).reshape(-1)
        if x.size != len(keys):
            raise ValueError(f"{len(keys)} keys but {x.size} samples")
        if not np.all(np.isfinite(x)) or np.any(x < 0):
            raise ValueError("CPU demand samples must be finite and >= 0")
        rows = self._rows(keys)
        self.count[rows], self.mean[rows], self.var[rows] = welford_step(
            self.count[rows], self.mean[rows], self.var[rows], x, self.learning.window
        )

    def tasks(self) -> list[K]:
        return list(self._row)

    def forget(self, key: K) -> None:
        """Forgets one task (it stopped running); nothing if it was not known."""
        row = self._row.pop(key, None)
        if row is not None:
            self._free.append(row)

    def retain(self, keys: Iterable[K]) -> None:
        """Forgets every task not in ``keys`` (tasks that stopped running)."""
        keep = set(keys)
        for key in [k for k in self._row if k not in keep]:
            self._free.append(self._row.pop(key))

    def clear(self) -> None:
        self._free.extend(self._row.values())
        self._row.clear()

    def known(self) -> dict[K, tuple[float, float]]:
        """(mean, std) of every task with at least ``min_samples`` samples."""
        out: dict[K, tuple[float, float]] = {}
        for key, row in self._row.items():
            if self.count[row] >= self.learning.min_samples:
                out[key] = (float(self.mean[row]), float(np.sqrt(max(self.var[row], 0.0))))
        return out


@dataclass(frozen=True)
class OverflowCounts:
    machine_samples: int  # cumulative
    overflowed_samples: int
    recent_samples: int  # within the last ``overflow_window`` samples
    recent_overflowed: int

    @property
    def recent_rate(self) -> float:
        return self.recent_overflowed / self.recent_samples if self.recent_samples else 0.0


def machines_overflowing(demand_sum: npt.ArrayLike, capacity: npt.ArrayLike) -> BoolArray:
    """Whether each machine's summed CPU demand exceeds its capacity (rounding aside)."""
    demand = np.asarray(demand_sum, dtype=np.float64)
    cap = np.asarray(capacity, dtype=np.float64)
    return np.asarray(demand > cap + np.maximum(1.0, 1e-6 * cap))


class OverflowMeter:
    """Machine samples with and without CPU overflow: cumulative, and over a recent window."""

    def __init__(self, window: int = 20_000) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self.samples = 0
        self.overflowed = 0
        self._recent: deque[tuple[int, int]] = deque()  # (samples, overflowed) per batch
        self._recent_samples = 0
        self._recent_overflowed = 0

    def observe(self, demand_sum: npt.ArrayLike, capacity: npt.ArrayLike) -> None:
        """One sample of each machine in a batch (e.g. one poll cycle)."""
        over = machines_overflowing(demand_sum, capacity)
        n, k = int(over.size), int(over.sum())
        if n == 0:
            return
        self.samples += n
        self.overflowed += k
        self._recent.append((n, k))
        self._recent_samples += n
        self._recent_overflowed += k
        while len(self._recent) > 1 and self._recent_samples - self._recent[0][0] >= self.window:
            old_n, old_k = self._recent.popleft()
            self._recent_samples -= old_n
            self._recent_overflowed -= old_k

    def clear(self) -> None:
        self.samples = self.overflowed = self._recent_samples = self._recent_overflowed = 0
        self._recent.clear()

    def counts(self) -> OverflowCounts:
        return OverflowCounts(self.samples, self.overflowed, self._recent_samples, self._recent_overflowed)
