"""`make test`'s Chromium step (infra/scripts/ensure_chromium.sh): silent when Chromium is there;
otherwise it installs it, or says in one line why it could not and leaves that line for the
browser tests to fail with."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "infra" / "scripts" / "ensure_chromium.sh"
TOOLS = ("bash", "id", "mkdir", "rm", "tee", "dirname", "env")


def run(tools: Path, artifacts: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(tools / "bash"), str(SCRIPT)],
        env={"PATH": str(tools), "CELLPILOT_ARTIFACTS_DIR": str(artifacts)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def toolbox(tmp_path: Path) -> Path:
    """A PATH with the shell tools the script uses and no browser, sudo or package manager."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (tools / tool).symlink_to(found)
    return tools


def test_without_a_way_to_install_it_says_why_in_one_line(tmp_path: Path) -> None:
    artifacts = tmp_path / "artifacts"
    answer = run(toolbox(tmp_path), artifacts)
    assert answer.returncode == 0  # the rest of the suite still runs
    lines = answer.stderr.strip().splitlines()
    assert len(lines) == 1, answer.stderr
    assert lines[0].startswith("Chromium is missing and could not be installed (")
    assert lines[0].endswith("the dashboard browser tests will fail.")
    assert (artifacts / "chromium-missing.txt").read_text().strip() == lines[0]


def test_with_chromium_on_the_path_it_does_nothing_and_clears_an_old_failure(tmp_path: Path) -> None:
    tools = toolbox(tmp_path)
    chromium = tools / "chromium"
    chromium.write_text("#!/bin/sh\n")
    chromium.chmod(0o755)
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    (artifacts / "chromium-missing.txt").write_text("from an earlier run\n")
    answer = run(tools, artifacts)
    assert answer.returncode == 0
    assert (answer.stdout, answer.stderr) == ("", "")
    assert not (artifacts / "chromium-missing.txt").exists()
