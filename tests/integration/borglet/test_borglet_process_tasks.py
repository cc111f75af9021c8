"""A Borglet driven through its gRPC API as the Borgmaster would drive it, running real processes
(the bundled workload program) and enforcing limits on them (Borg §3.3, §6.2; Autopilot §2.3)."""

from __future__ import annotations

import asyncio
import os

import grpc
import psutil
import pytest
from borglet_builders import (
    MIB,
    BorgletFactory,
    poll,
    poll_until,
    process_task,
    simulated_task,
    task_in,
)

from cellpilot.api.v1 import borglet_pb2, state_pb2

RUNNING, DEAD = state_pb2.TASK_STATE_RUNNING, state_pb2.TASK_STATE_DEAD
OOM, KILLED = state_pb2.TASK_EVENT_KIND_OOM, state_pb2.TASK_EVENT_KIND_KILLED


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_start_poll_and_stop_a_real_process(borglet_factory: BorgletFactory) -> None:
    async with borglet_factory(memory_bytes=4 << 30) as (borglet, stub):
        machine = borglet.profiles[0].machine_id
        started = await stub.StartTask(
            borglet_pb2.StartTaskRequest(
                request_id="start-1",
                master_epoch=1,
                machine_id=machine,
                task=process_task("alice/web", "120s:40MiB:200m", 200 * MIB, cpu_limit=500),
            )
        )
        assert started.task.state == RUNNING
        pid = borglet.machines[0].tasks[("alice/web", 0)].process.pid
        assert os.getpgid(pid) == pid  # its own process group, signalled as a whole
        # Metered every second: its RSS (40 MiB held) and CPU rate show up in the poll.
        report = await poll_until(
            stub,
            machine,
            lambda r: (
                task_in(r, "alice/web").usage.memory_bytes > 35 * MIB
                and task_in(r, "alice/web").usage.cpu_millicores > 50
            ),
        )
        assert report.usage.memory_bytes >= task_in(report, "alice/web").usage.memory_bytes
        assert [e.event.kind for e in report.events] == [state_pb2.TASK_EVENT_KIND_RUNNING]
        # Nobody polls for a while: the task keeps running (Borg §3.3).
        await asyncio.sleep(2)
        assert not _gone(pid)
        # Starting the same incarnation again is a no-op.
        again = await stub.StartTask(
            borglet_pb2.StartTaskRequest(
                master_epoch=1,
                machine_id=machine,
                task=process_task("alice/web", "120s:40MiB:200m", 200 * MIB),
            )
        )
        assert again.task.started_ms == started.task.started_ms
        stopped = await stub.StopTask(
            borglet_pb2.StopTaskRequest(
                request_id="stop-1",
                master_epoch=1,
                machine_id=machine,
                job_id="alice/web",
                task_index=0,
                incarnation=1,
                reason=KILLED,
            )
        )
        assert stopped.task.state == DEAD
        assert stopped.task.exit_reason == KILLED
        assert _gone(pid)
        after = await poll(stub, machine)
        kinds = [(e.event.kind, e.event.cause_id) for e in after.events]
        assert kinds == [(state_pb2.TASK_EVENT_KIND_RUNNING, "start-1"), (KILLED, "stop-1")]
        # Once the master acknowledges the events, they and the dead task are forgotten.
        acked = await poll(stub, machine, ack_event_sequence=after.events[-1].sequence)
        assert list(acked.events) == []
        assert list(acked.tasks) == []


async def test_hard_limit_oom_kills_the_process_and_reports_it(borglet_factory: BorgletFactory) -> None:
    async with borglet_factory(memory_bytes=4 << 30) as (borglet, stub):
        machine = borglet.profiles[0].machine_id
        limit = 100 * MIB
        await stub.StartTask(
            borglet_pb2.StartTaskRequest(
                master_epoch=1,
                machine_id=machine,
                task=process_task("bob/leaky", "1s:20MiB:0,60s:400MiB:0", limit, hard=True, priority=9),
            )
        )
        pid = borglet.machines[0].tasks[("bob/leaky", 0)].process.pid
        report = await poll_until(stub, machine, lambda r: task_in(r, "bob/leaky").state == DEAD)
        task = task_in(report, "bob/leaky")
        assert task.exit_reason == OOM
        assert _gone(pid)
        oom = [e.event for e in report.events if e.event.kind == OOM]
        assert len(oom) == 1
        assert oom[0].usage.memory_bytes > limit  # the memory seen at the kill
        assert oom[0].limits.memory_bytes == limit
        assert "hard memory limit" in oom[0].detail
        assert oom[0].state == state_pb2.TASK_STATE_PENDING  # the master reschedules it
        assert oom[0].event_time_ms >= task.started_ms


