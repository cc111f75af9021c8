"""Quota and admission control (Borg §2.5).

Quota is a vector of resource quantities per user at a given priority; it bounds
what the user's jobs may ask for at a time. Quota checking is admission control,
not scheduling: a job without enough quota is rejected at submission, and the
rejection names the resource and by how much it is over. Every user has infinite
quota at priority zero (§2.5). We keep quota per user and priority band.

A job's demand is its task count times its per-task limits. Jobs that run inside
an alloc set are charged nothing: the allocs already hold (and were charged for)
the resources (§2.4).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cellpilot.job_vocabulary import PriorityBand
from cellpilot.schedule.model import PlacementJob
from cellpilot.schedule.priority import band_of
from cellpilot.schedule.resources import EPSILON, NUM_RESOURCES, RESOURCE_NAMES, Resources, format_amount


@dataclass(frozen=True)
class Admitted:
    job: str


@dataclass(frozen=True)
class Rejected:
    job: str
    resource: str
    requested: float  # the job's total demand of ``resource``
    available: float  # quota left for it before this job
    reason: str

    @property
    def over_by(self) -> float:
        return self.requested - self.available


class QuotaBook:
    """Quota per (user, band) and what admitted jobs use of it."""

    def __init__(self) -> None:
        self._quota: dict[tuple[str, PriorityBand], np.ndarray] = {}
        self._used: dict[tuple[str, PriorityBand], np.ndarray] = {}
        self._jobs: dict[str, tuple[str, PriorityBand, np.ndarray]] = {}

    def set_quota(self, user: str, band: PriorityBand, quota: Resources) -> None:
        self._quota[(user, band)] = quota.array()

    def quota(self, user: str, band: PriorityBand) -> Resources:
        return Resources.from_array(self._quota.get((user, band), np.zeros(NUM_RESOURCES)))

    def used(self, user: str, band: PriorityBand) -> Resources:
        return Resources.from_array(self._used.get((user, band), np.zeros(NUM_RESOURCES)))

    @staticmethod
    def demand(job: PlacementJob) -> np.ndarray:
        if job.shape.alloc_set is not None:
            return np.zeros(NUM_RESOURCES)
        return job.task_count * job.shape.limits.array()

    def check(self, job: PlacementJob, replacing: str | None = None) -> Admitted | Rejected:
        """Would ``job`` be admitted (optionally in place of the admitted job ``replacing``)?"""
        demand = self.demand(job)
        if job.priority == 0:
            return Admitted(job.name)  # infinite quota at priority zero (§2.5)
        band = band_of(job.priority)
        key = (job.user, band)
        used = self._used.get(key, np.zeros(NUM_RESOURCES)).copy()
        if replacing is not None and replacing in self._jobs:
            old_user, old_band, old_demand = self._jobs[replacing]
            if (old_user, old_band) == key:
                used -= old_demand
        quota = self._quota.get(key, np.zeros(NUM_RESOURCES))
        left = quota - used
        over = np.flatnonzero(demand > left + EPSILON)
        if over.size == 0:
            return Admitted(job.name)
        r = int(over[0])
        name = RESOURCE_NAMES[r]
        available = max(float(left[r]), 0.0)
        reason = (
            f"job {job.name} asks for {format_amount(r, demand[r])} of {name} at {band.name.lower()} "
            f"priority; user {job.user} has {format_amount(r, available)} of "
            f"{format_amount(r, quota[r])} quota left (over by {format_amount(r, demand[r] - available)})"
        )
        return Rejected(job.name, name, float(demand[r]), available, reason)

    def admit(self, job: PlacementJob) -> Admitted | Rejected:
        """Checks quota at submission; an admitted job's demand is charged to its user."""
        if job.name in self._jobs:
            raise ValueError(f"job {job.name} is already admitted")
        verdict = self.check(job)
        if isinstance(verdict, Admitted):
            self._charge(job)
        return verdict

    def update(self, job: PlacementJob) -> Admitted | Rejected:
        """Re-admits a changed job (more tasks, bigger limits, another priority)."""
        verdict = self.check(job, replacing=job.name)
        if isinstance(verdict, Admitted):
            self.release(job.name)
            self._charge(job)
        return verdict

    def release(self, job_name: str) -> None:
        entry = self._jobs.pop(job_name, None)
        if entry is not None:
            user, band, demand = entry
            self._used[(user, band)] = self._used[(user, band)] - demand  # never in place: see copy()

    def copy(self) -> QuotaBook:
        """An independent book with the same quotas and charges (the arrays are never changed in
        place, so they are shared)."""
        other = QuotaBook()
        other._quota = dict(self._quota)
        other._used = dict(self._used)
        other._jobs = dict(self._jobs)
        return other

    def _charge(self, job: PlacementJob) -> None:
        band = band_of(job.priority)
        demand = self.demand(job)
        key = (job.user, band)
        self._used[key] = self._used.get(key, np.zeros(NUM_RESOURCES)) + demand
        self._jobs[job.name] = (job.user, band, demand)
