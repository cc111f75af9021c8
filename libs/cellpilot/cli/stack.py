"""``cellpilot stack up|down|status|env``: the embedded broker, PostgreSQL and Redis."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from cellpilot.cli.output import Column, OutputOption, print_table, use_output
from cellpilot.stack import Stack, StackConfig, StackEndpoints
from cellpilot.stack.supervision import stack_status, stop_data_dir
from cellpilot.stack.supervision_state import SupervisorState, UnitStatus
from cellpilot.stack.supervisor import StackError

app = typer.Typer(help="Start, inspect and stop the embedded stack (no Docker needed).", no_args_is_help=True)
console = Console(stderr=True)

DataDir = Annotated[
    Path,
    typer.Option(
        "--data-dir", envvar="CELLPILOT_STACK_DIR", help="Where the stack keeps its data, logs and state."
    ),
]


def _stack(data_dir: Path, kafka_port: int = 0, postgres_port: int = 0, redis_port: int = 0) -> Stack:
    return Stack(
        StackConfig(data_dir, kafka_port=kafka_port, postgres_port=postgres_port, redis_port=redis_port)
    )


@contextmanager
def _exit_on_stack_error(failure: str) -> Iterator[None]:
    """A StackError inside the block is printed after ``failure`` and ends the command (exit 1)."""
    try:
        yield
    except StackError as error:
        console.print(f"[red]{failure}:[/red] {error}")
        raise typer.Exit(1) from error


def start_stack(stack: Stack) -> StackEndpoints:
    """Bring the stack up with a live status line; exits with a message if it cannot."""
    with (
        _exit_on_stack_error("could not start the stack"),
        console.status("starting the embedded stack") as status,
    ):

        def progress(line: str) -> None:
            status.update(line)
            console.log(line)

        return stack.up(progress=progress)


@app.command()
def up(
    data_dir: DataDir = Path(".cellpilot/stack"),
    kafka_port: Annotated[int, typer.Option(help="0: a free port, remembered in the data directory")] = 0,
    postgres_port: Annotated[int, typer.Option(help="0: a free port, remembered in the data directory")] = 0,
    redis_port: Annotated[int, typer.Option(help="0: a free port, remembered in the data directory")] = 0,
) -> None:
    """Start the broker, PostgreSQL and Redis; wait until healthy; create topics; migrate."""
    stack = _stack(data_dir, kafka_port, postgres_port, redis_port)
    endpoints = start_stack(stack)
    console.print(f"[green]stack is up[/green]; settings in {stack.config.env_path}")
    for key, value in endpoints.as_env().items():
        typer.echo(f"{key}={value}")


@app.command()
def down(data_dir: DataDir = Path(".cellpilot/stack")) -> None:
    """Stop every process of the stack and wait until their ports are released.

    If `cellpilot run` supervises this data directory, it is asked to stop everything (its
    services too), as `cellpilot stop` does; otherwise it would restart what stops here."""
    state = SupervisorState.load(data_dir)
    with _exit_on_stack_error("stack down failed"):
        if state is not None and state.supervisor_alive():
            stop_data_dir(data_dir, console.log)
        else:
            _stack(data_dir).down(progress=console.log)


@app.command()
def status(
    data_dir: DataDir = Path(".cellpilot/stack"),
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    output: OutputOption = "",
) -> None:
    """Show every embedded component and service replica: pid, state (running, restarting,
    gave-up, stopped), restarts and ports. Exit code 1 if anything is not running."""
    as_json = use_output(output, as_json)
    current = stack_status(data_dir)
    supervisor = current.supervisor
    if as_json:
        document = {
            "supervisor": None if supervisor is None else {"pid": supervisor.pid, "phase": supervisor.phase},
            "units": [
                {**unit.as_dict(), "listening": unit.name not in current.not_listening}
                for unit in current.units
            ],
            "healthy": current.healthy,
        }
        typer.echo(json.dumps(document, indent=2))
    else:
        if supervisor is None:
            title = "no supervisor: `cellpilot run` is not running for this data directory"
        else:
            title = f"supervised by cellpilot run (pid {supervisor.pid}, {supervisor.phase})"

        def state(unit: UnitStatus) -> str:
            if unit.name in current.not_listening:
                return f"{unit.state} (not listening)"
            return (
                unit.state if unit.state != "restarting" else f"restarting in {unit.restart_in_s or 0:.1f} s"
            )

        columns = (
            Column("name", lambda unit: unit.name, identifier=True),
            Column("replica", lambda unit: str(unit.replica), identifier=True),
            Column("pid", lambda unit: str(unit.pid or "-")),
            Column("state", state),
            Column("restarts", lambda unit: str(unit.restarts)),
            Column("port", lambda unit: ",".join(str(port) for port in unit.ports) or "-"),
            Column("last exit", lambda unit: unit.last_exit or "-"),
        )
        print_table(title, columns, current.units)
    if not current.healthy:
        raise typer.Exit(1)
