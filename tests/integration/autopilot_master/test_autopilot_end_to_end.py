"""The whole vertical-autoscaling loop on the embedded stack, every hop over mTLS (Autopilot §3.1):

Borglet fleet (simulated tasks, event time 300x faster than the wall clock) -> usage.samples
-> aggregator (5-minute histograms) -> usage.histograms -> recommender worker ->
recommendations -> Autopilot master -> actuations -> actuator -> Borgmaster UpdateJob.

An over-provisioned Autopiloted job (limits 8x its steady usage) gets its limits lowered; a
dry-run job with the same usage gets recommendations but its limits never change (§5).
Every service runs in-process with its own topics, consumer groups and Redis prefixes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from autopilot_master_harness import (
    GIB,
    Scenario,
    actuator,
    api_client,
    autopilot,
    borgmaster,
    eventually,
    grant,
    job_spec,
    job_status,
)
from usage_pipeline import usage_pipeline

from cellpilot.api.v1 import job_pb2, resources_pb2, state_pb2
from cellpilot.stack import StackEndpoints

ON, DRY = job_pb2.SCALING_MODE_ON, job_pb2.SCALING_MODE_DRY_RUN
SPEEDUP = 300.0  # one 5-minute window per wall second
LIMIT_CPU, LIMIT_MEMORY = 4_000, 4 * GIB  # the steady model uses 500 millicores and 256 MiB


async def test_over_provisioned_job_is_right_sized_and_dry_run_job_never_changes(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    scenario = Scenario(endpoints)
    await scenario.create_topics()
    async with borgmaster(fresh_database_url, scenario) as bm:
        client = api_client([bm.address])
        await grant(client, scenario.user)
        fat = await client.borgmaster.submit_job(
            job_spec("fat", scenario.user, cpu_mode=ON, memory_mode=ON, cpu=LIMIT_CPU, memory=LIMIT_MEMORY)
        )
        shadow = await client.borgmaster.submit_job(
            job_spec(
                "shadow", scenario.user, cpu_mode=DRY, memory_mode=DRY, cpu=LIMIT_CPU, memory=LIMIT_MEMORY
            )
        )
        # No usage history yet: both are released after a short hold with their own limits (§3.1).
        settings = scenario.autopilot_settings([bm.address], hold_grace_s=0.5)
        async with (
            usage_pipeline(scenario, fresh_database_url, [bm.address], speedup=SPEEDUP),
            autopilot(settings) as master,
            actuator(scenario.actuator_settings([bm.address])) as act,
        ):
            ap_client = api_client([bm.address], [master.address])
            before = await eventually(
                lambda: _running(client, shadow.job_id), 20, "the dry-run job's task running"
            )

            async def right_sized() -> state_pb2.JobStatus | None:
                status = await job_status(client, fat.job_id)
                limits = status.spec.task.limits
                return (
                    status
                    if limits.cpu_millicores < LIMIT_CPU and limits.memory_bytes < LIMIT_MEMORY
                    else None
                )

            sized = await eventually(right_sized, 45, "the Autopiloted job's limits lowered")
            # Steady usage of 500 millicores / 256 MiB: the new limits sit near it, not at the old ones.
            assert 500 <= sized.spec.task.limits.cpu_millicores <= 1_500
            assert 256 * (1 << 20) <= sized.spec.task.limits.memory_bytes <= GIB
            assert act.outcomes["applied"] >= 1

            async def dry_run_recommended() -> bool:
                view = (await ap_client.autopilot.get_recommendation(shadow.job_id, False)).recommendations
                cpu = [v for v in view.vertical if v.resource == resources_pb2.RESOURCE_CPU]
                return bool(cpu) and cpu[0].mode == DRY and 0 < cpu[0].chosen.value < LIMIT_CPU

            await eventually(dry_run_recommended, 20, "a recommendation shown for the dry-run job")
            await asyncio.sleep(1.0)  # a few more windows: the dry-run job still never moves
            after = await job_status(client, shadow.job_id)
            assert after.spec.task.limits == before.spec.task.limits
            assert after.spec_version == before.spec_version
            await ap_client.close()
        await client.close()


async def _running(client: Any, job_id: str) -> state_pb2.JobStatus | None:
    status = await job_status(client, job_id)
    return status if status.task_counts.running >= 1 else None
