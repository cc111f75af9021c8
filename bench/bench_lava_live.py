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

from bench.harness import Report
from cellpilot.borg.cell_state import CellState
from cellpilot.borg.decisions import Accepted, Command, KillJob, RegisterMachine, SetQuota, SubmitJob, handle
from cellpilot.borg.lifetime_tracker import LifetimeTracker
from cellpilot.borg.model import JobSpec, MachineSpec, SimulatedRuntime, TaskSpec
from cellpilot.borg.mutations import LifetimeModelTrained, LogRecord, Mutation, to_records
from cellpilot.borg.scheduling_view import SchedulingView
from cellpilot.borg.task_lifetimes import LifetimeHistory, TrainedModel, train_lifetime_model
from cellpilot.job_vocabulary import AppClass, PriorityBand
from cellpilot.schedule import Resources, SchedulerConfig, default_profile
from cellpilot.units import GIB

FIGURES = ["lava.live.best_fit_pass_s", "lava.live.lava_pass_s", "lava.live.pass_vs_best_fit"]
MACHINES, RUNNING_JOBS, PENDING_JOBS, TASKS_PER_JOB = 500, 200, 200, 10
HOUR_MS = 3_600_000


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


def _job(name: str, shape: int) -> JobSpec:
    limits = Resources(250 * (shape + 1), (shape % 4 + 1) * GIB / 2, 0, 0)
    return JobSpec(
        name,
        "bench",
        4,
        TaskSpec(limits, runtime=SimulatedRuntime("steady")),
        TASKS_PER_JOB,
        app_class=AppClass.BATCH,
    )


def _cell() -> tuple[_Log, TrainedModel]:
    log = _Log()
    for i in range(MACHINES):
        spec = MachineSpec(
            f"m{i:03d}", "127.0.0.1:1", Resources(32_000, 128 * GIB, 1000 * GIB, 100), first_port=20000
        )
        log.run(RegisterMachine("", spec))
    log.run(SetQuota("", "bench", PriorityBand.BATCH, Resources(1e9, 1e15, 1e15, 1e6)))
    for r in range(3):  # history: shape s lives (s + 1) hours
        for shape in range(10):
            log.run(SubmitJob("", _job(f"past-{r}-{shape}", shape)))
        log.schedule()
        for shape in range(10):
            log.now_ms += HOUR_MS
            log.run(KillJob("", f"bench/past-{r}-{shape}"))
    history = LifetimeHistory()
    history.feed(log.records)
    trained = train_lifetime_model(history, min_runs=100)
    assert isinstance(trained, TrainedModel)
    log.commit([LifetimeModelTrained(trained.model.to_json(), trained.runs, log.now_ms)])
    for j in range(RUNNING_JOBS):
        log.run(SubmitJob("", _job(f"running-{j}", j % 10)))
    log.schedule()
    for j in range(PENDING_JOBS):
        log.run(SubmitJob("", _job(f"pending-{j}", j % 10)))
    return log, trained


def _pass(log: _Log, placement: str) -> float:
    state = CellState()
    state.apply_all(log.records)
    tracker = LifetimeTracker()
    view = SchedulingView(default_profile("best-fit", 0.0, placement, tracker), SchedulerConfig())
    view.rebuild(state)
    now = log.now_ms / 1000
    tracker.sync(state, view.cell, now)  # loading the model and the running tasks: not per pass
    start = time.perf_counter()
    if placement == "lava":
        tracker.sync(state, view.cell, now)
        tracker.expect_pending(state, view.cell, log.now_ms)
    plan = view.plan(state, log.now_ms)
    if placement == "lava":
        tracker.sync(state, view.cell, now)
        tracker.changes(state)
    elapsed = time.perf_counter() - start
    assert plan.placed == PENDING_JOBS * TASKS_PER_JOB, plan
    return elapsed


def run(report: Report) -> None:
    log, _ = _cell()
    baseline = min(_pass(log, "best-fit") for _ in range(3))
    lava = min(_pass(log, "lava") for _ in range(3))
    report("lava.live.best_fit_pass_s", baseline, "s")
    report("lava.live.lava_pass_s", lava, "s")
    report("lava.live.pass_vs_best_fit", lava / baseline, "x")
