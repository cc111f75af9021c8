"""Driving docker-compose.yml from programs (the container tests, ``make bench BENCH=compose.``):
bring up, wait for health, fault containers (stop, kill, cut off the network), tear down.

Every operation goes through the Docker CLI (``docker compose`` when the v2 plugin exists,
else ``docker-compose``) with a timeout, so a stuck engine fails a test instead of hanging it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[3]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"
PROJECT = "cellpilot-test"
SERVICE_MODULE_PREFIX = "cellpilot_services."
PUBLISHED_PORTS = (7100, 7101, 7102, 7300, 7400, 7401, 8080)


class DockerError(RuntimeError):
    pass


def run(
    argv: Sequence[str], timeout_s: float = 120.0, check: bool = True, env: dict[str, str] | None = None
) -> str:
    try:
        done = subprocess.run(
            list(argv),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env={**os.environ, **(env or {})},
        )
    except subprocess.TimeoutExpired as error:
        raise DockerError(f"{' '.join(argv)} did not finish within {timeout_s:.0f} s") from error
    if check and done.returncode != 0:
        raise DockerError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        run(["docker", "info", "--format", "{{.ServerVersion}}"], timeout_s=20)
    except DockerError:
        return False
    return True


def compose_command() -> list[str]:
    try:
        run(["docker", "compose", "version"], timeout_s=20)
        return ["docker", "compose"]
    except DockerError:
        if shutil.which("docker-compose") is None:
            raise DockerError("neither `docker compose` nor `docker-compose` is installed") from None
        return ["docker-compose"]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


@dataclass
class ContainerState:
    service: str
    container_id: str
    status: str  # created, running, paused, restarting, exited, dead
    health: str  # healthy, unhealthy, starting, or "" without a health check
    exit_code: int
    restarts: int


@dataclass
class ComposeStack:
    """One compose project made from docker-compose.yml, named ``project``."""

    project: str = PROJECT
    env: dict[str, str] = field(default_factory=dict)
    command: list[str] = field(default_factory=compose_command)

    def compose(self, *args: str, timeout_s: float = 120.0, check: bool = True) -> str:
        argv = [*self.command, "-p", self.project, "-f", str(COMPOSE_FILE), *args]
        return run(argv, timeout_s=timeout_s, check=check, env=self.env)

    # ------------------------------------------------------------------ configuration

    def config(self) -> dict[str, object]:
        parsed = yaml.safe_load(self.compose("config"))
        assert isinstance(parsed, dict)
        return parsed

    def services_image(self) -> str:
        services = self.config()["services"]
        assert isinstance(services, dict)
        return str(services["borgmaster-0"]["image"])

    def modules_in_image(self, image: str, modules: Iterable[str]) -> dict[str, bool]:
        """Which ``cellpilot_services`` modules the services image contains."""
        names = sorted(set(modules))
        script = (
            "import importlib.util, json, sys; "
            "print(json.dumps({m: importlib.util.find_spec(m) is not None for m in sys.argv[1:]}))"
        )
        out = run(["docker", "run", "--rm", image, "python", "-c", script, *names], timeout_s=120)
        found = json.loads(out.strip().splitlines()[-1])
        return {name: bool(found[name]) for name in names}

    def runnable_services(self) -> tuple[list[str], dict[str, str]]:
        """Services whose module (and whose dependencies' modules) is in the image.

        Returns (services to start, {service left out: why}).
        """
        services = self.config()["services"]
        assert isinstance(services, dict)
        active = {name: spec for name, spec in services.items() if not spec.get("profiles")}
        modules = {}
        for name, spec in active.items():
            command = spec.get("command") or []
            if len(command) >= 3 and command[1] == "-m" and command[2].startswith(SERVICE_MODULE_PREFIX):
                modules[name] = command[2]
        present = self.modules_in_image(self.services_image(), modules.values()) if modules else {}
        missing: dict[str, str] = {
            name: f"module {module} is not in the services image" for name, module in modules.items()
            if not present[module]
        }  # fmt: skip
        changed = True
        while changed:  # a service whose dependency cannot start cannot start either
            changed = False
            for name, spec in active.items():
                deps = spec.get("depends_on") or {}
                blocked = [d for d in deps if d in missing]
                if name not in missing and blocked:
                    missing[name] = f"depends on {', '.join(blocked)}, which cannot start"
                    changed = True
        return [name for name in active if name not in missing], missing

    # ------------------------------------------------------------------ lifecycle

    def down(self) -> None:
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "10", timeout_s=180)

    def up(self, services: Sequence[str], timeout_s: float = 420.0) -> None:
        self.compose("up", "-d", "--no-build", *services, timeout_s=timeout_s)

    def volumes(self) -> list[str]:
        out = run(
            ["docker", "volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={self.project}"]
        )
        return out.split()

    def container_id(self, service: str) -> str:
        ids = self.compose("ps", "-q", service).split()
        if not ids:
            raise DockerError(f"no container for service {service} in project {self.project}")
        return ids[0]

    def states(self) -> dict[str, ContainerState]:
        ids = self.compose("ps", "-a", "-q").split()
        if not ids:
            return {}
        inspected = json.loads(run(["docker", "inspect", *ids]))
        result = {}
        for item in inspected:
            service = item["Config"]["Labels"].get("com.docker.compose.service", "")
            state = item["State"]
            result[service] = ContainerState(
                service=service,
                container_id=item["Id"],
                status=state["Status"],
                health=(state.get("Health") or {}).get("Status", ""),
                exit_code=int(state.get("ExitCode", 0)),
                restarts=int(item.get("RestartCount", 0)),
            )
        return result

    def logs(self, service: str, tail: int = 40) -> str:
        return self.compose("logs", "--no-color", "--tail", str(tail), service, check=False, timeout_s=60)

    def wait_healthy(self, services: Sequence[str], timeout_s: float = 300.0) -> float:
        """Wait until every service is healthy (or, for one-shot ones, exited 0); returns seconds.

        Fails early, with the container's log, when a container exits with an error or keeps
        restarting: waiting longer cannot help.
        """
        start = time.monotonic()
        deadline = start + timeout_s
        states: dict[str, ContainerState] = {}
        while time.monotonic() < deadline:
            states = self.states()
            pending = []
            for service in services:
                state = states.get(service)
                if state is None:
                    pending.append(service)
                elif state.status == "exited" and state.exit_code == 0 and not state.health:
                    continue  # a one-shot service that finished
                elif state.status in ("exited", "dead") or state.restarts >= 3:
                    raise DockerError(
                        f"{service} is {state.status} (exit {state.exit_code}, {state.restarts} restarts):\n"
                        + self.logs(service)
                    )
                elif state.health not in ("healthy", "") or state.status != "running":
                    pending.append(service)
            if not pending:
                return time.monotonic() - start
            time.sleep(1.0)
        summary = ", ".join(
            f"{s}={states[s].status}/{states[s].health or '-'}" if s in states else f"{s}=absent"
            for s in services
        )
        raise DockerError(f"not healthy within {timeout_s:.0f} s: {summary}")

    # ------------------------------------------------------------------ faults (Docker itself)

    def stop(self, service: str, timeout_s: int = 10) -> None:
        run(["docker", "stop", "-t", str(timeout_s), self.container_id(service)], timeout_s=timeout_s + 60)

    def kill(self, service: str) -> None:
        """SIGKILL the service's container (no clean shutdown; its restart policy does not apply)."""
        run(["docker", "kill", self.container_id(service)], timeout_s=60)

    def start(self, service: str) -> None:
        run(["docker", "start", self.container_id(service)])

    def pause(self, service: str) -> None:
        run(["docker", "pause", self.container_id(service)])

    def unpause(self, service: str) -> None:
        run(["docker", "unpause", self.container_id(service)])

    def exec(self, service: str, argv: Sequence[str], timeout_s: float = 120.0, check: bool = True) -> str:
        return run(["docker", "exec", self.container_id(service), *argv], timeout_s=timeout_s, check=check)

    def restart(self, service: str) -> None:
        run(["docker", "restart", "-t", "10", self.container_id(service)], timeout_s=120)

    def network(self) -> str:
        out = run(
            ["docker", "network", "ls", "-q", "--filter", f"label=com.docker.compose.project={self.project}"]
        )
        networks = out.split()
        if len(networks) != 1:
            raise DockerError(f"expected one network for {self.project}, found {networks}")
        return networks[0]

    def disconnect(self, service: str) -> None:
        run(["docker", "network", "disconnect", self.network(), self.container_id(service)])

    def connect(self, service: str) -> None:
        run(["docker", "network", "connect", "--alias", service, self.network(), self.container_id(service)])


def client_options(compose: ComposeStack, into: Path, user: str = "compose-client") -> dict[str, Any]:
    """What a client outside the stack needs: mTLS with the stack's ``client`` certificate and an
    admin user's bearer token. The CA, the certificate and the token secret are copied out of a
    running Borgmaster (its share of the certificates: each container mounts only its own)."""
    from cellpilot.security.identity import ADMIN
    from cellpilot.security.tls import SecuritySettings
    from cellpilot.security.tokens import load_signer

    shutil.rmtree(into, ignore_errors=True)
    into.parent.mkdir(parents=True, exist_ok=True)
    run(["docker", "cp", f"{compose.container_id('borgmaster-0')}:/certs", str(into)])
    token = load_signer(into).issue_for(user, kind="user", capabilities=[ADMIN], ttl_s=3600)
    return SecuritySettings(tls_mode="mtls", certs_dir=into, token=token).client_options()
