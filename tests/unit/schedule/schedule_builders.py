"""Small builders for scheduling tests: machines, shapes, tasks and cells in human units."""

from __future__ import annotations

import numpy as np

from cellpilot.job_vocabulary import AppClass
from cellpilot.schedule import Cell, CellMachine, PlacementConstraint, PlacementTask, Resources, TaskShape
from cellpilot.schedule.cell import LIMIT, NUM_LEVELS, RESERVATION
from cellpilot.units import GIB


def machine(
    name: str,
    cores: float = 10,
    ram_gib: float = 40,
    disk_gib: float = 100,
    ports: float = 100,
    rack: str = "r0",
    power: str = "p0",
    **attributes: str | float,
) -> CellMachine:
    return CellMachine.build(name, Resources.of(cores, ram_gib, disk_gib, ports), rack, power, attributes)


def shape(
    priority: int = 5,
    cores: float = 1,
    ram_gib: float = 1,
    disk_gib: float = 0,
    ports: float = 0,
    constraints: tuple[PlacementConstraint, ...] = (),
    packages: tuple[str, ...] = (),
    cpu_mean: float | None = None,
    cpu_std: float | None = None,
    alloc_set: str | None = None,
    is_alloc: bool = False,
) -> TaskShape:
    return TaskShape(
        priority=priority,
        limits=Resources.of(cores, ram_gib, disk_gib, ports),
        app_class=AppClass.LATENCY_SENSITIVE if priority >= 9 else AppClass.BATCH,
        constraints=constraints,
        packages=packages,
        cpu_mean=cpu_mean,
        cpu_std=cpu_std,
        alloc_set=alloc_set,
        is_alloc=is_alloc,
    )


def task(
    job: str = "job",
    index: int = 0,
    user: str = "u",
    reservation: Resources | None = None,
    **shape_args: object,
) -> PlacementTask:
    return PlacementTask(job, index, user, shape(**shape_args), reservation=reservation)  # type: ignore[arg-type]


def cell_of(*machines: CellMachine) -> Cell:
    cell = Cell(machine_hint=2, task_hint=2)  # small hints exercise the arrays' growth
    for m in machines:
        cell.add_machine(m)
    return cell


def gib(x: float) -> float:
    return x * GIB


def recomputed_totals(cell: Cell) -> np.ndarray:
    """Brute force: per machine and level, the channel sums of top-level tasks below it."""
    expected = np.zeros_like(cell.below[: cell.n_machines])
    for h in cell.running_tasks().tolist():
        if cell.t_alloc[h] >= 0:
            continue
        m = int(cell.t_machine[h])
        expected[m, int(cell.t_priority[h]) + 1 :] += cell.t_amount[h]
    return expected


def prod_limit_sum(cell: Cell, m: int) -> np.ndarray:
    total = np.zeros(4)
    for h in cell.tasks_on(m):
        if cell.spec(h).shape.prod:
            total += cell.t_amount[h, LIMIT]
    return total


__all__ = [
    "LIMIT",
    "NUM_LEVELS",
    "RESERVATION",
    "cell_of",
    "gib",
    "machine",
    "prod_limit_sum",
    "recomputed_totals",
    "shape",
    "task",
]
