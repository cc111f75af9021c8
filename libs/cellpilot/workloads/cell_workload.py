"""Synthetic Borg cells: heterogeneous machines and a mixed workload of jobs.

Borg cells are heterogeneous in machine sizes and capabilities (Borg §2.2) and run a
mix of long-running prod services and non-prod batch work (§2.1), with fine-grained
requests that cluster around no particular size (§5.4, Figure 8) and tasks that use
much less than their limits (§5.5, Figure 11). No trace is published with the
paper, so this generator is a stand-in with stated, untuned assumptions:

* machines come from a few platforms with different CPU:RAM ratios (the
  ``heterogeneous`` mix) or from one platform (``homogeneous``), in racks of 40 and
  power domains of 5 racks;
* jobs are prod services (priority 9–10, latency-sensitive, RAM-heavy, a few
  ports), batch jobs (priority 2–8, CPU-heavy), best-effort jobs (priority 0–1) and
  a few monitoring jobs (priority 11), with log-normal per-task sizes;
* job sizes are heavy-tailed: half are single tasks, a few have hundreds;
* some jobs carry a hard architecture constraint or a soft platform preference;
* each task has a reservation, as resource reclamation would have computed it long
  after start-up (§5.5): usage (a log-normal fraction of the limit) plus 10 %.

Task sizes are scaled so that the workload's CPU limits add up to ``fill`` of the
cell's CPU capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cellpilot.job_vocabulary import AppClass
from cellpilot.schedule.model import CellMachine, PlacementConstraint, PlacementJob, PlacementTask, TaskShape
from cellpilot.schedule.resources import Resources


@dataclass(frozen=True)
class Platform:
    name: str
    cores: float
    ram_gib: float
    disk_gib: float
    arch: str
    share: float  # fraction of the cell's machines


HETEROGENEOUS: tuple[Platform, ...] = (
    Platform("balanced", 32, 128, 2000, "x86", 0.40),
    Platform("compute", 64, 128, 2000, "x86", 0.20),
    Platform("memory", 32, 384, 2000, "x86", 0.20),
    Platform("small-arm", 16, 32, 1000, "arm", 0.20),
)
HOMOGENEOUS: tuple[Platform, ...] = (Platform("balanced", 32, 128, 2000, "x86", 1.0),)
MACHINE_MIXES = {"heterogeneous": HETEROGENEOUS, "homogeneous": HOMOGENEOUS}

MACHINES_PER_RACK = 40
RACKS_PER_POWER_DOMAIN = 5
PORTS_PER_MACHINE = 1000


@dataclass(frozen=True)
class JobClass:
    name: str
    share: float  # fraction of jobs
    priorities: tuple[int, ...]
    app_class: AppClass
    cores_median: float
    ram_gib_per_core: float  # median RAM per core
    ports: int
    usage_median: float  # median usage / limit (Borg §5.5, Figure 11)


JOB_CLASSES: tuple[JobClass, ...] = (
    JobClass("service", 0.30, (9, 10), AppClass.LATENCY_SENSITIVE, 1.0, 6.0, 2, 0.45),
    JobClass("batch", 0.45, (2, 3, 4, 5, 6, 7, 8), AppClass.BATCH, 1.0, 1.5, 0, 0.6),
    JobClass("best-effort", 0.22, (0, 1), AppClass.BATCH, 0.5, 2.0, 0, 0.5),
    JobClass("monitoring", 0.03, (11,), AppClass.LATENCY_SENSITIVE, 0.25, 1.0, 1, 0.5),
)


def generate_machines(count: int, rng: np.random.Generator, mix: str = "heterogeneous") -> list[CellMachine]:
    platforms = MACHINE_MIXES[mix]
    shares = np.array([p.share for p in platforms])
    kinds = rng.choice(len(platforms), size=count, p=shares / shares.sum())
    machines = []
    for i, kind in enumerate(kinds.tolist()):
        p = platforms[kind]
        rack = i // MACHINES_PER_RACK
        machines.append(
            CellMachine.build(
                f"m{i:05d}",
                Resources.of(p.cores, p.ram_gib, p.disk_gib, PORTS_PER_MACHINE),
                rack=f"rack-{rack}",
                power_domain=f"power-{rack // RACKS_PER_POWER_DOMAIN}",
                attributes={"arch": p.arch, "platform": p.name},
            )
        )
    return machines


def _job_sizes(rng: np.random.Generator, total: int) -> list[int]:
    """Heavy-tailed job sizes summing to ``total``: half single tasks, a few hundreds."""
    sizes: list[int] = []
    left = total
    while left > 0:
        u = rng.random()
        if u < 0.5:
            size = 1
        elif u < 0.8:
            size = int(rng.integers(2, 11))
        elif u < 0.96:
            size = int(rng.integers(11, 101))
        else:
            size = int(min(1000, np.ceil(100 * (1 - rng.random()) ** -0.7)))
        size = min(size, left)
        sizes.append(size)
        left -= size
    return sizes


@dataclass(frozen=True)
class WorkloadJob:
    job: PlacementJob
    usage: float  # the tasks' usage as a fraction of their limits

    def tasks(self, reclaimed: bool = True) -> list[PlacementTask]:
        """The job's tasks; ``reclaimed``: with the reservation reclamation converged to (§5.5)."""
        job = self.job
        if not reclaimed:
            return job.tasks()
        reservation = job.shape.limits.scaled(min(1.0, self.usage * 1.1))
        return [
            PlacementTask(job.name, i, job.user, job.shape, reservation=reservation)
            for i in range(job.task_count)
        ]


