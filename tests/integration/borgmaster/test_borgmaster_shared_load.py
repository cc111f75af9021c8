"""A job's demand shared by its ready tasks across two Borglet processes (Borg §2.6, Autopilot §3.3).

Each Borglet hosts some of the job's tasks and splits the job's demand the way a load balancer
would: it reads which of the job's tasks are ready from the Borgmaster. Four tasks on four
machines (one port each, so one task per machine), two machines per Borglet: each task carries a
quarter of the job's 4 cores. Scaled down to two tasks, each of the remaining two carries half —
whichever Borglet it runs on — and bursts beyond its 1-core limit into its machine's spare CPU.
"""

from __future__ import annotations

import uuid
from typing import Any

from borgmaster_harness import borglet, eventually, grant, leader_of, replicas, simulated_job, stub

from cellpilot.api.v1 import borgmaster_pb2, job_pb2, state_pb2
from cellpilot.stack import StackEndpoints

QUIET = {"cpu_noise": 0.0, "memory_noise": 0.0}


def _shared_job(user: str) -> job_pb2.JobSpec:
    spec = simulated_job("front", user=user, tasks=4, cpu=1000)
    spec.task.limits.ports = 1
    simulated = spec.task.runtime.simulated
    simulated.params.update({"cpu_millicores": 0.0, "memory_bytes": 50e6, **QUIET})
    simulated.demand.CopyFrom(
        job_pb2.SharedDemand(usage_model="steady", params={"cpu_millicores": 4000.0, **QUIET})
    )
    return spec


async def _usage(client: Any, job_id: str, tasks: int) -> dict[int, tuple[str, int]] | None:
    job = (await client.GetJob(borgmaster_pb2.GetJobRequest(job_id=job_id, include_tasks=True))).job
    running = {
        t.task_index: (t.machine_id, t.usage.cpu_millicores)
        for t in job.tasks
        if t.state == state_pb2.TASK_STATE_RUNNING and t.ready and t.task_index < job.spec.task_count
    }
    return running if len(running) == tasks else None


async def test_each_ready_task_carries_its_share_of_the_job_whichever_borglet_runs_it(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    fleet = {"fleet_size": 2, "ports": 1, "cpu_millicores": 8000, "load_balancer_refresh_s": 0.2}
    async with (
        replicas(fresh_database_url, endpoints, 1) as (master,),
        borglet(endpoints, [master.address], machine_id_prefix=f"a-{user}", **fleet) as one,
        borglet(endpoints, [master.address], machine_id_prefix=f"b-{user}", **fleet) as two,
    ):
        await leader_of([master])
        channel, client = stub(master.address)
        async with channel:
            await grant(client, user)
            job = await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(spec=_shared_job(user)))

            async def quarters() -> dict[int, tuple[str, int]] | None:
                usage = await _usage(client, job.job_id, 4)
                return usage if usage and all(cpu == 1000 for _, cpu in usage.values()) else None

            placed = await eventually(quarters, 30, "four tasks at a quarter of the demand each")
            borglets = {machine.split("-")[0] for machine, _ in placed.values()}
            assert borglets == {"a", "b"}, placed  # the job spans both Borglet processes
            assert {p.machine_id for p in (*one.profiles, *two.profiles)} >= {m for m, _ in placed.values()}

            request = borgmaster_pb2.UpdateJobRequest(job_id=job.job_id, spec=job_pb2.JobSpec(task_count=2))
            request.update_mask.paths.append("task_count")
            await client.UpdateJob(request)

            async def halves() -> dict[int, tuple[str, int]] | None:
                usage = await _usage(client, job.job_id, 2)
                return usage if usage and all(cpu == 2000 for _, cpu in usage.values()) else None

            # Losing two tasks raises the others' load: each remaining task now carries half
            # (beyond its 1-core limit: its machine has spare CPU).
            await eventually(halves, 30, "two tasks at half the demand each")