async def test_soft_limit_pressure_kills_only_the_lowest_priority_task_over_its_limit(
    borglet_factory: BorgletFactory,
) -> None:
    # A 500 MiB machine, short above 100 %. B (priority 5) holds 200 MiB over its 50 MiB soft
    # limit; C (priority 1, the lowest) holds 100 MiB within its 300 MiB limit. Neither is
    # killed while the machine has room. A (priority 2) then grows to 300 MiB over its 50 MiB
    # soft limit: the machine runs short, and of the tasks over their limit (A, B) the lowest
    # priority one, A, is killed (Autopilot §2.3); C, lower still but within its limit, is not.
    async with borglet_factory(memory_bytes=500 * MIB, memory_pressure_fraction=1.0) as (borglet, stub):
        machine = borglet.profiles[0].machine_id

        async def start(job: str, profile: str, limit: int, priority: int) -> None:
            await stub.StartTask(
                borglet_pb2.StartTaskRequest(
                    master_epoch=1,
                    machine_id=machine,
                    task=process_task(job, profile, limit, hard=False, priority=priority),
                )
            )

        await start("batch/b", "120s:200MiB:0", 50 * MIB, 5)
        await start("free/c", "120s:100MiB:0", 300 * MIB, 1)
        await poll_until(
            stub,
            machine,
            lambda r: (
                task_in(r, "batch/b").usage.memory_bytes > 195 * MIB
                and task_in(r, "free/c").usage.memory_bytes > 95 * MIB
            ),
        )
        settled = await poll(stub, machine)
        assert not settled.memory_pressure
        assert settled.usage.memory_bytes < 500 * MIB
        await start("batch/a", "120s:300MiB:0", 50 * MIB, 2)
        report = await poll_until(stub, machine, lambda r: task_in(r, "batch/a").state == DEAD)
        assert task_in(report, "batch/a").exit_reason == OOM
        assert task_in(report, "batch/b").state == RUNNING
        assert task_in(report, "free/c").state == RUNNING
        oom = [e.event for e in report.events if e.event.kind == OOM]
        assert [(e.job_id, e.state) for e in oom] == [("batch/a", state_pb2.TASK_STATE_PENDING)]
        assert "soft memory limit" in oom[0].detail
        # Relieved: the survivors fit again, and nothing else is killed afterwards.
        await asyncio.sleep(2)
        final = await poll(stub, machine)
        assert task_in(final, "batch/b").state == RUNNING
        assert task_in(final, "free/c").state == RUNNING
        assert final.usage.memory_bytes < 500 * MIB


async def test_a_deposed_master_is_refused_and_bad_calls_name_the_field(
    borglet_factory: BorgletFactory,
) -> None:
    async with borglet_factory(publish_samples=False) as (borglet, stub):
        machine = borglet.profiles[0].machine_id
        await poll(stub, machine, epoch=5)
        with pytest.raises(grpc.aio.AioRpcError) as stale:
            await poll(stub, machine, epoch=4)
        assert stale.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "epoch 4" in stale.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as stale_start:
            await stub.StartTask(
                borglet_pb2.StartTaskRequest(master_epoch=4, machine_id=machine, task=simulated_task("u/j"))
            )
        assert stale_start.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert list((await poll(stub, machine, epoch=5)).tasks) == []  # nothing was started
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await poll(stub, "no-such-machine", epoch=5)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        bad = simulated_task("u/j", model="no-such-model")
        with pytest.raises(grpc.aio.AioRpcError) as invalid:
            await stub.StartTask(borglet_pb2.StartTaskRequest(master_epoch=6, machine_id=machine, task=bad))
        assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert invalid.value.details().startswith("task.spec.runtime.simulated.usage_model")
        # A newer master is obeyed, and from then on the older one is refused.
        await stub.StartTask(
            borglet_pb2.StartTaskRequest(master_epoch=6, machine_id=machine, task=simulated_task("u/j"))
        )
        with pytest.raises(grpc.aio.AioRpcError):
            await poll(stub, machine, epoch=5)
        assert task_in(await poll(stub, machine, epoch=6), "u/j").state == RUNNING


async def test_the_desired_set_starts_tasks_and_kills_duplicates(borglet_factory: BorgletFactory) -> None:
    async with borglet_factory(publish_samples=False) as (borglet, stub):
        machine = borglet.profiles[0].machine_id
        first = borglet_pb2.DesiredTasks(
            version=1, tasks=[simulated_task("u/j", 0), simulated_task("u/j", 1)]
        )
        report = await poll(stub, machine, desired=first)
        assert report.desired_version == 1
        assert sorted((t.task_index, t.state) for t in report.tasks) == [(0, RUNNING), (1, RUNNING)]
        # Task 1 was rescheduled elsewhere (incarnation 2 on another machine): the master's new
        # set omits it here, so this copy is a duplicate and is killed (Borg §3.3).
        second = borglet_pb2.DesiredTasks(version=2, tasks=[simulated_task("u/j", 0)])
        report = await poll(stub, machine, desired=second, master_replica_id="bm-0")
        assert report.desired_version == 2
        assert task_in(report, "u/j", 0).state == RUNNING
        duplicate = task_in(report, "u/j", 1)
        assert (duplicate.state, duplicate.exit_reason) == (DEAD, KILLED)
        killed = [e.event for e in report.events if e.event.kind == KILLED]
        assert [(e.task_index, e.cause_id) for e in killed] == [(1, "poll:bm-0:1:2")]
        assert "duplicate" in killed[0].detail
