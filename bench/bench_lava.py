"""Prediction and reprediction latency of the lifetime models (LAVA §3, Figure 8: 9 us median in Borg).

The shipped model is the distribution model (``cellpilot.lifetimes.distribution_model``):
one LightGBM multiclass call per VM at creation gives its lifetime distribution, and
every reprediction conditions that distribution on the uptime (no model call):

* ``batched_us_per_vm``: repredicting 10 000 VMs at their uptimes from their kept
  distributions (E[T_r | T_u], what LAS and LAVA's ledger calls), per VM.
* ``distribution_batched_us_per_vm`` / ``distribution_single_us``: the model call at
  creation, batched and for one VM (LightGBM's single-row entry point).
* ``point_batched_us_per_vm``: the point model below (one regression call per
  reprediction), the path that ``batched_us_per_vm`` measured before.

The point model (E[T_r | T_u] regression, kept for comparison):

The model is the one the LAVA study trains (100 trees, 31 leaves, uptime-expanded
examples of a synthetic 7-day history); the queries are 10 000 VMs of another trace
at random uptimes, as the scheduler repredicts them.

* ``single_us``: median latency of one ``predict_remaining_one`` call (one VM).
  It goes through LightGBM's single-row C entry point with a configuration built
  once (``LGBM_BoosterPredictForMatSingleRowFast``); what is left is ctypes call
  overhead plus the walk of 100 trees.
* ``single_booster_us``: the same VM through ``Booster.predict`` (the public Python
  path). Each call pays for argument validation, numpy-to-C conversion, output
  allocation and per-call setup in LightGBM, tens of microseconds that dwarf the tree
  walk; that per-call overhead is why the single-row path exists.
* ``batched_us_per_vm``: one ``predict_remaining`` call for all 10 000 VMs (one
  thread), divided by 10 000. Its baseline is the single-call path of the same run:
  ``batched_speedup`` = single_us / batched_us_per_vm and ``batched_speedup_vs_booster``
  = single_booster_us / batched_us_per_vm. LightGBM's batched predict already reaches
  the paper's <= 10 us per VM, so no compiled/numpy tree walk is needed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bench.harness import FULL, SMOKE, Report, best_of, sized, stopwatch
from cellpilot.lifetimes.distribution_model import DistributionModel
from cellpilot.lifetimes.features import vm_features
from cellpilot.lifetimes.model import LifetimeModel, TrainingParams
from cellpilot.lifetimes.vm_table import HOUR
from cellpilot.workloads.vm_trace import VmTraceConfig, generate_vm_trace

FIGURES = [
    "lava.repredict.batched_us_per_vm",
    "lava.repredict.point_batched_us_per_vm",
    "lava.predict.distribution_batched_us_per_vm",
    "lava.predict.distribution_single_us",
    "lava.repredict.single_us",
    "lava.repredict.single_booster_us",
    "lava.repredict.batched_speedup",
    "lava.repredict.batched_speedup_vs_booster",
]


@dataclass(frozen=True)
class Size:
    days: float  # of the synthetic VM trace the models train on
    hosts: int
    queries: int
    single_calls: int
    booster_calls: int


SIZES = {
    FULL: Size(days=7.0, hosts=100, queries=10_000, single_calls=5_000, booster_calls=1_000),
    SMOKE: Size(days=1.0, hosts=10, queries=500, single_calls=200, booster_calls=50),
}


def _median_call_us(calls: int, queries: int, call: Callable[[int], object]) -> float:
    """Median wall time of ``call(query index)`` in microseconds."""
    timings = np.empty(calls)
    for i in range(calls):
        start = time.perf_counter_ns()
        call(i % queries)
        timings[i] = time.perf_counter_ns() - start
    return float(np.median(timings)) / 1000.0


def run(report: Report, size: str = FULL) -> None:
    params = sized(SIZES, size)
    queries_n = params.queries
    config = VmTraceConfig(days=params.days, hosts=params.hosts)
    history = generate_vm_trace(np.random.default_rng(1), config)
    history = history.subset(history.created >= 0)
    with stopwatch() as elapsed:
        model = LifetimeModel.train(vm_features(history), history.lifetime, TrainingParams())
    print(f"trained on {len(history)} VMs x 8 uptimes in {elapsed():.1f} s", flush=True)

    queries = generate_vm_trace(np.random.default_rng(2), config)
    rng = np.random.default_rng(3)
    rows = rng.choice(len(queries), size=queries_n, replace=len(queries) < queries_n)
    features = vm_features(queries)[rows]
    uptime = rng.random(queries_n) * queries.lifetime[rows]
    uptime_h = uptime / HOUR
    print(
        f"median query uptime {np.median(uptime_h):.2f} h; fast single-row path: {model.has_fast_single_row}"
    )

    def one(i: int) -> float:
        return model.predict_remaining_one(features[i], float(uptime[i]))

    def booster_one(i: int) -> np.ndarray:
        return model.predict_remaining(features[i : i + 1], uptime[i : i + 1])

    for i in range(200):  # warm up both paths
        one(i)
        booster_one(i)
    single = _median_call_us(params.single_calls, queries_n, one)
    booster = _median_call_us(params.booster_calls, queries_n, booster_one)
    batched = best_of(5, lambda: model.predict_remaining(features, uptime)) / queries_n * 1e6
    check = model.predict_remaining(features[:50], uptime[:50])
    assert np.allclose([one(i) for i in range(50)], check)  # both paths give the same answers

    with stopwatch() as elapsed:
        dist_model = DistributionModel.train(vm_features(history), history.lifetime)
    print(f"distribution model: {dist_model.num_trees} trees, trained in {elapsed():.1f} s", flush=True)
    kept = dist_model.predict_distribution(features)  # what the scheduler keeps per VM
    dist_batched = best_of(5, lambda: dist_model.predict_distribution(features)) / queries_n * 1e6
    for i in range(200):
        dist_model.predict_probs_one(features[i])
    dist_single = _median_call_us(
        params.single_calls, queries_n, lambda i: dist_model.predict_probs_one(features[i])
    )
    repredict = (
        best_of(5, lambda: kept.take(np.arange(queries_n)).expected_remaining(uptime)) / queries_n * 1e6
    )
    assert np.allclose(dist_model.predict_probs_one(features[0]), kept.probs[0])

    report("lava.repredict.single_us", single, "us")
    report("lava.repredict.single_booster_us", booster, "us")
    report("lava.repredict.batched_us_per_vm", repredict, "us")
    report("lava.repredict.point_batched_us_per_vm", batched, "us")
    report("lava.predict.distribution_batched_us_per_vm", dist_batched, "us")
    report("lava.predict.distribution_single_us", dist_single, "us")
    report("lava.repredict.batched_speedup", single / batched, "x")
    report("lava.repredict.batched_speedup_vs_booster", booster / batched, "x")
    print(
        f"one VM: {single:.1f} us through LightGBM's single-row C entry point, {booster:.1f} us through "
        "Booster.predict, whose fixed per-call cost (argument checks, conversions, setup) dominates; "
        f"a batch of {queries_n} costs {batched:.2f} us per VM (paper: 9 us median, §3)."
    )
    print(
        f"distribution model: {dist_single:.1f} us for one VM at creation, {dist_batched:.2f} us per VM "
        f"batched; repredicting from the kept distribution: {repredict:.2f} us per VM batched."
    )
