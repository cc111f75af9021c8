"""Failure stays with the task, on the real embedded stack (Borg §3.3, §4).

* A spec naming an unknown usage model or parameter is INVALID_ARGUMENT at SubmitJob and
  UpdateJob, naming the field, and reaches no Borglet.
* A task that fails on its Borglet (a command that does not exist; a runtime its Borglet
  does not offer, so its plan cannot be run there) fails alone: its status shows why, its
  machine stays UP and the task beside it keeps running the same incarnation.
* Tasks that OOM at once back off: their incarnations grow about logarithmically with time
  and their checkpoint-log records stay under a cap; a task that crashes three times on one
  machine is moved off it, and why-pending says so while there is nowhere else to go.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from typing import Any

import grpc
import pytest
from borgmaster_harness import borglet, eventually, grant, leader_of, replicas, simulated_job, stub

from cellpilot.api.v1 import borgmaster_pb2, job_pb2, machine_pb2, state_pb2
from cellpilot.stack import StackEndpoints

RUNNING, PENDING = state_pb2.TASK_STATE_RUNNING, state_pb2.TASK_STATE_PENDING
MIB = 1 << 20


async def _job(client: Any, job_id: str) -> Any:
    return (await client.GetJob(borgmaster_pb2.GetJobRequest(job_id=job_id, include_tasks=True))).job


async def _machines(client: Any) -> list[Any]:
    return list((await client.ListMachines(borgmaster_pb2.ListMachinesRequest())).machines)


def _command_job(name: str, user: str, command: str, *args: str) -> job_pb2.JobSpec:
    spec = simulated_job(name, user=user, cpu=100, memory=256 * MIB)
    spec.app_class = job_pb2.APP_CLASS_BATCH
    spec.task.runtime.Clear()
    spec.task.runtime.process.command = command
    spec.task.runtime.process.args.extend(args)
    return spec


async def test_a_spec_with_a_typo_is_refused_at_the_door_naming_the_field(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    async with replicas(fresh_database_url, endpoints, 1) as (master,):
        await leader_of([master])
        channel, client = stub(master.address)
        async with channel:
            await grant(client, user)
            before = master.replica.state.last_sequence
            bad_model = simulated_job("typo", user=user)
            bad_model.task.runtime.simulated.usage_model = "nope"
            bad_param = simulated_job("param", user=user)
            bad_param.task.runtime.simulated.usage_model = "diurnal"
            bad_param.task.runtime.simulated.params["base_cpu_millicores"] = 300
            cases = [
                (bad_model, "spec.task.runtime.simulated.usage_model", "known models"),
                (
                    bad_param,
                    "spec.task.runtime.simulated.params.base_cpu_millicores",
                    "cpu_mean_millicores",
                ),
            ]
            for spec, field, words in cases:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(spec=spec))
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert refused.value.details().startswith(field), refused.value.details()
                assert words in refused.value.details()
            assert master.replica.state.last_sequence == before, "nothing was logged"
            # UpdateJob validates the merged spec the same way.
            good = await client.SubmitJob(
                borgmaster_pb2.SubmitJobRequest(spec=simulated_job("good", user=user))
            )
            update = job_pb2.JobSpec(task=bad_param.task)
            request = borgmaster_pb2.UpdateJobRequest(job_id=good.job_id, spec=update)
            request.update_mask.paths.append("task.runtime")
            with pytest.raises(grpc.aio.AioRpcError) as refused_update:
                await client.UpdateJob(request)
            assert refused_update.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused_update.value.details().startswith(
                "spec.task.runtime.simulated.params.base_cpu_millicores"
            )
            assert (await _job(client, good.job_id)).spec_version == 1


async def test_a_task_failing_on_its_borglet_fails_alone_and_its_machine_stays_up(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    async with replicas(fresh_database_url, endpoints, 1, missed_polls_down=3) as (master,):
        await leader_of([master])
        # One machine whose Borglet offers no process runtime: a process task's plan cannot
        # be run there (as a plan the Borglet cannot read); another job's command is missing.
        async with borglet(endpoints, [master.address], fleet_size=1, allow_process_runtime=False) as agent:
            machine_id = agent.profiles[0].machine_id
            channel, client = stub(master.address)
            async with channel:
                await eventually(lambda: _machines(client), 15, "the machine registered")
                await grant(client, user)
                neighbour = simulated_job("neighbour", user=user, cpu=200)
                neighbour.task.runtime.simulated.startup_seconds = 0
                await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(spec=neighbour))
                await client.SubmitJob(
                    borgmaster_pb2.SubmitJobRequest(spec=_command_job("proc", user, "/bin/sleep", "600"))
                )

                async def failed_with_reason() -> Any:
                    task = (await _job(client, f"{user}/proc")).tasks[0]
                    return task if task.failures >= 2 else None

                failed = await eventually(failed_with_reason, 30, "the process task failed twice")
                assert "does not run process tasks" in failed.last_failure
                assert "spec.runtime.process" in failed.last_failure
                running = (await _job(client, f"{user}/neighbour")).tasks[0]
                assert running.state == RUNNING
                # Long enough for a machine failing its polls to be marked down (3 x 0.5 s).
                await asyncio.sleep(3.0)
                (machine,) = await _machines(client)
                assert machine.state == machine_pb2.MACHINE_STATE_UP
                after = (await _job(client, f"{user}/neighbour")).tasks[0]
                assert (after.state, after.incarnation, after.machine_id) == (
                    RUNNING,
                    running.incarnation,
                    machine_id,
                )
                proc = (await _job(client, f"{user}/proc")).tasks[0]
                assert proc.failures >= 2
                assert proc.reason in (state_pb2.TASK_EVENT_KIND_FAILED, state_pb2.TASK_EVENT_KIND_SCHEDULED,
                                       state_pb2.TASK_EVENT_KIND_RUNNING)  # fmt: skip
                events = await client.GetTask(
                    borgmaster_pb2.GetTaskRequest(job_id=f"{user}/proc", task_index=0)
                )
                failures = [e for e in events.recent_events if e.kind == state_pb2.TASK_EVENT_KIND_FAILED]
                assert failures
                assert all(e.state == PENDING for e in failures)
                assert all(e.machine_id == machine_id for e in failures)
                assert not [e for e in events.recent_events if e.kind == state_pb2.TASK_EVENT_KIND_LOST]


async def test_tasks_that_oom_at_once_back_off_and_bound_the_log(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    jobs = 12
    async with replicas(fresh_database_url, endpoints, 1) as (master,):
        await leader_of([master])
        async with borglet(endpoints, [master.address], fleet_size=2):
            channel, client = stub(master.address)
            async with channel:
                await eventually(lambda: _machines(client), 15, "the machines registered")
                await grant(client, user)
                started = time.monotonic()
                first_seq = master.replica.state.last_sequence
                for i in range(jobs):
                    spec = simulated_job(f"oom{i}", user=user, cpu=100, memory=64 * MIB)
                    spec.task.runtime.simulated.params["memory_bytes"] = 256 * MIB  # over its limit
                    await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(spec=spec))
                await asyncio.sleep(15.0)
                elapsed = time.monotonic() - started
                records = master.replica.state.last_sequence - first_seq
                statuses = [(await _job(client, f"{user}/oom{i}")).tasks[0] for i in range(jobs)]
        incarnations = [t.incarnation for t in statuses]
        # Delays of 1, 2, 4, 8 s: at most 5 starts in 15 s (without backoff: one every poll).
        bound = 1 + math.ceil(math.log2(elapsed + 1))
        assert max(incarnations) <= bound, incarnations
        assert min(t.failures for t in statuses) >= 2, "every task crash-looped"
        assert all(t.state != state_pb2.TASK_STATE_DEAD for t in statuses), "an OOM loop is not given up"
        assert all("OOM" in t.last_failure or "oom" in t.last_failure for t in statuses)
        # Submission, then per start: scheduled, (running), OOM.
        per_task = records / jobs
        assert per_task <= 3 * max(incarnations) + 2, (records, incarnations)


async def test_a_task_crashing_on_one_machine_is_moved_off_it(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    user = f"u{uuid.uuid4().hex[:6]}"
    async with replicas(fresh_database_url, endpoints, 1) as (master,):
        await leader_of([master])
        async with borglet(endpoints, [master.address], fleet_size=1) as first:
            bad = first.profiles[0].machine_id
            channel, client = stub(master.address)
            async with channel:
                await eventually(lambda: _machines(client), 15, "the first machine registered")
                await grant(client, user)
                # Crashes on the first machine only (the Borglet tells a task its machine).
                script = f'test "$CELLPILOT_MACHINE_ID" != "{bad}" || exit 3; exec sleep 600'
                await client.SubmitJob(
                    borgmaster_pb2.SubmitJobRequest(spec=_command_job("picky", user, "/bin/sh", "-c", script))
                )
                job_id = f"{user}/picky"

                async def avoiding() -> Any:
                    task = (await _job(client, job_id)).tasks[0]
                    return task if task.avoided_machines else None

                task = await eventually(avoiding, 30, "the task avoids the machine it crashed on")
                assert [a.machine_id for a in task.avoided_machines] == [bad]
                assert task.failures >= 3
                assert task.state == PENDING

                async def explained() -> Any:
                    why = await client.WhyPending(borgmaster_pb2.WhyPendingRequest(job_id=job_id))
                    return why if why.avoided_machines and "avoid" in why.summary else None

                why = await eventually(explained, 15, "why-pending names the avoided machine")
                assert bad in why.summary
                async with borglet(endpoints, [master.address], fleet_size=1) as second:
                    good = second.profiles[0].machine_id

                    async def moved() -> Any:
                        t = (await _job(client, job_id)).tasks[0]
                        return t if t.state == RUNNING and t.machine_id == good else None

                    await eventually(moved, 30, "the task runs on the other machine")
                    assert (await _job(client, job_id)).tasks[0].machine_id == good
