"""Updates through gRPC (Borg §2.3) and the Autopilot hold (Autopilot §3.1), checked against the log.

* An Autopiloted job waits in HELD_FOR_AUTOPILOT, unscheduled, until the Autopilot actuator
  calls UpdateJob with ``release_hold`` (and its leader epoch as ``fencing_token``); an older
  token is then refused.
* A limit change that still fits is done in place; one that no longer fits reschedules the
  tasks, rolling, never more than ``policy.max_disruptions`` down at any log position.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from borgmaster_harness import GIB, eventually, grant, leader_of, machine, replicas, simulated_job, stub
from google.protobuf.field_mask_pb2 import FieldMask

from cellpilot.api.v1 import borgmaster_pb2, job_pb2, state_pb2
from cellpilot.borg.cell_state import CellState
from cellpilot.borg.lifecycle import TaskEvent, TaskState
from cellpilot.borg.mutations import LogRecord, TaskStateChanged
from cellpilot.checkpoint_store import PostgresCheckpointStore
from cellpilot.platform.error_reasons import FENCED, reason_of
from cellpilot.platform.postgres import create_engine
from cellpilot.stack import StackEndpoints

RUNNING = state_pb2.TASK_STATE_RUNNING
# No Borglet answers in these tests: polls are far apart, so registered machines stay up and
# scheduled tasks stay where the master put them.
NO_POLLS = {"poll_interval_s": 600}


async def _log(database_url: str) -> list[LogRecord]:
    engine = create_engine(database_url, pool_size=1)
    try:
        return await PostgresCheckpointStore(engine).read(0, limit=1_000_000)
    finally:
        await engine.dispose()


async def _job(client: Any, job_id: str) -> Any:
    return (await client.GetJob(borgmaster_pb2.GetJobRequest(job_id=job_id, include_tasks=True))).job


async def _register(client: Any, *machine_ids: str, memory: int = 8 * GIB) -> None:
    for machine_id in machine_ids:
        await client.RegisterMachine(
            borgmaster_pb2.RegisterMachineRequest(
                request_id=f"register-{machine_id}", spec=machine(machine_id, memory=memory)
            )
        )


async def test_an_autopiloted_job_is_held_until_the_actuator_releases_it(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    async with replicas(fresh_database_url, endpoints, 1, **NO_POLLS) as (master,):
        await leader_of([master])
        channel, client = stub(master.address)
        async with channel:
            await grant(client, "alice")
            await _register(client, "m0")
            spec = simulated_job("auto", tasks=2)
            spec.autopilot.memory.mode = job_pb2.SCALING_MODE_ON
            submitted = await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(request_id="s", spec=spec))
            assert submitted.state == state_pb2.JOB_STATE_HELD_FOR_AUTOPILOT
            plain = await client.SubmitJob(
                borgmaster_pb2.SubmitJobRequest(request_id="p", spec=simulated_job("plain"))
            )
            assert plain.state == state_pb2.JOB_STATE_PENDING

            async def plain_running() -> bool:
                return (await _job(client, "alice/plain")).state == state_pb2.JOB_STATE_RUNNING

            await eventually(plain_running, 10, "the job without Autopilot scheduled")
            held = await _job(client, "alice/auto")
            assert held.state == state_pb2.JOB_STATE_HELD_FOR_AUTOPILOT, "scheduler passes ran; still held"
            assert all(t.state == state_pb2.TASK_STATE_PENDING and not t.machine_id for t in held.tasks)
            listed = await client.ListJobs(
                borgmaster_pb2.ListJobsRequest(states=[state_pb2.JOB_STATE_HELD_FOR_AUTOPILOT])
            )
            assert [j.job_id for j in listed.jobs] == ["alice/auto"], "how the actuator finds held jobs"
            why = await client.WhyPending(borgmaster_pb2.WhyPendingRequest(job_id="alice/auto"))
            assert "held until Autopilot" in why.summary

            # What the Autopilot actuator sends on the first recommendation: release_hold, its
            # leader epoch as fencing_token, and (here) the recommended memory limit.
            recommended = simulated_job("auto", memory=GIB // 2)
            release = borgmaster_pb2.UpdateJobRequest(
                request_id="autopilot-first",
                job_id="alice/auto",
                spec=recommended,
                update_mask=FieldMask(paths=["task.limits.memory_bytes"]),
                fencing_token=7,
                release_hold=True,
            )
            released = await client.UpdateJob(release)
            assert released.job.state == state_pb2.JOB_STATE_PENDING
            assert released.job.fencing_token == 7
            assert released.job.spec_version == 2
            again = await client.UpdateJob(release)
            assert again.log_sequence == released.log_sequence, "a retried release changes nothing"

            # The bare form: release_hold alone, no spec and no mask, keeps the job's own limits.
            bare_spec = simulated_job("bare")
            bare_spec.autopilot.cpu.mode = job_pb2.SCALING_MODE_DRY_RUN
            await client.SubmitJob(borgmaster_pb2.SubmitJobRequest(request_id="b", spec=bare_spec))
            bare = await client.UpdateJob(
                borgmaster_pb2.UpdateJobRequest(
                    request_id="autopilot-bare", job_id="alice/bare", release_hold=True, fencing_token=7
                )
            )
            assert bare.job.state == state_pb2.JOB_STATE_PENDING
            assert bare.job.spec.task.limits == bare_spec.task.limits

            async def auto_running() -> Any:
                job = await _job(client, "alice/auto")
                return job if job.state == state_pb2.JOB_STATE_RUNNING else None

            job = await eventually(auto_running, 10, "the released job scheduled")
            assert {t.limits.memory_bytes for t in job.tasks} == {GIB // 2}
            assert {t.machine_id for t in job.tasks} == {"m0"}

            with pytest.raises(grpc.aio.AioRpcError) as deposed:
                await client.UpdateJob(
                    borgmaster_pb2.UpdateJobRequest(
                        request_id="autopilot-old",
                        job_id="alice/auto",
                        spec=simulated_job("auto", memory=GIB),
                        update_mask=FieldMask(paths=["task.limits.memory_bytes"]),
                        fencing_token=6,
                    )
                )
            assert deposed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "fencing_token" in (deposed.value.details() or "")
            assert reason_of(deposed.value.trailing_metadata()) == FENCED

    records = await _log(fresh_database_url)
    assert sum(1 for r in records if r.cause_id == "autopilot-first") == 1, "one JobUpdated, no retry"
    assert all(r.request_id != "autopilot-old" for r in records)


def _down_after(records: list[LogRecord], job_id: str, from_seq: int) -> list[int]:
    """How many of the job's tasks were down (rescheduled, not yet placed) at each log position."""
    state = CellState()
    down: list[int] = []
    for record in records:
        state.apply(record)
        if record.sequence >= from_seq:
            job = state.jobs[job_id]
            down.append(
                sum(1 for t in job.tasks.values() if t.state is TaskState.PENDING and t.incarnation > 0)
            )
    return down


