"""Resource reclamation: a task's reservation as a pure function of its usage (Borg §5.5).

Borg §5.5: the reservation is the Borgmaster's estimate of what a task will use.
It starts equal to the limit; after 300 s (to let start-up transients pass) it
decays slowly towards the observed usage plus a safety margin, and it is raised
quickly when usage exceeds it. Non-prod tasks are then scheduled against the
reservations of others, not their limits.

The paper does not publish the margin or the decay rate; our defaults (10 % margin,
one-hour half-life) are parameters, not findings. Everything is vectorised over
tasks (rows) and resource dimensions (columns).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from cellpilot.array_types import FloatArray


@dataclass(frozen=True)
class ReclamationParams:
    startup_s: float = 300.0  # §5.5: the reservation stays at the limit for 300 s
    safety_margin: float = 0.10  # target = usage * (1 + margin), capped at the limit
    decay_half_life_s: float = 3600.0  # "decays slowly": half the gap to the target per hour

    def __post_init__(self) -> None:
        if self.startup_s < 0 or self.safety_margin < 0 or self.decay_half_life_s <= 0:
            raise ValueError("startup_s and safety_margin must be >= 0, decay_half_life_s > 0")


def initial_reservation(limit: npt.ArrayLike) -> FloatArray:
    """§5.5: the initial reservation equals the limit."""
    return np.array(limit, dtype=np.float64, copy=True)


def next_reservation(
    reservation: npt.ArrayLike,
    limit: npt.ArrayLike,
    usage: npt.ArrayLike,
    started_at: npt.ArrayLike,
    last_update: npt.ArrayLike,
    now: float,
    params: ReclamationParams | None = None,
) -> FloatArray:
    """The reservation at ``now`` given the one computed at ``last_update``.

    Shapes: ``reservation``, ``limit`` and ``usage`` are ``(n, R)`` (or ``(R,)``);
    ``started_at`` and ``last_update`` are per task, ``(n,)`` (or scalars).
    """
    p = params or ReclamationParams()
    resv = np.asarray(reservation, dtype=np.float64)
    lim = np.asarray(limit, dtype=np.float64)
    use = np.asarray(usage, dtype=np.float64)
    start = np.asarray(started_at, dtype=np.float64)
    last = np.asarray(last_update, dtype=np.float64)
    if resv.ndim == 2:
        start = start[:, None]
        last = last[:, None]

    target = np.minimum(lim, use * (1.0 + p.safety_margin))
    decay_from = np.maximum(last, start + p.startup_s)
    dt = np.maximum(now - decay_from, 0.0)
    keep = np.exp2(-dt / p.decay_half_life_s)
    decayed = target + (resv - target) * keep
    # Usage above the reservation: raise it at once to usage plus margin.
    raised = np.where(use > resv, np.maximum(resv, target), decayed)
    in_startup = (now - start) < p.startup_s
    out = np.where(in_startup, lim, raised)
    return np.clip(out, 0.0, lim)
