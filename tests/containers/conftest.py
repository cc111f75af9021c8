"""The compose stack for tests/containers: brought up once from clean, torn down with its volumes.

Services whose module is not in the services image yet (or that depend on such a service)
are left out of the bring-up; a test that needs one fails at once, naming it, instead of
waiting for a container that can never become healthy.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from compose_stack import RunningStack

from cellpilot.client import CellpilotClient
from cellpilot.client.failover import RetryPolicy
from cellpilot.stack.compose_project import (
    PUBLISHED_PORTS,
    ComposeStack,
    DockerError,
    docker_answers,
    port_in_use,
    run,
)
from cellpilot.stack.compose_project import client_options as compose_client_options


def _publish_host() -> str:
    """127.0.0.1, or 127.0.0.2 when a local stack (`make run`) already holds the ports there."""
    if "CELLPILOT_PUBLISH_HOST" in os.environ:
        return os.environ["CELLPILOT_PUBLISH_HOST"]
    if any(port_in_use(port) for port in PUBLISHED_PORTS) and not any(
        port_in_use(port, "127.0.0.2") for port in PUBLISHED_PORTS
    ):
        return "127.0.0.2"
    return "127.0.0.1"


PUBLISH_HOST = _publish_host()
BORGMASTERS = [f"{PUBLISH_HOST}:{port}" for port in (7100, 7101, 7102)]
AUTOPILOTS = [f"{PUBLISH_HOST}:{port}" for port in (7400, 7401)]
MONITORING = [f"{PUBLISH_HOST}:7300"]

# Event time runs this many times faster than the wall clock in the Borglets, so 5-minute
# usage windows close every few seconds (override with CELLPILOT_SPEEDUP).
TEST_ENV = {
    "CELLPILOT_SPEEDUP": os.environ.get("CELLPILOT_SPEEDUP", "60"),
    "CELLPILOT_BORGLET_FLEET_SIZE": os.environ.get("CELLPILOT_BORGLET_FLEET_SIZE", "4"),
    "CELLPILOT_PUBLISH_HOST": PUBLISH_HOST,
}


def _report(config: pytest.Config, line: str) -> None:
    """Print past pytest's output capture (the timing is the point of the line)."""
    capture = config.pluginmanager.get_plugin("capturemanager")
    if capture is None:
        print(line, flush=True)
        return
    with capture.global_and_fixture_disabled():
        print(f"\n{line}", flush=True)


@pytest.fixture(scope="session")
def stack(request: pytest.FixtureRequest, artifacts_dir: Path) -> Iterator[RunningStack]:
    if not docker_answers():
        pytest.skip("no Docker engine answers `docker info`")
    compose = ComposeStack(env=TEST_ENV)
    image = compose.services_image()
    try:
        run(["docker", "image", "inspect", image], timeout_s=30)
    except DockerError:
        pytest.fail(f"image {image} not found: run `make images` (offline) or `docker compose build`")
    compose.down()  # from clean: no containers, no volumes left from an earlier run
    busy = [port for port in PUBLISHED_PORTS if port_in_use(port, PUBLISH_HOST)]
    if busy:
        pytest.fail(f"ports {busy} on {PUBLISH_HOST} are in use: stop whatever runs there (another stack?)")
    started, missing = compose.runnable_services()
    for service, why in missing.items():
        _report(request.config, f"containers: not starting {service}: {why}")
    begin = time.monotonic()
    try:
        compose.up(started)
        compose.wait_healthy(started)
    except DockerError as error:
        states = compose.states().items()
        unwell = [s for s, st in states if st.health == "unhealthy" or st.status != "running"]
        logs = "\n".join(f"--- {s}:\n{compose.logs(s, tail=15)}" for s in unwell if s != "kafka-topics")
        compose.down()
        pytest.fail(f"the stack did not come up: {error}\n{logs}", pytrace=False)
    elapsed = time.monotonic() - begin
    _report(request.config, f"containers: clean -> healthy in {elapsed:.1f} s ({len(started)} containers)")
    (artifacts_dir / "containers-timing.json").write_text(
        json.dumps({"clean_to_healthy_s": round(elapsed, 1), "containers": started, "missing": missing})
        + "\n"
    )
    try:
        yield RunningStack(compose, started, missing, elapsed)
    finally:
        compose.down()
        left = compose.volumes()
        _report(request.config, f"containers: torn down, volumes left: {left or 'none'}")


@pytest.fixture(scope="session")
def client_options(stack: RunningStack, artifacts_dir: Path) -> dict[str, Any]:
    """mTLS with the stack's `client` certificate and an admin user's bearer token."""
    return compose_client_options(stack.compose, artifacts_dir / "containers-certs", "container-tests")


async def _master_first(options: dict[str, Any]) -> list[str]:
    """The published Borgmaster ports, the elected master's first.

    A follower names the master by its compose host name (borgmaster-<i>), which only the
    compose network resolves; from the host its published port is 127.0.0.1:710<i>.
    """
    async with CellpilotClient(BORGMASTERS, policy=RetryPolicy(budget_s=30.0), **options) as probe:
        leader = (await probe.borgmaster.get_leader()).leader.replica_id
    index = int(leader.rsplit("-", 1)[-1]) if leader.startswith("borgmaster-") else 0
    return [BORGMASTERS[index], *(a for i, a in enumerate(BORGMASTERS) if i != index)]


@pytest.fixture
async def client(stack: RunningStack, client_options: dict[str, Any]) -> AsyncIterator[CellpilotClient]:
    policy = RetryPolicy(budget_s=45.0, max_backoff_s=1.0, call_timeout_s=5.0)
    first = await _master_first(client_options)
    async with CellpilotClient(first, AUTOPILOTS, MONITORING, policy=policy, **client_options) as client:
        yield client
