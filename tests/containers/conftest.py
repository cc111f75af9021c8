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

import pytest
from compose_stack import (
    PUBLISHED_PORTS,
    ComposeStack,
    DockerError,
    RunningStack,
    docker_answers,
    port_in_use,
    run,
)

from cellpilot.client import CellpilotClient
from cellpilot.client.failover import RetryPolicy

BORGMASTERS = ["127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.1:7102"]
AUTOPILOTS = ["127.0.0.1:7400", "127.0.0.1:7401"]
MONITORING = ["127.0.0.1:7300"]

# Event time runs this many times faster than the wall clock in the Borglets, so 5-minute
# usage windows close every few seconds (override with CELLPILOT_SPEEDUP).
TEST_ENV = {
    "CELLPILOT_SPEEDUP": os.environ.get("CELLPILOT_SPEEDUP", "60"),
    "CELLPILOT_BORGLET_FLEET_SIZE": os.environ.get("CELLPILOT_BORGLET_FLEET_SIZE", "4"),
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
    busy = [port for port in PUBLISHED_PORTS if port_in_use(port)]
    if busy:
        pytest.fail(f"ports {busy} on 127.0.0.1 are in use: stop whatever runs there (another stack?)")
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


async def _master_first() -> list[str]:
    """The published Borgmaster ports, the elected master's first.

    A follower names the master by its compose host name (borgmaster-<i>), which only the
    compose network resolves; from the host its published port is 127.0.0.1:710<i>.
    """
    async with CellpilotClient(BORGMASTERS, policy=RetryPolicy(budget_s=30.0)) as probe:
        leader = (await probe.borgmaster.get_leader()).leader.replica_id
    index = int(leader.rsplit("-", 1)[-1]) if leader.startswith("borgmaster-") else 0
    return [BORGMASTERS[index], *(a for i, a in enumerate(BORGMASTERS) if i != index)]


@pytest.fixture
async def client(stack: RunningStack) -> AsyncIterator[CellpilotClient]:
    policy = RetryPolicy(budget_s=45.0, max_backoff_s=1.0, call_timeout_s=5.0)
    async with CellpilotClient(await _master_first(), AUTOPILOTS, MONITORING, policy=policy) as client:
        yield client
