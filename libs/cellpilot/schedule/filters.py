"""Feasibility filters (Borg §3.2): resources, hard constraints, and GPA for CPU.

Resources available to a task include those held by lower-priority tasks it may
preempt (§3.2). Prod tasks are checked against the limits of the tasks already on
the machine, non-prod tasks against their reservations, so that they can use
reclaimed resources (§5.5). With ``gpa_rho > 0`` the CPU dimension of non-prod
tasks is instead checked with the Gaussian Percentile Approximation (GPA §4): the
machine's CPU usage is modelled as a Gaussian with the summed means and variances
of its tasks' instantaneous usage, and the task fits iff the probability that it
exceeds the capacity stays at most ``gpa_rho``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cellpilot.array_types import BoolArray, FloatArray, IntpArray
from cellpilot.schedule.cell import CPU_MEAN, CPU_VAR, NUM_LEVELS, Cell
from cellpilot.schedule.gpa import gaussian_z
from cellpilot.schedule.plugins import Plugin, Request, register
from cellpilot.schedule.resources import CPU, EPSILON, RESOURCE_NAMES


def non_preemptible_use(cell: Cell, req: Request, machines: IntpArray) -> FloatArray:
    """Channels held on ``machines`` by tasks ``req`` may not preempt: shape (n, K)."""
    return cell.below[machines, NUM_LEVELS] - cell.below[machines, req.threshold]


@register("filter", "resources")
@dataclass(frozen=True)
class ResourceFit(Plugin):
    """Enough of every resource, counting preemptible tasks as free (§3.2, §5.5)."""

    gpa_rho: float = 0.0  # > 0: GPA CPU fit test for non-prod tasks with this overflow probability
    _z: float = field(default=0.0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not 0.0 <= self.gpa_rho < 1.0:
            raise ValueError(f"gpa_rho must be in [0, 1), got {self.gpa_rho}")
        if self.gpa_rho > 0:
            object.__setattr__(self, "_z", gaussian_z(self.gpa_rho))

    def uses_gpa(self, req: Request) -> bool:
        return self.gpa_rho > 0 and not req.prod

    def fits(self, capacity: FloatArray, used: FloatArray, req: Request) -> BoolArray:
        """Row-wise fit of ``req`` given capacities (n, R) and the channels in use (n, K)."""
        avail = capacity - used[:, req.basis]
        need = req.limits - EPSILON
        if not self.uses_gpa(req):
            return np.asarray((avail >= need).all(axis=1))
        ok = (avail[:, 1:] >= need[1:]).all(axis=1)
        mean = used[:, CPU_MEAN] + req.amount[CPU_MEAN]
        var = used[:, CPU_VAR] + req.amount[CPU_VAR]
        return ok & (mean + self._z * np.sqrt(var) <= capacity[:, CPU] + EPSILON)

    def feasible(self, cell: Cell, req: Request, machines: IntpArray) -> BoolArray:
        used = non_preemptible_use(cell, req, machines)
        return cell.alive[machines] & self.fits(cell.capacity[machines], used, req)

    def shortfall(self, cell: Cell, req: Request, machines: IntpArray) -> FloatArray:
        """Per machine and resource, how much the request exceeds what is available (n, R)."""
        used = non_preemptible_use(cell, req, machines)
        capacity = cell.capacity[machines]
        short = req.limits - (capacity - used[:, req.basis])
        if self.uses_gpa(req):
            # CPU under GPA: how much lower the task's mean must be for the test to pass.
            mean = used[:, CPU_MEAN] + req.amount[CPU_MEAN]
            var = used[:, CPU_VAR] + req.amount[CPU_VAR]
            short[:, CPU] = mean + self._z * np.sqrt(var) - capacity[:, CPU]
        return short

    def exclusions(self, cell: Cell, req: Request, machines: IntpArray) -> dict[str, BoolArray]:
        short = self.shortfall(cell, req, machines)
        out: dict[str, BoolArray] = {}
        for r, resource in enumerate(RESOURCE_NAMES):
            label = "cpu (GPA)" if r == CPU and self.uses_gpa(req) else resource
            out[label] = short[:, r] > EPSILON
        return out


@register("filter", "hard-constraints")
@dataclass(frozen=True)
class HardConstraints(Plugin):
    """Hard constraints on machine attributes filter machines (§2.3)."""

    def feasible(self, cell: Cell, req: Request, machines: IntpArray) -> BoolArray:
        ok = np.ones(machines.shape[0], dtype=bool)
        for constraint in req.hard:
            ok &= cell.attributes.satisfies(constraint, machines)
        return ok

    def exclusions(self, cell: Cell, req: Request, machines: IntpArray) -> dict[str, BoolArray]:
        return {f"constraint {c.describe()}": ~cell.attributes.satisfies(c, machines) for c in req.hard}
