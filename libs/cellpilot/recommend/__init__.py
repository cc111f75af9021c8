"""Autopilot's recommenders (EuroSys '20, §3.2-3.3) as pure, vectorised numpy code.

Where each part of the paper lives:

===========================================  =================================================
Paper                                        Implementation
===========================================  =================================================
§3.2.1 histograms s_i[t], s[t], b[k]         :mod:`cellpilot.usage` (``buckets``, ``histogram``,
                                             ``windows.build_task_windows``, ``sum_by_group``)
Eq. 1  w[tau] = 2^(-tau / t_half)            :func:`moving_window.decay_weight`, applied
                                             incrementally in :func:`moving_window.update_window`
S_max (last N samples)                       ``WindowState.peak_ring`` in ``update_window``
Eq. 2  S_avg, weighted average               ``avg_weighted_sum / avg_weight`` in ``update_window``
Eq. 3  h[t][k], S_pj load-adjusted %ile      ``WindowState.decayed`` x b[k] and
                                             :func:`moving_window.weighted_percentile`
§3.2.2 policy table (class, latency, OOM)    :func:`policy.statistic_for`, :func:`policy.evaluate_statistics`
§3.2.2 safety margin 10-15 %                 :class:`post_processing.MarginCurve`
§3.2.2 max over the last hour                :func:`post_processing.update_window_max`
§3.2 user bounds                             :func:`cellpilot.autopilot.vertical_targets.bound_limits`
Eqs. 4-5  o(L)[t], u(L)[t]                   ``EnsembleState.smoothed`` (H_d) and its prefix sums
                                             in :func:`ml_ensemble.update_ensemble`
Eq. 6  L'_m[t] arg-min with change penalty   "Eq. 6" block of ``update_ensemble``
Eq. 7  L_m[t] = L'_m[t] + M_m                :meth:`ml_ensemble.ModelGrid.limit_values`
Eq. 8  c_m[t] decayed model cost             "Eq. 8" block of ``update_ensemble``
Eq. 9  model choice with switch penalties    "Eq. 9" block of ``update_ensemble``
§3.3 CPU-utilisation source, n_r = r_S / r*  :func:`horizontal.update_cpu_source`
§3.3 target-size source n_r = f[t]           :class:`horizontal.TargetSizeSource`
§3.3 four stabilisers                        :func:`horizontal.stabilise`
§3.3 source + stabilisers, restartable       :class:`horizontal.CpuHorizontalRecommender`
===========================================  =================================================

Recommenders compose: every vertical recommender kind is an :class:`estimator.Estimator`
over the per-job states all kinds share (each moving-window statistic,
:mod:`window_statistic_kind`; the ML ensemble, :mod:`ml_kind`), with decorators for the
safety margin (:class:`estimator.WithMargin`) and the max over the last hour
(:class:`post_processing.LastHourMax`). The kinds are registered data,
:mod:`cellpilot.autopilot.recommender_registry`, and one batch step runs them all,
:mod:`cellpilot.autopilot.candidates` (with the OOM reaction), as the recommender workers and
the studies both run it; the master's selection and bounds are
:mod:`cellpilot.autopilot.selection` and :mod:`cellpilot.autopilot.vertical_targets`. Every state is
a :class:`job_arrays.JobArrays` of stacked per-job arrays: one job is J = 1, a batch is
many jobs updated in one call, and any state serialises with ``to_bytes`` / ``from_bytes``.
Each update costs O(buckets x models) per job and never rescans history.
"""

from cellpilot.recommend.job_arrays import JobArrays
from cellpilot.recommend.ml_ensemble import EnsembleConfig, MarginMode, ModelGrid
from cellpilot.recommend.moving_window import WindowConfig
from cellpilot.recommend.policy import JobProfile, Statistic
from cellpilot.recommend.post_processing import MarginCurve

__all__ = [
    "EnsembleConfig",
    "JobArrays",
    "JobProfile",
    "MarginCurve",
    "MarginMode",
    "ModelGrid",
    "Statistic",
    "WindowConfig",
]
