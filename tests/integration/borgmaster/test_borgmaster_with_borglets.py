"""The Borgmaster with real Borglets: submit, schedule, run, kill through gRPC; OOM kills with real
processes visible on borg.events; a machine that stops answering is marked down, its tasks are
rescheduled, and when it returns its duplicates are killed (Borg §3.3)."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path
from typing import Any

from borgmaster_harness import (
    MIB,
    WORKLOAD,
    BorgletProcess,
    EventLog,
    borglet,
    eventually,
    grant,
    leader_of,
    replicas,
    retried_write,
    simulated_job,
    stub,
)
from stack_security import service_channel

from cellpilot.api.v1 import (
    borglet_pb2,
    borglet_pb2_grpc,
    borgmaster_pb2,
    job_pb2,
    machine_pb2,
    resources_pb2,
    state_pb2,
)
from cellpilot.stack import StackEndpoints

RUNNING, PENDING = state_pb2.TASK_STATE_RUNNING, state_pb2.TASK_STATE_PENDING
K = state_pb2.TaskEventKind


def _process_job(name: str, user: str, profile: str, memory: int, priority: int, hard: bool = True) -> Any:
    spec = simulated_job(name, user=user, priority=priority, cpu=100, memory=memory)
    spec.app_class = job_pb2.APP_CLASS_BATCH
    spec.task.memory_limit_kind = job_pb2.MEMORY_LIMIT_KIND_HARD if hard else job_pb2.MEMORY_LIMIT_KIND_SOFT
    spec.task.runtime.Clear()
    spec.task.runtime.process.command = WORKLOAD[0]
    spec.task.runtime.process.args.extend([*WORKLOAD[1:], "--profile", profile, "--grow-rate", "64MiB"])
    return spec


async def _job(client: Any, job_id: str) -> Any:
    return (await client.GetJob(borgmaster_pb2.GetJobRequest(job_id=job_id, include_tasks=True))).job


async def test_submit_schedule_run_and_kill_with_real_borglets(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    async with (
        replicas(fresh_database_url, endpoints, 1, publish_events=True) as (master,),
        EventLog(endpoints.kafka_bootstrap, {user}) as events,
    ):
        await leader_of([master])
        async with borglet(endpoints, [master.address], fleet_size=2) as agent:
            channel, client = stub(master.address)
            async with channel:

                async def registered() -> bool:
                    machines = (await client.ListMachines(borgmaster_pb2.ListMachinesRequest())).machines
                    return len(machines) == 2

                await eventually(registered, 15, "both machines registered")
                await grant(client, user)
                spec = simulated_job("web", user=user, tasks=3, cpu=1000)
                spec.task.runtime.simulated.startup_seconds = 0
                done = await client.SubmitJob(
                    borgmaster_pb2.SubmitJobRequest(request_id=f"{user}-1", spec=spec)
                )
                job_id = done.job_id
                # A real process task next to the simulated ones.
                sleeper = _process_job("sleeper", user, "600s:10MiB:0", 256 * MIB, priority=9)
                await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(request_id=f"{user}-2", spec=sleeper))

                async def all_started() -> bool:
                    for jid in (job_id, f"{user}/sleeper"):
                        job = await _job(client, jid)
                        if job.state != state_pb2.JOB_STATE_RUNNING:
                            return False
                        if any(
                            t.state != RUNNING or t.reason != K.TASK_EVENT_KIND_RUNNING for t in job.tasks
                        ):
                            return False
                    return True

                await eventually(all_started, 20, "every task reported running by its Borglet")
                job = await _job(client, job_id)
                machines = {t.machine_id for t in job.tasks}
                assert machines <= {m.machine_id for m in agent.profiles}
                task = await client.GetTask(borgmaster_pb2.GetTaskRequest(job_id=job_id, task_index=0))
                assert [e.kind for e in task.recent_events][-3:] == [
                    K.TASK_EVENT_KIND_SUBMITTED,
                    K.TASK_EVENT_KIND_SCHEDULED,
                    K.TASK_EVENT_KIND_RUNNING,
                ]
                sleeper_status = await _job(client, f"{user}/sleeper")
                host = sleeper_status.tasks[0].machine_id
                agent_index = [p.machine_id for p in agent.profiles].index(host)
                record = agent.machines[agent_index].tasks[(f"{user}/sleeper", 0)]
                assert record.alive
                assert not record.simulated, "a real process runs"
                # Every machine shows what its tasks reserve: the scheduler's reservations
                # (Borg §5.5), never more than their limits, and nothing on an empty machine.
                listed = (await client.ListMachines(borgmaster_pb2.ListMachinesRequest())).machines
                for listed_machine in listed:
                    reserved, allocated = listed_machine.reserved, listed_machine.allocated
                    assert (
                        0 < reserved.cpu_millicores <= allocated.cpu_millicores
                        or not allocated.cpu_millicores
                    )
                    assert reserved.memory_bytes <= allocated.memory_bytes
                assert sum(m.reserved.cpu_millicores for m in listed) > 0

                await client.KillJob(borgmaster_pb2.KillJobRequest(request_id=f"{user}-k", job_id=job_id))
                await client.KillJob(
                    borgmaster_pb2.KillJobRequest(request_id=f"{user}-k2", job_id=f"{user}/sleeper")
                )

                async def stopped_on_borglets() -> bool:
                    return not any(
                        jid.startswith(f"{user}/") and rec.alive
                        for machine in agent.machines
                        for (jid, _), rec in machine.tasks.items()
                    )

                await eventually(stopped_on_borglets, 15, "the Borglets stopped the killed tasks")
                assert (await _job(client, job_id)).state == state_pb2.JOB_STATE_DEAD

                async def published() -> bool:
                    return (
                        sum(1 for e in events.task_events(job_id) if e.kind == K.TASK_EVENT_KIND_KILLED) == 3
                    )

                await eventually(published, 15, "KILLED events on borg.events")
                mine = events.task_events(job_id)
                assert [e.log_sequence for e in mine] == sorted(e.log_sequence for e in mine), "in log order"
                for index in range(3):
                    kinds = [e.kind for e in mine if e.task_index == index]
                    assert kinds == [
                        K.TASK_EVENT_KIND_SUBMITTED,
                        K.TASK_EVENT_KIND_SCHEDULED,
                        K.TASK_EVENT_KIND_RUNNING,
                        K.TASK_EVENT_KIND_KILLED,
                    ]


async def test_oom_kills_with_real_processes_are_events(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    async with (
        replicas(fresh_database_url, endpoints, 1, publish_events=True) as (master,),
        EventLog(endpoints.kafka_bootstrap, {user}) as events,
    ):
        await leader_of([master])
        # One 500 MiB machine, short of memory above 100 % (as in the Borglet's own pressure test).
        async with borglet(endpoints, [master.address], memory_bytes=500 * MIB, memory_pressure_fraction=1.0):
            channel, client = stub(master.address)
            async with channel:
                await eventually(lambda: _machines(client, 1), 15, "the machine registered")
                await grant(client, user)
                best_effort = resources_pb2.Resources(cpu_millicores=10_000, memory_bytes=1 << 40)
                await client.SetQuota(
                    borgmaster_pb2.SetQuotaRequest(
                        request_id=f"{user}-be",
                        user=user,
                        band=job_pb2.PRIORITY_BAND_BEST_EFFORT,
                        limit=best_effort,
                    )
                )

                async def submit(name: str, profile: str, limit: int, priority: int, hard: bool) -> str:
                    spec = _process_job(name, user, profile, limit, priority, hard)
                    request = borgmaster_pb2.SubmitJobRequest(request_id=f"{user}-{name}", spec=spec)
                    response = await retried_write(lambda: client.SubmitJob(request))
                    return str(response.job_id)

                leaky = await submit("leaky", "1s:20MiB:0,60s:300MiB:0", 100 * MIB, 9, hard=True)

                async def oom_of(job_id: str) -> list[Any]:
                    return [e for e in events.task_events(job_id) if e.kind == K.TASK_EVENT_KIND_OOM]

                await eventually(lambda: oom_of(leaky), 30, "a hard-limit OOM event")
                oom = (await oom_of(leaky))[0]
                assert oom.state == PENDING, "an OOM-killed task is rescheduled"
                assert oom.usage.memory_bytes > 100 * MIB, "the usage seen at the kill"
                assert "hard memory limit" in oom.detail
                await client.KillJob(borgmaster_pb2.KillJobRequest(request_id=f"{user}-kl", job_id=leaky))

                # Soft limits: B (priority 5) holds 200 MiB over its 50 MiB limit, C (priority 1)
                # 100 MiB within 300 MiB; then A (priority 2) grows to 300 MiB over 50 MiB. The
                # machine runs short and A, the lowest priority task over its limit, is killed.
                b = await submit("b", "600s:200MiB:0", 50 * MIB, 5, hard=False)
                c = await submit("c", "600s:100MiB:0", 300 * MIB, 1, hard=False)

                async def grown() -> bool:
                    statuses = [(await _job(client, j)).tasks[0] for j in (b, c)]
                    return all(t.state == RUNNING and t.usage.memory_bytes > 95 * MIB for t in statuses)

                await eventually(grown, 30, "B and C hold their memory")
                a = await submit("a", "600s:300MiB:0", 50 * MIB, 2, hard=False)
                await eventually(lambda: oom_of(a), 40, "a soft-limit pressure OOM of A")
                soft = (await oom_of(a))[0]
                assert "soft memory limit" in soft.detail
                assert not await oom_of(b)
                assert not await oom_of(c)


async def _machines(client: Any, count: int) -> bool:
    return len((await client.ListMachines(borgmaster_pb2.ListMachinesRequest())).machines) == count


async def test_a_borglet_that_stops_answering_is_marked_down_and_its_duplicates_are_killed_on_return(
    fresh_database_url: str, endpoints: StackEndpoints, tmp_path: Path
) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    async with replicas(fresh_database_url, endpoints, 1, missed_polls_down=3) as (master,):
        await leader_of([master])
        first = BorgletProcess(endpoints, [master.address], f"{user}-m1", tmp_path)
        first.start()
        channel, client = stub(master.address)
        try:
            async with channel:
                await eventually(lambda: _machines(client, 1), 20, "the first machine registered")
                await grant(client, user)
                spec = simulated_job("web", user=user, tasks=1)
                done = await client.SubmitJob(
                    borgmaster_pb2.SubmitJobRequest(request_id=f"{user}-s", spec=spec)
                )

                async def task() -> Any:
                    return (await _job(client, done.job_id)).tasks[0]

                async def started_on(machine_id: str) -> bool:
                    t = await task()
                    return (
                        t.state == RUNNING
                        and t.machine_id == machine_id
                        and t.reason == K.TASK_EVENT_KIND_RUNNING
                    )

                await eventually(
                    lambda: started_on(first.machine_id), 20, "the task runs on the first machine"
                )
                old = await task()
                async with borglet(endpoints, [master.address], machine_ids=[f"{user}-m2"]):
                    await eventually(lambda: _machines(client, 2), 20, "the second machine registered")
                    first.signal(signal.SIGSTOP)  # it keeps its task, but answers no poll

                    async def down() -> bool:
                        machines = (await client.ListMachines(borgmaster_pb2.ListMachinesRequest())).machines
                        return any(
                            m.spec.machine_id == first.machine_id
                            and m.state == machine_pb2.MACHINE_STATE_DOWN
                            for m in machines
                        )

                    await eventually(down, 20, "the silent machine marked down")
                    await eventually(lambda: started_on(f"{user}-m2"), 20, "the task rescheduled elsewhere")
                    moved = await task()
                    assert moved.incarnation == old.incarnation + 1
                    events = await client.GetTask(
                        borgmaster_pb2.GetTaskRequest(job_id=done.job_id, task_index=0)
                    )
                    assert K.TASK_EVENT_KIND_LOST in [e.kind for e in events.recent_events]

                    first.signal(signal.SIGCONT)  # it comes back still running incarnation 1
                    borglet_channel = service_channel(first.address, "borgmaster")
                    async with borglet_channel:
                        borglet_stub = borglet_pb2_grpc.BorgletStub(borglet_channel)

                        async def duplicate_killed() -> bool:
                            report = await borglet_stub.Poll(
                                borglet_pb2.PollRequest(
                                    machine_id=first.machine_id, master_epoch=master.replica.epoch
                                )
                            )
                            return not any(
                                t.job_id == done.job_id and t.state == RUNNING for t in report.tasks
                            )

                        await eventually(duplicate_killed, 20, "the returning machine killed its duplicate")

                    async def up_again() -> bool:
                        machines = (await client.ListMachines(borgmaster_pb2.ListMachinesRequest())).machines
                        return any(
                            m.spec.machine_id == first.machine_id and m.state == machine_pb2.MACHINE_STATE_UP
                            for m in machines
                        )

                    await eventually(up_again, 10, "the machine is up again")
                    still = await task()
                    assert (still.machine_id, still.incarnation) == (f"{user}-m2", moved.incarnation)
        finally:
            first.stop()
