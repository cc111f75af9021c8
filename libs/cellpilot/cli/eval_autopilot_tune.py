"""``cellpilot eval autopilot-tune``: the §3.2.3 sweep of the ML recommender, chosen on training
seeds and reported on held-out seeds (:mod:`cellpilot.evaluate.autopilot_tuning`).

Writes the chosen configuration (by default the shipped ``ml_tuned.json``) and the report
(by default ``docs/results/ml-tuning.md``): the objective, the whole sweep, the choice and
the held-out comparison with the command that reproduces it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from cellpilot.autopilot.ml_config import load_ml_config
from cellpilot.cli.eval_autopilot import FORMATS
from cellpilot.cli.output import console
from cellpilot.cli.study_command import MeasuredDaysOption, SyntheticJobsOption, comma_list, replay_progress
from cellpilot.cli.study_runner import ShardPlacement, register_study
from cellpilot.evaluate.autopilot_metrics import LIMIT_CHANGE_KEYS
from cellpilot.evaluate.autopilot_replay import ReplayConfig
from cellpilot.evaluate.autopilot_tuning import (
    EQ8_MODES,
    MODEL_GRIDS,
    OBJECTIVE,
    TuningGrid,
    TuningSetup,
    run_sweep,
)
from cellpilot.evaluate.replay_machines import CELL_MODELS, DEFAULT_CELL
from cellpilot.evaluate.report import markdown_table, write_markdown, write_summary
from cellpilot.recommend.ml_ensemble import EnsembleConfig

METRIC_COLUMNS = (
    "relative_slack_mean",
    "relative_oom_rate_per_task_day",
    "oom_free_job_days_fraction",
    *LIMIT_CHANGE_KEYS,
    "absolute_slack_machines",
)
SETTING_COLUMNS = (
    "eq8",
    "model_grid",
    "cost_decay",
    "w_underrun",
    "w_limit_change_over_w_underrun",
    "w_model_change",
)
TUNE_FORMATS = FORMATS | {
    "violation": ".3g",
    "w_limit_change_over_w_underrun": "g",
    "down_after_drop_h": ".1f",
}


def _with_never(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows for display: a limit that did not come down after the probe's drop reads "never"."""
    return [
        r | {"down_after_drop_h": "never" if r.get("down_after_drop_h") is None else r["down_after_drop_h"]}
        for r in rows
    ]


def _floats(text: str, option: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in comma_list(text))
    except ValueError:
        raise typer.BadParameter("must be comma-separated numbers", param_hint=option) from None
    if not values:
        raise typer.BadParameter("needs at least one value", param_hint=option)
    return values


def _seeds(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in comma_list(text))
    except ValueError:
        raise typer.BadParameter("must be comma-separated integers", param_hint=option) from None
    if not values:
        raise typer.BadParameter("needs at least one seed", param_hint=option)
    return values


