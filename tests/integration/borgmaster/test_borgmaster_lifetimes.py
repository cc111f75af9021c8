"""LAS / LAVA / LARS live (LAVA §3-4): a real Borgmaster trains its lifetime model on its own
checkpoint log, keeps LAVA's host states in its replicated state, and drains in LARS order.

The history is made through the API: rounds of a short-lived job (250 millicores, killed after
a fraction of a second) and a long-lived one (2 cores, killed seconds later); their tasks'
runs are the cell's lifetimes. Event time is the wall clock here, so every class is LC1 — the
test checks the mechanics (the model trained from the log, host states surviving failover, the
drain's order), not the classes' boundaries, which the core's unit tests cover.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from borgmaster_harness import GIB, eventually, grant, leader_of, machine, replicas, simulated_job, stub

from cellpilot.api.v1 import borgmaster_pb2, lifetimes_pb2, machine_pb2, state_pb2
from cellpilot.borg.lifecycle import TaskEvent
from cellpilot.borg.mutations import LogRecord, TaskStateChanged
from cellpilot.checkpoint_store import PostgresCheckpointStore
from cellpilot.platform.postgres import create_engine
from cellpilot.stack import StackEndpoints

RUNNING = state_pb2.TASK_STATE_RUNNING
NO_POLLS = {"poll_interval_s": 600}  # no Borglet: registered machines stay up, tasks stay put
LAVA = {**NO_POLLS, "placement_policy": "lava", "lifetime_interval_s": 0.5, "drain_evictions_per_pass": 1}
TASKS = 8


async def _log(database_url: str) -> list[LogRecord]:
    engine = create_engine(database_url, pool_size=1)
    try:
        return await PostgresCheckpointStore(engine).read(0, limit=1_000_000)
    finally:
        await engine.dispose()


async def _running(client: Any, job_id: str) -> Any:
    async def check() -> Any:
        job = (await client.GetJob(borgmaster_pb2.GetJobRequest(job_id=job_id, include_tasks=True))).job
        return job if job.tasks and all(t.state == RUNNING for t in job.tasks) else None

    return await eventually(check, 15, f"{job_id} running")


async def _submit(client: Any, name: str, cpu: int, tasks: int = TASKS) -> str:
    spec = simulated_job(name, priority=4, tasks=tasks, cpu=cpu, memory=GIB // 4)
    await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(request_id=f"submit-{name}", spec=spec))
    return f"alice/{name}"


async def _cell(client: Any, *machine_ids: str) -> None:
    await grant(client, "alice", cores=10_000)
    for machine_id in machine_ids:
        await client.RegisterMachine(
            borgmaster_pb2.RegisterMachineRequest(
                request_id=f"register-{machine_id}", spec=machine(machine_id, cpu=64_000, memory=64 * GIB)
            )
        )


async def _history(client: Any, rounds: int) -> None:
    """Short runs (~0.2 s, 250 m) and long runs (~3 s, 2 cores), ended by their user."""
    for r in range(rounds):
        short = await _submit(client, f"short-{r}", 250)
        long = await _submit(client, f"long-{r}", 2000)
        await _running(client, short)
        await _running(client, long)
        await asyncio.sleep(0.2)
        await client.KillJob(borgmaster_pb2.KillJobRequest(request_id=f"kill-{short}", job_id=short))
        await asyncio.sleep(2.8)
        await client.KillJob(borgmaster_pb2.KillJobRequest(request_id=f"kill-{long}", job_id=long))


def _hosts(answer: lifetimes_pb2.GetLifetimesResponse) -> list[tuple[Any, ...]]:
    return [
        (
            h.machine_id,
            h.state,
            h.lifetime_class,
            h.deadline_ms,
            tuple((r.job_id, r.task_index) for r in h.residual),
        )
        for h in answer.hosts
    ]


async def test_training_with_too_little_history_is_refused_naming_min_runs(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    async with replicas(fresh_database_url, endpoints, 1, **LAVA) as (master,):
        await leader_of([master])
        channel, client = stub(master.address)
        async with channel:
            await _cell(client, "m0")
            await _history(client, rounds=1)  # 16 runs
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await client.TrainLifetimes(lifetimes_pb2.TrainLifetimesRequest(min_runs=50))
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "holds 16 finished task runs" in (refused.value.details() or "")
            assert "min_runs" in (refused.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as negative:
                await client.TrainLifetimes(lifetimes_pb2.TrainLifetimesRequest(min_runs=-1))
            assert negative.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (negative.value.details() or "").startswith("min_runs")
            with pytest.raises(grpc.aio.AioRpcError) as unnamed:
                await client.DrainMachine(lifetimes_pb2.DrainMachineRequest(request_id="d"))
            assert unnamed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert (unnamed.value.details() or "").startswith("machine_id")
            status = await client.GetLifetimes(lifetimes_pb2.GetLifetimesRequest())
            assert (status.placement_policy, status.model_loaded, len(status.hosts)) == ("lava", False, 0)


async def test_lava_host_states_survive_failover_and_a_drain_moves_tasks_in_lars_order(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    async with replicas(fresh_database_url, endpoints, 2, **LAVA) as masters:
        first = await leader_of(masters)
        channel, client = stub(first.address)
        async with channel:
            await _cell(client, "m0")
            await _history(client, rounds=2)
            trained = await client.TrainLifetimes(
                lifetimes_pb2.TrainLifetimesRequest(request_id="t", min_runs=30)
            )
            assert (trained.runs, trained.jobs) == (4 * TASKS, 4)
            await _running(client, await _submit(client, "placed", 1000, tasks=4))

            async def hosts_recorded() -> Any:
                answer = await client.GetLifetimes(lifetimes_pb2.GetLifetimesRequest())
                return answer if answer.hosts else None

            before = await eventually(hosts_recorded, 10, "LAVA host states in the master's state")
            assert before.model_loaded
            assert before.model_runs == 4 * TASKS
            assert [(h.machine_id, h.state, h.lifetime_class) for h in before.hosts] == [
                ("m0", lifetimes_pb2.LAVA_HOST_STATE_OPEN, 1)
            ]
            assert before.hosts[0].deadline_ms > 0
        await first.stop()  # the master goes away; the other replica takes over

        second = await leader_of([m for m in masters if m is not first], within=15)
        channel, client = stub(second.address)
        async with channel:
            after = await client.GetLifetimes(lifetimes_pb2.GetLifetimesRequest())
            assert _hosts(after) == _hosts(before), "the new master has the same LAVA host states"
            assert second.replica.state.lava_hosts == first.replica.state.lava_hosts

            # A drain on the new master: the long-lived job's tasks move first (LARS, §4.4).
            await client.RegisterMachine(
                borgmaster_pb2.RegisterMachineRequest(
                    request_id="register-m1", spec=machine("m1", cpu=64_000, memory=64 * GIB)
                )
            )
            await client.SetMachineState(
                borgmaster_pb2.SetMachineStateRequest(
                    request_id="hold-m1", machine_id="m1", state=machine_pb2.MACHINE_STATE_DRAINING
                )
            )
            brief = await _submit(client, "brief", 250, tasks=3)
            lasting = await _submit(client, "lasting", 2000, tasks=3)
            await _running(client, brief)
            await _running(client, lasting)
            await client.SetMachineState(
                borgmaster_pb2.SetMachineStateRequest(
                    request_id="open-m1", machine_id="m1", state=machine_pb2.MACHINE_STATE_UP
                )
            )
            drain = await client.DrainMachine(
                lifetimes_pb2.DrainMachineRequest(
                    request_id="drain-m0", machine_id="m0", detail="maintenance"
                )
            )
            assert drain.order == "lars"
            order = [(m.task.job_id, m.task.task_index) for m in drain.moves]
            assert [job for job, _ in order[:3]] == [lasting] * 3, f"longest predicted first: {order}"
            assert set(order[3:]) >= {(brief, i) for i in range(3)}
            remaining = [m.lifetime.remaining_s for m in drain.moves]
            assert remaining == sorted(remaining, reverse=True)

            async def drained() -> Any:
                machines = await client.ListMachines(borgmaster_pb2.ListMachinesRequest())
                m0 = next(m for m in machines.machines if m.spec.machine_id == "m0")
                return m0 if m0.state == machine_pb2.MACHINE_STATE_DRAINING and m0.task_count == 0 else None

            await eventually(drained, 20, "m0 drained")
            await _running(client, lasting)
            await _running(client, brief)
    evicted = [
        (r.mutation.job_id, r.mutation.task_index)
        for r in await _log(fresh_database_url)
        if isinstance(r.mutation, TaskStateChanged)
        and r.mutation.reason is TaskEvent.EVICTED
        and "is draining" in r.mutation.detail
    ]
    assert evicted == order, "the master evicted in the order the drain announced"
