"""The §3.2.3 off-line sweep over the ML recommender's hyperparameters.

§3.2.3: the ensemble has five hyperparameters (d, w_o, w_u, w_dL, w_dm), tuned "in off-line
experiments during which we simulate Autopilot behavior on a sample of saved traces"; the
goal is "a configuration that dominates alternative algorithms (such as the moving window
recommenders) over a large portion of the sample, with a similar (or slightly lower)
number of overruns and limit adjustments, and significantly higher utilization", found by
"a parameter sweep (an exhaustive search) over possible values of the weights".

Here: every configuration of a grid is replayed (:mod:`cellpilot.evaluate.autopilot_replay`)
on a *tuning* population; the moving-window recommender is replayed on the same jobs. A
configuration is *admissible* when, on the tuning population, its relative OOM rate and
its 99th-percentile limit changes per job-day are no higher than the moving window's and
its OOM-free job-days no fewer; the admissible configuration with the lowest mean relative
slack is chosen (if none is admissible, the one with the smallest violation, and the report
says so). The chosen configuration and the library default are then replayed, with the
moving window and VPA, on a separate *report* population (other seeds): numbers that were
not used for the choice.

w_o is fixed at 1: scaling all five weights together changes none of the arg-mins of
eqs. 6 and 9, so only the ratios matter. Memory only (the paper's §4 focus).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field, replace
from typing import Any

from cellpilot.evaluate.autopilot_policies import STANDARD_RECOMMENDERS, RecommenderSpec
from cellpilot.evaluate.autopilot_replay import ReplayConfig, run_study
from cellpilot.recommend.ml_ensemble import EnsembleConfig
from cellpilot.workloads.autopilot_jobs import AutopilotWorkloadConfig

HYPERPARAMETERS: tuple[str, ...] = (
    "cost_decay",
    "w_overrun",
    "w_underrun",
    "w_limit_change",
    "w_model_change",
)
METRICS: tuple[str, ...] = (
    "relative_slack_mean",
    "relative_slack_median",
    "relative_oom_rate_per_task_day",
    "oom_free_job_days_fraction",
    "limit_changes_per_job_day_p99",
    "absolute_slack_machines",
)


@dataclass(frozen=True)
class TuningGrid:
    """The swept values (w_o = 1)."""

    cost_decay: tuple[float, ...] = (0.003, 0.01, 0.03)
    w_underrun: tuple[float, ...] = (0.02, 0.05, 0.1, 0.2)
    w_limit_change: tuple[float, ...] = (0.003, 0.01, 0.03)
    w_model_change: tuple[float, ...] = (0.003, 0.03)

    def configs(self, base: EnsembleConfig | None = None) -> list[EnsembleConfig]:
        base = base or EnsembleConfig()
        return [
            replace(base, cost_decay=d, w_overrun=1.0, w_underrun=u, w_limit_change=dl, w_model_change=dm)
            for d, u, dl, dm in itertools.product(
                self.cost_decay, self.w_underrun, self.w_limit_change, self.w_model_change
            )
        ]


@dataclass(frozen=True)
class TuningSetup:
    """Populations: ``tune_seeds`` choose, ``report_seeds`` report (disjoint)."""

    jobs: int = 100
    days: int = 5  # measured days per population
    warmup_days: int = 2
    tune_seeds: tuple[int, ...] = (1001,)
    report_seeds: tuple[int, ...] = (2001, 2002)
    grid: TuningGrid = field(default_factory=TuningGrid)
    replay: ReplayConfig = field(default_factory=ReplayConfig)

    def __post_init__(self) -> None:
        if set(self.tune_seeds) & set(self.report_seeds):
            raise ValueError("tuning and report seeds must differ")

    def workload(self, seed: int) -> AutopilotWorkloadConfig:
        return AutopilotWorkloadConfig(
            jobs=self.jobs, days=self.days + self.warmup_days, seed=seed, with_cpu=False
        )


def hyperparameters(config: EnsembleConfig) -> dict[str, float]:
    return {name: float(getattr(config, name)) for name in HYPERPARAMETERS}


def config_from_hyperparameters(values: dict[str, Any], base: EnsembleConfig | None = None) -> EnsembleConfig:
    """An :class:`EnsembleConfig` with the given hyperparameters (unknown keys are ignored)."""
    chosen: dict[str, Any] = {k: float(values[k]) for k in HYPERPARAMETERS if k in values}
    return replace(base or EnsembleConfig(), **chosen)


def _evaluate(
    setup: TuningSetup, seed: int, spec: RecommenderSpec, ml: EnsembleConfig | None
) -> dict[str, Any]:
    replay = replace(setup.replay, warmup_days=setup.warmup_days, ml=ml or setup.replay.ml)
    result = run_study(setup.workload(seed), [spec], replay, workers=1)
    summary = result.summaries[spec.name]
    return {k: summary.get(k) for k in (*METRICS, "job_days")}


def _mean(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Job-day-weighted mean of each metric over seeds."""
    total = sum(r["job_days"] for r in rows) or 1
    return {k: sum(float(r[k] or 0.0) * r["job_days"] for r in rows) / total for k in METRICS} | {
        "job_days": float(total)
    }


