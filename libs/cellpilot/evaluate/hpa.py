"""The Kubernetes Horizontal Pod Autoscaler as documented: the baseline of the horizontal study.

Written from the Kubernetes documentation ("Horizontal Pod Autoscaling": algorithm details,
configurable scaling behaviour; the ``autoscaling/v2`` API reference of ``HPAScalingRules``
and ``HPAScalingPolicy``), not from the controller's code. The Kubernetes HPA controller:

* syncs every 15 s (``--horizontal-pod-autoscaler-sync-period``);
* recommends ``desired = ceil(pods x currentUtilisation / targetUtilisation)``, utilisation
  being the mean CPU usage of the ready pods with a metric over their CPU request (here: the
  task's CPU limit), and makes no change while ``|ratio - 1| <= 0.1`` (the tolerance);
* is conservative about pods it cannot measure: not-yet-ready pods are set aside, and ready
  pods that reported no metric count at 0 % of their request on a scale-up and at 100 % on
  a scale-down; when the ready pods alone would scale up, the not-ready pods count at 0 %;
  the ratio is then computed again, and no change is made if it is within the tolerance or
  reverses the direction;
* stabilises: a scale-up goes to the lowest recommendation of the scale-up window (default
  0 s: the current one), a scale-down to the highest of the scale-down window (default
  300 s); the window is seeded with the current count when the controller first sees the
  workload, so nothing scales down in its first 5 minutes;
* limits the rate of change with scaling policies, each allowing a number of pods or a
  percentage of the count at the start of its period (``periodSeconds``); ``selectPolicy``
  Max (default) takes the policy allowing the most change, Min the least, Disabled forbids
  that direction. Defaults: up by the larger of 100 % or 4 pods per 15 s, down by 100 % per
  15 s;
* keeps the count within [minReplicas, maxReplicas] (a count outside is set to the bound).

What this model takes as given (documented choices): the caller observes at its own step
(the study's decision step) and each call runs every sync due since the last one on that
observation; between syncs of one call, the pods a sync added are not ready yet, and the
pods it removed are the not-ready ones first (as a ReplicaSet does), their load moving to
the pods that stay (the measured usage is kept).

Pure: the state is a frozen record of recent recommendations and scale events, ``now``
passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

POLICY_KINDS = ("pods", "percent")
SELECT_POLICIES = ("max", "min", "disabled")
_EPS = 1e-9


@dataclass(frozen=True)
class HpaPolicy:
    """One scaling policy: at most ``value`` pods (or percent of the count) per ``period_s``."""

    kind: str
    value: float
    period_s: float

    def __post_init__(self) -> None:
        if self.kind not in POLICY_KINDS:
            raise ValueError(f"policy kind must be one of {POLICY_KINDS}, got {self.kind!r}")
        if not (self.value > 0 and 0 < self.period_s <= 1800):
            raise ValueError("a policy needs a positive value and a period in (0, 1800] seconds")


@dataclass(frozen=True)
class HpaRules:
    """The behaviour of one direction: its stabilisation window, policies and their selection."""

    stabilisation_window_s: float
    policies: tuple[HpaPolicy, ...]
    select: str = "max"

    def __post_init__(self) -> None:
        if not 0 <= self.stabilisation_window_s <= 3600:
            raise ValueError("the stabilisation window must be in [0, 3600] seconds")
        if self.select not in SELECT_POLICIES:
            raise ValueError(f"select must be one of {SELECT_POLICIES}, got {self.select!r}")
        if not self.policies and self.select != "disabled":
            raise ValueError("at least one scaling policy is needed")


DEFAULT_SCALE_UP = HpaRules(0.0, (HpaPolicy("percent", 100, 15), HpaPolicy("pods", 4, 15)))
DEFAULT_SCALE_DOWN = HpaRules(300.0, (HpaPolicy("percent", 100, 15),))


@dataclass(frozen=True)
class HpaConfig:
    target_utilisation: float  # a fraction of the pod's CPU request
    tolerance: float = 0.1
    min_replicas: int = 1
    max_replicas: int | None = None  # None: unbounded (the caller caps the count itself)
    scale_up: HpaRules = DEFAULT_SCALE_UP
    scale_down: HpaRules = DEFAULT_SCALE_DOWN
    sync_period_s: float = 15.0

    def __post_init__(self) -> None:
        if not 0.0 < self.target_utilisation <= 1.0:
            raise ValueError(f"target utilisation must be in (0, 1], got {self.target_utilisation}")
        if not 0.0 <= self.tolerance < 1.0:
            raise ValueError(f"tolerance must be in [0, 1), got {self.tolerance}")
        if self.min_replicas < 1:
            raise ValueError("need at least one replica")
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ValueError("max replicas must be at least min replicas")
        if self.sync_period_s <= 0:
            raise ValueError("the sync period must be positive")

    @property
    def downscale_window_s(self) -> float:
        return self.scale_down.stabilisation_window_s

    def clamp(self, count: int) -> int:
        high = count if self.max_replicas is None else min(count, self.max_replicas)
        return max(self.min_replicas, high)


@dataclass(frozen=True)
class HpaState:
    """Recent recommendations and scale events, oldest first: (seconds, replicas) and (seconds,
    change); ``last_sync_s`` is None until the controller first sees the workload."""

    recent: tuple[tuple[float, int], ...] = ()
    events: tuple[tuple[float, int], ...] = ()
    last_sync_s: float | None = None


def hpa_recommendation(
    config: HpaConfig, current: int, ready: int, ready_usage: float, request: float, unmetered: int = 0
) -> int:
    """The replica calculator's recommendation before stabilisation and rate limits.

    ``current`` pods: ``ready`` ready ones with a metric (summed CPU usage ``ready_usage``),
    ``unmetered`` ready ones that reported no metric, the rest not ready; ``request`` each
    pod's CPU request (same unit as the usage)."""
    if ready <= 0 or request <= 0:
        return current  # no metrics from any ready pod: no scaling action
    not_ready = max(current - ready - unmetered, 0)
    ratio = ready_usage / (ready * request) / config.target_utilisation
    if abs(ratio - 1.0) <= config.tolerance + 1e-12:  # 1.1 stays inside despite rounding
        return current
    up = ratio > 1.0
    if unmetered == 0 and not (up and not_ready > 0):
        return max(config.min_replicas, math.ceil(ratio * ready - _EPS))
    # Conservative: unmetered pods at 0 % (up) or 100 % (down) of their request; on a
    # scale-up the not-ready pods at 0 %; on a scale-down they stay set aside.
    counted = ready + unmetered + (not_ready if up else 0)
    assumed = ready_usage + (0.0 if up else unmetered * request)
    again = assumed / (counted * request) / config.target_utilisation
    if abs(again - 1.0) <= config.tolerance + 1e-12 or (again > 1.0) != up:
        return current
    desired = math.ceil(again * counted - _EPS)
    if (desired < current) if up else (desired > current):
        return current  # the recount would move against the direction of the change
    return max(config.min_replicas, desired)


