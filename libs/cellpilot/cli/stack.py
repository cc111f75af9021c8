"""``cellpilot stack up|down|status|env``: the embedded broker, PostgreSQL and Redis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from cellpilot.stack import Stack, StackConfig, StackEndpoints
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


def start_stack(stack: Stack) -> StackEndpoints:
    """Bring the stack up with a live status line; exits with a message if it cannot."""
    try:
        with console.status("starting the embedded stack") as status:

            def progress(line: str) -> None:
                status.update(line)
                console.log(line)

            return stack.up(progress=progress)
    except StackError as error:
        console.print(f"[red]could not start the stack:[/red] {error}")
        raise typer.Exit(1) from error


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
    """Stop every process of the stack and wait until their ports are released."""
    stack = _stack(data_dir)
    try:
        stack.down(progress=console.log)
    except StackError as error:
        console.print(f"[red]stack down failed:[/red] {error}")
        raise typer.Exit(1) from error


@app.command()
def status(
    data_dir: DataDir = Path(".cellpilot/stack"),
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show each component's pid, port and whether it is running. Exit code 1 if any is down."""
    stack = _stack(data_dir)
    rows = stack.status()
    if as_json:
        typer.echo(json.dumps([row.__dict__ for row in rows], indent=2))
    else:
        table = Table("component", "pid", "port", "running", "listening")
        for row in rows:
            table.add_row(row.name, str(row.pid or "-"), str(row.port), str(row.running), str(row.listening))
        Console().print(table)
    if not all(row.running and row.listening for row in rows):
        raise typer.Exit(1)