async def test_an_update_that_no_longer_fits_reschedules_rolling_within_the_disruption_cap(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    async with replicas(fresh_database_url, endpoints, 1, **NO_POLLS) as (master,):
        await leader_of([master])
        channel, client = stub(master.address)
        async with channel:
            await grant(client, "alice")
            await _register(client, "m0")  # one 8 GiB machine: all three 2 GiB tasks land on it
            await client.SubmitJob(
                borgmaster_pb2.SubmitJobRequest(
                    request_id="s", spec=simulated_job("web", tasks=3, memory=2 * GIB)
                )
            )

            async def placed() -> Any:
                job = await _job(client, "alice/web")
                return job if job.state == state_pb2.JOB_STATE_RUNNING else None

            before = await eventually(placed, 10, "three tasks on m0")
            assert {t.machine_id for t in before.tasks} == {"m0"}
            await _register(client, "m1", "m2")

            # A CPU change that fits where the tasks run: done in place, nobody moves.
            await client.UpdateJob(
                borgmaster_pb2.UpdateJobRequest(
                    request_id="cpu",
                    job_id="alice/web",
                    spec=simulated_job("web", cpu=600),
                    update_mask=FieldMask(paths=["task.limits.cpu_millicores"]),
                    policy=borgmaster_pb2.UpdatePolicy(max_disruptions=1),
                )
            )
            in_place = await _job(client, "alice/web")
            assert [(t.machine_id, t.incarnation, t.limits.cpu_millicores) for t in in_place.tasks] == [
                (t.machine_id, t.incarnation, 600) for t in before.tasks
            ]

            # 3 x 5 GiB cannot stay on the 8 GiB machine: every task must move, one at a time.
            grown = await client.UpdateJob(
                borgmaster_pb2.UpdateJobRequest(
                    request_id="grow",
                    job_id="alice/web",
                    spec=simulated_job("web", memory=5 * GIB),
                    update_mask=FieldMask(paths=["task.limits.memory_bytes"]),
                    policy=borgmaster_pb2.UpdatePolicy(max_disruptions=1),
                )
            )

            async def rolled() -> Any:
                job = await _job(client, "alice/web")
                done = all(t.state == RUNNING and t.spec_version == grown.job.spec_version for t in job.tasks)
                return job if done and job.state == state_pb2.JOB_STATE_RUNNING else None

            after = await eventually(rolled, 20, "the rolling update done")
            assert all(t.limits.memory_bytes == 5 * GIB for t in after.tasks)
            by_machine: dict[str, int] = {}
            for t in after.tasks:
                by_machine[t.machine_id] = by_machine.get(t.machine_id, 0) + 1
            assert max(by_machine.values()) == 1, f"5 GiB tasks do not share an 8 GiB machine: {by_machine}"
            pairs = zip(after.tasks, before.tasks, strict=True)
            assert all(t.incarnation == b.incarnation + 1 for t, b in pairs), "each task moved once"

    records = await _log(fresh_database_url)
    grow_seq = next(r.sequence for r in records if r.request_id == "grow")
    evicted = [
        r.mutation
        for r in records
        if isinstance(r.mutation, TaskStateChanged)
        and r.mutation.reason is TaskEvent.EVICTED
        and r.mutation.job_id == "alice/web"
    ]
    causes = [
        r.cause_id
        for r in records
        if isinstance(r.mutation, TaskStateChanged) and r.mutation.reason is TaskEvent.EVICTED
    ]
    assert len(evicted) == 3
    assert all("rolling update" in m.detail for m in evicted)
    assert causes.count("grow") == 1, "the update itself moved one task"
    down = _down_after(records, "alice/web", grow_seq)
    assert max(down) == 1, "never more than max_disruptions tasks down"
    assert down[-1] == 0
