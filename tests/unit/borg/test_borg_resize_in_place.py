"""Resizing in place (Autopilot §2.3): a grown task that no longer fits its machine evicts
lower-priority neighbours first (production never preempts production, Borg §2.5), and
moves only when eviction cannot make room."""

from __future__ import annotations

from dataclasses import replace

import pytest
from borg_builders import Master, job_spec, machine_spec

from cellpilot.borg.decisions import Accepted, SetMachineState, SubmitJob, UpdateJob
from cellpilot.borg.lifecycle import TaskEvent, TaskState
from cellpilot.borg.model import MachineAvailability
from cellpilot.borg.mutations import TaskStateChanged
from cellpilot.job_vocabulary import PriorityBand
from cellpilot.units import GIB

PROD, BATCH = 9, 2


def _cell(*neighbours: tuple[int, float]) -> Master:
    """One 8 GiB machine running alice's 1 GiB prod task next to bob's neighbours (priority,
    GiB); a spare machine (drained while they were placed) that a moved task can go to."""
    master = Master()
    master.add_machines(machine_spec("m0", ram_gib=8), machine_spec("spare", ram_gib=8))
    master.accept(SetMachineState("", "spare", MachineAvailability.DRAINING))
    for user in ("alice", "bob"):
        for band in (PriorityBand.PRODUCTION, PriorityBand.BATCH):
            master.grant(user, band)
    for spec in (
        *(
            job_spec(f"n{i}", user="bob", priority=p, task_count=1, ram_gib=g)
            for i, (p, g) in enumerate(neighbours)
        ),
        job_spec("web", priority=PROD, task_count=1, ram_gib=1),
    ):
        master.accept(SubmitJob(f"submit-{spec.job_id}", spec))
        master.schedule()
    assert {j.tasks[0].machine_id for j in master.state.jobs.values()} == {"m0"}
    master.accept(SetMachineState("", "spare", MachineAvailability.UP))
    return master


def _resize(master: Master, memory_gib: float) -> Accepted:
    spec = master.state.jobs["alice/web"].spec
    new = replace(spec, task=replace(spec.task, limits=replace(spec.task.limits, ram=memory_gib * GIB)))
    return master.accept(UpdateJob("grow", "alice/web", new, ("task.limits.memory_bytes",)))


def _events(result: Accepted) -> list[tuple[str, TaskEvent]]:
    return [(m.job_id, m.reason) for m in result.mutations if isinstance(m, TaskStateChanged)]


def test_a_resize_that_fits_changes_nothing_else() -> None:
    master = _cell((BATCH, 4))
    assert _events(_resize(master, 2)) == [("alice/web", TaskEvent.UPDATED)]


def test_a_resize_that_no_longer_fits_evicts_a_lower_priority_neighbour_and_stays() -> None:
    master = _cell((BATCH, 4))
    result = _resize(master, 6)  # 4 GiB batch neighbour + 6 GiB > 8 GiB
    assert _events(result) == [("bob/n0", TaskEvent.PREEMPTED), ("alice/web", TaskEvent.UPDATED)]
    web = master.state.jobs["alice/web"].tasks[0]
    tenant = master.state.jobs["bob/n0"].tasks[0]
    assert (web.state, web.machine_id, web.limits.ram) == (TaskState.RUNNING, "m0", 6 * GIB)
    assert tenant.state is TaskState.PENDING
    master.schedule()  # the neighbour goes elsewhere
    assert (tenant.state, tenant.machine_id) == (TaskState.RUNNING, "spare")


@pytest.mark.parametrize(
    "neighbours",
    [((PROD, 4),), ((PROD, 3), (BATCH, 3))],
    ids=["production-never-preempts-production", "evicting-the-batch-task-is-not-enough"],
)
def test_a_resize_moves_the_task_when_eviction_cannot_make_room(
    neighbours: tuple[tuple[int, float], ...],
) -> None:
    master = _cell(*neighbours)
    result = _resize(master, 6)
    assert _events(result) == [("alice/web", TaskEvent.EVICTED)]
    assert all(
        master.state.jobs[f"bob/n{i}"].tasks[0].state is TaskState.RUNNING for i in range(len(neighbours))
    )
    master.schedule()
    web = master.state.jobs["alice/web"].tasks[0]
    assert (web.state, web.machine_id, web.limits.ram) == (TaskState.RUNNING, "spare", 6 * GIB)
