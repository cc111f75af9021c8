"""Task lifetimes of a live cell (LAVA §3): the model's inputs for a Borg task, the cell's
history of finished task runs replayed from its checkpoint log, training, and LARS's order.

LAVA §3 predicts a VM's remaining lifetime from what is known at creation plus its uptime.
A Borg task maps onto the same model inputs (:data:`cellpilot.lifetimes.features.FEATURE_NAMES`):
its limits are the shape (cores, memory GiB, local disk GiB), its app class the category, its
user the owner, its priority band the zone and its priority the tier, and the hour of day it
started the creation hour.

The history is the log itself (Borg §3.1: the checkpoint replays to any past state): a task
run starts when it is scheduled and ends when the task stops running. Runs that finished or
were killed by their user are lifetimes; runs cut short by the system (evicted, preempted,
lost with their machine, failed) say nothing about how long the task would have lived and
are left out, as a VM trace has only the VMs that exited on their own.

LARS (§4.4) drains a host by migrating "the longest-predicted VM" first, "as shorter-lived
VMs exit while LARS migrates longer-lived VMs"; :func:`drain_plan` orders a drain's evictions
that way with :func:`cellpilot.schedule.lifetime_aware.lars.migration_key`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from cellpilot.array_types import FloatArray
from cellpilot.borg.cell_state import CellState, TaskKey, TaskRecord
from cellpilot.borg.changes import TaskChange
from cellpilot.borg.lifecycle import TaskEvent, TaskState
from cellpilot.borg.model import JobSpec
from cellpilot.borg.mutations import LogRecord
from cellpilot.job_vocabulary import AppClass, PriorityBand
from cellpilot.lifetimes.distribution_model import DistributionModel, DistributionParams
from cellpilot.lifetimes.features import NUM_FEATURES
from cellpilot.lifetimes.lifetime_classes import LIFETIME_CLASS_UPPER, NUM_LIFETIME_CLASSES, lifetime_class
from cellpilot.lifetimes.predictors import DEFAULT_CLASS_RISK, estimate_lifetimes
from cellpilot.schedule.lifetime_aware.lars import MigrationOrder, migration_key
from cellpilot.units import GIB

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
OWNER_CODES = 4096  # users hashed into this many categories (stable across replicas and restarts)
DEFAULT_MIN_RUNS = 50
ENDS_A_LIFETIME = frozenset({TaskEvent.FINISHED, TaskEvent.KILLED})
_APP_CODES = {AppClass.UNSPECIFIED: 0, AppClass.LATENCY_SENSITIVE: 1, AppClass.BATCH: 2}
# The API's order (job.proto), the codes the lifetime model was trained with.
_BAND_CODES = {
    PriorityBand.UNSPECIFIED: 0,
    PriorityBand.MONITORING: 1,
    PriorityBand.PRODUCTION: 2,
    PriorityBand.BATCH: 3,
    PriorityBand.BEST_EFFORT: 4,
}


def class_name(klass: int) -> str:
    """``LC2 (1-10 h)`` for class 1 (0..3 = LC1..LC4, LAVA §4.3); ``none`` below 0."""
    if klass < 0:
        return "none"
    bounds = [0.0, *(LIFETIME_CLASS_UPPER / 3600.0)]
    k = min(klass, NUM_LIFETIME_CLASSES - 1)
    if k == NUM_LIFETIME_CLASSES - 1:
        return f"LC{k + 1} (>= {bounds[k]:g} h)"
    return f"LC{k + 1} ({bounds[k]:g}-{bounds[k + 1]:g} h)"


def task_features(spec: JobSpec, started_ms: int) -> FloatArray:
    """The model's creation-time inputs of a task of ``spec`` that started at ``started_ms``."""
    limits = spec.task.limits
    return np.array(
        [
            limits.cpu / 1000.0,
            limits.ram / GIB,
            limits.disk / GIB,
            float(_APP_CODES[spec.app_class]),
            float(zlib.crc32(spec.user.encode()) % OWNER_CODES),
            float(_BAND_CODES[spec.effective_band]),
            float(spec.priority),
            float((started_ms % DAY_MS) // HOUR_MS),
        ],
        dtype=np.float64,
    )


@dataclass(frozen=True)
class TaskLifetime:
    """A task's predicted remaining lifetime at its uptime (E[T_r | T_u], §3) and its LAVA
    class (§4.3), the risk class of :func:`cellpilot.lifetimes.predictors.risk_classes`."""

    remaining_s: float
    uptime_s: float
    lifetime_class: int


def predict(model: DistributionModel, rows: list[tuple[JobSpec, int, float]]) -> list[TaskLifetime]:
    """One batch prediction: per (spec, started_ms, uptime_s), the remaining lifetime and class,
    by the same rule as the offline study's model predictor (:mod:`cellpilot.lifetimes.predictors`)."""
    if not rows:
        return []
    features = np.array([task_features(spec, started) for spec, started, _ in rows]).reshape(
        len(rows), NUM_FEATURES
    )
    uptimes = np.array([max(u, 0.0) for _, _, u in rows])
    estimates = estimate_lifetimes(model, features, uptimes, DEFAULT_CLASS_RISK)
    return [
        TaskLifetime(float(r), float(u), int(c))
        for r, u, c in zip(estimates.remaining, uptimes, estimates.lifetime_class, strict=True)
    ]


# ---------------------------------------------------------------------- history
class LifetimeHistory:
    """Finished task runs, harvested by replaying checkpoint-log records in order."""

    def __init__(self) -> None:
        self.state = CellState()
        self._started: dict[TaskKey, tuple[int, FloatArray]] = {}
        self.started_ms: list[int] = []
        self.features: list[FloatArray] = []
        self.lifetimes_s: list[float] = []
        self.jobs: set[str] = set()

    def feed(self, records: Iterable[LogRecord]) -> None:
        for record in records:
            for change in self.state.apply(record):
                if isinstance(change, TaskChange):
                    self._observe(change)

    def _observe(self, change: TaskChange) -> None:
        key = (change.job_id, change.task_index)
        if change.kind is TaskEvent.SCHEDULED:
            spec = self.state.jobs[change.job_id].spec
            self._started[key] = (change.event_time_ms, task_features(spec, change.event_time_ms))
        elif change.state is not TaskState.RUNNING and key in self._started:
            started_ms, features = self._started.pop(key)
            if change.kind in ENDS_A_LIFETIME:
                self.started_ms.append(started_ms)
                self.features.append(features)
                self.lifetimes_s.append(max(change.event_time_ms - started_ms, 0) / 1000.0)
                self.jobs.add(change.job_id)

    @property
    def runs(self) -> int:
        return len(self.lifetimes_s)


@dataclass(frozen=True)
class TrainedModel:
    model: DistributionModel
    runs: int
    jobs: int
    median_lifetime_s: float
    runs_per_class: tuple[int, ...]  # by actual lifetime, LC1..LC4


@dataclass(frozen=True)
class TooLittleHistory:
    runs: int
    needed: int

    def __str__(self) -> str:
        return (
            f"the cell's checkpoint log holds {self.runs} finished task runs (tasks that finished or "
            f"were killed by their user); training needs at least {self.needed} (min_runs)"
        )


def train_lifetime_model(
    history: LifetimeHistory, min_runs: int = DEFAULT_MIN_RUNS
) -> TrainedModel | TooLittleHistory:
    """Trains the lifetime distribution model (LAVA §3) on the cell's finished runs: the model
    the offline study ships (:class:`~cellpilot.lifetimes.distribution_model.DistributionModel`)."""
    if history.runs < max(min_runs, 1):
        return TooLittleHistory(history.runs, max(min_runs, 1))
    order = np.argsort(np.array(history.started_ms), kind="stable")  # the model trains in creation order
    features = np.array(history.features)[order]
    lifetimes = np.array(history.lifetimes_s)[order]
    # Small histories need small leaves, or every tree is one leaf (the class frequencies).
    params = DistributionParams(min_data_in_leaf=int(np.clip(lifetimes.size // 5, 2, 50)))
    model = DistributionModel.train(features, lifetimes, params)
    counts = np.bincount(lifetime_class(lifetimes), minlength=NUM_LIFETIME_CLASSES)
    return TrainedModel(
        model,
        int(lifetimes.size),
        len(history.jobs),
        float(np.median(lifetimes)),
        tuple(int(c) for c in counts),
    )


# ---------------------------------------------------------------------- drains (LARS)
@dataclass(frozen=True)
class DrainPlan:
    order: str  # "lars" or "machine"
    reason: str
    moves: tuple[tuple[TaskKey, TaskLifetime | None], ...]


def lars_key(
    task: TaskRecord, lifetimes: Mapping[TaskKey, TaskLifetime], rank: int
) -> tuple[int, float, int]:
    """Sort key of a drain eviction: predicted tasks by LARS (longest remaining first, §4.4),
    then the tasks without a prediction in machine order."""
    lifetime = lifetimes.get(task.key)
    if lifetime is None:
        return (1, 0.0, rank)
    return (0, *migration_key(MigrationOrder.LARS, lifetime.remaining_s, rank))


def lars_order(lifetimes: Mapping[TaskKey, TaskLifetime]) -> Callable[[list[TaskRecord]], list[TaskRecord]]:
    """The order :func:`cellpilot.borg.decisions.drain_step` evicts in under LARS."""

    def order(tasks: list[TaskRecord]) -> list[TaskRecord]:
        return [t for _, t in sorted(enumerate(tasks), key=lambda it: lars_key(it[1], lifetimes, it[0]))]

    return order


def drain_plan(
    state: CellState, machine_ids: Iterable[str], lifetimes: Mapping[TaskKey, TaskLifetime]
) -> DrainPlan:
    """The order in which the tasks of the draining ``machine_ids`` are evicted."""
    tasks: list[TaskRecord] = []
    for machine_id in sorted(machine_ids):
        tasks += [t for _, t in state.tasks_on(machine_id)]
    moves = tuple((t.key, lifetimes.get(t.key)) for t in lars_order(lifetimes)(tasks))
    if lifetimes and any(lt is not None for _, lt in moves):
        return DrainPlan(
            "lars",
            "longest predicted remaining lifetime first (LARS, LAVA §4.4): short-lived tasks get "
            "the time to exit on their own before their turn",
            moves,
        )
    return DrainPlan("machine", "no lifetime model: the machine's task order", moves)
