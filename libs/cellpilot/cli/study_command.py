"""What the ``cellpilot eval`` commands share besides where their shards run (:mod:`study_runner`):
the options several of them take (``--out``, ``--seed``, ``--jobs``, ``--days``), trace files
named by ``--trace``, comma-separated choices, options checked by the study's own configuration,
the progress bar of a replay and the goals table of a report."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from cellpilot.cli.output import console
from cellpilot.cli.text_file import TextFileError, read_text_file

T = TypeVar("T")

OutOption = Annotated[
    Path, typer.Option("--out", help="directory for summary.json, results.md and the plots")
]
WorkloadSeedOption = Annotated[int, typer.Option("--seed", help="seed of the synthetic workload")]
SyntheticJobsOption = Annotated[int, typer.Option("--jobs", help="jobs in each synthetic population")]
MeasuredDaysOption = Annotated[
    int, typer.Option("--days", help="days measured in each population (warm-up days come on top)")
]
ReplayDaysOption = Annotated[float, typer.Option("--days", help="simulated days per replay")]


def read_trace(path: Path, kind: str, max_bytes: int) -> str:
    """A trace file named by ``--trace``, read whole; one that is not ``kind`` text is a usage error."""
    try:
        return read_text_file(path, kind, max_bytes)
    except TextFileError as err:
        raise typer.BadParameter(str(err), param_hint="--trace") from None


def comma_list(text: str) -> tuple[str, ...]:
    """``"a, b,,c"`` -> ``("a", "b", "c")``."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def checked_options(build: Callable[[], T], param_hint: str | None = None) -> T:
    """The study's configuration built from the options; what it refuses is a usage error."""
    try:
        return build()
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint=param_hint) from None


def replay_progress(description_width: int = 0, counted: bool = True) -> Progress:
    """A transient bar per replay stage: description, bar, done of total, time elapsed."""
    description = "{task.description" + (f":<{description_width}" if description_width else "") + "}"
    columns: list[Any] = [TextColumn(description), BarColumn()]
    if counted:
        columns.append(MofNCompleteColumn())
    columns.append(TimeElapsedColumn())
    return Progress(*columns, console=console, transient=True)


def met_goal_rows(goals: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A summary's goals as table rows: the goal and whether it was met (``yes``, ``NO``, ``not run``)."""
    met = {True: "yes", False: "NO", None: "not run"}
    return [
        {"goal": name, "met": met[goal["met"]], **({"detail": goal["detail"]} if "detail" in goal else {})}
        for name, goal in goals.items()
    ]
