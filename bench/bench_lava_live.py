"""What LAVA costs a live scheduling pass (LAVA §4.3; §4.5 reports no observable overhead in Borg).

The Borgmaster core (:class:`SchedulingView` and :class:`LifetimeTracker`, as the master runs
them) places 2 000 pending tasks (200 jobs of 10, ten shapes) on 500 machines already running
2 000 tasks, with a lifetime model trained on the cell's own log (jobs of each shape killed by
their user after a shape-dependent time). One pass with the LAVA policy includes what the
master adds around it: following the cell and predicting the pending jobs before it, the host
states after it.

* ``lava.live.best_fit_pass_s``: the pass with the best-fit policy (the baseline), best of 3.
* ``lava.live.lava_pass_s``: the same pass with the LAVA policy, best of 3.
* ``lava.live.pass_vs_best_fit``: their ratio.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.harness import FULL, SMOKE, Report, sized
from cellpilot.borg.cell_state import CellState
from cellpilot.borg.decisions import Accepted, Command, KillJob, RegisterMachine, SetQuota, SubmitJob, handle
from cellpilot.borg.lifetime_tracker import LifetimeTracker
from cellpilot.borg.model import JobSpec, MachineSpec, SimulatedRuntime, TaskSpec
from cellpilot.borg.mutations import LifetimeModelTrained, LogRecord, Mutation, to_records
from cellpilot.borg.scheduling_view import SchedulingView
from cellpilot.borg.task_lifetimes import LifetimeHistory, TrainedModel, train_lifetime_model
from cellpilot.job_vocabulary import AppClass, PriorityBand
from cellpilot.schedule import Resources, SchedulerConfig, default_profile
from cellpilot.schedule.lifetime_aware.policies import BASELINE, placement_policy
from cellpilot.units import GIB

FIGURES = ["lava.live.best_fit_pass_s", "lava.live.lava_pass_s", "lava.live.pass_vs_best_fit"]
HOUR_MS = 3_600_000


@dataclass(frozen=True)
class Size:
    machines: int
    running_jobs: int
    pending_jobs: int
    tasks_per_job: int
    repeats: int  # best of


SIZES = {
    FULL: Size(machines=500, running_jobs=200, pending_jobs=200, tasks_per_job=10, repeats=3),
    # The history still needs the model's minimum of 100 runs: 3 rounds x 10 shapes x 4 tasks.
    SMOKE: Size(machines=40, running_jobs=10, pending_jobs=10, tasks_per_job=4, repeats=1),
}


class _Log:
    def __init__(self) -> None:
        self.state = CellState()
        self.records: list[LogRecord] = []
        self.now_ms = 1_000_000

    def commit(self, mutations: tuple[Mutation, ...] | list[Mutation]) -> None:
        records = to_records(self.state.last_sequence + 1, 1, self.now_ms, mutations, "", "bench")
        for record in records:
            self.state.apply(record)
        self.records += records

    def run(self, command: Command) -> None:
        result = handle(self.state, command, self.now_ms)
        assert isinstance(result, Accepted), result
        self.commit(result.mutations)

    def schedule(self) -> None:
        view = SchedulingView.build(self.state)
        plan = view.plan(self.state, self.now_ms)
        self.commit(plan.mutations)


def _job(name: str, shape: int, tasks: int) -> JobSpec:
    limits = Resources(250 * (shape + 1), (shape % 4 + 1) * GIB / 2, 0, 0)
    return JobSpec(
        name,
        "bench",
        4,
        TaskSpec(limits, runtime=SimulatedRuntime("steady")),
        tasks,
        app_class=AppClass.BATCH,
    )


def _cell(size: Size) -> tuple[_Log, TrainedModel]:
    log = _Log()
    tasks = size.tasks_per_job
    for i in range(size.machines):
        spec = MachineSpec(
            f"m{i:03d}", "127.0.0.1:1", Resources(32_000, 128 * GIB, 1000 * GIB, 100), first_port=20000
        )
        log.run(RegisterMachine("", spec))
    log.run(SetQuota("", "bench", PriorityBand.BATCH, Resources(1e9, 1e15, 1e15, 1e6)))
    for r in range(3):  # history: shape s lives (s + 1) hours
        for shape in range(10):
            log.run(SubmitJob("", _job(f"past-{r}-{shape}", shape, tasks)))
        log.schedule()
        for shape in range(10):
            log.now_ms += HOUR_MS
            log.run(KillJob("", f"bench/past-{r}-{shape}"))
    history = LifetimeHistory()
    history.feed(log.records)
    trained = train_lifetime_model(history, min_runs=100)
    assert isinstance(trained, TrainedModel)
    log.commit([LifetimeModelTrained(trained.model.to_json(), trained.runs, log.now_ms)])
    for j in range(size.running_jobs):
        log.run(SubmitJob("", _job(f"running-{j}", j % 10, tasks)))
    log.schedule()
    for j in range(size.pending_jobs):
        log.run(SubmitJob("", _job(f"pending-{j}", j % 10, tasks)))
    return log, trained


def _pass(log: _Log, placement: str, pending_tasks: int) -> float:
    state = CellState()
    state.apply_all(log.records)
    tracker = LifetimeTracker()
    view = SchedulingView(default_profile("best-fit", 0.0, placement, tracker), SchedulerConfig())
    view.rebuild(state)
    now = log.now_ms / 1000
    tracker.sync(state, view.cell, now)  # loading the model and the running tasks: not per pass
    lifetime_aware = placement_policy(placement).needs_lifetimes  # the master's work around the pass
    start = time.perf_counter()
    if lifetime_aware:
        tracker.sync(state, view.cell, now)
        tracker.expect_pending(state, view.cell, log.now_ms)
    plan = view.plan(state, log.now_ms)
    if lifetime_aware:
        tracker.sync(state, view.cell, now)
        tracker.changes(state)
    elapsed = time.perf_counter() - start
    assert plan.placed == pending_tasks, plan
    return elapsed


def run(report: Report, size: str = FULL) -> None:
    params = sized(SIZES, size)
    log, _ = _cell(params)
    pending = params.pending_jobs * params.tasks_per_job
    baseline = min(_pass(log, BASELINE, pending) for _ in range(params.repeats))
    lava = min(_pass(log, "lava", pending) for _ in range(params.repeats))
    report("lava.live.best_fit_pass_s", baseline, "s")
    report("lava.live.lava_pass_s", lava, "s")
    report("lava.live.pass_vs_best_fit", lava / baseline, "x")
