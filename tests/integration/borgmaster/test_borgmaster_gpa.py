"""GPA live (GPA §4): a real Borgmaster learns its tasks' CPU demand from its Borglet polls and
places non-prod tasks with the Gaussian fit test; the fleet's throttling shows the overflow.

Two cells run side by side, each one Borgmaster and one fleet-mode Borglet simulating the same
machines, and get the same batch job: more one-core tasks than fit by their limits, each using
about a quarter core with per-second noise. The limit-based cell places 8 tasks per 8-core
machine; the GPA cell, once the moments are learned, colocates several times more, and the
fraction of machine samples whose CPU demand exceeded the capacity (tasks throttled because
the machine was full) stays near rho.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from borgmaster_harness import GIB, MIB, borglet, eventually, grant, leader_of, replicas, simulated_job, stub
from sqlalchemy.engine import make_url

from cellpilot.api.v1 import borgmaster_pb2, job_pb2, state_pb2
from cellpilot.platform.postgres import apply_migrations, drop_database, ensure_database
from cellpilot.stack import StackEndpoints

RHO = 0.05
MACHINES = 4
CORES = 8
TASKS = 200  # one-core limits: 8 per machine by limits; about 27 per machine under GPA at rho 0.05
SPEEDUP = 10.0  # event-seconds per wall second: a 0.25 s poll brings a new second of every machine
MASTER = {
    "poll_interval_s": 0.25,
    "schedule_interval_s": 0.1,
    "force_pass_interval_s": 0.5,
    "gpa_min_samples": 15,
    "gpa_window_samples": 100,
}


@pytest.fixture
def second_database_url(endpoints: StackEndpoints) -> Iterator[str]:
    name = f"test_{uuid.uuid4().hex[:12]}"
    url = str(make_url(endpoints.postgres_url).set(database=name))
    asyncio.run(ensure_database(url))
    asyncio.run(apply_migrations(url))
    yield url
    asyncio.run(drop_database(url))


def _batch_job(user: str) -> Any:
    spec = simulated_job("crunch", user=user, priority=4, tasks=TASKS, cpu=1000, memory=128 * MIB)
    spec.app_class = job_pb2.APP_CLASS_BATCH
    runtime = spec.task.runtime.simulated
    runtime.startup_seconds = 0
    runtime.seed = 11
    runtime.params.update(
        {"cpu_millicores": 250.0, "cpu_noise": 0.35, "task_spread": 0.15, "memory_bytes": 32.0 * MIB}
    )
    return spec


async def _run_cell(
    database_url: str, endpoints: StackEndpoints, rho: float, settle_s: float, measure_s: float
) -> dict[str, Any]:
    """Submit the job, let placement settle, then measure overflow over ``measure_s``."""
    user = f"g{uuid.uuid4().hex[:6]}"
    async with replicas(database_url, endpoints, 1, gpa_rho=rho, **MASTER) as (master,):
        await leader_of([master])
        async with borglet(
            endpoints,
            [master.address],
            fleet_size=MACHINES,
            cpu_millicores=CORES * 1000,
            memory_bytes=16 * GIB,
            speedup=SPEEDUP,
        ):
            channel, client = stub(master.address)
            async with channel:

                async def registered() -> bool:
                    machines = (await client.ListMachines(borgmaster_pb2.ListMachinesRequest())).machines
                    return len(machines) == MACHINES

                await eventually(registered, 20, "the fleet's machines registered")
                await grant(client, user)
                await client.SubmitJob(
                    borgmaster_pb2.SubmitJobRequest(request_id=f"{user}-1", spec=_batch_job(user))
                )

                async def running() -> int:
                    job = (
                        await client.GetJob(
                            borgmaster_pb2.GetJobRequest(job_id=f"{user}/crunch", include_tasks=True)
                        )
                    ).job
                    return sum(t.state == state_pb2.TASK_STATE_RUNNING for t in job.tasks)

                await eventually(running, 20, "the first tasks running")
                await asyncio.sleep(settle_s)
                before = await client.GetCellStatus(borgmaster_pb2.GetCellStatusRequest())
                placed_before = await running()
                started = time.monotonic()
                await asyncio.sleep(measure_s)
                after = await client.GetCellStatus(borgmaster_pb2.GetCellStatusRequest())
                samples = after.machine_samples - before.machine_samples
                overflowed = after.overflowed_samples - before.overflowed_samples
                return {
                    "placed": await running(),
                    "placed_before": placed_before,
                    "machines": after.machines_in_use,
                    "samples": samples,
                    "overflow": overflowed / samples if samples else float("nan"),
                    "tasks_with_cpu_stats": after.tasks_with_cpu_stats,
                    "gpa_rho": after.gpa_rho,
                    "measured_s": time.monotonic() - started,
                }


@pytest.mark.slow
async def test_gpa_colocates_more_batch_tasks_at_an_overflow_near_rho(
    fresh_database_url: str, second_database_url: str, endpoints: StackEndpoints
) -> None:
    limits, gpa = await asyncio.gather(
        _run_cell(fresh_database_url, endpoints, 0.0, settle_s=12.0, measure_s=24.0),
        _run_cell(second_database_url, endpoints, RHO, settle_s=12.0, measure_s=24.0),
    )
    print(f"\nlimit-based: {limits}\nGPA rho={RHO}: {gpa}")
    assert limits["gpa_rho"] == 0.0
    assert gpa["gpa_rho"] == RHO
    assert limits["placed"] == MACHINES * CORES, "by limits: one-core tasks fill the 8-core machines"
    assert limits["overflow"] == 0.0
    # GPA: at least twice as many tasks on the same machines, settled before the measurement.
    assert gpa["placed"] >= 2 * limits["placed"], gpa
    assert gpa["placed"] - gpa["placed_before"] <= MACHINES, (
        "placement (nearly) settled before the measurement"
    )
    assert gpa["tasks_with_cpu_stats"] >= 0.9 * gpa["placed"]
    assert gpa["samples"] >= 100
    # Measured overflow near rho: a generous bound (moments are estimated from ~15-100 samples,
    # and GPA §5.2 finds the Gaussian underestimates rare events).
    assert gpa["overflow"] <= 3 * RHO + 0.02, gpa
