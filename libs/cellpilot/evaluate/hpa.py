"""The Kubernetes Horizontal Pod Autoscaler as documented: the baseline of the horizontal study.

The Kubernetes documentation ("Horizontal Pod Autoscaling", algorithm details) defines:

* ``desired = ceil(current x currentUtilisation / targetUtilisation)``, utilisation being the
  mean CPU usage of the ready pods over their CPU request (here: the task's CPU limit);
* a tolerance: no change while ``|ratio - 1| <= 0.1`` (ratio = current / target utilisation);
* not-yet-ready pods are set aside; when the ready pods alone would scale up, the ratio is
  computed again with the not-ready pods counted at 0 % usage, and no change is made if that
  ratio is within the tolerance or reverses the direction;
* a scale-down stabilisation window (default 5 minutes): when scaling down, the highest
  recommendation of the window is used, so a count only drops once every recommendation of
  the last 5 minutes is that low; scale-up is immediate (window 0).

Left out, and said so in the study's report: the default scale-up rate policy (100 % or 4
pods per 15 s, whichever is more), which never binds at the study's decision steps unless the
ratio exceeds 16 in a minute; the controller's 15-second sync period (the study decides at its
own step); min/max replicas other than 1 and unbounded.

Pure: state is a frozen tuple of recent (time, recommendation) pairs, ``now`` passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class HpaConfig:
    target_utilisation: float  # a fraction of the pod's CPU request
    tolerance: float = 0.1
    downscale_window_s: float = 300.0
    min_replicas: int = 1

    def __post_init__(self) -> None:
        if not 0.0 < self.target_utilisation <= 1.0:
            raise ValueError(f"target utilisation must be in (0, 1], got {self.target_utilisation}")
        if not 0.0 <= self.tolerance < 1.0:
            raise ValueError(f"tolerance must be in [0, 1), got {self.tolerance}")
        if self.downscale_window_s < 0 or self.min_replicas < 1:
            raise ValueError("need a non-negative window and at least one replica")


@dataclass(frozen=True)
class HpaState:
    """Recommendations of the scale-down stabilisation window, oldest first: (seconds, replicas)."""

    recent: tuple[tuple[float, int], ...] = ()


def hpa_recommendation(
    config: HpaConfig, current: int, ready: int, ready_usage: float, request: float
) -> int:
    """The replica calculator's recommendation before stabilisation.

    ``current`` pods of which ``ready`` are ready; ``ready_usage`` the summed CPU usage of the
    ready pods, ``request`` each pod's CPU request (same unit)."""
    if ready <= 0 or request <= 0:
        return current  # no metrics from any ready pod: no scaling action
    not_ready = max(current - ready, 0)
    ratio = ready_usage / (ready * request) / config.target_utilisation
    if abs(ratio - 1.0) <= config.tolerance + 1e-12:  # 1.1 stays inside despite rounding
        return current
    if ratio > 1.0 and not_ready > 0:
        # Not-ready pods count as using 0 %; no action if that is within tolerance or reverses.
        dampened = ready_usage / ((ready + not_ready) * request) / config.target_utilisation
        if dampened <= 1.0 + config.tolerance + 1e-12:
            return current
        return max(config.min_replicas, math.ceil(dampened * (ready + not_ready) - 1e-9))
    return max(config.min_replicas, math.ceil(ratio * ready - 1e-9))


def hpa_step(
    config: HpaConfig,
    state: HpaState,
    current: int,
    ready: int,
    ready_usage: float,
    request: float,
    now_s: float,
) -> tuple[HpaState, int]:
    """One sync of the controller: the recommendation, then the scale-down stabilisation window."""
    recommendation = hpa_recommendation(config, current, ready, ready_usage, request)
    recent = tuple((t, r) for t, r in state.recent if t > now_s - config.downscale_window_s)
    recent += ((now_s, recommendation),)
    if recommendation >= current:
        return HpaState(recent), recommendation
    highest = max(r for _, r in recent)
    return HpaState(recent), min(current, highest)