def tuning_markdown(sweep: dict[str, Any], command: str, seconds: float) -> list[str]:
    """The report: sizes and command, objective, choice, held-out comparison, then the whole sweep."""
    setup = sweep["setup"]
    table = _with_never(
        sorted(sweep["table"], key=lambda r: (r["violation"] > 0, r["violation"], r["relative_slack_mean"]))
    )
    probe = sweep["probe"]
    probe_text = (
        "`down_after_drop_h` (the objective's drop rule: it must not be never): hours until ML's "
        f"chosen limit (eq. 9, "
        f"the ensemble alone) is below {probe['down_gib']:g} GiB after a {probe['tasks']}-task job's usage "
        f"drops from {probe['high_gib']:g} to {probe['low_gib']:g} GiB per task (one sample per task and "
        f"5-minute window, {probe['days_before']} days before the drop); never = not within "
        f"{probe['days_after']} days.\n"
    )
    unconstrained = sweep["unconstrained_setting"]
    held_rows = [{"recommender": name, **m} for name, m in sweep["held_out"].items()]
    goal_rows = [{**g, "met": "yes" if g["met"] else "NO"} for g in sweep["held_out_goals"]]
    chosen = sweep["chosen"]
    setting = sweep["chosen_setting"]
    met = sweep["chosen_train_metrics"]["violation"] == 0.0
    grids = "; ".join(
        f"`{name}`: half-lives {', '.join(f'{h:.3g}' for h in g['decay_half_lives_windows'])} windows, "
        f"margins {', '.join(f'{m:g}' for m in g['margins'])} GiB"
        for name, g in setup["grid"]["model_grids"].items()
    )
    return [
        f"Reproduce (one command, {seconds / 60:.0f} min wall on the 2-core shared machine):\n\n"
        f"```\n{command}\n```\n",
        f"Sizes: populations of {setup['jobs']} synthetic jobs, {setup['measured_days']} measured days after "
        f"{setup['warmup_days']} warm-up days, replayed in the closed loop under the cell model with "
        f"overcommit {setup['cell_overcommit']:g}; training seeds {setup['train_seeds']}, held-out seeds "
        f"{setup['held_out_seeds']} (never used for the choice); {setup['configurations']} settings; serving "
        "jobs' memory (§4.1.2). Model grids (5-minute windows; additive margins, eq. 7): " + grids + ".\n",
        "## Objective (fixed before the run)\n",
        sweep["objective"] + "\n",
        sweep["objective_history"] + "\n",
        f"Settings meeting the constraints on the training seeds: {sweep['admissible']} of "
        f"{len(sweep['table'])}. "
        + (
            ""
            if met
            else "**None met them: the objective was missed; the "
            "setting with the smallest violation is shipped.**"
        ),
        "## Choice (shipped in `libs/cellpilot/autopilot/data/ml_tuned.json`)\n",
        markdown_table(
            _with_never(
                [setting | {"down_after_drop_h": sweep["chosen_train_metrics"]["down_after_drop_h"]}]
            ),
            (*SETTING_COLUMNS, "w_limit_change", "down_after_drop_h"),
            TUNE_FORMATS,
        ),
        probe_text,
        markdown_table(
            [{"": "chosen", **chosen["options"]}],
            ("", "margin_mode", "cost_at_previous_limit", "normalise_histograms"),
        ),
        "Training seeds, chosen setting vs the moving window:\n",
        markdown_table(
            [
                {"recommender": "ml (chosen)", **sweep["chosen_train_metrics"]},
                {"recommender": "moving-window", **sweep["train_moving_window"]},
            ],
            ("recommender", *METRIC_COLUMNS),
            TUNE_FORMATS,
        ),
        "For comparison, not shipped: the objective without the drop rule chooses:\n\n"
        + markdown_table(
            _with_never([unconstrained]),
            (*SETTING_COLUMNS, *METRIC_COLUMNS, "down_after_drop_h"),
            TUNE_FORMATS,
        ),
        "## Held-out seeds\n",
        markdown_table(held_rows, ("recommender", *METRIC_COLUMNS), TUNE_FORMATS),
        "Per held-out seed:\n",
        markdown_table(sweep["held_out_per_seed"], ("seed", "recommender", *METRIC_COLUMNS), TUNE_FORMATS),
        "Goals (issue's ML goals, checked on the held-out seeds):\n",
        markdown_table(goal_rows, ("goal", "met", "numbers")),
        "## The whole sweep (training seeds; constraints met first, then by violation and slack)\n",
        probe_text,
        markdown_table(
            table, (*SETTING_COLUMNS, *METRIC_COLUMNS, "violation", "down_after_drop_h"), TUNE_FORMATS
        ),
    ]


