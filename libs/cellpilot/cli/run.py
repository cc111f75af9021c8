"""``cellpilot run`` and ``cellpilot stop``: the whole system on one machine, no Docker."""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from cellpilot.cli.stack import start_stack
from cellpilot.stack import Stack, StackConfig
from cellpilot.stack.services import SERVICES, ServiceSupervisor

console = Console(stderr=True)

DataDir = Annotated[
    Path, typer.Option("--data-dir", envvar="CELLPILOT_STACK_DIR", help="The stack's data directory.")
]


def run(
    data_dir: DataDir = Path(".cellpilot/stack"),
    detach: Annotated[
        bool, typer.Option(help="Start everything and return instead of waiting for Ctrl-C.")
    ] = False,
) -> None:
    """Start the embedded stack and every service; Ctrl-C (or `cellpilot stop`) stops them all."""
    stack = Stack(StackConfig(data_dir))
    endpoints = start_stack(stack)
    supervisor = ServiceSupervisor(stack.config.data_dir, stack.config.env_path)
    running = supervisor.start()
    console.print("[green]Cellpilot is up.[/green]")
    for key, value in endpoints.as_env().items():
        console.print(f"  {key}={value}")
    console.print(f"  connection settings: {stack.config.env_path}")
    console.print(f"  logs: {stack.config.data_dir / 'logs'}")
    if running:
        console.print("  services: " + ", ".join(f"{s.name}[{s.replica}] pid {s.pid}" for s in running))
    else:
        console.print("  services: none registered yet (see cellpilot/stack/services.py)")
    if detach:
        return
    console.print("Press Ctrl-C to stop everything.")
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    with contextlib.suppress(KeyboardInterrupt):
        stopped.wait()
    _stop(stack, supervisor)


def stop(data_dir: DataDir = Path(".cellpilot/stack")) -> None:
    """Stop every service and the embedded stack started by `cellpilot run`."""
    stack = Stack(StackConfig(data_dir))
    _stop(stack, ServiceSupervisor(stack.config.data_dir, stack.config.env_path))


def _stop(stack: Stack, supervisor: ServiceSupervisor) -> None:
    console.log("stopping services")
    supervisor.stop()
    stack.down(progress=console.log)


__all__ = ["SERVICES", "run", "stop"]