def _rate_limit(
    rules: HpaRules, events: tuple[tuple[float, int], ...], current: int, now_s: float, up: bool
) -> int:
    """The furthest count the policies allow from ``current`` now (never past ``current``'s side)."""
    if rules.select == "disabled":
        return current
    limits = []
    for policy in rules.policies:
        moved = sum(c for t, c in events if t > now_s - policy.period_s and (c > 0) == up)
        start = current - moved  # the count at the start of the policy's period
        if policy.kind == "pods":
            limits.append(start + policy.value if up else start - policy.value)
        elif up:
            limits.append(math.ceil(start * (1.0 + policy.value / 100.0) - _EPS))
        else:
            limits.append(math.floor(start * (1.0 - policy.value / 100.0) + _EPS))
    most_change = (rules.select == "max") == up
    limit = int(max(limits) if most_change else min(limits))
    return max(limit, current) if up else min(limit, current)


def _sync(
    config: HpaConfig,
    state: HpaState,
    current: int,
    pods: tuple[int, int],
    usage: float,
    request: float,
    now_s: float,
) -> tuple[HpaState, int]:
    """One sync at ``now_s``; ``pods`` = (ready with a metric, ready without one)."""
    ready, unmetered = pods
    keep = max(config.scale_up.stabilisation_window_s, config.scale_down.stabilisation_window_s)
    recent = tuple((t, r) for t, r in state.recent if t > now_s - keep)
    longest = max((p.period_s for p in config.scale_up.policies + config.scale_down.policies), default=0.0)
    events = tuple((t, c) for t, c in state.events if t > now_s - longest)
    if config.clamp(current) != current:  # outside [min, max]: straight to the bound
        desired = config.clamp(current)
    elif ready <= 0 or request <= 0:  # no metrics: no recommendation, no action
        desired = current
    else:
        raw = hpa_recommendation(config, current, ready, usage, request, unmetered)
        up_window = [r for t, r in recent if t > now_s - config.scale_up.stabilisation_window_s]
        down_window = [r for t, r in recent if t > now_s - config.scale_down.stabilisation_window_s]
        recent += ((now_s, raw),)
        desired = current
        if desired < min([raw, *up_window]):
            desired = min([raw, *up_window])
            desired = min(desired, _rate_limit(config.scale_up, events, current, now_s, up=True))
        elif desired > max([raw, *down_window]):
            desired = max([raw, *down_window])
            desired = max(desired, _rate_limit(config.scale_down, events, current, now_s, up=False))
        desired = config.clamp(desired)  # current is inside [min, max]: the bound of this direction
    if desired != current:
        events += ((now_s, desired - current),)
    return HpaState(recent, events, now_s), desired


def _after_change(pods: tuple[int, int], current: int, desired: int) -> tuple[int, int]:
    """Pods (ready with a metric, ready without) after a change: added pods are not ready;
    removed ones are the not-ready first, then the unmetered, then the measured."""
    ready, unmetered = pods
    removed = max(current - desired - max(current - ready - unmetered, 0), 0)
    from_unmetered = min(removed, unmetered)
    return ready - (removed - from_unmetered), unmetered - from_unmetered


def hpa_step(
    config: HpaConfig,
    state: HpaState,
    current: int,
    ready: int,
    ready_usage: float,
    request: float,
    now_s: float,
    *,
    unmetered: int = 0,
) -> tuple[HpaState, int]:
    """The controller up to ``now_s``: every sync due since the last one, on this observation.

    The first call is the controller's first sight of the workload: it syncs now, its
    stabilisation window seeded with ``current``. A call before the next sync is due
    changes nothing."""
    if state.last_sync_s is None:
        syncs = [float(now_s)]
        state = replace(state, recent=((float(now_s), current),))
    else:
        due = math.floor((now_s - state.last_sync_s) / config.sync_period_s + _EPS)
        syncs = [state.last_sync_s + k * config.sync_period_s for k in range(1, due + 1)]
    pods = (min(ready, current), min(unmetered, max(current - ready, 0)))
    for t in syncs:
        state, desired = _sync(config, state, current, pods, ready_usage, request, t)
        pods = _after_change(pods, current, desired)
        current = desired
    return state, current
