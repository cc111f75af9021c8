"""The clairvoyant bound of the closed-loop replay: the least limit, in hindsight, that costs no OOM.

Per job and 5-minute window the bound knows what is coming and sets the smallest limit that
kills none of the job's tasks for its limit (Autopilot §2.3):

* **hard** enforcement: the job's peak of the window (a task over a hard limit dies);
* **soft** enforcement, under the replay's cell model (:mod:`cellpilot.evaluate.replay_machines`):
  a task over a soft limit dies only on a machine that runs out of memory, so the limit must
  cover the peak of the job's tasks on such machines and nothing else. A machine's shortage
  depends on every co-located limit (reservations are limits over the overcommit), so the
  bound starts every job at its floor (below), finds the machines short at those limits and
  raises each job with a task on one to that task's peak. Raising limits only adds
  reservations, so no machine becomes short and one pass leaves no task over its limit on a
  short machine. Kills of tasks within their limits (the replayed tasks alone overflow a
  machine, Borg §6.2) are the cell's, not the limit's: the bound suffers them like everyone.

The **floor** is the day's 95th percentile of the job's 5-minute average usage, the usage
§4.1.1's relative slack charges a job-day's average limit against. A limit that follows every
window's peak down below that (a diurnal job at night) would have a negative relative slack,
so it would bound nothing; with the floor, every window's limit is at least the day's p95 and
the bound's relative slack is >= 0 by construction. The floor is computed at the start of each
day from the usage the job will show if none of its tasks is killed (restarts, leaks); a kill
only lowers later usage (a leak starts again from nothing), so the floor never undershoots
the p95 the metric measures.
"""

from __future__ import annotations

import numpy as np

from cellpilot.array_types import BoolArray, Float32Array, FloatArray
from cellpilot.evaluate.autopilot_deciders import ChunkLayout
from cellpilot.evaluate.autopilot_metrics import USAGE_PERCENTILE
from cellpilot.evaluate.replay_machines import ReplayMachines


def usage_floor(
    layout: ChunkLayout,
    mean: Float32Array,
    running: BoolArray,
    restart: BoolArray,
    leak: FloatArray,
    growth: FloatArray,
) -> FloatArray:
    """Per job, the p95 of its tasks' 5-minute average usage over the windows given (W, N),
    if nothing is killed; ``growth`` is the leak grown so far (N,). NaN for a job that never runs.

    The usage is rounded to float32 and the percentile taken as
    :class:`~cellpilot.evaluate.autopilot_metrics.DayAccumulator` does, so with no kill the
    floor equals the measured p95 exactly.
    """
    g = growth.copy()
    usage = np.full(mean.shape, np.nan, dtype=np.float32)
    for w in range(mean.shape[0]):
        g[restart[w]] = 0.0
        usage[w] = np.where(running[w], mean[w] + g, np.nan)
        g = g + leak * running[w]
    floor = np.full(layout.jobs, np.nan)
    for j in range(layout.jobs):
        values = usage[:, layout.bounds[j] : layout.bounds[j + 1]]
        values = values[~np.isnan(values)]
        if values.size:
            floor[j] = float(np.percentile(values, USAGE_PERCENTILE))
    return floor


def bound_limits(
    layout: ChunkLayout,
    machines: ReplayMachines,
    running: BoolArray,
    peak: FloatArray,
    floor: FloatArray,
    hard: bool,
) -> FloatArray:
    """Each job's bound limit for one window (NaN for a job with no running task and no floor)."""
    job = layout.job_of_task
    if hard:
        return np.fmax(floor, layout.per_job_max(np.where(running, peak, np.nan)))
    limit = floor[job]
    short = machines.short(running, peak, limit)
    at_risk = running & short[machines.machine] & (peak > limit)
    return np.fmax(floor, layout.per_job_max(np.where(at_risk, peak, np.nan)))
