"""The Borglet's cgroup v2 file I/O: finding a delegated subtree at start, one cgroup per process task.

Every read and write of the cgroup filesystem is here; what to write and how to read it is
:mod:`cellpilot.borg.cgroup_v2` (Borg §6.2: the Borglet "manipulates the container settings").

Layout: ``<parent>/cellpilot-borglet-<boot id>/<task>``, where ``<parent>`` is the
``CELLPILOT_BORGLET_CGROUP_ROOT`` directory or, by default, the Borglet's own cgroup. cgroup
v2 hands controllers to child cgroups only from a cgroup with no processes of its own, so
when the Borglet is the only process in its own cgroup (a delegated systemd unit, a
container whose entry point it is) it first moves itself into a leaf child
``cellpilot-borglet-self``; when other processes share it, it falls back to metering.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
from dataclasses import replace
from pathlib import Path

from cellpilot.borg.cgroup_v2 import (
    TASK_SETUP_FILES,
    CgroupDecision,
    CgroupMounts,
    CgroupProbe,
    CgroupUsage,
    cgroup_name,
    decide,
    describe_setup_error,
    enable_controllers_line,
    limit_files,
    own_cgroup_dir,
    own_cgroup_path,
    parse_controllers,
    parse_mountinfo,
    parse_usage,
)

log = logging.getLogger(__name__)

PROC_SELF = Path("/proc/self")
SELF_LEAF = "cellpilot-borglet-self"
USAGE_FILES = ("memory.current", "memory.peak", "cpu.stat", "memory.events")


class _SetupError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as error:
        code = error.errno or 0
        raise _SetupError(describe_setup_error(str(path), code, os.geteuid()), code) from error


def _mkdir(path: Path) -> None:
    try:
        path.mkdir(exist_ok=True)
    except OSError as error:
        code = error.errno or 0
        raise _SetupError(describe_setup_error(str(path), code, os.geteuid()), code) from error


def _enable_controllers(directory: Path) -> None:
    line = enable_controllers_line(parse_controllers(_read(directory / "cgroup.subtree_control") or ""))
    if line:
        _write(directory / "cgroup.subtree_control", line)


def _only_this_process(directory: Path) -> bool:
    pids = (_read(directory / "cgroup.procs") or "").split()
    return pids == [str(os.getpid())]


def probe(setting: str, proc: Path = PROC_SELF) -> CgroupProbe:
    """Gather the facts :func:`decide` needs: mounts, the parent directory, its controllers."""
    if setting == "none":
        return CgroupProbe(setting, CgroupMounts(), None, None, os.geteuid())
    mounts = parse_mountinfo(_read(proc / "mountinfo") or "")
    parent = setting or own_cgroup_dir(mounts, own_cgroup_path(_read(proc / "cgroup") or ""))
    if not setting and parent is not None and Path(parent).name == SELF_LEAF:
        parent = str(Path(parent).parent)  # an earlier Borglet in this process moved it there
    controllers = None
    if parent is not None:
        text = _read(Path(parent) / "cgroup.controllers")
        controllers = parse_controllers(text) if text is not None else None
    return CgroupProbe(setting, mounts, parent, controllers, os.geteuid())


class TaskCgroups:
    """The Borglet's own cgroup subtree, holding one child cgroup per process task."""

    def __init__(self, base: Path) -> None:
        self.base = base

    @classmethod
    def detect(
        cls, setting: str, boot_id: str, proc: Path = PROC_SELF
    ) -> tuple[TaskCgroups | None, CgroupDecision]:
        """The subtree if the host allows it (created now), and the decision with its reasons."""
        facts = probe(setting, proc)
        decision = decide(facts)
        if not decision.usable or decision.parent is None:
            return None, decision
        try:
            base = cls._create_subtree(Path(decision.parent), boot_id)
        except _SetupError as error:
            return None, decide(replace(facts, setup_error=str(error)))
        return cls(base), decision

    @staticmethod
    def _create_subtree(parent: Path, boot_id: str) -> Path:
        try:
            _enable_controllers(parent)
        except _SetupError as error:
            if error.code != errno.EBUSY or not _only_this_process(parent):
                raise
            leaf = parent / SELF_LEAF
            _mkdir(leaf)
            _write(leaf / "cgroup.procs", str(os.getpid()))
            log.info(
                "borglet moved itself into a leaf cgroup to delegate controllers", extra={"leaf": str(leaf)}
            )
            _enable_controllers(parent)
        base = parent / f"cellpilot-borglet-{boot_id}"
        _mkdir(base)
        _enable_controllers(base)
        return base

    def create(self, task_name: str, cpu_limit_millicores: int, memory_limit_bytes: int, hard: bool) -> Path:
        """A cgroup for one task with its limits written (raises OSError if it cannot be made)."""
        path = self.base / cgroup_name(task_name)
        path.mkdir(exist_ok=True)
        for name, value in TASK_SETUP_FILES:
            with contextlib.suppress(OSError):  # optional: older kernels, no swap accounting
                (path / name).write_text(value)
        try:
            self.set_limits(path, cpu_limit_millicores, memory_limit_bytes, hard)
        except OSError:
            self.remove(path)
            raise
        return path

    @staticmethod
    def set_limits(path: Path, cpu_limit_millicores: int, memory_limit_bytes: int, hard: bool) -> None:
        """Write memory.max and cpu.max (in place: a running task is not restarted, Borg §2.3)."""
        for name, value in limit_files(cpu_limit_millicores, memory_limit_bytes, hard):
            (path / name).write_text(value)

    @staticmethod
    def attach(path: Path, pid: int) -> None:
        (path / "cgroup.procs").write_text(str(pid))

    @staticmethod
    def read_usage(path: Path) -> CgroupUsage | None:
        """memory.current, memory.peak, cpu.stat and memory.events (None once the cgroup is gone)."""
        files = {name: text for name in USAGE_FILES if (text := _read(path / name)) is not None}
        if "memory.current" not in files:
            return None
        try:
            return parse_usage(files)
        except ValueError:
            return None

    @staticmethod
    def kill(path: Path) -> None:
        """SIGKILL every process in the cgroup (cgroup.kill; one by one on kernels before 5.14)."""
        if (path / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (path / "cgroup.kill").write_text("1")
                return
        for pid in (_read(path / "cgroup.procs") or "").split():
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid), signal.SIGKILL)

    @staticmethod
    def remove(path: Path) -> bool:
        """Remove a task cgroup; False only while processes are still leaving it (EBUSY)."""
        try:
            path.rmdir()
        except FileNotFoundError:
            return True
        except OSError as error:
            if error.errno == errno.EBUSY:
                return False
            log.warning("could not remove a task cgroup", extra={"cgroup": str(path), "error": str(error)})
        return True

    def close(self) -> None:
        """Remove the Borglet's subtree once its tasks are gone."""
        for child in self.base.iterdir() if self.base.is_dir() else ():
            if child.is_dir():
                self.remove(child)
        self.remove(self.base)
