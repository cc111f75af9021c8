"""Local processes of a stack: how one ended, and how a set of them is stopped without leftovers.

A :class:`ProcessHandle` is a process this program started (its ``Popen``: polling it reaps the
child, so no zombie is left, and tells the exit code or signal) or one it found by pid (started
by an earlier program; a zombie of it counts as gone, and how it ended is unknown).

:func:`stop_processes` is the one way processes of a stack are stopped: the clean-stop signal
to each (to its whole process group where asked), a short grace period, then SIGKILL to each
process group and every descendant seen before the stop, and every child reaped.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil

POLL_INTERVAL_S = 0.05
REAP_AFTER_KILL_S = 3.0


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended: an exit code, a signal, or unknown (a process we did not start)."""

    code: int | None = None
    signal: int | None = None

    @classmethod
    def from_returncode(cls, returncode: int) -> ExitStatus:
        return cls(signal=-returncode) if returncode < 0 else cls(code=returncode)

    def describe(self) -> str:
        if self.signal is not None:
            with contextlib.suppress(ValueError):
                return f"killed by {signal.Signals(self.signal).name}"
            return f"killed by signal {self.signal}"
        if self.code is not None:
            return f"exit code {self.code}"
        return "exit status unknown (not started by this supervisor)"


class ProcessHandle:
    """One process of the stack, started here (``popen``) or found by pid."""

    def __init__(self, pid: int, popen: subprocess.Popen[bytes] | None = None) -> None:
        self.pid = pid
        self._popen = popen
        self._found: psutil.Process | None = None
        self._exit: ExitStatus | None = None
        if popen is None:
            try:
                self._found = psutil.Process(pid)
            except psutil.NoSuchProcess:
                self._exit = ExitStatus()

    @classmethod
    def started(cls, popen: subprocess.Popen[bytes]) -> ProcessHandle:
        return cls(popen.pid, popen)

    @property
    def is_child(self) -> bool:
        return self._popen is not None

    def poll(self) -> ExitStatus | None:
        """None while the process runs; how it ended once it has (a child is reaped here)."""
        if self._exit is not None:
            return self._exit
        if self._popen is not None:
            returncode = self._popen.poll()
            if returncode is not None:
                self._exit = ExitStatus.from_returncode(returncode)
        elif self._found is not None and not process_alive(self._found):
            self._exit = ExitStatus()
        return self._exit

    def send(self, sig: int, group: bool = False) -> None:
        """``sig`` to the process, or to its process group (each stack process leads its own)."""
        if self.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group and os.getpgid(self.pid) == self.pid:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)

    def descendants(self) -> list[psutil.Process]:
        if self.poll() is not None:
            return []
        try:
            return list(psutil.Process(self.pid).children(recursive=True))
        except psutil.NoSuchProcess:
            return []


def process_alive(process: psutil.Process) -> bool:
    """True while ``process`` (the same one: pid and start time) runs; a zombie is not running."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def pid_alive(pid: int) -> bool:
    try:
        return process_alive(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False


def listening_ports(pid: int) -> list[int]:
    """The TCP ports ``pid`` listens on, lowest first (empty if it is gone or not ours to inspect)."""
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []
    return sorted({c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN and c.laddr})


def listens(pid: int, host: str, port: int) -> bool:
    """Whether process ``pid`` itself listens on ``port``: another process's server there (say
    another stack given the same port) is not ours, and our clients must not be sent to it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        if sock.connect_ex((host, port)) != 0:
            return False
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.AccessDenied:
        return True  # not ours to inspect: the port answering is all we can know
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in connections)


@dataclass(frozen=True)
class StopRequest:
    """One process to stop: its handle, its clean-stop signal, whether to signal its whole group."""

    name: str
    handle: ProcessHandle
    stop_signal: int = signal.SIGTERM
    group: bool = True


def stop_processes(
    requests: Iterable[StopRequest], grace_s: float, log: Callable[[str], None] = lambda _: None
) -> dict[str, ExitStatus]:
    """Stop every process: clean signal, wait ``grace_s``, then SIGKILL what is left; reap all."""
    pending = [r for r in requests if r.handle.poll() is None]
    # Descendants seen now are killed too if still there after the grace period (a process
    # that left its group, e.g. a task a Borglet started in its own session).
    descendants = {r.name: r.handle.descendants() for r in pending}
    for request in pending:
        request.handle.send(request.stop_signal, group=request.group)
    ended: dict[str, ExitStatus] = {}
    deadline = time.monotonic() + grace_s
    while pending and time.monotonic() < deadline:
        pending = _without_ended(pending, ended)
        if pending:
            time.sleep(POLL_INTERVAL_S)
    for request in pending:
        log(f"{request.name}: still running after {grace_s:.0f} s; SIGKILL (pid {request.handle.pid})")
        request.handle.send(signal.SIGKILL, group=True)
        request.handle.send(signal.SIGKILL)
    kill_deadline = time.monotonic() + REAP_AFTER_KILL_S
    while pending and time.monotonic() < kill_deadline:
        pending = _without_ended(pending, ended)
        if pending:
            time.sleep(POLL_INTERVAL_S)
    for leftovers in descendants.values():
        for process in leftovers:
            if process_alive(process):
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
    return ended


def _without_ended(pending: list[StopRequest], ended: dict[str, ExitStatus]) -> list[StopRequest]:
    still = []
    for request in pending:
        status = request.handle.poll()
        if status is None:
            still.append(request)
        else:
            ended[request.name] = status
    return still
