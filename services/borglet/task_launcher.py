"""The first moments of a process task: join its cgroup, become the task account, run the command.

The Borglet starts ``python -I -S task_launcher.py FD`` with an empty environment and the
launch description (JSON) readable on file descriptor FD; this program moves itself into the task's
cgroup while it still has the Borglet's rights (so nothing the task starts is ever outside
it), drops to the task account (supplementary groups, group, user: real, effective and
saved), closes that descriptor and replaces itself with the task's command, whose environment
applies only from there on. Standard library only (it runs without site-packages).

Exit codes when the command never ran: 125 it could not join its cgroup or switch user,
126 the command could not be executed, 127 it does not exist.
"""

from __future__ import annotations

import json
import os
import sys


def _fail(code: int, message: str) -> int:
    sys.stderr.write(f"cellpilot task launcher: {message}\n")
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
        return _fail(125, f"cannot confine the task: {error}")
    argv = [spec["executable"], *spec["args"]]
    try:
        os.execve(spec["executable"], argv, spec["env"])
    except FileNotFoundError as error:
        return _fail(127, str(error))
    except (OSError, ValueError) as error:  # not executable, a NUL byte
        return _fail(126, str(error))
    return 0  # not reached: execve replaced this program


if __name__ == "__main__":
    sys.exit(main())
