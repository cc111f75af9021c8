"""As whom and with what environment a process task runs: the account choice, the environment,
the command lookup."""

from __future__ import annotations

from pathlib import Path

import pytest

from cellpilot_services.borglet.task_sandbox import (
    DEFAULT_TASK_USER,
    MINIMAL_PATH,
    check_exec_strings,
    choose_task_account,
    resolve_command,
    task_environment,
)


@pytest.mark.parametrize(
    ("euid", "configured", "name", "create", "words"),
    [
        (0, "", DEFAULT_TASK_USER, True, ["system user cellpilot-task", "unset"]),
        (0, "nobody", "nobody", False, ["the user nobody", "CELLPILOT_BORGLET_TASK_USER"]),
        (1000, "", "", False, ["own user alice (uid 1000)", "not root"]),
        (1000, "alice", "", False, ["own user alice"]),
    ],
    ids=["root-default-account", "root-configured-account", "not-root", "not-root-configured-as-itself"],
)
def test_task_account_choice(euid: int, configured: str, name: str, create: bool, words: list[str]) -> None:
    choice = choose_task_account(euid, "alice", configured)
    assert (choice.name, choice.create) == (name, create)
    for word in words:
        assert word in choice.reason


def test_a_borglet_that_is_not_root_refuses_another_task_user() -> None:
    with pytest.raises(ValueError, match=r"CELLPILOT_BORGLET_TASK_USER='bob'.*not root"):
        choose_task_account(1000, "alice", "bob")


def test_the_task_environment_holds_only_what_is_given() -> None:
    identity = {"CELLPILOT_TASK_JOB_ID": "u/j"}
    env = task_environment({}, {"GREETING": "hi"}, Path("/w/t"), identity)
    assert env == {"PATH": MINIMAL_PATH, "HOME": "/w/t", "GREETING": "hi", "CELLPILOT_TASK_JOB_ID": "u/j"}
    # The spec wins over the base environment and HOME; nobody overrides the task's identity.
    spec = {"PATH": "/opt/bin", "HOME": "/h", "CELLPILOT_TASK_JOB_ID": "spoofed"}
    env = task_environment({"PATH": "/usr/bin", "TZ": "UTC"}, spec, Path("/w/t"), identity)
    assert env == {"PATH": "/opt/bin", "TZ": "UTC", "HOME": "/h", "CELLPILOT_TASK_JOB_ID": "u/j"}


def test_commands_resolve_on_the_task_path_or_fail_to_start(tmp_path: Path) -> None:
    assert resolve_command("sh", MINIMAL_PATH, tmp_path) in {"/usr/bin/sh", "/bin/sh"}
    assert resolve_command("/bin/sh", "", tmp_path) == "/bin/sh"
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    assert resolve_command("./run.sh", "", tmp_path) == str(tmp_path / "run.sh")
    with pytest.raises(FileNotFoundError, match="not found on PATH"):
        resolve_command("no-such-command-here", MINIMAL_PATH, tmp_path)
    with pytest.raises(FileNotFoundError):
        resolve_command("/no/such/program", MINIMAL_PATH, tmp_path)


@pytest.mark.parametrize(
    ("argv", "env", "words"),
    [
        (["/bin/true", "a\0b"], {}, "embedded null byte"),
        (["/bin/true"], {"A\0B": "1"}, "embedded null byte"),
        (["/bin/true"], {"A": "1\0"}, "embedded null byte"),
        (["/bin/true"], {"A=B": "1"}, "illegal environment variable name"),
    ],
    ids=["nul-in-argument", "nul-in-name", "nul-in-value", "equals-in-name"],
)
def test_strings_exec_would_refuse_fail_the_start(argv: list[str], env: dict[str, str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        check_exec_strings(argv, env)
    check_exec_strings(["/bin/true", "x"], {"A": "1"})
