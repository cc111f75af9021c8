"""The deciders of the horizontal autoscaling study: each turns what it sees into a task count.

* ``autopilot-cpu`` / ``autopilot-target-size``: Autopilot §3.3 through the shared
  recommender (:mod:`cellpilot.recommend.horizontal`) at the API's defaults but for the knobs
  of the setting (r*, horizon T, deferred-downscaling window T_d);
* ``hpa``: the Kubernetes rule (:mod:`cellpilot.evaluate.hpa`);
* ``bound``: clairvoyant, from the demand ahead; ``fixed-peak`` / ``fixed-mean``: one count.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Protocol

import numpy as np
import numpy.typing as npt

from cellpilot.autopilot.decisions import HorizontalConfig
from cellpilot.evaluate.horizontal_config import (
    DECIDERS,
    HOUR_S,
    MAX_TASKS,
    HorizontalStudyConfig,
    Setting,
)
from cellpilot.evaluate.hpa import DEFAULT_SCALE_DOWN, HpaConfig, HpaState, hpa_step
from cellpilot.job_vocabulary import HorizontalStatistic
from cellpilot.recommend.horizontal import (
    CpuHorizontalRecommender,
    CpuUtilisationSource,
    TargetSizeSource,
    initial_stabiliser_state,
    raw_task_count,
    stabilise,
)
from cellpilot.world.job_demand import JobDemand

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Observation:
    """What a decider sees at the end of a step (CPU in millicores, means over the step)."""

    now_s: int
    running: int
    ready: int  # tasks ready through the whole step (the HPA's pods with metrics)
    initialising: int  # tasks not ready yet at the end of the step
    usage: float  # served CPU of all the job's tasks
    ready_usage: float  # served CPU of the ``ready`` tasks
    offered_load: float  # the job's demand at the balancer, served or not


class Decider(Protocol):
    def decide(self, observation: Observation) -> int: ...


def autopilot_config(knobs: Mapping[str, float]) -> HorizontalConfig:
    """The API's defaults (``HorizontalConfig``) with the setting's horizon and deferral."""
    defaults = HorizontalConfig()
    hour_ms = 1000 * HOUR_S
    return replace(
        defaults,
        horizon_ms=round(knobs.get("horizon_h", defaults.horizon_ms / hour_ms) * hour_ms),
        deferred_downscaling_ms=round(
            knobs.get("deferral_h", defaults.deferred_downscaling_ms / hour_ms) * hour_ms
        ),
    )


class AutopilotCpu:
    def __init__(self, config: HorizontalStudyConfig, defaults: HorizontalConfig, target: float) -> None:
        source = CpuUtilisationSource(
            target,
            horizon_ms=defaults.horizon_ms,
            statistic=HorizontalStatistic(defaults.statistic.value),
        )
        self.recommender = CpuHorizontalRecommender(source, defaults.stabiliser_config())
        self.state = self.recommender.initial_state(1)
        self.limit = config.task_cpu_limit

    def decide(self, o: Observation) -> int:
        self.state, decision = self.recommender.update(
            self.state, [o.usage], self.limit, [o.running], [o.now_s * 1000], [o.initialising]
        )
        return int(decision.target[0])


def _tasks_for_offered_load(signals: Mapping[str, FloatArray], target: float, limit: float) -> FloatArray:
    return raw_task_count(signals["offered_load_millicores"], target, limit)


class AutopilotTargetSize:
    def __init__(self, config: HorizontalStudyConfig, defaults: HorizontalConfig, target: float) -> None:
        function = partial(_tasks_for_offered_load, target=target, limit=config.task_cpu_limit)
        self.source = TargetSizeSource(function)
        self.stabiliser = defaults.stabiliser_config()
        self.state = initial_stabiliser_state(1, self.stabiliser)

    def decide(self, o: Observation) -> int:
        raw = self.source.raw_recommendation({"offered_load_millicores": np.array([o.offered_load])})
        self.state, decision = stabilise(
            self.stabiliser, self.state, raw, [o.running], [o.now_s * 1000], [o.initialising]
        )
        return int(decision.target[0])


def hpa_config(config: HorizontalStudyConfig, setting: Setting | None = None) -> HpaConfig:
    """The HPA of the study: the documented defaults with the setting's target (default r*) and
    scale-down stabilisation window, at most the study's task cap as maxReplicas."""
    knobs = dict(setting if setting is not None else config.default_setting("hpa"))
    return HpaConfig(
        knobs["target_utilisation"],
        max_replicas=MAX_TASKS,
        scale_down=replace(DEFAULT_SCALE_DOWN, stabilisation_window_s=knobs["downscale_window_s"]),
    )


