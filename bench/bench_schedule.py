"""Scheduling a 10 000-machine cell (Borg §3.4): from scratch, online, naive baseline, memory.

* ``from_scratch_s``: 100 000 tasks of a synthetic heterogeneous workload
  (:mod:`cellpilot.workloads.cell_workload`) placed onto an empty 10 000-machine cell
  in one pass, with equivalence classes, score caching and relaxed randomisation on.
* ``naive_from_scratch_s``: the same with all three off. A full naive run would take
  minutes, so it places a fixed sample of the same pass (the tasks right after the
  first half, on a cell pre-filled with the first half) and extrapolates its time per
  placement to 100 000 tasks; ``speedup_vs_naive`` is the ratio.
* ``online_placements_per_s``: on the loaded cell the from-scratch pass left, 20 000
  tasks in jobs of mixed sizes arrive one job at a time; each job is scheduled as it
  arrives while a random running job exits (the exits are inside the timed loop). Best
  of two identical runs, each on a fresh copy of the loaded cell. The naive scheduler
  places the first 1 000 of the same tasks from the same state for
  ``online_speedup_vs_naive``.
* ``state_mib``: tracemalloc's peak while building the cell and binding the 100 000
  placements (Python objects and numpy arrays alike); the numpy arrays' ``nbytes`` sum is
  printed for comparison.
"""

from __future__ import annotations

import time
import tracemalloc
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from bench.harness import FULL, SMOKE, Report, sized, stopwatch
from cellpilot.schedule import Cell, PlacementTask, Scheduler, SchedulerConfig, default_profile, pending_order
from cellpilot.schedule.model import CellMachine
from cellpilot.workloads.cell_workload import generate_jobs, generate_machines, workload_tasks

FIGURES = [
    "schedule.cell10k.from_scratch_s",
    "schedule.cell10k.naive_from_scratch_s",
    "schedule.cell10k.speedup_vs_naive",
    "schedule.cell10k.online_placements_per_s",
    "schedule.cell10k.naive_online_placements_per_s",
    "schedule.cell10k.online_speedup_vs_naive",
    "schedule.cell10k.state_mib",
]

FILL = 0.7


@dataclass(frozen=True)
class Size:
    machines: int
    tasks: int
    naive_sample: int  # tasks of the from-scratch pass the naive scheduler places
    online_tasks: int
    naive_online_tasks: int


SIZES = {
    FULL: Size(
        machines=10_000, tasks=100_000, naive_sample=1_000, online_tasks=20_000, naive_online_tasks=1_000
    ),
    SMOKE: Size(machines=200, tasks=2_000, naive_sample=100, online_tasks=400, naive_online_tasks=100),
}


def new_cell(machines: list[CellMachine], task_hint: int) -> Cell:
    cell = Cell(machine_hint=len(machines), task_hint=task_hint)
    cell.add_machines(machines)
    return cell


def online_stream(
    cell: Cell,
    scheduler: Scheduler,
    arrivals: list[list[PlacementTask]],
    rng: np.random.Generator,
    start: float,
) -> tuple[int, float]:
    """Schedules each arriving job while a random running job exits; returns (placed, seconds).

    Preemption victims go back to pending and are retried with the next arrival.
    """
    running: dict[str, list[str]] = defaultdict(list)
    for task_id in cell.task_handle:
        running[task_id.rsplit("/", 1)[0]].append(task_id)
    names = list(running)
    pending: list[PlacementTask] = []
    placed = 0
    with stopwatch() as elapsed:
        for i, tasks in enumerate(arrivals):
            k = int(rng.integers(len(names)))
            names[k], names[-1] = names[-1], names[k]
            for task_id in running.pop(names.pop()):
                handle = cell.task_handle.get(task_id)  # a preempted task is no longer running
                if handle is not None:
                    cell.unbind(handle)
            result = scheduler.schedule(cell, pending + tasks, now=start + i)
            pending = list(result.pending)
            placed += len(result.placements)
            for placement in result.placements:
                job = placement.task.job
                if job not in running:
                    names.append(job)
                running[job].append(placement.task.task_id)
    return placed, elapsed()


def replay(machines: list[CellMachine], placements: list[tuple[PlacementTask, int]], task_hint: int) -> Cell:
    cell = new_cell(machines, task_hint)
    for task, machine in placements:
        cell.bind(task, machine, now=0.0)
    return cell


def jobs_of(tasks: list[PlacementTask], limit: int) -> list[list[PlacementTask]]:
    by_job: dict[str, list[PlacementTask]] = defaultdict(list)
    for t in tasks:
        by_job[t.job].append(t)
    out, total = [], 0
    for job_tasks in by_job.values():
        if total >= limit:
            break
        out.append(job_tasks)
        total += len(job_tasks)
    return out


