"""The OS accounts Cellpilot runs processes as, and creating a dedicated one when we are root.

Least privilege: a process that needs no root rights does not keep them. PostgreSQL refuses
to run as root, so the embedded stack runs it as a system account; a Borglet running as root
runs its process tasks as one (Borg §6.1 isolates tasks from each other and from the machine).
Both use :func:`system_account`, which creates the account on first use.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunAs:
    """The OS user a process runs as (uid None: the current user)."""

    uid: int | None = None
    gid: int | None = None
    name: str = ""

    def chown(self, path: Path) -> None:
        if self.uid is not None and self.gid is not None:
            os.chown(path, self.uid, self.gid)

    def allow_traversal_to(self, path: Path) -> list[Path]:
        """Let this user reach ``path``: add the others' execute (search) bit to each ancestor.

        Needed when we are root and the process runs as a system user, but the files it needs
        sit below a private directory (e.g. a 0700 temp dir, or a Python under /root). Only
        directory *search* is granted, never listing or reading. Returns the directories changed.
        """
        changed: list[Path] = []
        if self.uid is None:
            return changed
        for ancestor in path.resolve().parents:
            mode = ancestor.stat().st_mode
            if not mode & stat.S_IXOTH:
                ancestor.chmod(mode | stat.S_IXOTH)
                changed.append(ancestor)
        return changed

    def groups(self) -> list[int]:
        """The supplementary groups a process of this user gets (root's must not be kept)."""
        if self.gid is None:
            return []
        return os.getgrouplist(self.name, self.gid) if self.name else [self.gid]


def current_account() -> RunAs:
    """The user this process runs as, named (uid None: no switch is needed to run as it)."""
    try:
        name = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        name = str(os.geteuid())
    return RunAs(name=name)


def existing_account(name: str) -> RunAs:
    """An account that must already exist (KeyError naming it otherwise)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise KeyError(f"no such user: {name!r}") from None
    return RunAs(entry.pw_uid, entry.pw_gid, entry.pw_name)


def system_account(name: str) -> RunAs:
    """The system account ``name`` (no home, no login shell), created if it does not exist yet.

    Needs root to create it. Two processes creating it at once is fine: the loser of the race
    finds the account the winner made.
    """
    try:
        return existing_account(name)
    except KeyError:
        pass
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    try:
        subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as error:
        try:
            return existing_account(name)
        except KeyError:
            stderr = getattr(error, "stderr", b"") or b""
            detail = stderr.decode(errors="replace").strip() or str(error)
            raise RuntimeError(f"could not create the system user {name!r}: {detail}") from error
    return existing_account(name)
