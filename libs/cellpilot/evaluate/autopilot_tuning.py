"""The §3.2.3 off-line sweep over the ML recommender's hyperparameters.

§3.2.3: the ensemble has five hyperparameters (d, w_o, w_u, w_dL, w_dm), tuned "in off-line
experiments during which we simulate Autopilot behavior on a sample of saved traces"; the
goal is "a configuration that dominates alternative algorithms (such as the moving window
recommenders) over a large portion of the sample, with a similar (or slightly lower)
number of overruns and limit adjustments, and significantly higher utilization", found by
"a parameter sweep (an exhaustive search) over possible values of the weights".

Here: every configuration of a grid is replayed in the closed loop
(:mod:`cellpilot.evaluate.autopilot_replay`) on *tuning* populations, side by side with the
moving-window recommender on the same jobs. The grid is the product of the weights (d, w_o,
w_u, w_dL, w_dm), the model ensembles (a grid of decay rates d_m times margins M_m) and the
*variants*: eqs. 4-9 as written, and each named deviation
(:mod:`cellpilot.recommend.ml_ensemble`) alone or together. A
configuration is *admissible* when, on the tuning populations, its relative OOM rate and its
99th-percentile limit changes per job-day are no higher than the moving window's, and its
OOM-free job-days no fewer than the moving window's nor than §4.3's reliability level ("over
99.5% of Autopilot job-days see no OOMs"); the admissible configuration with the lowest mean
relative slack is chosen (if none is admissible, the lowest-slack one among the tenth with the
smallest violation, and the report says so); the same rule picks the best configuration of
each variant. These, the incumbent (the configuration the services load now), the library
default, the moving window and VPA are then replayed on separate *report* populations (other
seeds): numbers that were not used for the choice of weights, on which the variants are
compared (:func:`held_out_choice`).

w_o defaults to 1: scaling all four weights together changes none of the arg-mins of eqs. 6
and 9, so only the ratios matter (the grid accepts other values). Memory only (the paper's
§4 focus).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from cellpilot.autopilot.ml_config import (
    ML_HYPERPARAMETERS,
    grid_description,
    grid_from_description,
    hyperparameters,
    options,
    with_options,
)
from cellpilot.evaluate.autopilot_deciders import STANDARD_RECOMMENDERS, RecommenderSpec
from cellpilot.evaluate.autopilot_replay import ReplayConfig, run_study
from cellpilot.evaluate.sharding import IN_PROCESS, ShardRunner
from cellpilot.recommend.ml_ensemble import DEFAULT_HALF_LIVES, DEFAULT_MARGINS, EnsembleConfig, MarginMode
from cellpilot.workloads.autopilot_jobs import AutopilotWorkloadConfig

HYPERPARAMETERS = ML_HYPERPARAMETERS
METRICS: tuple[str, ...] = (
    "relative_slack_mean",
    "relative_slack_median",
    "relative_oom_rate_per_task_day",
    "oom_free_job_days_fraction",
    "limit_changes_per_job_day_p99",
    "absolute_slack_machines",
)


# The variants: eqs. 4-9 as written, each named deviation alone, and all three together.
VARIANTS: dict[str, dict[str, Any]] = {
    "as-written": {},
    "relative-margins": {"margin_mode": MarginMode.RELATIVE.value},
    "cost-at-previous": {"cost_at_previous_limit": True},
    "normalised": {"normalise_histograms": True},
    "all-three": {
        "margin_mode": MarginMode.RELATIVE.value,
        "cost_at_previous_limit": True,
        "normalise_histograms": True,
    },
}
# Model ensembles (d_m x M_m): half-lives in 5-minute windows; margins None = the mode's
# default ladder (ml_ensemble.DEFAULT_MARGINS).
MODEL_GRIDS: dict[str, dict[str, Any]] = {
    "10x10": {"decay_half_lives_windows": list(DEFAULT_HALF_LIVES), "margins": None},
    "5x5": {"decay_half_lives_windows": list(DEFAULT_HALF_LIVES[::2]), "margins": "every-other"},
}


def _model_grid(name: str, mode: MarginMode) -> dict[str, Any]:
    spec = dict(MODEL_GRIDS[name])
    if spec["margins"] == "every-other":
        spec["margins"] = list(DEFAULT_MARGINS[mode][::2])
    return spec


@dataclass(frozen=True)
class TuningGrid:
    """The swept values: the product of every axis."""

    variants: tuple[str, ...] = tuple(VARIANTS)
    model_grids: tuple[str, ...] = ("10x10",)
    cost_decay: tuple[float, ...] = (0.01, 0.03)
    w_overrun: tuple[float, ...] = (1.0,)
    # w_u / w_o: the unpenalised arg-min sits near the (1 - w_u / w_o) quantile of the
    # histogram, so 0.002 and 0.01 are about the 99.8th and 99th percentiles.
    w_underrun: tuple[float, ...] = (0.002, 0.01)
    # A change must save this much cost: in samples with raw counts (eqs. 4-5 as written),
    # in fractions of the window's samples when normalised; the range covers both.
    w_limit_change: tuple[float, ...] = (0.003, 0.3)
    w_model_change: tuple[float, ...] = (0.01,)

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANTS] + [
            g for g in self.model_grids if g not in MODEL_GRIDS
        ]
        if unknown:
            raise ValueError(f"unknown variant or model grid: {unknown}")

    def configs(self, base: EnsembleConfig | None = None) -> list[tuple[str, str, EnsembleConfig]]:
        """(variant, model grid, configuration) for every point of the product."""
        base = base or EnsembleConfig()
        out = []
        for variant, grid_name in itertools.product(self.variants, self.model_grids):
            shaped = with_options(base, VARIANTS[variant])
            mode = shaped.grid.margin_mode
            shaped = replace(shaped, grid=grid_from_description(_model_grid(grid_name, mode), mode))
            for d, wo, wu, dl, dm in itertools.product(
                self.cost_decay, self.w_overrun, self.w_underrun, self.w_limit_change, self.w_model_change
            ):
                config = replace(
                    shaped, cost_decay=d, w_overrun=wo, w_underrun=wu, w_limit_change=dl, w_model_change=dm
                )
                out.append((variant, grid_name, config))
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "variants": {v: VARIANTS[v] for v in self.variants},
            "model_grids": list(self.model_grids),
            **{name: list(getattr(self, name)) for name in ML_HYPERPARAMETERS},
        }


@dataclass(frozen=True)
class TuningSetup:
    """Populations: ``tune_seeds`` choose, ``report_seeds`` report (disjoint).

    The defaults (40 configurations, 40-job populations) keep the sweep to a few CPU
    minutes per population.
    """

    jobs: int = 40
    days: int = 3  # measured days per population
    warmup_days: int = 2
    tune_seeds: tuple[int, ...] = (1001,)
    report_seeds: tuple[int, ...] = (2001,)
    reliability: float = 0.995  # §4.3: OOM-free job-days of Autopiloted jobs
    grid: TuningGrid = field(default_factory=TuningGrid)
    # The sweep starts from the library defaults, not from a previous sweep's result.
    replay: ReplayConfig = field(default_factory=lambda: ReplayConfig(ml=EnsembleConfig()))
    # The configuration the services load now, reported beside the sweep's (None: not shown).
    incumbent: EnsembleConfig | None = None

    def __post_init__(self) -> None:
        if set(self.tune_seeds) & set(self.report_seeds):
            raise ValueError("tuning and report seeds must differ")

    def workload(self, seed: int) -> AutopilotWorkloadConfig:
        return AutopilotWorkloadConfig(
            jobs=self.jobs, days=self.days + self.warmup_days, seed=seed, with_cpu=False
        )


def _study(
    setup: TuningSetup,
    seed: int,
    specs: Sequence[RecommenderSpec],
    runner: ShardRunner,
    progress: Callable[[int, int], None] | None,
) -> dict[str, dict[str, Any]]:
    """Every spec replayed over one population in one pass (the jobs are generated once)."""
    replay = replace(setup.replay, warmup_days=setup.warmup_days)
    # In parallel, small chunks: with dozens of configurations per chunk, balance the workers.
    workers = runner.workers
    chunk_jobs = 64 if workers <= 1 else max(1, -(-setup.jobs // (4 * workers)))
    result = run_study(
        setup.workload(seed), specs, replay, runner=runner, progress=progress, max_chunk_jobs=chunk_jobs
    )
    return {
        name: {k: summary.get(k) for k in (*METRICS, "job_days")}
        for name, summary in result.summaries.items()
    }


def _mean(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Job-day-weighted mean of each metric over seeds."""
    total = sum(r["job_days"] for r in rows) or 1
    return {k: sum(float(r[k] or 0.0) * r["job_days"] for r in rows) / total for k in METRICS} | {
        "job_days": float(total)
    }


