"""Why is this task pending? (Borg §2.6), in the terms of the Borgmaster's API.

The counting and the search for the smallest fitting change are the scheduling core's
(:func:`cellpilot.schedule.explain_pending`); this module restricts them to the machines
that take new tasks (up, not draining), counts exclusions per API constraint and per
resource, and turns the core's smallest "reduce" or "scale" option into the limits that
would let the task schedule now. A task backing off after failures says when it restarts,
and machines it avoids after crashing there are counted as excluded (Borg §4).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from cellpilot.borg.cell_state import CellState
from cellpilot.borg.lifecycle import JobState, TaskState
from cellpilot.borg.model import Constraint
from cellpilot.borg.restart_backoff import avoided_machines
from cellpilot.borg.scheduling_view import MACHINE_ID, SchedulingView, schedule_constraint
from cellpilot.job_vocabulary import ConstraintKind
from cellpilot.schedule import RESOURCE_NAMES, PlacementTask, Request, Resources, explain_pending
from cellpilot.schedule.filters import non_preemptible_use
from cellpilot.schedule.resources import EPSILON


@dataclass(frozen=True)
class ResourceShortage:
    resource: str  # "cpu", "ram", "disk" or "ports"
    machines_excluded: int
    max_available: float  # the most of it available to the task on a machine passing the constraints


@dataclass(frozen=True)
class PendingReport:
    job_id: str
    task_index: int
    job_state: JobState
    task_state: TaskState
    summary: str = ""
    machines_total: int = 0
    machines_feasible: int = 0
    constraint_exclusions: tuple[tuple[Constraint, int], ...] = ()
    resource_exclusions: tuple[ResourceShortage, ...] = ()
    fitting_limits: Resources | None = None
    evaluated_at_ms: int = 0
    next_restart_ms: int = 0  # backing off after failures until then (0: not)
    avoided_machines: tuple[tuple[str, int], ...] = ()  # (machine, until), after crashes there


def explain(
    view: SchedulingView, state: CellState, job_id: str, index: int, now_ms: int | None = None
) -> PendingReport:
    """The task's pending explanation; a task that is not pending gets only its states.

    ``now_ms`` is the cell's event time (default: the last record's), against which restart
    backoffs and machine avoidances are judged.
    """
    job = state.jobs[job_id]
    task = job.tasks[index]
    base = PendingReport(job_id, index, job.state, task.state, evaluated_at_ms=state.event_time_ms)
    if task.state is not TaskState.PENDING:
        return base
    now = state.event_time_ms if now_ms is None else now_ms
    avoided = avoided_machines(task, now)
    if task.not_before_ms > now and job.state is not JobState.HELD_FOR_AUTOPILOT:
        wait_s = (task.not_before_ms - now) / 1000.0
        summary = (
            f"{job_id}/{index} is backing off after {task.failures} failure(s) in a row "
            f"(last: {task.last_failure or 'unknown'}); it may restart in {wait_s:.1f} s "
            "(Borg §4: crash loops back off)"
        )
        if avoided:
            summary += "; " + _avoidance(avoided, now)
        machines_up = sum(1 for rec in state.machines.values() if rec.schedulable)
        return replace(
            base,
            summary=summary,
            machines_total=machines_up,
            next_restart_ms=task.not_before_ms,
            avoided_machines=avoided,
        )
    if view.stale:
        view.rebuild(state)
    cell = view.cell
    machines = np.array(
        sorted(cell.machine_index[m] for m, rec in state.machines.items() if rec.schedulable), dtype=np.intp
    )
    total = int(machines.size)
    shape = view.task_shape(job, task, now)
    if job.state is JobState.HELD_FOR_AUTOPILOT:
        summary = f"{job_id}/{index} is held until Autopilot makes its first recommendation (Autopilot §3.1)"
        return PendingReport(
            job_id, index, job.state, task.state, summary, total, evaluated_at_ms=state.event_time_ms
        )
    spec = PlacementTask(job_id, index, job.spec.user, shape)
    if shape.alloc_set is not None or total == 0:
        explanation = explain_pending(cell, spec, view.profile)
        return PendingReport(
            job_id,
            index,
            job.state,
            task.state,
            explanation.summary(),
            total,
            0,
            evaluated_at_ms=state.event_time_ms,
        )
    hard = [c for c in job.spec.constraints if c.kind is not ConstraintKind.SOFT]
    passing = np.ones(total, dtype=bool)
    exclusions: list[tuple[Constraint, int]] = []
    for constraint in hard:
        ok = cell.attributes.satisfies(schedule_constraint(constraint), machines)
        exclusions.append((constraint, int(np.count_nonzero(~ok))))
        passing &= ok
    avoiding = [c for c in shape.hard_constraints if c.attribute == MACHINE_ID]
    n_avoided = 0
    for off in avoiding:
        ok = cell.attributes.satisfies(off, machines)
        n_avoided += int(np.count_nonzero(~ok))
        passing &= ok
    req = Request.compile(shape)
    req.job = cell.job_codes.get(job_id, -1)
    fit = view.profile.resource_fit
    short = fit.shortfall(cell, req, machines)
    lacking = short > EPSILON
    available = np.maximum(
        cell.capacity[machines] - non_preemptible_use(cell, req, machines)[:, req.basis], 0.0
    )
    shortages = []
    for r, name in enumerate(RESOURCE_NAMES):
        best = float(available[passing, r].max()) if passing.any() else 0.0
        shortages.append(ResourceShortage(name, int(np.count_nonzero(lacking[:, r])), best))
    feasible = np.ones(total, dtype=bool)
    for f in view.profile.filters:
        feasible &= f.feasible(cell, req, machines)
    explanation = explain_pending(cell, spec, view.profile)
    fitting = None
    for option in explanation.options:
        if option.kind == "reduce" and option.resource is not None:
            values = shape.limits.array()
            values[RESOURCE_NAMES.index(option.resource)] -= option.amount
            fitting = Resources.from_array(np.maximum(values, 0.0))
            break
        if option.kind == "scale":
            fitting = shape.limits.scaled(option.factor)
            break
    n_feasible = int(np.count_nonzero(feasible))
    if n_feasible:
        summary = (
            f"{job_id}/{index} fits on {n_feasible} of {total} machines; it is scheduled on the next pass"
        )
    else:
        reasons = [f"{c.attribute} {c.operator.name.lower()} {c.value}: {n}" for c, n in exclusions if n]
        if n_avoided:
            reasons.append(f"avoided after crashing there: {n_avoided}")
        reasons += [
            f"not enough {s.resource}: {s.machines_excluded}" for s in shortages if s.machines_excluded
        ]
        because = ", ".join(reasons) or "no reason found"
        summary = f"{job_id}/{index} fits on none of {total} machines up ({because})"
        smallest = next((o for o in explanation.options if o.kind in ("reduce", "scale")), None)
        if smallest is not None:
            summary += f"; smallest fix: {smallest.description}"
    if avoided:
        summary += "; " + _avoidance(avoided, now)
    return PendingReport(
        job_id,
        index,
        job.state,
        task.state,
        summary,
        total,
        n_feasible,
        tuple(exclusions),
        tuple(shortages),
        fitting if not n_feasible else None,
        state.event_time_ms,
        0,
        avoided,
    )


def _avoidance(avoided: tuple[tuple[str, int], ...], now_ms: int) -> str:
    machines = ", ".join(f"{m} for {(until - now_ms) / 1000.0:.0f} s" for m, until in avoided)
    return f"it avoids machines it crashed on repeatedly (Borg §4): {machines}"
