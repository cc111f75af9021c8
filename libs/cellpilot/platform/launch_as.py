"""Start a program as another account (and inside a cgroup) through a small launcher.

Two callers need a child that runs as another user: the Borglet's process tasks (Borg §6.1:
tasks are isolated from each other and from the machine) and the embedded stack's servers when
the stack runs as root (PostgreSQL refuses to run as root; each service gets its own account).
Letting ``subprocess`` switch the user itself is unsafe in a process that has gRPC threads:
CPython only uses ``vfork`` when no user, group or groups change is asked for, and otherwise
``fork`` runs gRPC's at-fork handlers in the child, which can crash it (SIGSEGV) before it ever
executes the program. So the parent starts ``python -I -S launch_as.py FD`` (vfork-safe: no
credentials change, an empty environment) with the launch description (JSON) readable on file
descriptor FD; the launcher moves itself into the cgroup while it still has the parent's
rights (so nothing the program starts is ever outside it), drops to the account
(supplementary groups, group, user: real, effective and saved), closes that descriptor and
replaces itself with the program, whose environment applies only from there on. Standard
library only (it runs without site-packages).

Exit codes when the program never ran: 125 it could not join its cgroup or switch user,
126 the program could not be executed, 127 it does not exist.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

LAUNCHER = os.path.abspath(__file__)


def launch_spec(
    executable: str,
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    uid: int | None = None,
    gid: int | None = None,
    groups: Sequence[int] = (),
    cgroup: str = "",
    argv0: str | None = None,
) -> dict[str, Any]:
    """What the launcher does: ``argv0`` (default ``executable``) is the program's argv[0]."""
    return {
        "executable": executable,
        "argv0": argv0 or executable,
        "args": list(args),
        "env": dict(env),
        "cgroup": cgroup,
        "uid": uid,
        "gid": gid,
        "groups": list(groups),
    }


def launcher_argv(fd: int) -> list[str]:
    return [sys.executable, "-I", "-S", LAUNCHER, str(fd)]


def write_spec(fd: int, spec: Mapping[str, Any]) -> None:
    """Hand the description to a started launcher and close our end of the pipe."""
    try:
        pending = memoryview(json.dumps(spec).encode())
        with contextlib.suppress(BrokenPipeError):  # it died at once: its exit code says so
            while pending:
                pending = pending[os.write(fd, pending) :]
    finally:
        os.close(fd)


def popen_as(spec: Mapping[str, Any], **popen_options: Any) -> subprocess.Popen[bytes]:
    """Start the launcher for ``spec`` (``popen_options``: cwd, stdout, start_new_session…;
    never user/group/env, which the launcher applies)."""
    spec_read, spec_write = os.pipe()
    try:
        try:
            process = subprocess.Popen(
                launcher_argv(spec_read), env={}, pass_fds=(spec_read,), **popen_options
            )
        finally:
            os.close(spec_read)
    except BaseException:
        os.close(spec_write)
        raise
    write_spec(spec_write, spec)
    return process


def start_as(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    uid: int | None,
    gid: int | None,
    groups: Sequence[int] = (),
    executable: str | None = None,
    **popen_options: Any,
) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, env=env, **popen_options)`` as the account ``uid``/``gid`` with
    supplementary ``groups`` (uid None: as ourselves, directly). ``executable`` replaces
    ``argv[0]`` as the program run, like Popen's; a bare name is looked up on ``env``'s PATH."""
    if uid is None:
        return subprocess.Popen(list(argv), executable=executable, env=dict(env), **popen_options)
    program = executable or argv[0]
    resolved = shutil.which(program, path=env.get("PATH")) if os.sep not in program else program
    if resolved is None:
        raise FileNotFoundError(f"no such program on PATH: {program!r}")
    spec = launch_spec(resolved, argv[1:], env, uid=uid, gid=gid, groups=groups, argv0=argv[0])
    return popen_as(spec, **popen_options)


def _fail(code: int, message: str) -> int:
    sys.stderr.write(f"cellpilot launcher: {message}\n")
    sys.stderr.flush()
    return code


def main() -> int:
    with os.fdopen(int(sys.argv[1]), "rb") as stream:
        spec = json.loads(stream.read())
    try:
        if spec.get("cgroup"):
            with open(os.path.join(spec["cgroup"], "cgroup.procs"), "w") as procs:
                procs.write(str(os.getpid()))
        if spec.get("uid") is not None:
            os.setgroups(spec["groups"])
            os.setresgid(spec["gid"], spec["gid"], spec["gid"])
            os.setresuid(spec["uid"], spec["uid"], spec["uid"])
    except OSError as error:
        return _fail(125, f"cannot confine the program: {error}")
    argv = [spec.get("argv0") or spec["executable"], *spec["args"]]
    try:
        os.execve(spec["executable"], argv, spec["env"])
    except FileNotFoundError as error:
        return _fail(127, str(error))
    except (OSError, ValueError) as error:  # not executable, a NUL byte
        return _fail(126, str(error))
    return 0  # not reached: execve replaced this program


if __name__ == "__main__":
    sys.exit(main())
