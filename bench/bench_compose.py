"""The compose stack's replicated stores, failed over under load (docker-compose.yml).

Brings the compose stack up from clean (project ``cellpilot-bench``; needs a Docker engine and
the images of ``make images``), then runs each scenario of :mod:`cellpilot.stack.store_failovers`
once while SubmitJob requests stream in through the published Borgmaster ports, and tears the
stack down with its volumes:

* ``compose.pg_failover_write_gap_s``: the PostgreSQL primary killed -> the next acknowledged
  submit (goal <= 15 s); ``compose.pg_failover_acked_lost``: acknowledged jobs missing after it;
* ``compose.pg_partition_write_gap_s``, ``compose.pg_partition_acked_lost`` and
  ``compose.pg_partition_two_primaries_s``: the same with the primary cut off the network
  (``docker network disconnect``), and how long both members ran as primaries;
* ``compose.redis_failover_autopilot_gap_s``: the Redis master killed -> the Autopilot lease
  held again on the promoted master; ``compose.fencing_token_decreases``: times the Autopilot
  fencing token went backwards across it (must be 0);
* ``compose.master_and_pg_kill_write_gap_s`` and ``compose.master_and_pg_kill_acked_lost``: the
  elected Borgmaster and the PostgreSQL primary killed at the same moment;
* ``compose.clean_to_healthy_s``: ``up`` from clean volumes until every container is healthy.

Its smoke size is run by the container tests (tests/containers/test_store_failovers.py, on the
stack they already run), not by ``make test``: a fresh checkout has no images.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from pathlib import Path

from bench.harness import FULL, SMOKE, Report
from cellpilot.client import CellpilotClient
from cellpilot.client.failover import RetryPolicy
from cellpilot.stack import compose_project, store_failovers
from cellpilot.stack.compose_project import ComposeStack, DockerError, client_options, docker_answers
from cellpilot.stack.store_failovers import RedisFailover, StoreFailover

FIGURES = [
    "compose.pg_failover_write_gap_s",
    "compose.pg_failover_acked_lost",
    "compose.pg_partition_write_gap_s",
    "compose.pg_partition_acked_lost",
    "compose.pg_partition_two_primaries_s",
    "compose.redis_failover_autopilot_gap_s",
    "compose.fencing_token_decreases",
    "compose.master_and_pg_kill_write_gap_s",
    "compose.master_and_pg_kill_acked_lost",
    "compose.clean_to_healthy_s",
]
# One round of each scenario at either size: a failover takes what it takes.
SIZES = {FULL: 1, SMOKE: 1}
# The smoke run needs what `make test` does not have (tests/bench/test_benchmarks_smoke.py).
NEEDS_COMPOSE_IMAGES = True
PROJECT = "cellpilot-bench"


def report_outcomes(
    report: Report,
    pg_kill: StoreFailover,
    pg_cut: StoreFailover,
    redis: RedisFailover,
    both: StoreFailover,
    clean_to_healthy_s: float,
) -> None:
    """The scenarios' outcomes as this benchmark's figures."""
    report("compose.pg_failover_write_gap_s", pg_kill.write_gap_s, "s")
    report("compose.pg_failover_acked_lost", float(len(pg_kill.lost)), "jobs")
    report("compose.pg_partition_write_gap_s", pg_cut.write_gap_s, "s")
    report("compose.pg_partition_acked_lost", float(len(pg_cut.lost)), "jobs")
    report("compose.pg_partition_two_primaries_s", pg_cut.two_primaries_s, "s")
    report("compose.redis_failover_autopilot_gap_s", redis.autopilot_gap_s, "s")
    report("compose.fencing_token_decreases", float(redis.token_decreases), "count")
    report("compose.master_and_pg_kill_write_gap_s", both.write_gap_s, "s")
    report("compose.master_and_pg_kill_acked_lost", float(len(both.lost)), "jobs")
    report("compose.clean_to_healthy_s", clean_to_healthy_s, "s")


async def _scenarios(compose: ComposeStack, options: dict[str, object], report: Report, up_s: float) -> None:
    publish = compose.env["CELLPILOT_PUBLISH_HOST"]
    borgmasters = [f"{publish}:{port}" for port in (7100, 7101, 7102)]
    policy = RetryPolicy(budget_s=60.0, max_backoff_s=1.0, call_timeout_s=5.0)
    async with CellpilotClient(borgmasters, policy=policy, **options) as client:  # type: ignore[arg-type]
        user = f"bench{uuid.uuid4().hex[:6]}"
        await store_failovers.grant_quota(client, user)
        pg_kill = await store_failovers.kill_postgres_primary(compose, client, user)
        pg_cut = await store_failovers.partition_postgres_primary(compose, client, user)
        redis = await store_failovers.kill_redis_master(compose)
        both = await store_failovers.kill_master_and_postgres_primary(compose, client, user)
    report_outcomes(report, pg_kill, pg_cut, redis, both, up_s)


def run(report: Report, size: str = FULL) -> None:
    if not docker_answers():
        raise RuntimeError("no Docker engine answers `docker info`: the compose benchmark needs one")
    env = {
        "CELLPILOT_PUBLISH_HOST": os.environ.get("CELLPILOT_PUBLISH_HOST", "127.0.0.1"),
        "CELLPILOT_SPEEDUP": os.environ.get("CELLPILOT_SPEEDUP", "60"),
        "CELLPILOT_BORGLET_FLEET_SIZE": os.environ.get("CELLPILOT_BORGLET_FLEET_SIZE", "4"),
    }
    compose = ComposeStack(project=PROJECT, env=env)
    # The images must exist (make images): fail at once, not after a long up.
    compose_project.run(["docker", "image", "inspect", compose.services_image()], timeout_s=30)
    compose.down()
    services, missing = compose.runnable_services()
    if missing:
        raise DockerError(f"services that cannot start from these images: {missing} (make images)")
    started = time.monotonic()
    try:
        compose.up(services)
        compose.wait_healthy(services, timeout_s=420)
        up_s = time.monotonic() - started
        print(f"compose stack healthy from clean in {up_s:.0f} s ({len(services)} containers)", flush=True)
        with tempfile.TemporaryDirectory(prefix="cellpilot-bench-compose-") as scratch:
            options = client_options(compose, Path(scratch) / "certs", "bench-compose")
            asyncio.run(_scenarios(compose, options, report, up_s))
    finally:
        compose.down()