def run(report: Report, size: str = FULL) -> None:
    params = sized(SIZES, size)
    hint = params.tasks + params.online_tasks
    rng = np.random.default_rng(2024)
    machines = generate_machines(params.machines, rng)
    tasks = workload_tasks(generate_jobs(machines, params.tasks, rng, FILL))
    # Arriving jobs come from the same generator, sized like the from-scratch workload's jobs.
    arriving_jobs = generate_jobs(
        machines, params.online_tasks, np.random.default_rng(7), FILL * params.online_tasks / params.tasks
    )
    arriving = [
        PlacementTask("online-" + t.job, t.index, t.user, t.shape, t.reservation)
        for t in workload_tasks(arriving_jobs)
    ]

    # From scratch, all §3.4 techniques on.
    cell = new_cell(machines, hint)
    fast = Scheduler(default_profile(), SchedulerConfig(), np.random.default_rng(1))
    start = time.perf_counter()
    result = fast.schedule(cell, tasks, now=0.0)
    from_scratch = time.perf_counter() - start
    placements = [(p.task, p.machine) for p in result.placements]
    print(
        f"from scratch: {len(result.placements)} placed, {len(result.unschedulable)} pending, "
        f"{fast.stats.machines_evaluated} machine evaluations, {fast.stats.pools_built} equivalence classes"
    )
    report("schedule.cell10k.from_scratch_s", from_scratch, "s")

    # Naive: a fixed sample of the same pass, extrapolated per placement.
    ordered = pending_order(tasks)
    half = len(ordered) // 2
    sample = ordered[half : half + params.naive_sample]
    where = {t.task_id: m for t, m in placements}
    naive_cell = new_cell(machines, hint)
    for t in ordered[:half]:
        if t.task_id in where:
            naive_cell.bind(t, where[t.task_id], now=0.0)
    naive = Scheduler(default_profile(), SchedulerConfig.naive(), np.random.default_rng(1))
    with stopwatch() as elapsed:
        naive_result = naive.schedule(naive_cell, sample, now=0.0)
    per_task = elapsed() / len(sample)
    naive_total = per_task * len(tasks)
    print(
        f"naive: {len(sample)} tasks of the pass (after the first {half}) in {elapsed():.2f} s, "
        f"{len(naive_result.placements)} placed; extrapolated to {len(tasks)} tasks: {naive_total:.0f} s"
    )
    report(
        "schedule.cell10k.naive_from_scratch_s",
        naive_total,
        f"s (extrapolated from a {len(sample)}-task sample)",
    )
    report("schedule.cell10k.speedup_vs_naive", naive_total / from_scratch, "x")

    # Online arrivals of mixed-size jobs on the loaded cell: best of two identical runs, each on
    # a fresh copy of the from-scratch state (rebuilt by replaying its placements).
    del cell, naive_cell
    arrivals = jobs_of(arriving, params.online_tasks)
    best = float("inf")
    placed = 0
    for _ in range(2):
        loaded = replay(machines, placements, hint)
        online = Scheduler(default_profile(), SchedulerConfig(), np.random.default_rng(1))
        placed, seconds = online_stream(loaded, online, arrivals, np.random.default_rng(3), start=1.0)
        best = min(best, seconds)
    rate = placed / best
    print(
        f"online: {len(arrivals)} jobs, {placed} tasks placed in {best:.2f} s (best of 2; job exits included)"
    )
    report("schedule.cell10k.online_placements_per_s", rate, "placements/s")
    naive_arrivals = jobs_of(arriving, params.naive_online_tasks)
    loaded = replay(machines, placements, hint)
    naive_placed, naive_seconds = online_stream(
        loaded, naive, naive_arrivals, np.random.default_rng(3), start=1.0
    )
    naive_rate = naive_placed / naive_seconds
    print(f"naive online: the first {naive_placed} of those tasks placed in {naive_seconds:.2f} s")
    report("schedule.cell10k.naive_online_placements_per_s", naive_rate, "placements/s")
    report("schedule.cell10k.online_speedup_vs_naive", rate / naive_rate, "x")
    del loaded, online, fast, naive

    # Memory of the cell state: tracemalloc peak while building it with all placements bound.
    tracemalloc.start()
    traced = replay(machines, placements, hint)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"cell state: {len(placements)} tasks on {params.machines} machines; numpy arrays "
        f"{traced.nbytes() / 2**20:.1f} MiB (nbytes sum); the tracemalloc peak below also counts "
        "the Python objects (specs, dicts, sets)"
    )
    report("schedule.cell10k.state_mib", peak / 2**20, "MiB (tracemalloc peak)")
