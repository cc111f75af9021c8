"""``docker compose config`` of the repository's compose files, for the tests that check them.

The Compose here: the v2 plugin (``docker compose``) if it answers, else ``docker-compose``
1.29; none, and the tests that need one skip. The registry path: never the ``.env`` that ``make
images`` writes for the offline one (an empty env file instead).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
KAFKA_HA_FILE = REPO_ROOT / "docker-compose.kafka-ha.yml"


def compose_commands() -> list[list[str]]:
    found = []
    if (
        shutil.which("docker")
        and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    ):
        found.append(["docker", "compose"])
    if shutil.which("docker-compose"):
        found.append(["docker-compose"])
    return found


def compose_config(command: list[str], files: list[Path], project: str) -> dict[str, Any]:
    """The resolved configuration of ``files`` (later ones override earlier ones)."""
    with tempfile.NamedTemporaryFile("w", suffix=".env") as no_env:
        selected = [arg for path in files for arg in ("-f", str(path))]
        done = subprocess.run(
            [*command, *selected, "--env-file", no_env.name, "-p", project, "config"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    return dict(yaml.safe_load(done.stdout))


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """target -> source volume of a service's named-volume mounts."""
    out = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source, target = volume.split(":")[:2]
        else:
            source, target = volume.get("source", ""), volume["target"]
        out[target] = source
    return out
