"""``cellpilot run`` and ``cellpilot stop``: the whole system on one machine, no Docker.

``cellpilot run`` starts the embedded stack and every service replica, then supervises them
(:mod:`cellpilot.stack.supervision`): a process that dies is restarted with backoff, or given
up on after too many restarts. SIGINT (Ctrl-C), SIGTERM (``cellpilot stop``) or SIGHUP stop
everything in order and end it with exit code 0. ``--detach`` runs the same supervisor in the
background (its log in ``DATA_DIR/logs/run.log``) and returns once everything is up.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer
from rich.console import Console

from cellpilot.cli.dashboard_cmd import DEFAULT_DASHBOARD_URL as DASHBOARD_URL
from cellpilot.cli.dashboard_cmd import sign_in_link
from cellpilot.cli.output import DEFAULT_AUTOPILOT, DEFAULT_BORGMASTER, DEFAULT_MONITORING
from cellpilot.cli.stack import start_stack
from cellpilot.client import CellpilotError, RetryPolicy, SyncCellpilotClient
from cellpilot.demo import DEMO_USER, submit_demo_workload
from cellpilot.security.browser_sessions import DEFAULT_TICKET_TTL_S, BrowserSessionSigner
from cellpilot.security.identity import ADMIN
from cellpilot.security.tls import SecuritySettings
from cellpilot.security.tokens import TokenError, load_signer
from cellpilot.stack import Stack, StackConfig
from cellpilot.stack.restart_policy import RestartPolicy
from cellpilot.stack.services import SERVICES, ServiceSpec, ServiceSupervisor
from cellpilot.stack.supervision import Watchdog, stop_data_dir
from cellpilot.stack.supervision_state import SupervisorState

DEMO_TOKEN_DAYS = 7
SUPERVISE_INTERVAL_S = 0.5
# --detach waits this long for the background supervisor to report everything started.
DETACHED_START_TIMEOUT_S = 300.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

# Unwrapped lines where stderr is a file (the detached supervisor's log): one event, one line.
console = Console(stderr=True, soft_wrap=not sys.stderr.isatty())

DataDir = Annotated[
    Path, typer.Option("--data-dir", envvar="CELLPILOT_STACK_DIR", help="The stack's data directory.")
]
_defaults = RestartPolicy()


def _log(line: str) -> None:
    """A timestamped line: Rich's log layout on a terminal, a single plain line in a log file."""
    if console.is_terminal:
        console.log(line)
    else:
        console.print(f"[{datetime.now():%H:%M:%S}] {line}", markup=False, highlight=False)


class StopRequested(BaseException):
    """A stop signal arrived while starting up (a BaseException: no ``except Exception`` eats it)."""


