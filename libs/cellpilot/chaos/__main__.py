"""``python -m cellpilot.chaos [--short] [--out chaos-results.json] [--data-dir DIR] [--keep]``.

Runs one chaos run (:mod:`cellpilot.chaos`), shows its progress, prints every figure as
``CHAOS <name> <value> <unit>`` and writes them to ``--out``. Exit code 0 when every invariant
held, 1 when one did not (each failed one is named), 2 when the run itself could not be done.
The data directory (default: a new one under the system's temporary directory) is removed
after a run whose invariants held, unless ``--keep``; otherwise its logs are left for reading.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress

from cellpilot.chaos.driver import ChaosDriver, Progress
from cellpilot.chaos.plan import PLANS
from cellpilot.chaos.report import failed, write_results


class RichChaosProgress(Progress):
    """A progress bar over the faults with what is happening now; events as log lines."""

    def __init__(self, console: Console, faults: int) -> None:
        self.console = console
        self.bar = RichProgress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task = self.bar.add_task("starting", total=faults)

    def step(self, text: str) -> None:
        self.bar.update(self.task, description=text)
        if not self.console.is_terminal:
            self.event(text)

    def event(self, text: str) -> None:
        self.console.log(text) if self.console.is_terminal else self.console.print(
            text, markup=False, highlight=False
        )

    def fault_done(self) -> None:
        self.bar.advance(self.task)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cellpilot.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--short", action="store_true", help="the test suite's subset of faults, with shorter pauses"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("chaos-results.json"), help="where the figures go (JSON)"
    )
    parser.add_argument(
        "--data-dir", type=Path, help="a new or empty directory for the run (default: a temporary one)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the data directory (logs) after the run")
    args = parser.parse_args(argv)

    # The run is self-contained: no CELLPILOT_ setting of this shell reaches it or its client.
    for name in [k for k in os.environ if k.startswith("CELLPILOT_")]:
        del os.environ[name]
    # On a terminal a live progress bar; in a file (the test suite) one unwrapped line per event.
    console = Console(stderr=True, soft_wrap=not sys.stderr.isatty(), log_path=False)
    if args.data_dir is not None and args.data_dir.exists() and any(args.data_dir.iterdir()):
        console.print(f"[red]{args.data_dir} is not empty[/red]: a chaos run needs a fresh data directory")
        return 2
    # Not under a private temporary root: PostgreSQL, run as its own user when we are root,
    # must reach its data directory (as for the test suite's second stack).
    data_dir = (args.data_dir or Path(tempfile.mkdtemp(prefix="cellpilot-chaos-"))).resolve()
    plan = PLANS["short" if args.short else "full"]
    # The reader's own log (its log resets, the Kafka client's reconnections): a file, not the terminal.
    logging.basicConfig(
        filename=data_dir / "chaos.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    progress = RichChaosProgress(console, len(plan.faults))
    try:
        with progress.bar:
            result = asyncio.run(ChaosDriver(plan, data_dir, progress).execute())
    except Exception as error:
        console.print(f"[red]the chaos run could not be done:[/red] {error}")
        console.print(f"logs: {data_dir / 'logs'}")
        return 2
    for figure in result.figures:
        print(figure.line(), flush=True)
    write_results(args.out, result.facts, result.figures)
    broken = failed(result.figures)
    console.print(f"{result.stopped}; figures in {args.out}")
    if broken:
        for figure in broken:
            console.print(
                f"[red]invariant failed:[/red] {figure.line()} (must be {figure.must_be}) {figure.note}"
            )
        console.print(f"logs kept: {data_dir / 'logs'}")
        return 1
    if args.keep:
        console.print(f"data directory kept: {data_dir}")
    else:
        shutil.rmtree(data_dir, ignore_errors=True)
    console.print(f"[green]every invariant held[/green] ({result.facts.wall_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
