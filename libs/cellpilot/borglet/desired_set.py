"""Converging a machine on the master's desired task set (Borg §3.3), as a pure diff.

The desired set is authoritative: anything alive on the machine that the set does not name
with the same incarnation is a duplicate (e.g. a task rescheduled elsewhere while this
machine was down) and is killed; anything named and not known here is started; a known
task whose spec version changed is updated in place. A task named with the incarnation of
a task that already died here is left dead: the master gives a restart a new incarnation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cellpilot.borglet.hosted_task import TaskKey, TaskPlan


@dataclass(frozen=True)
class KnownTask:
    key: TaskKey
    incarnation: int
    spec_version: int
    alive: bool


@dataclass(frozen=True)
class DesiredChanges:
    kill: tuple[KnownTask, ...]  # alive here but not desired (or an outdated incarnation)
    start: tuple[TaskPlan, ...]  # desired, not running here
    update: tuple[TaskPlan, ...]  # desired and running here with another spec version


def diff_desired(known: Iterable[KnownTask], desired: Sequence[TaskPlan]) -> DesiredChanges:
    wanted = {plan.key: plan for plan in desired}
    if len(wanted) != len(desired):
        raise ValueError("the desired set names a task twice")
    here = {task.key: task for task in known}
    kill = tuple(
        task
        for task in here.values()
        if task.alive and (task.key not in wanted or wanted[task.key].incarnation != task.incarnation)
    )
    start = []
    update = []
    for plan in desired:
        current = here.get(plan.key)
        if current is None or current.incarnation != plan.incarnation:
            start.append(plan)
        elif current.alive and current.spec_version != plan.spec_version:
            update.append(plan)
    return DesiredChanges(kill=kill, start=tuple(start), update=tuple(update))
