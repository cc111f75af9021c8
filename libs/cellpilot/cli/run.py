"""``cellpilot run`` and ``cellpilot stop``: the whole system on one machine, no Docker."""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from cellpilot.cli.output import DEFAULT_AUTOPILOT, DEFAULT_BORGMASTER, DEFAULT_MONITORING
from cellpilot.cli.stack import start_stack
from cellpilot.client import CellpilotError, RetryPolicy, SyncCellpilotClient
from cellpilot.demo import DEMO_USER, submit_demo_workload
from cellpilot.security.identity import ADMIN
from cellpilot.security.tls import SecuritySettings
from cellpilot.security.tokens import TokenError, load_signer
from cellpilot.stack import Stack, StackConfig
from cellpilot.stack.services import SERVICES, ServiceSupervisor

DASHBOARD_URL = "https://127.0.0.1:8080"
DEMO_TOKEN_DAYS = 7

console = Console(stderr=True)

DataDir = Annotated[
    Path, typer.Option("--data-dir", envvar="CELLPILOT_STACK_DIR", help="The stack's data directory.")
]


def run(
    data_dir: DataDir = Path(".cellpilot/stack"),
    detach: Annotated[
        bool, typer.Option(help="Start everything and return instead of waiting for Ctrl-C.")
    ] = False,
    demo: Annotated[
        bool, typer.Option(help="Submit the demo workload (see cellpilot/demo) as the admin user 'demo'.")
    ] = True,
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
    if demo:
        _start_demo(stack)
    if detach:
        return
    console.print("Press Ctrl-C to stop everything.")
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    with contextlib.suppress(KeyboardInterrupt):
        stopped.wait()
    _stop(stack, supervisor)


def _start_demo(stack: Stack) -> None:
    """Mint an admin token for the demo user, submit the workload, say how to watch it."""
    certs_dir = stack.config.certs_dir
    try:
        token = load_signer(certs_dir).issue_for(
            DEMO_USER, kind="user", capabilities=[ADMIN], ttl_s=DEMO_TOKEN_DAYS * 24 * 3600
        )
    except TokenError as error:
        console.print(f"[red]no demo: cannot issue a token from {certs_dir}:[/red] {error}")
        return
    options = SecuritySettings.load(stack.config.env_path).client_options()
    options["token"] = token
    policy = RetryPolicy(budget_s=60.0, call_timeout_s=10.0, max_backoff_s=2.0)
    try:
        with (
            console.status("submitting the demo workload (waiting for a Borgmaster master)"),
            SyncCellpilotClient(
                DEFAULT_BORGMASTER.split(","),
                DEFAULT_AUTOPILOT.split(","),
                DEFAULT_MONITORING.split(","),
                policy=policy,
                **options,
            ) as client,
        ):
            submitted = submit_demo_workload(client)
    except CellpilotError as error:
        console.print(f"[red]could not submit the demo workload:[/red] {error}")
        return
    console.print("[green]Demo workload submitted[/green] (event time runs 60x faster than the clock):")
    for job, job_id in submitted:
        console.print(f"  {job_id:<16} {job.role}")
    token_path = stack.config.data_dir / "demo-token"
    token_path.write_text(token + "\n")
    token_path.chmod(0o600)
    # Plain lines (no wrapping): the URL, token and commands are meant to be copied.
    typer.echo(
        f"Dashboard: {DASHBOARD_URL}  (HTTPS signed by the stack's CA {certs_dir}/ca.crt)\n"
        "Every page wants the header 'Authorization: Bearer TOKEN'; the demo user's admin token "
        f"(also in {token_path}):\n{token}\n"
        "In a browser: import the CA certificate and send the header with a header extension "
        "(e.g. ModHeader). From a shell:\n"
        f'  curl --cacert {certs_dir}/ca.crt -H "authorization: Bearer $(cat {token_path})" '
        f"{DASHBOARD_URL}/api/jobs\n"
        "Watch Autopilot work:\n"
        f"  export CELLPILOT_TOKEN=$(cat {token_path}) CELLPILOT_STACK_ENV={stack.config.env_path}\n"
        "  cellpilot job show demo/web-fat; cellpilot autopilot show demo/web-leak; "
        "cellpilot job show demo/frontend",
        err=True,
    )


def stop(data_dir: DataDir = Path(".cellpilot/stack")) -> None:
    """Stop every service and the embedded stack started by `cellpilot run`."""
    stack = Stack(StackConfig(data_dir))
    _stop(stack, ServiceSupervisor(stack.config.data_dir, stack.config.env_path))


def _stop(stack: Stack, supervisor: ServiceSupervisor) -> None:
    console.log("stopping services")
    supervisor.stop()
    stack.down(progress=console.log)


__all__ = ["SERVICES", "run", "stop"]
