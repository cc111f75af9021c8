"""Crash loops and the checkpoint log: what restart backoff (Borg §4) saves.

N jobs (300 at full size) of one task each whose tasks die at once when they start (an OOM at
their first sample), on 50 machines, driven through the Borgmaster's decision core in event
time for 60 s: every 250 ms a scheduling pass, then every machine's Borglet reports its
tasks OOM-killed and the master commits the diff — as fast as the real service can notice a
crash (it polls a machine at once when its desired set changes). The same run measures:

* ``borgmaster.crashloop.log_records_per_s``: checkpoint-log records per second of event time
  with the default restart policy (1 s doubling to 5 min);
* ``borgmaster.crashloop.no_backoff_log_records_per_s``: the baseline, the same with no
  backoff (restarted as soon as the next pass runs: how the master behaved without it);
* ``borgmaster.crashloop.vs_no_backoff``: the ratio (lower is better);
* ``borgmaster.crashloop.max_incarnation`` and ``...no_backoff_max_incarnation``: the most
  restarts any task reached in the 60 s.

``python -m bench.bench_crashloop [--jobs N] [--seconds S]`` prints the same lines.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from bench.harness import FULL, SMOKE, Report, sized
from cellpilot.borg.cell_state import CellState
from cellpilot.borg.decisions import Accepted, SubmitJob, handle
from cellpilot.borg.lifecycle import TaskEvent, TaskState
from cellpilot.borg.model import JobSpec, MachineSpec, SimulatedRuntime, TaskSpec
from cellpilot.borg.mutations import MachineRegistered, Mutation, QuotaSet, to_records
from cellpilot.borg.poll_diff import MachineReport, ReportedEvent, ReportedTask, diff_report
from cellpilot.borg.restart_backoff import RestartPolicy
from cellpilot.borg.scheduling_view import SchedulingView
from cellpilot.job_vocabulary import AppClass, MemoryLimitKind, PriorityBand
from cellpilot.schedule import Resources
from cellpilot.units import GIB

FIGURES = [
    "borgmaster.crashloop.log_records_per_s",
    "borgmaster.crashloop.no_backoff_log_records_per_s",
    "borgmaster.crashloop.vs_no_backoff",
    "borgmaster.crashloop.max_incarnation",
    "borgmaster.crashloop.no_backoff_max_incarnation",
]
T0_MS = 1_700_000_000_000
NO_BACKOFF = RestartPolicy(initial_delay_ms=0, max_delay_ms=0, crash_threshold=1_000_000)


@dataclass(frozen=True)
class Size:
    jobs: int
    seconds: float  # of event time
    machines: int


SIZES = {FULL: Size(jobs=300, seconds=60.0, machines=50), SMOKE: Size(jobs=20, seconds=5.0, machines=5)}


@dataclass(frozen=True)
class CrashLoop:
    records: int  # log records appended during the run (after the jobs were submitted)
    seconds: float  # event time simulated
    max_incarnation: int
    tasks: int

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def records_per_task_per_minute(self) -> float:
        return self.records / self.tasks / (self.seconds / 60.0)


class _Master:
    """The decision core wired as the service wires it: decide, append (counted), apply, observe."""

    def __init__(self) -> None:
        self.state = CellState()
        self.view = SchedulingView()
        self.now_ms = T0_MS

    def commit(self, mutations: tuple[Mutation, ...] | list[Mutation]) -> None:
        for record in to_records(self.state.last_sequence + 1, 1, self.now_ms, mutations):
            self.view.observe(self.state, self.state.apply(record))


def _job(index: int) -> JobSpec:
    # Steady usage of 256 MiB under a 64 MiB hard limit: OOM-killed at its first sample.
    runtime = SimulatedRuntime("steady", (("memory_bytes", 256.0 * (1 << 20)),))
    limits = Resources(100, 64 * (1 << 20))
    return JobSpec(
        name=f"crash{index}",
        user="bench",
        priority=9,
        task=TaskSpec(limits, MemoryLimitKind.HARD, runtime),
        app_class=AppClass.LATENCY_SENSITIVE,
    )


def crash_loop(
    policy: RestartPolicy, jobs: int = 300, seconds: float = 60.0, machines: int = 50, step_ms: int = 250
) -> CrashLoop:
    """Runs ``jobs`` crash-looping tasks for ``seconds`` of event time under ``policy``."""
    master = _Master()
    for i in range(machines):
        spec = MachineSpec(
            f"m{i}", f"10.0.0.{i}:7000", Resources(64_000, 256 * GIB, 1e12, 1000), first_port=20000
        )
        master.commit([MachineRegistered(spec)])
    master.commit([QuotaSet("bench", PriorityBand.PRODUCTION, Resources(1e9, 1e15, 1e15, 1e6))])
    for i in range(jobs):
        result = handle(master.state, SubmitJob(f"s{i}", _job(i)), master.now_ms)
        assert isinstance(result, Accepted), result
        master.commit(result.mutations)
    first = master.state.last_sequence
    end = master.now_ms + int(seconds * 1000)
    sequence = 0
    while master.now_ms < end:
        plan = master.view.plan(master.state, master.now_ms, max_tasks=jobs, event_now_ms=master.now_ms)
        master.commit(plan.mutations)
        master.now_ms += step_ms
        mutations: list[Mutation] = []
        for machine_id, machine in master.state.machines.items():
            dead, events = [], []
            for job, task in master.state.tasks_on(machine_id):
                sequence += 1
                dead.append(
                    ReportedTask(
                        job.job_id,
                        task.index,
                        task.incarnation,
                        TaskState.DEAD,
                        TaskEvent.OOM,
                        started_ms=task.state_since_ms,
                    )
                )
                detail = "OOM: hard memory limit exceeded"
                events.append(
                    ReportedEvent(
                        sequence,
                        job.job_id,
                        task.index,
                        task.incarnation,
                        TaskEvent.OOM,
                        detail,
                        event_time_ms=master.now_ms,
                    )
                )
            if dead:
                report = MachineReport(
                    machine_id, master.now_ms, machine.desired_version, tuple(dead), tuple(events)
                )
                mutations += diff_report(master.state, report, policy=policy).mutations
        master.commit(mutations)
    incarnations = [t.incarnation for _, t in master.state.iter_tasks()]
    return CrashLoop(master.state.last_sequence - first, seconds, max(incarnations), jobs)


def run(report: Report, size: str = FULL) -> None:
    measure(report, sized(SIZES, size))


def measure(report: Report, size: Size) -> None:
    with_backoff = crash_loop(RestartPolicy(), size.jobs, size.seconds, size.machines)
    without = crash_loop(NO_BACKOFF, size.jobs, size.seconds, size.machines)
    report("borgmaster.crashloop.log_records_per_s", with_backoff.records_per_s, "records/s")
    report("borgmaster.crashloop.no_backoff_log_records_per_s", without.records_per_s, "records/s")
    report("borgmaster.crashloop.vs_no_backoff", with_backoff.records_per_s / without.records_per_s, "ratio")
    report("borgmaster.crashloop.max_incarnation", with_backoff.max_incarnation, "incarnations")
    report("borgmaster.crashloop.no_backoff_max_incarnation", without.max_incarnation, "incarnations")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    full = SIZES[FULL]
    parser.add_argument("--jobs", type=int, default=full.jobs)
    parser.add_argument("--seconds", type=float, default=full.seconds)
    args = parser.parse_args()

    def report(name: str, value: float, unit: str) -> None:
        print(f"BENCH {name} {value:.6g} {unit}", flush=True)

    measure(report, Size(args.jobs, args.seconds, full.machines))


if __name__ == "__main__":
    main()
