"""A scheduler's proposals to the elected master, and the master's verdict (Borg §3.4).

Borg §3.4 splits the scheduler out of the Borgmaster: a scheduler replica works on a cached copy
of the cell state, does a pass, and "informs the elected master of those assignments. The master
will accept and apply these assignments unless they are inappropriate (e.g., based on out of date
state), which will cause them to be reconsidered in the scheduler's next pass" — optimistic
concurrency, as in Omega. A :class:`PlacementProposal` is one batch of such assignments, stamped
with the log position and the master epoch it was computed at; the master judges each placement
against its current state (:meth:`cellpilot.borg.scheduling_view.SchedulingView.accept`), commits
the good ones and answers the stale ones in a :class:`ProposalVerdict`.

A placement names only the task (the pending incarnation and spec version the scheduler saw)
and the machine: the master chooses the victims and the ports itself, with the same code, so it
never appends a record its own state would refuse.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from cellpilot.borg.mutations import LavaHostsChanged, Mutation, TaskScheduled
from cellpilot.borg.records import TaskKey


@dataclass(frozen=True)
class ProposedPlacement:
    job_id: str
    task_index: int
    incarnation: int  # the pending incarnation the scheduler saw (it runs as incarnation + 1)
    spec_version: int  # the job's spec version the scheduler saw
    machine_id: str

    @property
    def key(self) -> TaskKey:
        return (self.job_id, self.task_index)


@dataclass(frozen=True)
class PlacementProposal:
    scheduler_id: str
    epoch: int  # the master epoch the scheduler addressed
    based_on_seq: int  # the log position its copy of the state had reached
    placements: tuple[ProposedPlacement, ...]
    # LAVA §4.3 host states the pass changed (lifetime-aware placement), committed with it.
    lava_hosts: LavaHostsChanged | None = None


@dataclass(frozen=True)
class Refusal:
    key: TaskKey
    reason: str


@dataclass(frozen=True)
class ProposalVerdict:
    """What the master made of a proposal: the placements it committed and the stale ones."""

    accepted: tuple[TaskKey, ...]
    refused: tuple[Refusal, ...]
    preempted: int = 0  # running tasks the accepted placements preempted
    wrong_epoch: bool = False  # the whole proposal was for another master


def proposed_placements(
    mutations: Iterable[Mutation], spec_versions: dict[str, int]
) -> tuple[ProposedPlacement, ...]:
    """The placements of a pass's mutations (its :class:`TaskScheduled` records), as proposals:
    each names the pending incarnation it replaces and the job's spec version it saw."""
    return tuple(
        ProposedPlacement(m.job_id, m.task_index, m.incarnation - 1, spec_versions[m.job_id], m.machine_id)
        for m in mutations
        if isinstance(m, TaskScheduled)
    )
