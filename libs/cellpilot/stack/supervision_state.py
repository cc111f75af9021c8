"""``DATA_DIR/supervisor.json``: what ``cellpilot run`` supervises and the state of each process.

The supervisor (``cellpilot run``) rewrites this file whenever something changes: its own pid
(``cellpilot stop`` signals it), its phase, and for every embedded component and service
replica the pid, state, restarts, listening ports and how it last ended. ``cellpilot stack
status`` reads it. Files are replaced atomically, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import psutil

STATE_FILE = "supervisor.json"

# running: up; restarting: died, a restart is planned; gave-up: died too often, left down;
# stopped: not running and not going to be started (stopped on purpose, or its supervisor is gone).
UnitState = Literal["running", "restarting", "gave-up", "stopped"]
Phase = Literal["starting", "running", "stopping", "stopped"]


def write_json_atomically(path: Path, data: object) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary file and a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class UnitStatus:
    """One supervised process: an embedded component (replica 0) or a service replica."""

    kind: Literal["component", "service"]
    name: str
    replica: int
    pid: int | None
    state: UnitState
    restarts: int = 0
    ports: tuple[int, ...] = ()
    last_exit: str | None = None  # how it last ended, e.g. "killed by SIGKILL"
    restart_in_s: float | None = None  # while restarting: seconds until the next start

    @property
    def label(self) -> str:
        return self.name if self.kind == "component" else f"{self.name}[{self.replica}]"

    @property
    def port(self) -> int | None:
        """The main port (the lowest it listens on; a service's metrics port is its port + 1000)."""
        return self.ports[0] if self.ports else None

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "ports": list(self.ports), "port": self.port}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> UnitStatus:
        fields = {key: value for key, value in data.items() if key in cls.__dataclass_fields__}
        fields["ports"] = tuple(fields.get("ports") or ())  # type: ignore[arg-type]
        return cls(**fields)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SupervisorState:
    pid: int
    # The supervisor process's start time (psutil create_time): a recycled pid is not it.
    started_at: float
    phase: Phase
    units: tuple[UnitStatus, ...] = field(default_factory=tuple)

    def supervisor_alive(self) -> bool:
        """True while the ``cellpilot run`` that wrote this runs (not a zombie, not a new pid)."""
        try:
            process = psutil.Process(self.pid)
            return (
                abs(process.create_time() - self.started_at) < 0.5
                and process.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.NoSuchProcess:
            return False

    def save(self, data_dir: Path) -> None:
        write_json_atomically(
            data_dir / STATE_FILE,
            {
                "pid": self.pid,
                "started_at": self.started_at,
                "phase": self.phase,
                "units": [unit.as_dict() for unit in self.units],
            },
        )

    @classmethod
    def load(cls, data_dir: Path) -> SupervisorState | None:
        """The state in ``data_dir``, or None if there is none (or it is unreadable)."""
        path = data_dir / STATE_FILE
        try:
            data = json.loads(path.read_text())
            return cls(
                pid=int(data["pid"]),
                started_at=float(data["started_at"]),
                phase=data["phase"],
                units=tuple(UnitStatus.from_dict(unit) for unit in data["units"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
