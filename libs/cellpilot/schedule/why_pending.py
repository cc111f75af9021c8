"""Why pending? (Borg §2.6): what keeps a task from scheduling, and what would fix it.

For a pending task we count, over the live machines of the cell, how many each hard
constraint and each resource dimension excludes (a machine can be excluded for
several reasons), and we search for the smallest single change to the request that
would let it schedule: lowering one resource, shrinking the whole request
proportionally, or dropping one hard constraint. Changes are ranked by their size
relative to the request (dropping a constraint counts as 1.0, a full change).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cellpilot.array_types import BoolArray, IntpArray
from cellpilot.schedule.cell import LIMIT, Cell
from cellpilot.schedule.model import PlacementConstraint, PlacementTask
from cellpilot.schedule.plugins import Request
from cellpilot.schedule.profile import Profile
from cellpilot.schedule.resources import EPSILON, RESOURCE_NAMES, format_amount


@dataclass(frozen=True)
class RequestChange:
    kind: str  # "reduce" one resource, "scale" the whole request, "drop-constraint"
    description: str
    relative: float  # size of the change relative to the request, in (0, 1]
    resource: str | None = None
    amount: float = 0.0  # how much to take off ``resource`` (its unit)
    factor: float = 1.0  # for "scale": multiply every limit by this
    constraint: PlacementConstraint | None = None
    machines: int = 0  # machines on which the changed request would fit


@dataclass(frozen=True)
class PendingExplanation:
    task_id: str
    machines: int  # live machines (or allocs of the task's alloc set) considered
    feasible: int  # where it fits right now (possibly after preemption)
    excluded: tuple[tuple[str, int], ...]  # reason -> machines it excludes
    options: tuple[RequestChange, ...]

    @property
    def smallest(self) -> RequestChange | None:
        return self.options[0] if self.options else None

    def summary(self) -> str:
        if self.feasible:
            return f"{self.task_id} fits on {self.feasible} of {self.machines} machines now"
        reasons = ", ".join(f"{reason}: {count}" for reason, count in self.excluded if count)
        text = f"{self.task_id} fits on none of {self.machines} machines ({reasons or 'none alive'})"
        if self.smallest is not None:
            text += f"; smallest fix: {self.smallest.description}"
        return text


def _resource_options(
    limits: np.ndarray, short: np.ndarray, other_ok: BoolArray, what: str
) -> list[RequestChange]:
    """Single-resource reductions and a proportional shrink, from per-row shortfalls."""
    options: list[RequestChange] = []
    lacking = short > EPSILON
    for r, name in enumerate(RESOURCE_NAMES):
        if limits[r] <= 0:
            continue
        others_fit = ~np.delete(lacking, r, axis=1).any(axis=1) & other_ok
        if not others_fit.any():
            continue
        need = np.maximum(short[others_fit, r], 0.0)
        best = float(need.min())
        if best <= EPSILON or best >= limits[r]:
            continue
        count = int(np.count_nonzero(need <= best + EPSILON))
        options.append(
            RequestChange(
                "reduce",
                f"lower {name} by {format_amount(r, best)} (to {format_amount(r, limits[r] - best)}) "
                f"to fit on {count} {what}",
                best / limits[r],
                resource=name,
                amount=best,
                machines=count,
            )
        )
    asked = limits > 0
    if asked.any() and other_ok.any():
        avail = limits[None, asked] - short[:, asked]
        factor_per_row = np.min(avail / limits[None, asked], axis=1)
        factor_per_row[~other_ok] = -np.inf
        factor = float(factor_per_row.max())
        if 0.0 < factor < 1.0:
            count = int(np.count_nonzero(factor_per_row >= factor - 1e-12))
            options.append(
                RequestChange(
                    "scale",
                    f"shrink the whole request to {factor:.1%} of its limits to fit on {count} {what}",
                    1.0 - factor,
                    factor=factor,
                    machines=count,
                )
            )
    return options


def explain_pending(cell: Cell, task: PlacementTask, profile: Profile) -> PendingExplanation:
    """Counts the machines each constraint and resource excludes, and the smallest fix."""
    if task.shape.alloc_set is not None:
        return _explain_in_alloc(cell, task)
    req = Request.compile(task.shape)
    req.job = cell.job_codes.get(task.job, -1)
    machines: IntpArray = cell.alive_machines()
    feasible = np.ones(machines.size, dtype=bool)
    excluded: dict[str, BoolArray] = {}
    for f in profile.filters:
        feasible &= f.feasible(cell, req, machines)
        excluded.update(f.exclusions(cell, req, machines))
    fit = profile.resource_fit
    short = fit.shortfall(cell, req, machines)
    constraint_ok = [cell.attributes.satisfies(c, machines) for c in req.hard]
    all_constraints = np.logical_and.reduce(constraint_ok) if constraint_ok else np.ones(machines.size, bool)
    options = _resource_options(req.limits, short, all_constraints & cell.alive[machines], "machines")
    resources_ok = ~(short > EPSILON).any(axis=1)
    for i, constraint in enumerate(req.hard):
        rest = [ok for j, ok in enumerate(constraint_ok) if j != i]
        others = np.logical_and.reduce(rest) if rest else np.ones(machines.size, bool)
        count = int(np.count_nonzero(others & resources_ok))
        if count and not feasible.any():
            options.append(
                RequestChange(
                    "drop-constraint",
                    f"drop the constraint {constraint.describe()} to fit on {count} machines",
                    1.0,
                    constraint=constraint,
                    machines=count,
                )
            )
    if feasible.any():
        options = []
    options.sort(key=lambda o: (o.relative, o.kind != "reduce", -o.machines))
    return PendingExplanation(
        task.task_id,
        int(machines.size),
        int(np.count_nonzero(feasible)),
        tuple((reason, int(np.count_nonzero(mask))) for reason, mask in excluded.items()),
        tuple(options),
    )


def _explain_in_alloc(cell: Cell, task: PlacementTask) -> PendingExplanation:
    name = task.shape.alloc_set
    assert name is not None
    allocs = np.array(sorted(cell.alloc_sets.get(name, ())), dtype=np.intp)
    limits = task.shape.limits.array()
    if allocs.size == 0:
        return PendingExplanation(task.task_id, 0, 0, ((f"alloc set {name!r} has no allocs", 0),), ())
    free = cell.t_amount[allocs, LIMIT] - cell.t_inner[allocs]
    short = limits[None, :] - free
    lacking = short > EPSILON
    feasible = int(np.count_nonzero(~lacking.any(axis=1)))
    excluded = tuple(
        (f"alloc {r}", int(np.count_nonzero(lacking[:, i]))) for i, r in enumerate(RESOURCE_NAMES)
    )
    options = [] if feasible else _resource_options(limits, short, np.ones(allocs.size, bool), "allocs")
    options.sort(key=lambda o: (o.relative, o.kind != "reduce"))
    return PendingExplanation(task.task_id, int(allocs.size), feasible, excluded, tuple(options))
