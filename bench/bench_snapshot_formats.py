"""The Borgmaster's snapshot (Borg §3.1) of a 10 000-machine, 100 000-task cell, in both formats.

The cell: the synthetic heterogeneous workload of :mod:`cellpilot.workloads.cell_workload`
(10 000 machines, 100 000 tasks in heavy-tailed jobs, CPU limits adding up to 70 % of the cell)
as the Borgmaster's :class:`CellState`, built by applying the records a master would log:
machines registered, quotas set, every job submitted (with a request id, as clients do), each
task placed first-fit by CPU and memory and reported running.

* ``cell_snapshot_mib`` / ``first_format_mib``: the serialised snapshot, written now
  (``CellSnapshot``) and in the first format (the API's statuses, ``Snapshot``), and their ratio;
* ``encode_s`` / ``decode_s``: state to bytes (building the message and serialising it) and
  bytes to a restored state, each with the first format's time and the ratio measured in the
  same run. Both decodings are checked to give the state that was encoded. The times are CPU
  seconds of this process, the best of three runs taken in turns (new, first, new, first, ...):
  the work is single-threaded, and on a machine shared by other jobs the wall time mostly
  measures how long the process waited for a core.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bench.harness import Report
from cellpilot.borg.cell_state import CellState
from cellpilot.borg.lifecycle import JobState, TaskEvent, TaskState
from cellpilot.borg.model import Constraint, JobSpec, MachineSpec, SimulatedRuntime, TaskSpec
from cellpilot.borg.mutations import (
    JobSubmitted,
    MachineRegistered,
    Mutation,
    QuotaSet,
    TaskScheduled,
    TaskStateChanged,
    to_records,
)
from cellpilot.borg_wire import checkpoint as checkpoint_codec
from cellpilot.borg_wire import snapshot_v1
from cellpilot.job_vocabulary import ConstraintKind, ConstraintOperator, PriorityBand
from cellpilot.schedule import Resources
from cellpilot.workloads import cell_workload

FIGURES = [
    "borgmaster.snapshot.cell10k.cell_snapshot_mib",
    "borgmaster.snapshot.cell10k.first_format_mib",
    "borgmaster.snapshot.cell10k.size_vs_first_format",
    "borgmaster.snapshot.cell10k.encode_s",
    "borgmaster.snapshot.cell10k.first_format_encode_s",
    "borgmaster.snapshot.cell10k.encode_vs_first_format",
    "borgmaster.snapshot.cell10k.decode_s",
    "borgmaster.snapshot.cell10k.first_format_decode_s",
    "borgmaster.snapshot.cell10k.decode_vs_first_format",
]


@dataclass(frozen=True)
class Size:
    machines: int
    tasks: int
    repeats: int


SIZES = {"full": Size(10_000, 100_000, 3), "smoke": Size(100, 1_000, 1)}
EVENT_TIME_MS = 1_700_000_000_000
EPOCH = 1
UNLIMITED = Resources(1e15, 1e18, 1e18, 1e9)
BANDS = [band for band in PriorityBand if band is not PriorityBand.UNSPECIFIED]


def _machine(spec: cell_workload.CellMachine, index: int) -> MachineSpec:
    return MachineSpec(
        machine_id=spec.name,
        borglet_address=f"10.{index // 65536}.{index // 256 % 256}.{index % 256}:7300",
        capacity=spec.capacity,
        attributes=tuple((k, str(v)) for k, v in spec.attributes),
        rack=spec.rack,
        power_domain=spec.power_domain,
        first_port=20_000,
    )


def _job(workload: cell_workload.WorkloadJob) -> JobSpec:
    job = workload.job
    shape = job.shape
    return JobSpec(
        name=job.name,
        user=job.user,
        priority=shape.priority,
        task=TaskSpec(
            Resources(*(float(round(v)) for v in shape.limits.array())),  # whole units, as the API takes them
            runtime=SimulatedRuntime("steady", (("usage", round(workload.usage, 3)),)),
            package_ids=shape.packages,
        ),
        task_count=job.task_count,
        app_class=shape.app_class,
        constraints=tuple(
            Constraint(
                c.attribute,
                ConstraintOperator.EQUAL,
                str(c.value),
                ConstraintKind.HARD if c.hard else ConstraintKind.SOFT,
            )
            for c in shape.constraints
        ),
    )


def placed_cell(machines: int, tasks: int, seed: int = 2024) -> CellState:
    """The cell described above, at the log position its records reach."""
    rng = np.random.default_rng(seed)
    fleet = cell_workload.generate_machines(machines, rng)
    jobs = [_job(j) for j in cell_workload.generate_jobs(fleet, tasks, rng, fill=0.7)]
    specs = [_machine(m, i) for i, m in enumerate(fleet)]
    state = CellState()

    def log(mutations: list[Mutation], request_id: str = "", method: str = "") -> None:
        digest = hashlib.sha256(request_id.encode()).hexdigest()[:32] if request_id else ""
        state.apply_all(
            to_records(
                state.last_sequence + 1,
                EPOCH,
                EVENT_TIME_MS + state.last_sequence,
                mutations,
                request_id,
                "bench",
                request_method=method,
                request_digest=digest,
            )
        )

    log([MachineRegistered(spec) for spec in specs])
    users = sorted({j.user for j in jobs})
    log([QuotaSet(user, band, UNLIMITED) for user in users for band in BANDS])
    for j in jobs:
        log([JobSubmitted(j.job_id, j, JobState.PENDING)], f"submit-{j.job_id}", "SubmitJob")
    # First fit by CPU and memory, from a cursor that moves on past full machines.
    free = np.array([[m.capacity.cpu, m.capacity.ram] for m in specs])
    next_port = [m.first_port for m in specs]
    cursor = 0
    placements: list[Mutation] = []
    started: list[Mutation] = []
    for j in jobs:
        need = np.array([j.task.limits.cpu, j.task.limits.ram])
        for index in range(j.task_count):
            for step in range(len(specs)):
                at = (cursor + step) % len(specs)
                if (free[at] >= need).all():
                    break
            else:
                continue  # fits nowhere: stays pending
            free[at] -= need
            ports = tuple(range(next_port[at], next_port[at] + int(j.task.limits.ports)))
            next_port[at] += len(ports)
            cursor = at
            placements.append(TaskScheduled(j.job_id, index, 1, specs[at].machine_id, ports, j.task.limits))
            started.append(TaskStateChanged(j.job_id, index, 1, TaskState.RUNNING, TaskEvent.RUNNING))
    log(placements)
    log(started)
    return state


def _cell_snapshot_bytes(state: CellState) -> bytes:
    return checkpoint_codec.snapshot_out(state, EPOCH).SerializeToString()


def _first_format_bytes(state: CellState) -> bytes:
    return snapshot_v1.snapshot_out(state, EPOCH).SerializeToString()


def run(report: Report, size: str = "full") -> None:
    if size not in SIZES:
        raise ValueError(f"no benchmark size {size!r} (this benchmark has {', '.join(sorted(SIZES))})")
    sized = SIZES[size]
    state = placed_cell(sized.machines, sized.tasks)
    running = sum(1 for _, t in state.iter_tasks() if t.state is TaskState.RUNNING)
    print(
        f"cell: {len(state.machines)} machines, {len(state.jobs)} jobs, "
        f"{sum(len(j.tasks) for j in state.jobs.values())} tasks ({running} running), "
        f"log position {state.last_sequence}"
    )
    new, old = _cell_snapshot_bytes(state), _first_format_bytes(state)
    expected = state.describe()
    for data, fmt in ((new, checkpoint_codec.SNAPSHOT_FORMAT), (old, snapshot_v1.FORMAT)):
        if checkpoint_codec.snapshot_in(data, fmt).describe() != expected:
            raise AssertionError(f"a {fmt} snapshot did not decode to the state encoded")
    mib = 2**20
    report("borgmaster.snapshot.cell10k.cell_snapshot_mib", len(new) / mib, "MiB")
    report("borgmaster.snapshot.cell10k.first_format_mib", len(old) / mib, "MiB")
    report("borgmaster.snapshot.cell10k.size_vs_first_format", len(new) / len(old), "x")

    encode, encode_old = _cpu_best_in_turns(
        sized.repeats, lambda: _cell_snapshot_bytes(state), lambda: _first_format_bytes(state)
    )
    report("borgmaster.snapshot.cell10k.encode_s", encode, "s (CPU)")
    report("borgmaster.snapshot.cell10k.first_format_encode_s", encode_old, "s (CPU)")
    report("borgmaster.snapshot.cell10k.encode_vs_first_format", encode / encode_old, "x")

    decode, decode_old = _cpu_best_in_turns(
        sized.repeats,
        lambda: checkpoint_codec.snapshot_in(new, checkpoint_codec.SNAPSHOT_FORMAT),
        lambda: checkpoint_codec.snapshot_in(old, snapshot_v1.FORMAT),
    )
    report("borgmaster.snapshot.cell10k.decode_s", decode, "s (CPU)")
    report("borgmaster.snapshot.cell10k.first_format_decode_s", decode_old, "s (CPU)")
    report("borgmaster.snapshot.cell10k.decode_vs_first_format", decode / decode_old, "x")


def _cpu_best_in_turns(repeats: int, *calls: Callable[[], object]) -> list[float]:
    """Each call's least CPU time over ``repeats`` rounds, the calls taking turns in each round."""
    best = [float("inf")] * len(calls)
    for _ in range(repeats):
        for i, call in enumerate(calls):
            start = time.process_time()
            call()
            best[i] = min(best[i], time.process_time() - start)
    return best