def _violation(candidate: dict[str, float], baseline: dict[str, float]) -> float:
    """How far a candidate is from admissible (0 = admissible), in relative terms."""
    oom = max(0.0, candidate["relative_oom_rate_per_task_day"] - baseline["relative_oom_rate_per_task_day"])
    free = max(0.0, baseline["oom_free_job_days_fraction"] - candidate["oom_free_job_days_fraction"])
    changes = max(0.0, candidate["limit_changes_per_job_day_p99"] - baseline["limit_changes_per_job_day_p99"])
    scale = max(baseline["relative_oom_rate_per_task_day"], 1e-4)
    return oom / scale + free * 100.0 + changes / max(baseline["limit_changes_per_job_day_p99"], 1.0)


def run_sweep(
    setup: TuningSetup,
    *,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Sweep the grid on the tuning seeds, choose, and compare on the report seeds (plain data out)."""
    configs = setup.grid.configs(setup.replay.ml)
    ml = STANDARD_RECOMMENDERS["ml"]
    window = STANDARD_RECOMMENDERS["moving-window"]
    vpa = STANDARD_RECOMMENDERS["vpa"]
    jobs: list[tuple[str, int, int, RecommenderSpec, EnsembleConfig | None]] = []
    for seed in setup.tune_seeds:
        jobs.append(("tune-baseline", -1, seed, window, None))
        jobs.extend(("tune", i, seed, ml, config) for i, config in enumerate(configs))
    total = len(jobs) + 4 * len(setup.report_seeds)
    done = 0
    results: dict[tuple[str, int, int], dict[str, Any]] = {}

    def tick() -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done, total)

    def run_all(batch: list[tuple[str, int, int, RecommenderSpec, EnsembleConfig | None]]) -> None:
        if workers <= 1:
            for tag, index, seed, spec, config in batch:
                results[(tag, index, seed)] = _evaluate(setup, seed, spec, config)
                tick()
            return
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {
                pool.submit(_evaluate, setup, seed, spec, config): (tag, index, seed)
                for tag, index, seed, spec, config in batch
            }
            for future in as_completed(futures):
                results[futures[future]] = future.result()
                tick()

    if progress:
        progress(0, total)
    run_all(jobs)
    baseline = _mean([results[("tune-baseline", -1, s)] for s in setup.tune_seeds])
    table = []
    for i, config in enumerate(configs):
        metrics = _mean([results[("tune", i, s)] for s in setup.tune_seeds])
        table.append({**hyperparameters(config), **metrics, "violation": _violation(metrics, baseline)})
    admissible = [row for row in table if row["violation"] == 0.0]
    pool_rows = admissible or sorted(table, key=lambda r: r["violation"])[: max(1, len(table) // 10)]
    chosen_row = min(pool_rows, key=lambda r: (r["relative_slack_mean"], r["relative_oom_rate_per_task_day"]))
    chosen = config_from_hyperparameters(chosen_row, setup.replay.ml)

    report_jobs: list[tuple[str, int, int, RecommenderSpec, EnsembleConfig | None]] = []
    for seed in setup.report_seeds:
        report_jobs += [
            ("report-tuned", 0, seed, ml, chosen),
            ("report-default", 0, seed, ml, setup.replay.ml),
            ("report-moving-window", 0, seed, window, None),
            ("report-vpa", 0, seed, vpa, None),
        ]
    run_all(report_jobs)
    report = {
        name: _mean([results[(f"report-{name}", 0, s)] for s in setup.report_seeds])
        for name in ("tuned", "default", "moving-window", "vpa")
    }
    return {
        "setup": {
            "jobs": setup.jobs,
            "measured_days": setup.days,
            "warmup_days": setup.warmup_days,
            "tune_seeds": list(setup.tune_seeds),
            "report_seeds": list(setup.report_seeds),
            "grid": {
                "cost_decay": list(setup.grid.cost_decay),
                "w_overrun": [1.0],
                "w_underrun": list(setup.grid.w_underrun),
                "w_limit_change": list(setup.grid.w_limit_change),
                "w_model_change": list(setup.grid.w_model_change),
            },
            "models": setup.replay.ml.grid.models,
        },
        "tune_baseline_moving_window": baseline,
        "table": table,
        "admissible": len(admissible),
        "chosen": hyperparameters(chosen),
        "chosen_tune_metrics": {k: chosen_row[k] for k in (*METRICS, "violation")},
        "default": hyperparameters(setup.replay.ml),
        "report": report,
    }