class Hpa:
    def __init__(self, config: HorizontalStudyConfig, setting: Setting) -> None:
        self.config = hpa_config(config, setting)
        self.state = HpaState()
        self.request = config.task_cpu_limit

    def decide(self, o: Observation) -> int:
        self.state, target = hpa_step(
            self.config, self.state, o.running, o.ready, o.ready_usage, self.request, o.now_s
        )
        return target


class Scripted:
    """A decider that knows its counts in advance: the bound (per step) or a fixed count."""

    def __init__(self, counts: Callable[[int], int]) -> None:
        self.counts = counts

    def decide(self, o: Observation) -> int:
        return self.counts(o.now_s)


@dataclass(frozen=True)
class DemandOutlook:
    """The job's demand on the sample grid, for the clairvoyant and fixed deciders."""

    seconds: FloatArray
    need: FloatArray  # tasks that serve each sample at the target utilisation
    total: FloatArray  # millicores


def demand_outlook(config: HorizontalStudyConfig, demand: JobDemand) -> DemandOutlook:
    ahead = config.step_s + config.startup_s
    seconds = np.arange(0, config.steps * config.step_s + ahead, config.sample_s, dtype=np.float64)
    total, _ = demand.total(seconds)
    return DemandOutlook(seconds, config.tasks_for(total), total)


def bound_count(config: HorizontalStudyConfig, outlook: DemandOutlook, now_s: int) -> int:
    """Clairvoyant: tasks started now are ready after the start-up, and the tasks running now
    must serve every sample until then and through the next step: the most any sample of
    ``[now, now + startup + step)`` needs (the fewest that never fall short at r*)."""
    window = (outlook.seconds >= now_s) & (outlook.seconds < now_s + config.startup_s + config.step_s)
    return max(1, int(np.max(outlook.need[window], initial=1.0)))


def fixed_count(config: HorizontalStudyConfig, outlook: DemandOutlook, statistic: str) -> int:
    horizon = outlook.seconds < config.steps * config.step_s
    load = np.max(outlook.total[horizon]) if statistic == "peak" else np.mean(outlook.total[horizon])
    return max(1, int(config.tasks_for(load)))


def make_decider(
    name: str, config: HorizontalStudyConfig, outlook: DemandOutlook, setting: Setting | None = None
) -> Decider:
    """``name`` at ``setting`` (default: the study's default setting of that decider); the
    bound and fixed counts always serve at the study's r*."""
    if name not in DECIDERS:
        raise ValueError(f"unknown decider {name!r}; known: {', '.join(DECIDERS)}")
    knobs = dict(setting if setting is not None else config.default_setting(name))
    if name == "autopilot-cpu":
        return AutopilotCpu(config, autopilot_config(knobs), knobs["target_utilisation"])
    if name == "autopilot-target-size":
        return AutopilotTargetSize(config, autopilot_config(knobs), knobs["target_utilisation"])
    if name == "hpa":
        return Hpa(config, tuple(knobs.items()))
    if name == "bound":
        return Scripted(partial(bound_count, config, outlook))
    if name in ("fixed-peak", "fixed-mean"):
        count = fixed_count(config, outlook, name.removeprefix("fixed-"))
        return Scripted(lambda _now: count)
    raise ValueError(f"unknown decider {name!r}; known: {', '.join(DECIDERS)}")
