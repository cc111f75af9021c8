"""Resizing in place through gRPC (Autopilot §2.3, Borg §2.5), checked against the log.

A production task on an 8 GiB machine grows from 1 to 6 GiB. With a 4 GiB batch neighbour
the master preempts the neighbour and resizes the task where it runs (same incarnation, same
machine). With a production neighbour (production never preempts production), or when
evicting the batch neighbour would not free enough, the task moves to the spare machine.
"""

from __future__ import annotations

from typing import Any

import pytest
from borgmaster_harness import GIB, eventually, grant, leader_of, machine, replicas, simulated_job, stub
from google.protobuf.field_mask_pb2 import FieldMask

from cellpilot.api.v1 import borgmaster_pb2, machine_pb2, state_pb2
from cellpilot.borg.lifecycle import TaskEvent
from cellpilot.borg.mutations import LogRecord, TaskStateChanged
from cellpilot.checkpoint_store import PostgresCheckpointStore
from cellpilot.platform.postgres import create_engine
from cellpilot.stack import StackEndpoints

PROD, BATCH = 9, 2
RUNNING = state_pb2.TASK_STATE_RUNNING
NO_POLLS = {"poll_interval_s": 600}  # no Borglet: registered machines stay up, tasks stay put


async def _log(database_url: str) -> list[LogRecord]:
    engine = create_engine(database_url, pool_size=1)
    try:
        return await PostgresCheckpointStore(engine).read(0, limit=1_000_000)
    finally:
        await engine.dispose()


async def _task(client: Any, job_id: str) -> Any:
    job = (await client.GetJob(borgmaster_pb2.GetJobRequest(job_id=job_id, include_tasks=True))).job
    return job.tasks[0]


async def _machine_state(client: Any, machine_id: str, state: Any) -> None:
    await client.SetMachineState(
        borgmaster_pb2.SetMachineStateRequest(
            request_id=f"{machine_id}-{state}", machine_id=machine_id, state=state
        )
    )


async def _cell(client: Any, neighbours: tuple[tuple[int, int], ...]) -> None:
    """alice's 1 GiB prod task next to bob's neighbours (priority, GiB) on m0; a spare machine,
    drained while they are placed, that a moved task can go to."""
    for user in ("alice", "bob"):
        await grant(client, user)
    for machine_id in ("m0", "spare"):
        await client.RegisterMachine(
            borgmaster_pb2.RegisterMachineRequest(
                request_id=machine_id, spec=machine(machine_id, memory=8 * GIB)
            )
        )
    await _machine_state(client, "spare", machine_pb2.MACHINE_STATE_DRAINING)
    specs = [
        simulated_job(f"n{i}", user="bob", priority=p, memory=g * GIB) for i, (p, g) in enumerate(neighbours)
    ]
    for spec in [*specs, simulated_job("web", priority=PROD, memory=GIB)]:
        await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(request_id=spec.name, spec=spec))
        job_id = f"{spec.user}/{spec.name}"

        async def running(job_id: str = job_id) -> Any:
            task = await _task(client, job_id)
            return task if task.state == RUNNING else None

        assert (await eventually(running, 10, f"{job_id} running")).machine_id == "m0"
    await _machine_state(client, "spare", machine_pb2.MACHINE_STATE_UP)


async def _grow_web(client: Any) -> None:
    await client.UpdateJob(
        borgmaster_pb2.UpdateJobRequest(
            request_id="grow",
            job_id="alice/web",
            spec=simulated_job("web", priority=PROD, memory=6 * GIB),
            update_mask=FieldMask(paths=["task.limits.memory_bytes"]),
        )
    )


def _stops(records: list[LogRecord]) -> list[tuple[str, TaskEvent]]:
    grow = next(r.sequence for r in records if r.request_id == "grow")
    return [
        (r.mutation.job_id, r.mutation.reason)
        for r in records
        if r.sequence >= grow and isinstance(r.mutation, TaskStateChanged)
    ]


async def test_a_resize_that_no_longer_fits_preempts_the_batch_neighbour_and_stays(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    async with replicas(fresh_database_url, endpoints, 1, **NO_POLLS) as (master,):
        await leader_of([master])
        channel, client = stub(master.address)
        async with channel:
            await _cell(client, ((BATCH, 4),))
            before = await _task(client, "alice/web")
            await _grow_web(client)
            web = await _task(client, "alice/web")
            assert (web.state, web.machine_id, web.incarnation) == (RUNNING, "m0", before.incarnation)
            assert web.limits.memory_bytes == 6 * GIB

            async def neighbour_moved() -> Any:
                task = await _task(client, "bob/n0")
                return task if task.state == RUNNING and task.machine_id == "spare" else None

            await eventually(neighbour_moved, 10, "the preempted neighbour rescheduled on the spare machine")
    records = await _log(fresh_database_url)
    assert _stops(records)[:2] == [("bob/n0", TaskEvent.PREEMPTED), ("alice/web", TaskEvent.UPDATED)]
    preempted = next(
        r.mutation
        for r in records
        if isinstance(r.mutation, TaskStateChanged) and r.mutation.job_id == "bob/n0"
    )
    assert "to resize alice/web/0 in place" in preempted.detail


@pytest.mark.parametrize(
    "neighbours",
    [((PROD, 4),), ((PROD, 3), (BATCH, 3))],
    ids=["production-never-preempts-production", "evicting-the-batch-task-is-not-enough"],
)
async def test_a_resize_moves_the_task_only_when_eviction_cannot_make_room(
    fresh_database_url: str, endpoints: StackEndpoints, neighbours: tuple[tuple[int, int], ...]
) -> None:
    async with replicas(fresh_database_url, endpoints, 1, **NO_POLLS) as (master,):
        await leader_of([master])
        channel, client = stub(master.address)
        async with channel:
            await _cell(client, neighbours)
            before = await _task(client, "alice/web")
            await _grow_web(client)

            async def moved() -> Any:
                task = await _task(client, "alice/web")
                return task if task.state == RUNNING and task.machine_id == "spare" else None

            web = await eventually(moved, 10, "the grown task running on the spare machine")
            assert (web.incarnation, web.limits.memory_bytes) == (before.incarnation + 1, 6 * GIB)
            for i in range(len(neighbours)):
                tenant = await _task(client, f"bob/n{i}")
                assert (tenant.state, tenant.machine_id, tenant.incarnation) == (RUNNING, "m0", 1)
    stops = _stops(await _log(fresh_database_url))
    assert stops == [("alice/web", TaskEvent.EVICTED)], "nobody was preempted; the task moved"
