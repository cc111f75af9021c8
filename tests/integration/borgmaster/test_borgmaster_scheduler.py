"""The scheduler beside the master (Borg §3.4), through the services: killed mid-pass it loses and
doubles no placement; a stale proposal is refused and the task placed by a later pass; a second
scheduler started by mistake changes nothing but the count of stale proposals."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

from borgmaster_harness import (
    SchedulerProcess,
    eventually,
    grant,
    leader_of,
    machine,
    replicas,
    scheduler,
    simulated_job,
    stub,
)
from stack_security import service_channel

from cellpilot.api.v1 import borgmaster_pb2, scheduler_pb2, scheduler_pb2_grpc
from cellpilot.borg.lifecycle import TaskState
from cellpilot.borg.mutations import TaskScheduled
from cellpilot.checkpoint_store import PostgresCheckpointStore
from cellpilot.stack import StackEndpoints

MACHINES = 40
JOBS = 60
TASKS_PER_JOB = 10  # 600 tasks: several passes and proposal batches
QUIET = {"poll_interval_s": 600}  # machines without Borglets: nobody marks them down meanwhile


async def _cell(address: str, user: str, jobs: int = JOBS) -> None:
    channel, client = stub(address)
    async with channel:
        await grant(client, user)
        for i in range(MACHINES):
            await client.RegisterMachine(
                borgmaster_pb2.RegisterMachineRequest(request_id=f"m{i}", spec=machine(f"m{i}", cpu=64_000))
            )
        for i in range(jobs):
            spec = simulated_job(f"j{i}", user=user, tasks=TASKS_PER_JOB, cpu=500)
            await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(request_id=f"{user}-{i}", spec=spec))


async def _status(address: str) -> borgmaster_pb2.GetCellStatusResponse:
    channel, client = stub(address)
    async with channel:
        return await client.GetCellStatus(borgmaster_pb2.GetCellStatusRequest())


async def _scheduled_records(database_url: str) -> list[TaskScheduled]:
    store = PostgresCheckpointStore.connect(database_url, pool_size=1)
    try:
        records = await store.read(0, limit=1_000_000)
    finally:
        await store.close()
    return [r.mutation for r in records if isinstance(r.mutation, TaskScheduled)]


async def test_a_scheduler_killed_mid_pass_loses_and_doubles_no_placement(
    fresh_database_url: str, endpoints: StackEndpoints, tmp_path: Path
) -> None:
    total = JOBS * TASKS_PER_JOB
    async with replicas(fresh_database_url, endpoints, 1, schedulers=0, **QUIET) as (master,):
        await leader_of([master])
        await _cell(master.address, "alice")
        # Small proposals, so the kill lands between the batches of one pass.
        first = SchedulerProcess(
            fresh_database_url, endpoints, [master.address], tmp_path, CELLPILOT_SCHEDULER_PROPOSAL_MAX="20"
        )
        first.start()
        try:

            async def some_placed() -> int:
                accepted = (await _status(master.address)).placements_accepted
                return accepted if 0 < accepted < total else 0

            placed_at_kill = await eventually(some_placed, 60, "the first proposals committed, not all")
            first.signal(signal.SIGKILL)
            assert first.process is not None
            first.process.wait(timeout=10)
        finally:
            first.stop()
        killed_at = (await _status(master.address)).placements_accepted
        assert killed_at < total, f"the kill came too late to test anything ({killed_at} of {total})"

        async with scheduler([master.address], master.settings):

            async def all_placed() -> bool:
                status = await _status(master.address)
                return status.tasks_running == total and status.tasks_pending == 0

            await eventually(all_placed, 90, "every task placed by the restarted scheduler")
        placements = await _scheduled_records(fresh_database_url)
        per_task = Counter((p.job_id, p.task_index) for p in placements)
        assert len(per_task) == total, "every task placed: none lost"
        assert max(per_task.values()) == 1, "no task placed twice"
        state = master.replica.state
        assert sum(len(m.tasks) for m in state.machines.values()) == total
        print(f"\nkilled after {placed_at_kill} (log: {killed_at}) of {total} placements")


async def test_a_stale_proposal_is_refused_and_the_task_placed_by_a_later_pass(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    async with replicas(fresh_database_url, endpoints, 1, schedulers=0, **QUIET) as (master,):
        await leader_of([master])
        await _cell(master.address, "bob", jobs=1)
        job = master.replica.state.jobs["bob/j0"]
        stale = scheduler_pb2.ProposePlacementsRequest(
            scheduler_id="a-stale-view",
            master_epoch=master.replica.epoch,
            based_on_sequence=1,
            placements=[
                # Computed before an update the scheduler had not seen yet: spec version 0.
                scheduler_pb2.ProposedPlacement(
                    job_id="bob/j0", task_index=0, incarnation=0, spec_version=0, machine_id="m0"
                ),
                scheduler_pb2.ProposedPlacement(
                    job_id="bob/j0",
                    task_index=1,
                    incarnation=job.tasks[1].incarnation,
                    spec_version=job.spec_version,
                    machine_id="no-such-machine",
                ),
            ],
        )
        async with service_channel(master.address, "scheduler") as channel:
            answer = await scheduler_pb2_grpc.SchedulerLinkStub(channel).ProposePlacements(stale)
        assert answer.accepted == 0
        assert {(r.task_index, r.reason) for r in answer.refused} == {
            (0, "the job was updated since"),
            (1, "the machine is down, draining or gone"),
        }
        assert master.replica.state.jobs["bob/j0"].counts[TaskState.RUNNING] == 0, "nothing was placed"
        async with scheduler([master.address], master.settings):

            async def placed() -> bool:
                return master.replica.state.jobs["bob/j0"].counts[TaskState.RUNNING] == TASKS_PER_JOB

            await eventually(placed, 30, "the refused tasks placed by the scheduler's next pass")
        status = await _status(master.address)
        assert status.placements_stale >= 2
        assert status.stale_reasons["the job was updated since"] >= 1


async def test_a_second_scheduler_started_by_mistake_is_harmless(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    total = JOBS * TASKS_PER_JOB
    async with replicas(fresh_database_url, endpoints, 1, schedulers=0, **QUIET) as (master,):
        await leader_of([master])
        async with (
            scheduler([master.address], master.settings, 0),
            scheduler([master.address], master.settings, 1),
        ):
            await _cell(master.address, "carol")

            async def all_placed() -> bool:
                status = await _status(master.address)
                return status.tasks_running == total and status.tasks_pending == 0

            await eventually(all_placed, 90, "every task placed with two schedulers proposing")
            await asyncio.sleep(1.0)  # both keep running: nothing more is placed or moved
        placements = await _scheduled_records(fresh_database_url)
        per_task = Counter((p.job_id, p.task_index) for p in placements)
        assert len(per_task) == total
        assert max(per_task.values()) == 1, "no task placed twice"
        status = await _status(master.address)
        print(f"\ntwo schedulers: {status.placements_accepted} accepted, {status.placements_stale} stale")
