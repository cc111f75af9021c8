"""Vertical CPU and horizontal scaling on one job settle over a week; measured against the moving
limit, they do not.

A closed loop through the code the services run, in event time: the world model
(:mod:`cellpilot.world.step`: a diurnal job demand split by the load balancer among the
ready tasks, each task on a machine with spare CPU to burst into, Autopilot §2.3) gives each
task's CPU every minute; a 5-minute window's histograms go through the recommender workers'
core (:func:`apply_histograms`) and their wire form (the recommender's ``recommendation_set``,
the Autopilot master's ``candidates_in``/``horizontal_inputs_in`` and :class:`JobInputs`) into the master's
:func:`decide`; its limit and task count are applied at once (new tasks ready after 2 minutes).

With r* a share of a per-task reference size the user fixes, the task count follows the daily
demand and the limit follows the per-task usage, and the seventh day looks like the third. With
r* a share of the limit Autopilot itself changes (Autopilot §3.3 read literally), every limit cut
raises the utilisation, which adds tasks, which lowers per-task usage, which cuts the limit again:
the count climbs to the job's maximum — which is why admission refuses that combination.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache

import numpy as np

from cellpilot.autopilot.decisions import (
    DecisionPolicy,
    HorizontalConfig,
    JobMemory,
    JobView,
    ScalingMode,
    VerticalConfig,
    decide,
)
from cellpilot.autopilot.job_inputs import JobInputs
from cellpilot.autopilot.job_recommendations import (
    HistogramInput,
    HorizontalSettings,
    RecommenderConfig,
    apply_histograms,
    apply_horizontal_settings,
)
from cellpilot.job_vocabulary import HorizontalStatistic
from cellpilot.units import GIB
from cellpilot.usage.buckets import MEMORY_SCHEME, Resource, default_scheme
from cellpilot.world.job_demand import JobDemand
from cellpilot.world.step import WorldTasks, step_world
from cellpilot.world.usage_models import resolve_params
from cellpilot_services.autopilot.convert import candidates_in, horizontal_inputs_in
from cellpilot_services.recommender.convert import recommendation_set

JOB = "u/frontend"
MINUTE_S = 60
WINDOW_S = 300
DAY_S = 86_400
STARTUP_S = 120
HORIZON_MS = 3_600_000  # r_S over the last hour, so the count follows the day
MAX_TASKS = 40


@dataclass
class Week:
    tasks: np.ndarray  # (windows,) task count at each window's end
    cpu_limit: np.ndarray  # (windows,) per-task CPU limit, millicores

    def day(self, d: int) -> slice:
        per_day = DAY_S // WINDOW_S
        return slice(d * per_day, (d + 1) * per_day)


@cache
def _run_week(reference_cpu_millicores: float | None, days: int = 7) -> Week:
    demand = JobDemand.build(
        "diurnal",
        resolve_params(
            "diurnal",
            {
                "cpu_mean_millicores": 6000.0,
                "cpu_amplitude": 0.6,
                "memory_mean_bytes": 0.0,
                "memory_amplitude": 0.0,
            },
        ),
        seed=11,
    )
    base = resolve_params("steady", {"cpu_millicores": 20.0, "memory_bytes": 256 * 2**20})
    horizontal = HorizontalConfig(
        ScalingMode.ON,
        min_tasks=1,
        max_tasks=MAX_TASKS,
        target_utilization=0.6,
        horizon_ms=HORIZON_MS,
        deferred_downscaling_ms=HORIZON_MS,
        slow_decay_half_period_ms=HORIZON_MS,
        reference_cpu_millicores=reference_cpu_millicores,
    )
    view = JobView(
        JOB, 1, cpu_limit=1000.0, memory_limit=float(GIB), task_count=4,
        cpu=VerticalConfig(ScalingMode.ON), memory=VerticalConfig(ScalingMode.OFF), horizontal=horizontal,
    )  # fmt: skip
    config = RecommenderConfig()
    states: dict = {}
    apply_horizontal_settings(config, states, {JOB: HorizontalSettings(HORIZON_MS, HorizontalStatistic.MAX)})
    memory, policy = JobMemory(), DecisionPolicy()
    started = list(np.full(view.task_count, -3600.0))  # start times of tasks 0..n-1
    cpu_scheme = default_scheme(Resource.CPU)
    counts, limits = [], []
    for window in range(days * DAY_S // WINDOW_S):
        start_s, end_s = window * WINDOW_S, (window + 1) * WINDOW_S
        n = view.task_count
        table = WorldTasks.for_job(
            demand, "steady", base, task_index=np.arange(n), start_s=started[:n],
            routed_from_s=np.asarray(started[:n]) + STARTUP_S,
            cpu_limit=view.cpu_limit, memory_limit=view.memory_limit, machine_cpu=16_000.0,
        )  # fmt: skip
        step = step_world(table, np.arange(start_s, end_s, MINUTE_S))
        cpu = step.cpu  # millicores, the histograms' unit
        end_ms = end_s * 1000
        inputs = [
            HistogramInput(
                JOB, Resource.CPU, end_ms,
                np.bincount(cpu_scheme.index_of(cpu.ravel()), minlength=cpu_scheme.size).astype(float),
                float(cpu.mean(axis=0).sum()),
            ),
            HistogramInput(
                JOB, Resource.MEMORY, end_ms,
                np.bincount(
                    MEMORY_SCHEME.index_of(step.memory.max(axis=0)), minlength=MEMORY_SCHEME.size
                ).astype(float),
                float(step.memory.mean(axis=0).sum()),
            ),
        ]  # fmt: skip
        for job_id, window_end, state in apply_histograms(config, states, inputs).ready:
            wire = recommendation_set(job_id, state, window_end, "loop", config)
            inputs = JobInputs.of(candidates_in(wire), horizontal_inputs_in(wire))
            candidates, signal = inputs.candidates(), inputs.signal(view.horizontal)
            ready = int(np.sum(np.asarray(started[:n]) + STARTUP_S <= end_s))
            decision, memory = decide(
                replace(view, initialising=n - ready), candidates, signal, memory, policy, window_end
            )
            if decision.cpu_limit is not None:
                view = replace(view, cpu_limit=float(decision.cpu_limit), spec_version=view.spec_version + 1)
            if decision.task_count is not None:
                wanted = decision.task_count
                started = started[:wanted] + [float(end_s)] * max(0, wanted - len(started[:wanted]))
                view = replace(view, task_count=wanted, spec_version=view.spec_version + 1)
        counts.append(view.task_count)
        limits.append(view.cpu_limit)
    return Week(np.asarray(counts), np.asarray(limits))


def test_with_a_reference_size_the_seventh_day_looks_like_the_third() -> None:
    week = _run_week(reference_cpu_millicores=1000.0)
    third, seventh = week.day(2), week.day(6)
    # The count follows the day (up at the peak, down in the trough) ...
    assert week.tasks[seventh].max() >= week.tasks[seventh].min() + 3
    # ... and does not drift: the same daily range and mean, and a limit that settled (a peak
    # moves by the small-change dead band, 10 % of the count, from one day to the next).
    assert abs(week.tasks[seventh].max() - week.tasks[third].max()) <= 2
    assert week.tasks[seventh].min() == week.tasks[third].min()
    assert abs(week.tasks[seventh].mean() - week.tasks[third].mean()) <= 0.1 * week.tasks[third].mean()
    assert week.tasks[seventh].max() < MAX_TASKS
    limit_third, limit_seventh = np.median(week.cpu_limit[third]), np.median(week.cpu_limit[seventh])
    assert abs(limit_seventh - limit_third) <= 0.1 * limit_third


def test_against_the_limit_autopilot_keeps_changing_the_count_runs_away() -> None:
    week = _run_week(reference_cpu_millicores=None)
    settled = _run_week(reference_cpu_millicores=1000.0)
    first, last = week.day(0), week.day(6)
    assert week.tasks[last].max() == MAX_TASKS, "the count climbs to the job's maximum"
    assert week.tasks[last].min() >= 2 * week.tasks[first].min(), "even the trough keeps climbing"
    assert np.median(week.cpu_limit[last]) < 0.7 * np.median(week.cpu_limit[first]), "as the limit shrinks"
    assert week.tasks[last].mean() > 1.5 * settled.tasks[settled.day(6)].mean()
