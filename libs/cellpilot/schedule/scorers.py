"""Scorers (Borg §3.2): each maps candidate machines to scores in [0, 100], higher better.

Packing: ``best-fit`` fills machines as tightly as possible; ``worst-fit`` is an
E-PVM-like cost that spreads load (Borg calls E-PVM "worst fit", §3.2); ``hybrid``
reduces stranded resources – resources left free on a machine that no typical task
can use because another dimension is full (§3.2; LAVA §2.2 describes Borg's
successor as producing empty shapes that match anticipated workload).

Other criteria of §3.2: minimising the number and priority of preempted tasks,
spreading a job's tasks across failure domains (§4), preferring machines that have
the task's packages, mixing high and low priorities on a machine, and soft
constraints (§2.3).

Packing scores use the task's placement basis: limits for prod, reservations for
non-prod (§5.5). Weights select which resource dimensions count (default CPU, RAM
and disk; ports rarely bind).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from cellpilot.array_types import FloatArray, IntpArray
from cellpilot.schedule.cell import COUNT, NUM_LEVELS, Cell
from cellpilot.schedule.plugins import MAX_SCORE, Plugin, Request, register
from cellpilot.schedule.priority import prod_levels
from cellpilot.schedule.resources import CPU, EPSILON


def utilisation_after(cell: Cell, req: Request, machines: IntpArray) -> tuple[FloatArray, FloatArray]:
    """Fractions of capacity in use before and after placing ``req`` (n, R), capped at 1."""
    inv = cell.inv_capacity[machines]
    before = cell.below[machines, NUM_LEVELS, req.basis] * inv
    after = np.minimum(before + req.limits * inv, 1.0)
    return np.minimum(before, 1.0), after


@dataclass(frozen=True)
class _WeightedPacking(Plugin):
    """A packing scorer's per-dimension weights, normalised to sum 1 in ``_w`` (CPU, RAM,
    disk, ports order); subclasses check their own arguments before calling this
    ``__post_init__``."""

    job_dependent: ClassVar[bool] = False
    cpu: float = 1.0
    ram: float = 1.0
    disk: float = 1.0
    ports: float = 0.0
    _w: FloatArray = field(init=False, repr=False, compare=False, default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        w = np.array([self.cpu, self.ram, self.disk, self.ports], dtype=np.float64)
        if np.any(w < 0) or w.sum() <= 0:
            raise ValueError("resource weights must be >= 0 and not all zero")
        object.__setattr__(self, "_w", w / w.sum())


@register("scorer", "best-fit")
@dataclass(frozen=True)
class BestFit(_WeightedPacking):
    """Mean weighted utilisation after placement: fullest machine first (§3.2)."""

    def score(self, cell: Cell, req: Request, machines: IntpArray) -> FloatArray:
        inv = cell.inv_capacity[machines]
        after = np.minimum((cell.below[machines, NUM_LEVELS, req.basis] + req.limits) * inv, 1.0)
        return (MAX_SCORE * after) @ self._w


@register("scorer", "worst-fit")
@dataclass(frozen=True)
class WorstFit(_WeightedPacking):
    """E-PVM-like (Amir et al., cited in Borg §3.2): minimise the increase of sum_r base^u_r.

    The increase is normalised by its largest possible value, sum_r w_r (base - 1),
    so the score is on the fixed 0–100 scale; the emptiest machine scores highest.
    """

    base: float = 16.0

    def __post_init__(self) -> None:
        if self.base <= 1.0:
            raise ValueError("worst-fit base must be > 1")
        super().__post_init__()

    def score(self, cell: Cell, req: Request, machines: IntpArray) -> FloatArray:
        u0, u1 = utilisation_after(cell, req, machines)
        increase = (np.power(self.base, u1) - np.power(self.base, u0)) @ self._w
        return MAX_SCORE * (1.0 - increase / (self.base - 1.0))


@register("scorer", "hybrid")
@dataclass(frozen=True)
class HybridStranding(_WeightedPacking):
    """Best fit that also minimises stranded resources (Borg §3.2 "hybrid").

    After placement, let f_r be the free fraction of dimension r and s_r the
    anticipated task shape (the cell's mean task limits) as a fraction of the
    machine. k = min_r f_r / s_r typical tasks still fit; what is left,
    f_r - k s_r, is stranded. score = 100 (fill + stranding_weight (1 - stranded))
    / (1 + stranding_weight), with fill and stranded as weighted means over r.
    """

    stranding_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.stranding_weight < 0:
            raise ValueError("stranding_weight must be >= 0")
        super().__post_init__()

    def score(self, cell: Cell, req: Request, machines: IntpArray) -> FloatArray:
        w = self._w
        counted = w > 0
        inv = cell.inv_capacity[machines]
        fill_after = np.minimum((cell.below[machines, NUM_LEVELS, req.basis] + req.limits) * inv, 1.0)
        free = 1.0 - fill_after
        shape = cell.anticipated_shape * inv
        # Typical tasks that still fit; a dimension with no capacity or demand does not limit it.
        k = (free[:, counted] / np.maximum(shape[:, counted], EPSILON)).min(axis=1)
        stranded = np.maximum(free - k[:, None] * shape, 0.0) @ w
        lam = self.stranding_weight
        return (MAX_SCORE / (1.0 + lam)) * (fill_after @ w + lam * (1.0 - stranded))


_FIRST_PROD = prod_levels().start


@register("scorer", "spread")
@dataclass(frozen=True)
class FailureDomainSpread(Plugin):
    """Spread a job's tasks across machines, racks and power domains (Borg §4).

    score = 100 * sum_d w_d / (1 + n_d), where n_d counts the job's tasks already in
    the candidate's machine, rack and power domain.
    """

    job_dependent: ClassVar[bool] = True
    machine: float = 0.6
    rack: float = 0.25
    power: float = 0.15

    def __post_init__(self) -> None:
        if min(self.machine, self.rack, self.power) < 0 or self.machine + self.rack + self.power <= 0:
            raise ValueError("spread weights must be >= 0 and not all zero")

    def score(self, cell: Cell, req: Request, machines: IntpArray) -> FloatArray:
        total = self.machine + self.rack + self.power
        if req.job < 0 or req.job >= len(cell.job_machine_counts):
            return np.full(machines.shape[0], MAX_SCORE)
        on_machine, in_rack, in_power = cell.job_counts(req.job, machines)
        value = self.machine / (1 + on_machine) + self.rack / (1 + in_rack) + self.power / (1 + in_power)
        return MAX_SCORE * value / total


@register("scorer", "packages")
@dataclass(frozen=True)
class PackageLocality(Plugin):
    """Prefer machines that already have the task's packages installed (Borg §3.2)."""

    job_dependent: ClassVar[bool] = False

    def score(self, cell: Cell, req: Request, machines: IntpArray) -> FloatArray:
        packages = req.shape.packages
        if not packages:
            return np.full(machines.shape[0], MAX_SCORE)
        present = np.zeros(machines.shape[0])
        for package in packages:
            holders = cell.packages.get(package)
            if holders:
                present += np.fromiter(
                    (m in holders for m in machines.tolist()), dtype=bool, count=machines.size
                )
        return MAX_SCORE * present / len(packages)


@register("scorer", "mix-priorities")
@dataclass(frozen=True)
class PriorityMixing(Plugin):
    """Prefer a mix of prod and non-prod work on a machine (Borg §3.2), by CPU limits.

    With s the prod share of the machine's CPU limits after placement,
    score = 100 * 4 s (1 - s): highest for an even mix.
    """

    job_dependent: ClassVar[bool] = False

    def score(self, cell: Cell, req: Request, machines: IntpArray) -> FloatArray:
        cpu = cell.below[machines, :, CPU]  # (n, levels + 1)
        total = cpu[:, NUM_LEVELS] + req.limits[CPU]
        prod = cpu[:, NUM_LEVELS] - cpu[:, _FIRST_PROD] + (req.limits[CPU] if req.prod else 0.0)
        share = prod / np.maximum(total, EPSILON)
        return (4.0 * MAX_SCORE) * share * (1.0 - share)


@register("scorer", "soft-constraints")
@dataclass(frozen=True)
class SoftConstraints(Plugin):
    """Weighted share of the task's soft constraints the machine satisfies (§2.3)."""

    job_dependent: ClassVar[bool] = False

    def score(self, cell: Cell, req: Request, machines: IntpArray) -> FloatArray:
        if not req.soft:
            return np.full(machines.shape[0], MAX_SCORE)
        total = sum(c.weight for c in req.soft)
        met = np.zeros(machines.shape[0])
        for constraint in req.soft:
            met += constraint.weight * cell.attributes.satisfies(constraint, machines)
        return MAX_SCORE * met / total


@register("scorer", "preemption-cost")
@dataclass(frozen=True)
class PreemptionCost(Plugin):
    """Fewest and lowest-priority preemptions first (Borg §3.2).

    100 when the task fits without preempting. Otherwise, with l the lowest level
    such that evicting every task below l covers the shortfall and n the number of
    tasks below l: 90 (1 - l / levels) + 10 / (1 + n). The priority of the victims
    dominates, their number breaks ties.
    """

    job_dependent: ClassVar[bool] = False

    def score(self, cell: Cell, req: Request, machines: IntpArray) -> FloatArray:
        free = cell.capacity[machines] - cell.below[machines, NUM_LEVELS, req.basis]
        deficit = req.limits - free
        needs = (deficit > EPSILON).any(axis=1)
        out = np.full(machines.shape[0], MAX_SCORE)
        if not needs.any() or req.threshold == 0:
            out[needs] = 0.0
            return out
        rows = machines[needs]
        held = cell.below[rows, 1 : req.threshold + 1]  # (n, thr, K): held by tasks below level l
        covered = np.asarray((held[:, :, req.basis] >= deficit[needs][:, None, :] - EPSILON).all(axis=2))
        any_cover = covered.any(axis=1)
        level = np.argmax(covered, axis=1) + 1
        count = held[np.arange(rows.size), level - 1, COUNT]
        score = 90.0 * (1.0 - level / NUM_LEVELS) + 10.0 / (1.0 + count)
        out[needs] = np.where(any_cover, score, 0.0)
        return out


PACKING_SCORERS = ("best-fit", "worst-fit", "hybrid")
