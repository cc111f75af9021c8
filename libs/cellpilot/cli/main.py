"""Entry point of the ``cellpilot`` command: one sub-command group per area."""

from __future__ import annotations

import sys

import typer

from cellpilot.cli import (
    autopilot_cmd,
    borgmaster,
    cell,
    certs,
    dashboard_cmd,
    eval_autopilot,
    eval_autopilot_tune,
    eval_compaction,
    eval_gpa,
    eval_horizontal,
    eval_lava,
    job,
    output,
    run,
    stack,
)
from cellpilot.cli.study_runner import bare_dask_means_local

app = typer.Typer(
    name="cellpilot",
    help="Cellpilot: Borg, Autopilot, GPA and LAVA as one open cluster manager.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    callback=output.use_token,
)
eval_app = typer.Typer(help="Offline studies that reproduce the papers' comparisons.", no_args_is_help=True)

app.add_typer(stack.app, name="stack")
app.add_typer(eval_app, name="eval")
app.add_typer(borgmaster.app, name="borgmaster")
app.add_typer(job.app, name="job")
app.add_typer(autopilot_cmd.app, name="autopilot")
app.add_typer(cell.app, name="cell")
app.add_typer(certs.app, name="certs")
app.add_typer(dashboard_cmd.app, name="dashboard")
for study in (eval_autopilot, eval_autopilot_tune, eval_gpa, eval_compaction, eval_lava, eval_horizontal):
    study.register(eval_app)
app.command("run")(run.run)
app.command("stop")(run.stop)


def main() -> None:
    """The ``cellpilot`` console entry point."""
    app(args=bare_dask_means_local(sys.argv[1:]), prog_name="cellpilot")


if __name__ == "__main__":
    main()