def autopilot_tune(
    out: Annotated[Path, typer.Option("--out", help="the chosen configuration (JSON)")] = Path(
        "libs/cellpilot/autopilot/data/ml_tuned.json"
    ),
    report: Annotated[Path, typer.Option(help="the markdown report")] = Path("docs/results/ml-tuning.md"),
    jobs: SyntheticJobsOption = TuningSetup.jobs,
    days: MeasuredDaysOption = TuningSetup.days,
    warmup_days: Annotated[
        int, typer.Option(help="days replayed before measuring")
    ] = TuningSetup.warmup_days,
    train_seeds: Annotated[
        str, typer.Option(help="comma-separated workload seeds the choice is made on")
    ] = ",".join(map(str, TuningSetup.train_seeds)),
    held_out_seeds: Annotated[
        str, typer.Option(help="comma-separated workload seeds the choice is reported on (disjoint)")
    ] = ",".join(map(str, TuningSetup.held_out_seeds)),
    eq8: Annotated[
        str, typer.Option(help=f"comma-separated eq. 8 modes ({', '.join(EQ8_MODES)})")
    ] = ",".join(TuningGrid.eq8),
    model_grids: Annotated[
        str, typer.Option(help=f"comma-separated d_m x M_m grids ({', '.join(MODEL_GRIDS)})")
    ] = ",".join(TuningGrid.model_grids),
    w_underrun: Annotated[str, typer.Option(help="comma-separated w_u values (w_o = 1)")] = ",".join(
        map(str, TuningGrid.w_underrun)
    ),
    limit_change_ratios: Annotated[
        str, typer.Option(help="comma-separated w_ΔL / w_u ratios (0, below, at, above 1)")
    ] = ",".join(map(str, TuningGrid.limit_change_ratios)),
    cost_decay: Annotated[str, typer.Option(help="comma-separated d values (eq. 8)")] = ",".join(
        map(str, TuningGrid.cost_decay)
    ),
    cell: Annotated[
        str, typer.Option(help=f"the replay's cell model ({', '.join(CELL_MODELS)})")
    ] = DEFAULT_CELL,
    *,
    placement: ShardPlacement,
) -> None:
    """The §3.2.3 sweep: chosen on training seeds by a stated objective, reported on held-out seeds."""
    if cell not in CELL_MODELS:
        raise typer.BadParameter(f"must be one of {', '.join(CELL_MODELS)}", param_hint="--cell")
    if jobs < 1 or days < 1 or warmup_days < 0:
        raise typer.BadParameter("--jobs and --days must be >= 1, --warmup-days >= 0")
    try:
        grid = TuningGrid(
            eq8=comma_list(eq8),
            model_grids=comma_list(model_grids),
            w_underrun=_floats(w_underrun, "--w-underrun"),
            limit_change_ratios=_floats(limit_change_ratios, "--limit-change-ratios"),
            cost_decay=_floats(cost_decay, "--cost-decay"),
        )
        setup = TuningSetup(
            jobs=jobs,
            days=days,
            warmup_days=warmup_days,
            train_seeds=_seeds(train_seeds, "--train-seeds"),
            held_out_seeds=_seeds(held_out_seeds, "--held-out-seeds"),
            grid=grid,
            replay=ReplayConfig(ml=EnsembleConfig(), cell=CELL_MODELS[cell]),
            incumbent=load_ml_config(),
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    command = (
        f"cellpilot eval autopilot-tune --jobs {jobs} --days {days} --warmup-days {warmup_days} "
        f"--train-seeds {','.join(map(str, setup.train_seeds))} "
        f"--held-out-seeds {','.join(map(str, setup.held_out_seeds))} --eq8 {','.join(grid.eq8)} "
        f"--model-grids {','.join(grid.model_grids)} --w-underrun {','.join(map(str, grid.w_underrun))} "
        f"--limit-change-ratios {','.join(map(str, grid.limit_change_ratios))} "
        f"--cost-decay {','.join(map(str, grid.cost_decay))} --cell {cell} --workers {placement.workers}"
    )
    console.print(f"{len(grid.points())} settings. Objective: {OBJECTIVE}")
    started = time.perf_counter()
    with placement.runner() as runner, replay_progress() as progress:
        bar = progress.add_task("sweep", total=None)
        sweep = run_sweep(
            setup,
            runner=runner,
            progress=lambda d, t, stage: progress.update(bar, completed=d, total=t, description=stage),
        )
    seconds = time.perf_counter() - started
    config = {
        "description": "ML recommender configuration from the §3.2.3 sweep (cellpilot eval autopilot-tune)",
        **sweep["chosen"],
        "chosen_setting": sweep["chosen_setting"],
        "objective": sweep["objective"],
        "objective_met_on_training_seeds": sweep["chosen_train_metrics"]["violation"] == 0.0,
        "command": command,
        "tuned_on": sweep["setup"],
        "train_metrics": sweep["chosen_train_metrics"],
        "train_moving_window": sweep["train_moving_window"],
        "probe": sweep["probe"],
        "unconstrained_setting_for_comparison": sweep["unconstrained_setting"],
        "held_out_metrics": sweep["held_out"],
    }
    write_summary(out.parent, config, name=out.name)
    write_markdown(
        report.parent,
        report.name,
        "ML recommender sweep (Autopilot §3.2.3): training and held-out seeds",
        tuning_markdown(sweep, command, seconds),
    )
    console.print(f"chosen: {sweep['chosen_setting']}")
    for goal in sweep["held_out_goals"]:
        console.print(f"held-out: {goal['goal']}: {'yes' if goal['met'] else 'NO'} ({goal['numbers']})")
    console.print(f"wrote {out} and {report} ({seconds:.0f} s)")


def register(eval_app: typer.Typer) -> None:
    register_study(eval_app, "autopilot-tune", autopilot_tune, workers=2)
