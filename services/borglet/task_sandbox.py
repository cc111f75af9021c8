"""As whom, where and with what environment a process task runs.

Borg §6.1 isolates tasks from each other and from the machine. Here the first line of that is
least privilege: a Borglet running as root runs its process tasks as an unprivileged account
(``CELLPILOT_BORGLET_TASK_USER``, or the system user ``cellpilot-task``, created on first use
like the embedded stack's PostgreSQL account); a Borglet that is not root runs them as its
own user. Each task gets a working directory of its own, owned by that account and private
to it, as its current directory and ``HOME``, and an environment holding only what its spec
gives plus a minimal ``PATH`` and ``HOME`` and the task's identity (``CELLPILOT_TASK_*``).
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cellpilot.platform.system_accounts import RunAs, current_account, existing_account, system_account

DEFAULT_TASK_USER = "cellpilot-task"
MINIMAL_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class AccountChoice:
    """Which account process tasks run as ("" = the Borglet's own) and why, in words."""

    name: str
    create: bool  # create the account if it does not exist
    reason: str


def choose_task_account(euid: int, own_name: str, configured: str) -> AccountChoice:
    """The account for process tasks, given who the Borglet is and the setting (ValueError if impossible)."""
    if euid != 0:
        if configured and configured != own_name:
            raise ValueError(
                f"CELLPILOT_BORGLET_TASK_USER={configured!r}: the Borglet runs as {own_name} (uid {euid}), "
                "not root, so it cannot run tasks as another user"
            )
        return AccountChoice(
            "",
            False,
            f"the Borglet's own user {own_name} (uid {euid}): it is not root, so it cannot switch users",
        )
    if configured:
        return AccountChoice(configured, False, f"the user {configured} (CELLPILOT_BORGLET_TASK_USER)")
    return AccountChoice(
        DEFAULT_TASK_USER, True, f"the system user {DEFAULT_TASK_USER} (CELLPILOT_BORGLET_TASK_USER is unset)"
    )


def task_account(configured: str) -> tuple[RunAs, str]:
    """The account process tasks run as, created if it is the default one, and a line saying so."""
    own = current_account()
    choice = choose_task_account(os.geteuid(), own.name, configured)
    if not choice.name:
        return own, choice.reason
    try:
        account = system_account(choice.name) if choice.create else existing_account(choice.name)
    except KeyError:
        raise ValueError(
            f"CELLPILOT_BORGLET_TASK_USER={configured!r}: no such user on this machine"
        ) from None
    if account.uid == 0:
        raise ValueError(f"CELLPILOT_BORGLET_TASK_USER={configured!r}: tasks must not run as root (uid 0)")
    return account, f"{choice.reason}, uid {account.uid}"


def make_interpreter_reachable(account: RunAs) -> list[Path]:
    """Let the task account run this Python, so the bundled workload program runs as that account.

    Only directory search permission on the ancestors of the interpreter and of the installed
    packages (as the embedded stack does for PostgreSQL); returns the directories changed.
    """
    changed: list[Path] = []
    for path in (Path(sys.executable), Path(sys.prefix) / "pyvenv.cfg", Path(__file__)):
        if path.exists():
            changed += account.allow_traversal_to(path)
    return changed


def make_working_dir(path: Path, account: RunAs) -> None:
    """The task's own directory: created, owned by the task account, private to it (0700)."""
    path.mkdir(parents=True, exist_ok=True)
    account.chown(path)
    path.chmod(0o700)
    account.allow_traversal_to(path)


def task_environment(
    base_env: Mapping[str, str], spec_env: Mapping[str, str], home: Path, identity: Mapping[str, str]
) -> dict[str, str]:
    """A minimal PATH, the operator's base environment, HOME, the spec's variables, the task's identity.

    Nothing is inherited from the Borglet's own environment.
    """
    return {"PATH": MINIMAL_PATH, **base_env, "HOME": str(home), **spec_env, **identity}


def resolve_command(command: str, path_env: str, cwd: Path) -> str:
    """The executable a command names: a path (relative to the task's directory) or a PATH lookup.

    Raises FileNotFoundError, so a missing command fails the start as it always has.
    """
    if "/" in command:
        candidate = cwd / command
        if not candidate.exists():
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
        return str(candidate)
    found = shutil.which(command, path=path_env)
    if found is None:
        raise FileNotFoundError(errno.ENOENT, f"not found on PATH {path_env!r}", command)
    return found


def check_exec_strings(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Refuse what exec would (ValueError): a NUL byte anywhere, an empty or '='-holding name.

    Checked before the launcher starts, so such a task fails to start rather than exiting later.
    """
    for text in (*argv, *env, *env.values()):
        if "\0" in text:
            raise ValueError(f"embedded null byte in {text!r}")
    for name in env:
        if not name or "=" in name:
            raise ValueError(f"illegal environment variable name {name!r}")
