"""Reclamation in the live cell (Borg §5.5), through the services, on the cell's one clock.

A production task holds a 3-core limit on a 4-core machine and uses 0.3 core. Its reservation
starts at the limit and, after the start-up period, decays toward usage plus a safety margin —
in the cell's event time, which a simulated fleet runs far faster than the wall clock. A batch
task of 2 cores does not fit by limits (3 + 2 > 4) but is placed against the reservations of
others: it lands on the same machine once enough is reclaimed, and the machine shows less
reserved than allocated.
"""

from __future__ import annotations

from borgmaster_harness import MIB, borglet, eventually, grant, leader_of, replicas, simulated_job, stub

from cellpilot.api.v1 import borgmaster_pb2, job_pb2, state_pb2
from cellpilot.stack import StackEndpoints

SPEEDUP = 1200.0  # 20 event-minutes per wall second: a reclamation half-life (1 h) in 3 wall seconds


async def test_batch_work_lands_in_what_production_left_unused(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    async with replicas(fresh_database_url, endpoints, 1, poll_interval_s=0.3, link_shard_refresh_s=0.5) as (
        master,
    ):
        await leader_of([master])
        async with borglet(endpoints, [master.address], fleet_size=1, cpu_millicores=4000, speedup=SPEEDUP):
            channel, client = stub(master.address)
            async with channel:

                async def registered() -> list[str]:
                    machines = (await client.ListMachines(borgmaster_pb2.ListMachinesRequest())).machines
                    return [m.spec.machine_id for m in machines]

                (machine_id,) = await eventually(registered, 20, "the machine registered")
                await grant(client, "alice")
                prod = simulated_job("serving", user="alice", priority=9, tasks=1, cpu=3000, memory=256 * MIB)
                prod.task.runtime.simulated.params.update(
                    {"cpu_millicores": 300.0, "memory_bytes": 64.0 * MIB}
                )
                await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(request_id="prod", spec=prod))

                async def reclaimed() -> borgmaster_pb2.ListMachinesResponse | None:
                    listed = await client.ListMachines(borgmaster_pb2.ListMachinesRequest())
                    (machine,) = listed.machines
                    reserved, allocated = machine.reserved.cpu_millicores, machine.allocated.cpu_millicores
                    return listed if allocated == 3000 and reserved < 2000 else None

                listed = await eventually(reclaimed, 60, "the production task's reservation reclaimed")
                print(f"\nreserved {listed.machines[0].reserved.cpu_millicores} m of 3000 m allocated")

                batch = simulated_job("crunch", user="alice", priority=4, tasks=1, cpu=2000, memory=256 * MIB)
                batch.app_class = job_pb2.APP_CLASS_BATCH
                batch.task.runtime.simulated.params.update(
                    {"cpu_millicores": 100.0, "memory_bytes": 64.0 * MIB}
                )
                await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(request_id="batch", spec=batch))

                async def placed() -> state_pb2.TaskStatus | None:
                    job = (
                        await client.GetJob(
                            borgmaster_pb2.GetJobRequest(job_id="alice/crunch", include_tasks=True)
                        )
                    ).job
                    running = [t for t in job.tasks if t.state == state_pb2.TASK_STATE_RUNNING]
                    return running[0] if running else None

                task = await eventually(placed, 30, "the batch task placed into the reclaimed room")
                assert task.machine_id == machine_id, "beside the production task, on the one machine"
                (machine,) = (await client.ListMachines(borgmaster_pb2.ListMachinesRequest())).machines
                assert machine.allocated.cpu_millicores == 5000, "limits over the machine's 4 cores"
                assert machine.reserved.cpu_millicores <= 4000