def required_oom_free(setup: TuningSetup, baseline: dict[str, float]) -> float:
    """OOM-free job-days an admissible configuration keeps: the moving window's, and at
    least §4.3's reliability level ("over 99.5% of Autopilot job-days see no OOMs")."""
    return max(baseline["oom_free_job_days_fraction"], setup.reliability)


def _violation(candidate: dict[str, float], baseline: dict[str, float], required_free: float) -> float:
    """How far a candidate is from admissible (0 = admissible), in relative terms."""
    oom = max(0.0, candidate["relative_oom_rate_per_task_day"] - baseline["relative_oom_rate_per_task_day"])
    free = max(0.0, required_free - candidate["oom_free_job_days_fraction"])
    changes = max(0.0, candidate["limit_changes_per_job_day_p99"] - baseline["limit_changes_per_job_day_p99"])
    scale = max(baseline["relative_oom_rate_per_task_day"], 1e-4)
    return oom / scale + free * 100.0 + changes / max(baseline["limit_changes_per_job_day_p99"], 1.0)


def _choose(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The selection rule (module docstring) over rows carrying metrics and a violation."""
    admissible = [row for row in rows if row["violation"] == 0.0]
    pool = admissible or sorted(rows, key=lambda r: r["violation"])[: max(1, len(rows) // 10)]
    return min(pool, key=lambda r: (r["relative_slack_mean"], r["relative_oom_rate_per_task_day"]))


def held_out_choice(report: dict[str, dict[str, float]], variants: Sequence[str], setup: TuningSetup) -> str:
    """The variant the report populations support: the selection rule applied to each
    variant's tuned configuration against the moving window of the report seeds."""
    baseline = report["moving-window"]
    required = required_oom_free(setup, baseline)
    rows = [
        {**report[v], "variant": v, "violation": _violation(report[v], baseline, required)} for v in variants
    ]
    return str(_choose(rows)["variant"])


def config_file_data(config: EnsembleConfig) -> dict[str, Any]:
    """What a configuration file holds for ``config`` (see :mod:`cellpilot.autopilot.ml_config`)."""
    return {
        "hyperparameters": hyperparameters(config),
        "options": options(config),
        "grid": grid_description(config.grid),
    }


def run_sweep(
    setup: TuningSetup,
    *,
    runner: ShardRunner = IN_PROCESS,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Sweep the grid on the tuning seeds, choose, and compare on the report seeds (plain data out).

    Per population, the moving window and every configuration are replayed side by side
    over the same generated jobs (and the same machine-pressure draws), chunks of jobs being
    the shards ``runner`` runs; ``progress(done, total)`` counts job-days over all populations.
    """
    points = setup.grid.configs(setup.replay.ml)
    ml = STANDARD_RECOMMENDERS["ml"]
    window = STANDARD_RECOMMENDERS["moving-window"]
    vpa = STANDARD_RECOMMENDERS["vpa"]
    candidates = [replace(ml, name=f"ml-{i}", ml=config) for i, (_, _, config) in enumerate(points)]
    population_days = setup.jobs * (setup.days + setup.warmup_days)
    total = population_days * (len(setup.tune_seeds) + len(setup.report_seeds))
    finished = 0

    def run(seed: int, specs: Sequence[RecommenderSpec]) -> dict[str, dict[str, Any]]:
        nonlocal finished
        offset = finished

        def tick(done: int, _: int) -> None:
            if progress:
                progress(offset + done, total)

        out = _study(setup, seed, specs, runner, tick)
        finished += population_days
        return out

    if progress:
        progress(0, total)
    tuned_runs = [run(seed, [window, *candidates]) for seed in setup.tune_seeds]
    baseline = _mean([r[window.name] for r in tuned_runs])
    required_free = required_oom_free(setup, baseline)
    table: list[dict[str, Any]] = []
    for spec, (variant, grid_name, config) in zip(candidates, points, strict=True):
        metrics = _mean([r[spec.name] for r in tuned_runs])
        violation = _violation(metrics, baseline, required_free)
        table.append(
            {"variant": variant, "model_grid": grid_name, **hyperparameters(config), **metrics}
            | {"violation": violation, "index": len(table)}
        )
    variants = [v for v in setup.grid.variants if any(row["variant"] == v for row in table)]
    per_variant = {v: _choose([row for row in table if row["variant"] == v]) for v in variants}
    chosen_row = _choose(table)

    def config_of(row: dict[str, Any]) -> EnsembleConfig:
        return points[int(row["index"])][2]

    report_specs = [replace(ml, name=v, ml=config_of(per_variant[v])) for v in variants]
    report_specs.append(replace(ml, name="library-default", ml=setup.replay.ml))
    if setup.incumbent is not None:
        report_specs.append(replace(ml, name="incumbent", ml=setup.incumbent))
    report_specs += [replace(window, name="moving-window"), replace(vpa, name="vpa")]
    report_runs = [run(seed, report_specs) for seed in setup.report_seeds]
    report = {spec.name: _mean([r[spec.name] for r in report_runs]) for spec in report_specs}
    held_out = held_out_choice(report, variants, setup)
    shipped = config_of(per_variant[held_out])
    return {
        "setup": {
            "jobs": setup.jobs,
            "measured_days": setup.days,
            "warmup_days": setup.warmup_days,
            "tune_seeds": list(setup.tune_seeds),
            "report_seeds": list(setup.report_seeds),
            "required_oom_free_job_days_fraction": required_free,
            "grid": setup.grid.describe(),
            "configurations": len(points),
        },
        "tune_baseline_moving_window": baseline,
        "table": table,
        "admissible": sum(row["violation"] == 0.0 for row in table),
        "per_variant": {
            v: {k: per_variant[v][k] for k in (*HYPERPARAMETERS, "model_grid")} for v in variants
        },
        "tuned_choice": str(chosen_row["variant"]),
        "held_out_choice": held_out,
        "chosen": config_file_data(shipped),
        "chosen_tune_metrics": {k: per_variant[held_out][k] for k in (*METRICS, "violation")},
        "default": config_file_data(setup.replay.ml),
        "report": report,
    }
