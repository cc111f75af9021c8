"""The §3.2.3 sweep at small size (Autopilot §3.2.3: "a parameter sweep ... over possible values
of the weights", replayed in the closed loop): configurations evaluated per CPU-second.

The sweep replays every configuration side by side over one generated population (the jobs,
their usage and the machine-pressure draws are made once per chunk of jobs, and every
configuration's ensemble runs batched over the chunk). Baseline measured in the same run, on
the same population and configurations: one study per configuration (each with the moving
window beside it, as the selection rule needs), which regenerates the jobs every time. The
per-configuration results of both are checked to be equal before anything is reported.

Figures:

* ``eval.autopilot.sweep_configs_per_s``: configurations per CPU-second over the tuning
  population (12 jobs x 2 days, 8 configurations: both eq. 8 modes x two w_u x two w_dL);
* ``eval.autopilot.sweep_speedup_vs_one_study_per_config``: the ratio to the baseline;
* ``eval.autopilot.sweep_small_s``: the whole small sweep (tuning and report populations,
  the choice), CPU seconds.
"""

from __future__ import annotations

import time
from dataclasses import replace

from bench.harness import FULL, SMOKE, Report, sized
from cellpilot.evaluate.autopilot_deciders import STANDARD_RECOMMENDERS
from cellpilot.evaluate.autopilot_replay import run_study
from cellpilot.evaluate.autopilot_tuning import TuningGrid, TuningSetup, run_sweep
from cellpilot.recommend.ml_ensemble import EnsembleConfig

FIGURES = [
    "eval.autopilot.sweep_configs_per_s",
    "eval.autopilot.sweep_speedup_vs_one_study_per_config",
    "eval.autopilot.sweep_small_s",
]

GRID = TuningGrid(
    eq8=("as-written", "previous-limit"),
    model_grids=("full",),
    w_underrun=(0.002, 0.01),
    limit_change_ratios=(1.0, 100.0),
)
SMOKE_GRID = TuningGrid(
    eq8=("as-written",), model_grids=("full",), w_underrun=(0.002,), limit_change_ratios=(1.0,)
)
SIZES = {
    FULL: TuningSetup(jobs=12, days=1, warmup_days=1, train_seeds=(11,), held_out_seeds=(12,), grid=GRID),
    SMOKE: TuningSetup(
        jobs=2, days=1, warmup_days=0, train_seeds=(11,), held_out_seeds=(12,), grid=SMOKE_GRID
    ),
}


def run(report: Report, size: str = FULL) -> None:
    setup = sized(SIZES, size)
    configs = [point.config for point in setup.grid.points(EnsembleConfig())]
    ml, window = STANDARD_RECOMMENDERS["ml"], STANDARD_RECOMMENDERS["moving-window"]
    specs = [replace(ml, name=f"ml-{i}", ml=c) for i, c in enumerate(configs)]
    workload = setup.workload(setup.train_seeds[0])
    replay = replace(setup.replay, warmup_days=setup.warmup_days)

    start = time.process_time()
    together = run_study(workload, [window, *specs], replay)
    batched = time.process_time() - start

    start = time.process_time()
    alone = [run_study(workload, [window, spec], replay) for spec in specs]
    separate = time.process_time() - start
    for spec, result in zip(specs, alone, strict=True):
        a, b = together.summaries[spec.name], result.summaries[spec.name]
        if any(a[k] != b[k] for k in ("relative_slack_mean", "oom_free_job_days_fraction")):
            raise AssertionError(f"{spec.name}: the batched sweep and its own study disagree")

    start = time.process_time()
    run_sweep(setup)
    whole = time.process_time() - start

    report("eval.autopilot.sweep_configs_per_s", len(configs) / batched, "configs/s/core")
    report("eval.autopilot.sweep_speedup_vs_one_study_per_config", separate / batched, "x")
    report("eval.autopilot.sweep_small_s", whole, "s")
