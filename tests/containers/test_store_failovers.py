"""The replicated stores under faults: PostgreSQL (Patroni, synchronous standby) and Redis
(Sentinel), each killed or cut off while SubmitJob requests stream in through the published
Borgmaster ports. Nothing acknowledged is lost or doubled, writes resume, the faulted member
rejoins as a standby, and the Autopilot lease's fencing token never goes backwards.

The scenarios are :mod:`cellpilot.stack.store_failovers`'s (the benchmark ``compose.`` prints
the same measurements as figures). They run after the other container tests (file order).
"""

from __future__ import annotations

import uuid

import pytest
from compose_stack import RunningStack

from bench import bench_compose
from bench.harness import Recorder
from cellpilot.client import CellpilotClient
from cellpilot.stack import store_failovers
from cellpilot.stack.store_failovers import RedisFailover, StoreFailover

pytestmark = [pytest.mark.containers, pytest.mark.timeout(900)]

STORES = (
    *store_failovers.POSTGRES_MEMBERS,
    "etcd-0",
    "etcd-1",
    "etcd-2",
    *store_failovers.REDIS_NODES,
    *store_failovers.SENTINELS,
)


# Each scenario's outcome, for the benchmark's figures (the last test).
OUTCOMES: dict[str, StoreFailover | RedisFailover] = {}


@pytest.fixture
async def user(stack: RunningStack, client: CellpilotClient) -> str:
    name = f"sf{uuid.uuid4().hex[:6]}"
    await store_failovers.grant_quota(client, name)
    return name


def _no_acknowledged_write_lost(outcome: StoreFailover) -> None:
    print(
        f"{outcome.faulted}: writes again after {outcome.write_gap_s:.1f} s ({outcome.promoted} promoted); "
        f"{outcome.acknowledged} acknowledged, {outcome.failed} given up by the client; "
        f"rejoined as {outcome.rejoined_as} {outcome.rejoin_s:.1f} s after coming back"
    )
    assert outcome.acknowledged >= 20, "the stream kept writing through the fault"
    assert not outcome.lost, f"acknowledged jobs missing after the failover: {outcome.lost[:10]}"
    assert not outcome.doubled, f"jobs listed twice: {outcome.doubled[:10]}"
    assert outcome.promoted != outcome.faulted.split("+")[-1], "another member took over"
    assert outcome.rejoined_as in ("replica", "sync_standby")


def test_the_stores_run_replicated(stack: RunningStack) -> None:
    stack.require(*STORES)
    cluster = store_failovers.postgres_cluster(stack.compose)
    assert sorted(cluster.values()) == ["leader", "sync_standby"], f"Patroni reports {cluster}"
    master = store_failovers.redis_master(stack.compose)
    replicas = [n for n in store_failovers.REDIS_NODES if n != master]
    for node in replicas:
        role = store_failovers.redis_admin(stack.compose, node, "ROLE").split()
        assert role[:2] == ["slave", master], f"{node} replicates {role[:2]}, not {master}"


async def test_killing_the_postgres_primary_loses_no_acknowledged_write(
    stack: RunningStack, client: CellpilotClient, user: str
) -> None:
    stack.require("pg-0", "pg-1", "borgmaster-0")
    outcome = OUTCOMES["pg_kill"] = await store_failovers.kill_postgres_primary(stack.compose, client, user)
    _no_acknowledged_write_lost(outcome)


async def test_cutting_the_postgres_primary_off_leaves_one_primary_and_it_rejoins(
    stack: RunningStack, client: CellpilotClient, user: str
) -> None:
    stack.require("pg-0", "pg-1", "borgmaster-0")
    outcome = await store_failovers.partition_postgres_primary(stack.compose, client, user)
    OUTCOMES["pg_cut"] = outcome
    _no_acknowledged_write_lost(outcome)
    assert outcome.two_primaries_s == 0.0, (
        f"both members ran as primaries for {outcome.two_primaries_s:.1f} s (split brain)"
    )


async def test_killing_the_redis_master_the_autopilot_lease_moves_with_growing_tokens(
    stack: RunningStack,
) -> None:
    stack.require(*store_failovers.REDIS_NODES, *store_failovers.SENTINELS, "autopilot-0", "autopilot-1")
    outcome = OUTCOMES["redis"] = await store_failovers.kill_redis_master(stack.compose)
    print(
        f"{outcome.killed} killed, {outcome.promoted} promoted; Autopilot lease held again after "
        f"{outcome.autopilot_gap_s:.1f} s; tokens {outcome.tokens}"
    )
    assert outcome.promoted != outcome.killed
    assert outcome.token_decreases == 0, f"the fencing token went backwards: {outcome.tokens}"
    assert outcome.old_master_role == "slave", "the old master came back as a replica"


async def test_killing_the_master_and_the_postgres_primary_together_loses_nothing(
    stack: RunningStack, client: CellpilotClient, user: str
) -> None:
    stack.require("pg-0", "pg-1", "borgmaster-0", "borgmaster-1", "borgmaster-2")
    outcome = await store_failovers.kill_master_and_postgres_primary(stack.compose, client, user)
    OUTCOMES["both"] = outcome
    _no_acknowledged_write_lost(outcome)


def test_the_compose_benchmark_reports_every_figure_from_these_outcomes(stack: RunningStack) -> None:
    """bench_compose's smoke size: its figures from the scenarios above (the same functions)."""
    missing = {"pg_kill", "pg_cut", "redis", "both"} - OUTCOMES.keys()
    assert not missing, f"scenarios that did not finish: {sorted(missing)}"
    recorder = Recorder()
    bench_compose.report_outcomes(
        recorder,
        OUTCOMES["pg_kill"],  # type: ignore[arg-type]
        OUTCOMES["pg_cut"],  # type: ignore[arg-type]
        OUTCOMES["redis"],  # type: ignore[arg-type]
        OUTCOMES["both"],  # type: ignore[arg-type]
        stack.clean_to_healthy_s,
    )
    assert sorted(recorder.figures) == sorted(bench_compose.FIGURES)
    assert all(value == value and value >= 0 for value in recorder.figures.values())