def generate_jobs(
    machines: list[CellMachine], tasks: int, rng: np.random.Generator, fill: float = 0.7
) -> list[WorkloadJob]:
    """Jobs with ``tasks`` tasks in total whose CPU limits add up to ``fill`` of the cell."""
    if fill <= 0:
        raise ValueError("fill must be > 0")
    sizes = _job_sizes(rng, tasks)
    shares = np.array([c.share for c in JOB_CLASSES])
    kinds = rng.choice(len(JOB_CLASSES), size=len(sizes), p=shares / shares.sum())
    raw: list[tuple[JobClass, int, float, float, float, int]] = []
    for size, kind in zip(sizes, kinds.tolist(), strict=True):
        c = JOB_CLASSES[kind]
        cores = c.cores_median * float(rng.lognormal(0.0, 0.8))
        ram_per_core = c.ram_gib_per_core * float(rng.lognormal(0.0, 0.5))
        usage = float(np.clip(c.usage_median * rng.lognormal(0.0, 0.4), 0.05, 1.0))
        priority = int(rng.choice(c.priorities))
        raw.append((c, size, cores, ram_per_core, usage, priority))
    capacity_cores = sum(m.capacity.cpu for m in machines) / 1000.0
    asked = sum(size * cores for _, size, cores, _, _, _ in raw)
    scale = fill * capacity_cores / asked if asked > 0 else 1.0
    jobs: list[WorkloadJob] = []
    for j, (c, size, cores, ram_per_core, usage, priority) in enumerate(raw):
        task_cores = max(cores * scale, 0.01)
        ram_gib = min(task_cores * ram_per_core, 200.0)
        disk_gib = float(np.clip(rng.lognormal(np.log(10.0), 0.8), 1.0, 500.0))
        constraints: tuple[PlacementConstraint, ...] = ()
        u = rng.random()
        if u < 0.10:
            constraints = (PlacementConstraint("arch", "==", "x86"),)
        elif u < 0.15:
            constraints = (PlacementConstraint("platform", "==", "memory", hard=False),)
        packages = (f"pkg-{j}",) + (("base-runtime",) if rng.random() < 0.2 else ())
        shape = TaskShape(
            priority=priority,
            limits=Resources.of(task_cores, ram_gib, disk_gib, c.ports),
            app_class=c.app_class,
            constraints=constraints,
            packages=packages,
        )
        job = PlacementJob(f"{c.name}-{j}", f"user-{int(rng.integers(0, 50))}", size, shape)
        jobs.append(WorkloadJob(job, usage))
    return jobs


def workload_tasks(jobs: list[WorkloadJob], reclaimed: bool = True) -> list[PlacementTask]:
    return [task for job in jobs for task in job.tasks(reclaimed)]
