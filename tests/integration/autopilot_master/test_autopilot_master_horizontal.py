"""Horizontal Autopilot through the master, actuator, Borgmaster and a Borglet (§3.3):
a job gains tasks when its CPU usage rises above r* x limit per task, and loses them
only once the deferred-downscaling period has passed since the high recommendation."""

from __future__ import annotations

import asyncio

from autopilot_master_harness import (
    WINDOW_MS,
    Publisher,
    Scenario,
    actuator,
    api_client,
    autopilot,
    borglets,
    borgmaster,
    eventually,
    grant,
    horizontal_set,
    job_spec,
    job_status,
    window,
)

from cellpilot.api.v1 import job_pb2, state_pb2
from cellpilot.stack import StackEndpoints

DEFERRAL_WINDOWS = 6  # T_d = 30 min of event time, six 5-minute windows


def _ready(status: state_pb2.JobStatus) -> int:
    return sum(
        1
        for t in status.tasks
        if t.task_index < status.spec.task_count and t.state == state_pb2.TASK_STATE_RUNNING and t.ready
    )


async def test_tasks_added_above_target_and_removed_only_after_deferred_downscaling(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    scenario = Scenario(endpoints)
    await scenario.create_topics()
    horizontal = job_pb2.HorizontalScalingConfig(
        mode=job_pb2.SCALING_MODE_ON,
        min_tasks=1,
        max_tasks=20,
        target_utilization=0.5,  # r*: half the 1000 m limit per task
        deferred_downscaling_seconds=DEFERRAL_WINDOWS * WINDOW_MS // 1000,
        slow_decay_half_period_seconds=300,
        max_initializing_fraction=1.0,
    )
    async with borgmaster(fresh_database_url, scenario) as bm, borglets(scenario, [bm.address]):
        client = api_client([bm.address])
        await grant(client, scenario.user)
        spec = job_spec("front", scenario.user, tasks=2, cpu=1000, horizontal=horizontal)
        spec.task.runtime.simulated.startup_seconds = 0
        job = await client.borgmaster.submit_job(spec)
        async with (
            autopilot(scenario.autopilot_settings([bm.address], hold_grace_s=0.0)),
            actuator(scenario.actuator_settings([bm.address])),
            Publisher(scenario) as publish,
        ):

            async def settled() -> state_pb2.JobStatus | None:
                status = await job_status(client, job.job_id, tasks=True)
                ready = status.state != state_pb2.JOB_STATE_HELD_FOR_AUTOPILOT and _ready(status)
                return status if ready == status.spec.task_count else None

            await eventually(settled, 20, "the job released and running")
            counts = []
            # Usage 3000 m over r* x 1000 m = 6 tasks wanted; growth is paced by readiness.
            step = 0
            for _ in range(8):
                await publish.recommendations(horizontal_set(job.job_id, window(step), 3000.0))
                step += 1
                await asyncio.sleep(0.6)
                status = await eventually(settled, 20, "the job's tasks ready")
                counts.append(status.spec.task_count)
                if status.spec.task_count == 6:
                    break
            assert counts[-1] == 6, f"grew to 6 tasks, saw {counts}"
            assert counts == sorted(counts), counts
            last_high = step - 1

            # Usage falls to 1000 m (2 tasks wanted): the count holds for T_d, then drops.
            held_at: list[int] = []
            dropped_at = None
            for _ in range(DEFERRAL_WINDOWS + 6):
                await publish.recommendations(horizontal_set(job.job_id, window(step), 1000.0))
                await asyncio.sleep(0.6)
                status = await eventually(settled, 20, "the job's tasks ready")
                elapsed = step - last_high
                if status.spec.task_count < 6:
                    dropped_at = elapsed
                    break
                held_at.append(elapsed)
                step += 1
            assert dropped_at is not None, f"never scaled down; held through {held_at}"
            assert dropped_at >= DEFERRAL_WINDOWS, f"scaled down after {dropped_at} windows, before T_d"
            assert dropped_at <= DEFERRAL_WINDOWS + 2, f"scaled down only after {dropped_at} windows"
        await client.close()