class _StopSignals:
    """SIGINT/SIGTERM/SIGHUP ask for an orderly stop; while starting up they interrupt the start."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.reason = ""
        self._interrupt = False
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested.is_set():
            _log(f"{name}: already stopping")
            return
        self.reason = {"SIGINT": "Ctrl-C (SIGINT)", "SIGTERM": "SIGTERM (cellpilot stop)"}.get(name, name)
        self.requested.set()
        if self._interrupt:
            raise StopRequested(name)

    @contextlib.contextmanager
    def interrupting(self) -> Iterator[None]:
        self._interrupt = True
        try:
            if self.requested.is_set():
                raise StopRequested(self.reason)
            yield
        finally:
            self._interrupt = False


def run(
    data_dir: DataDir = Path(".cellpilot/stack"),
    detach: Annotated[
        bool,
        typer.Option(help="Start everything under a background supervisor and return once it is up."),
    ] = False,
    demo: Annotated[
        bool, typer.Option(help="Submit the demo workload (see cellpilot/demo) as the admin user 'demo'.")
    ] = True,
    service: Annotated[
        list[str] | None,
        typer.Option(
            "--service", help="Run only this service (repeatable; default: all of them).", show_default=False
        ),
    ] = None,
    max_restarts: Annotated[
        int, typer.Option(help="Give up on a process restarted this many times within --restart-window.")
    ] = _defaults.max_restarts,
    restart_window: Annotated[
        float, typer.Option(help="Seconds over which --max-restarts counts restarts.")
    ] = _defaults.window_s,
    restart_backoff: Annotated[
        float, typer.Option(help="Seconds before the first restart; doubles per quick death (max 30 s).")
    ] = _defaults.initial_backoff_s,
) -> None:
    """Start the embedded stack and every service and keep them running; Ctrl-C (or `cellpilot
    stop`) stops them all."""
    specs = _selected_services(service or [])
    try:
        policy = RestartPolicy(
            initial_backoff_s=restart_backoff,
            max_backoff_s=max(_defaults.max_backoff_s, restart_backoff),
            max_restarts=max_restarts,
            window_s=restart_window,
        )
    except ValueError as error:
        console.print(f"[red]invalid restart policy:[/red] {error}")
        raise typer.Exit(2) from error
    existing = SupervisorState.load(data_dir)
    if existing is not None and existing.supervisor_alive():
        console.print(
            f"[red]cellpilot run (pid {existing.pid}) already runs for {data_dir}[/red]; "
            f"stop it with `cellpilot stop --data-dir {data_dir}`"
        )
        raise typer.Exit(1)
    stack = Stack(StackConfig(data_dir))
    stack.config.data_dir.mkdir(parents=True, exist_ok=True)
    if detach:
        forwarded = [f"--service={s.name}" for s in specs] if service else []
        forwarded += [
            f"--max-restarts={max_restarts}",
            f"--restart-window={restart_window}",
            f"--restart-backoff={restart_backoff}",
        ]
        _run_detached(stack, forwarded, demo)
        return
    _run_foreground(stack, specs, policy, demo)


def _selected_services(names: list[str]) -> tuple[ServiceSpec, ...]:
    known = {spec.name for spec in SERVICES}
    unknown = [name for name in names if name not in known]
    if unknown:
        console.print(f"[red]unknown service {unknown[0]!r}[/red]; known: {', '.join(sorted(known))}")
        raise typer.Exit(2)
    return tuple(spec for spec in SERVICES if not names or spec.name in names)


def _run_foreground(stack: Stack, specs: tuple[ServiceSpec, ...], policy: RestartPolicy, demo: bool) -> None:
    supervisor = ServiceSupervisor(stack.config.data_dir, stack.config.env_path)
    watchdog = Watchdog(stack, supervisor, policy, log=_log)
    stop = _StopSignals()
    started_ok = False
    try:
        with stop.interrupting():
            watchdog.save()  # `cellpilot stop` finds this process from here on
            start_stack(stack)
            supervisor.start(specs)
            watchdog.watch_all()
            started_ok = True
    except StopRequested:
        pass
    finally:
        if not started_ok:
            _log(f"{stop.reason or 'start failed'}: stopping what was started")
            watchdog.stop_all()
    if not started_ok:
        if stop.requested.is_set():
            console.print(f"[green]Cellpilot stopped[/green] ({stop.reason}) before it was up.")
            return
        raise typer.Exit(1)
    _print_up(stack, watchdog.state())
    if demo:
        threading.Thread(target=_start_demo, args=(stack,), name="demo", daemon=True).start()
    console.print("Press Ctrl-C (or run `cellpilot stop`) to stop everything.")
    try:
        while not stop.requested.is_set():
            watchdog.tick()
            stop.requested.wait(SUPERVISE_INTERVAL_S)
    except Exception as error:  # never leave the processes behind unsupervised
        _log(f"the supervisor failed ({error!r}): stopping everything")
        watchdog.stop_all()
        raise
    _log(f"{stop.reason}: stopping everything")
    began = time.monotonic()
    watchdog.stop_all()
    console.print(f"[green]Cellpilot stopped[/green] in {time.monotonic() - began:.1f} s ({stop.reason}).")


def _print_up(stack: Stack, state: SupervisorState) -> None:
    console.print("[green]Cellpilot is up.[/green]")
    for key, value in stack.endpoints.as_env().items():
        console.print(f"  {key}={value}")
    console.print(f"  connection settings: {stack.config.env_path}")
    console.print(f"  logs: {stack.config.data_dir / 'logs'}")
    services = [unit for unit in state.units if unit.kind == "service"]
    if services:
        console.print("  services: " + ", ".join(f"{unit.label} pid {unit.pid}" for unit in services))
    else:
        console.print("  services: none")
    console.print(f"  supervisor: cellpilot run pid {state.pid} (`cellpilot stack status` shows all)")


def _run_detached(stack: Stack, forwarded: list[str], demo: bool) -> None:
    """Start ``cellpilot run`` (foreground) in its own session, wait until it reports it is up."""
    logs = stack.config.data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / "run.log"
    argv = [sys.executable, "-m", "cellpilot.cli.main", "run", "--data-dir", str(stack.config.data_dir)]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [*argv, "--no-demo", *forwarded],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + DETACHED_START_TIMEOUT_S
    with console.status(f"starting everything under cellpilot run (pid {process.pid}, log {log_path})"):
        while True:
            state = SupervisorState.load(stack.config.data_dir)
            if state is not None and state.pid == process.pid and state.phase == "running":
                break
            if process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
                console.print(f"[red]cellpilot run did not start[/red]; last lines of {log_path}:\n{tail}")
                raise typer.Exit(1)
            time.sleep(0.2)
    stack = Stack(StackConfig(stack.config.data_dir))  # the ports the supervisor chose, now remembered
    _print_up(stack, state)
    console.print(f"  supervisor log: {log_path}")
    console.print(f"  stop everything with: cellpilot stop --data-dir {stack.config.data_dir}")
    if demo:
        _start_demo(stack)


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
    # Plain lines (no wrapping): the URL, link, token and commands are meant to be copied.
    typer.echo(demo_instructions(certs_dir, token, token_path, stack.config.env_path), err=True)


def demo_instructions(certs_dir: Path, token: str, token_path: Path, env_path: Path) -> str:
    """How to watch the demo: the dashboard with a one-time sign-in link for the demo user (and
    the token to paste), curl, and the CLI."""
    link = sign_in_link(DASHBOARD_URL, BrowserSessionSigner(load_signer(certs_dir)).ticket_for_token(token))
    stack_env = f"CELLPILOT_STACK_ENV={env_path}"
    return (
        f"Dashboard: {DASHBOARD_URL}  (HTTPS signed by the stack's CA {certs_dir}/ca.crt; "
        "import it into your browser, or accept the warning once)\n"
        f"Sign in as the demo user with this one-time link (valid {DEFAULT_TICKET_TTL_S // 60} minutes):\n"
        f"{link}\n"
        f"A new link: {stack_env} CELLPILOT_TOKEN=$(cat {token_path}) cellpilot dashboard login\n"
        f"Or paste the demo user's admin token (in {token_path}) at {DASHBOARD_URL}/sign-in.\n"
        "From a shell:\n"
        f'  curl --cacert {certs_dir}/ca.crt -H "authorization: Bearer $(cat {token_path})" '
        f"{DASHBOARD_URL}/api/jobs\n"
        "Watch Autopilot work:\n"
        f"  export CELLPILOT_TOKEN=$(cat {token_path}) {stack_env}\n"
        "  cellpilot job show demo/web-fat; cellpilot autopilot show demo/web-leak; "
        "cellpilot job show demo/frontend"
    )


def stop(data_dir: DataDir = Path(".cellpilot/stack")) -> None:
    """Stop every service and the embedded stack started by `cellpilot run`."""
    began = time.monotonic()
    stop_data_dir(data_dir, _log)
    console.print(f"[green]stopped[/green] in {time.monotonic() - began:.1f} s")


__all__ = ["SERVICES", "run", "stop"]
