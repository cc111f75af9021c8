"""Training examples for the remaining-lifetime model (LAVA §3).

§3 augments every VM into several examples that differ in the uptime input: the VM
seen at creation and at 12.5 %, 25 %, … of its lifetime; the label is what is left,
``T_r = L - T_u``. A regression model fitted on these examples with squared error
estimates the conditional mean E[T_r | features, T_u], the survival-model quantity
§3 uses for repredictions.

Note on the sampling: at a given uptime u > 0 the examples come from VMs with L > u,
each VM contributing its fixed fractions, so long VMs are spread over a wider range
of uptimes than short ones. This is the scheme of §3 as written; no reweighting.
"""

from __future__ import annotations

import numpy as np

from cellpilot.array_types import FloatArray, Int64Array
from cellpilot.lifetimes.features import model_inputs

# §3: the original example (uptime 0) plus uptimes of 12.5 %, 25 %, ... of the lifetime.
UPTIME_FRACTIONS: tuple[float, ...] = tuple(k / 8.0 for k in range(8))


def expand_examples(
    features: FloatArray, lifetimes: FloatArray, fractions: tuple[float, ...] = UPTIME_FRACTIONS
) -> tuple[FloatArray, FloatArray, Int64Array]:
    """Model inputs, remaining-lifetime labels (seconds) and source rows, fraction-major.

    Row ``j * n + i`` is VM ``i`` at uptime ``fractions[j] * lifetimes[i]``.
    """
    features = np.asarray(features, dtype=np.float64)
    lifetimes = np.asarray(lifetimes, dtype=np.float64)
    if features.shape[0] != lifetimes.shape[0]:
        raise ValueError("features and lifetimes must have the same number of rows")
    if np.any(lifetimes < 0):
        raise ValueError("lifetimes must be >= 0")
    f = np.asarray(fractions, dtype=np.float64)
    if f.size == 0 or np.any(f < 0) or np.any(f >= 1):
        raise ValueError("uptime fractions must be in [0, 1)")
    n = features.shape[0]
    uptime = (f[:, None] * lifetimes[None, :]).reshape(-1)
    inputs = model_inputs(np.tile(features, (f.size, 1)), uptime)
    remaining = np.tile(lifetimes, f.size) - uptime
    rows = np.tile(np.arange(n, dtype=np.int64), f.size)
    return inputs, remaining, rows


def expand_at_uptimes(
    features: FloatArray, lifetimes: FloatArray, uptimes_seconds: FloatArray
) -> tuple[FloatArray, FloatArray, Int64Array]:
    """Model inputs, lifetime labels (seconds, the whole lifetime) and source rows, uptime-major.

    Each VM is an example at every uptime of ``uptimes_seconds`` it outlived (and always at
    the first, normally 0): the examples at uptime u are exactly the VMs alive at u, so a
    classifier of the label learns P(lifetime | features, lifetime > u), the survival
    conditional that reprediction needs (§3). Unlike fractions of each VM's own lifetime,
    this ties no label to its uptime (with fractions k/8, a VM seen at uptime u lives
    between 8u/7 and 8u, so no example says "lives more than 8x its uptime").
    """
    features = np.asarray(features, dtype=np.float64)
    lifetimes = np.asarray(lifetimes, dtype=np.float64)
    grid = np.asarray(uptimes_seconds, dtype=np.float64)
    if features.shape[0] != lifetimes.shape[0]:
        raise ValueError("features and lifetimes must have the same number of rows")
    if grid.size == 0 or np.any(grid < 0) or np.any(np.diff(grid) <= 0):
        raise ValueError("uptimes must be >= 0 and increasing")
    parts = [
        np.flatnonzero(lifetimes > u) if k else np.arange(lifetimes.size, dtype=np.int64)
        for k, u in enumerate(grid.tolist())
    ]
    rows = np.concatenate(parts).astype(np.int64)
    uptime = np.concatenate([np.full(p.size, u) for p, u in zip(parts, grid.tolist(), strict=True)])
    return model_inputs(features[rows], uptime), lifetimes[rows], rows
