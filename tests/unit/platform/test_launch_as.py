"""The launcher that starts a program as another account (cellpilot.platform.launch_as)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from cellpilot.platform import launch_as
from cellpilot.platform.launch_as import launch_spec, popen_as, start_as
from cellpilot.platform.system_accounts import system_account

PRINT_IDS = (
    "import os, sys; "
    "print(os.getuid(), os.getgid(), sorted(os.getgroups()), sys.argv[1:], os.environ.get('X'))"
)


def run(process: subprocess.Popen[bytes]) -> tuple[int, str]:
    out, _ = process.communicate(timeout=60)
    return process.returncode, out.decode().strip()


def test_as_ourselves_it_runs_the_program_directly() -> None:
    code, out = run(
        start_as(
            [sys.executable, "-c", PRINT_IDS, "a"], env={"X": "y"}, uid=None, gid=None, stdout=subprocess.PIPE
        )
    )
    assert code == 0
    assert out.endswith("['a'] y")
    assert out.startswith(f"{os.getuid()} {os.getgid()}")


def test_a_program_run_as_another_account_never_asks_popen_to_switch_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CPython forks (running gRPC's at-fork handlers in the child) instead of vforking as soon
    as Popen is asked for a user, group or groups: the launcher does the switch instead."""
    seen: list[dict[str, Any]] = []
    real = subprocess.Popen

    def recording(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(launch_as.subprocess, "Popen", recording)
    spec = launch_spec(
        sys.executable, ["-c", "pass"], {}, uid=os.getuid(), gid=os.getgid(), groups=os.getgroups()
    )
    assert run(popen_as(spec, stdout=subprocess.PIPE))[0] == 0
    assert seen
    assert not {"user", "group", "extra_groups", "preexec_fn"} & set(seen[0])


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can start a program as another account")
def test_as_root_it_runs_the_program_as_the_account_with_only_its_groups() -> None:
    account = system_account("cellpilot-launch-test")
    groups = account.groups()
    code, out = run(
        start_as(
            [
                "renamed-sh",
                "-c",
                'echo "$(id -u) $(id -g) $(id -G) $(head -c 10 /proc/$$/cmdline) $0 $X"',
                "b",
            ],
            executable="/bin/sh",
            env={"X": "z", "PATH": "/usr/bin:/bin"},
            uid=account.uid,
            gid=account.gid,
            groups=groups,
            stdout=subprocess.PIPE,
        )
    )
    assert code == 0, out
    uid, gid, *rest = out.split()
    assert (int(uid), int(gid)) == (account.uid, account.gid)
    assert sorted(int(g) for g in rest[:-3]) == sorted({account.gid, *groups})
    assert rest[-3:] == ["renamed-sh", "b", "z"]


def test_a_missing_program_exits_127_and_says_so() -> None:
    spec = launch_spec(
        "/nonexistent/program", [], {}, uid=os.getuid(), gid=os.getgid(), groups=os.getgroups()
    )
    process = popen_as(spec, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    code, out = run(process)
    assert code == 127
    assert "cellpilot launcher" in out


def test_a_bare_name_is_looked_up_on_the_given_path_and_a_missing_one_is_refused() -> None:
    with pytest.raises(FileNotFoundError, match="nonexistent-program"):
        start_as(["nonexistent-program"], env={"PATH": "/usr/bin"}, uid=os.getuid(), gid=os.getgid())
    code, out = run(
        start_as(
            ["echo", "hi"],
            env={"PATH": "/usr/bin:/bin"},
            uid=os.getuid(),
            gid=os.getgid(),
            stdout=subprocess.PIPE,
        )
    )
    assert (code, out) == (0, "hi")
