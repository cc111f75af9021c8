"""Fauxmaster replay (Borg §3.1): the state rebuilt at an earlier log position equals what the live
master reported at that point, from the log alone and from a snapshot plus the log."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from borgmaster_harness import eventually, grant, leader_of, machine, replicas, simulated_job, stub
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.json_format import MessageToDict
from typer.testing import CliRunner

from cellpilot.api.v1 import borgmaster_pb2, borgmaster_pb2_grpc
from cellpilot.cli.borgmaster import app
from cellpilot.stack import StackEndpoints


def _strip(value: Any) -> Any:
    """Soft state (usage, reservations, what machines reserve) is not in the log; the rest must match."""
    if isinstance(value, dict):
        return {
            k: _strip(v)
            for k, v in value.items()
            if k not in ("reservation", "reserved", "usage", "lastContactMs")
        }
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


async def _live_view(client: borgmaster_pb2_grpc.BorgmasterStub) -> tuple[int, dict[str, Any]]:
    """What the live master reports, at one log position (retried until nothing moved meanwhile)."""
    while True:
        before = (await client.GetLeader(borgmaster_pb2.GetLeaderRequest())).leader.log_sequence
        jobs = (await client.ListJobs(borgmaster_pb2.ListJobsRequest())).jobs
        detail = {
            j.job_id: MessageToDict(
                (await client.GetJob(borgmaster_pb2.GetJobRequest(job_id=j.job_id, include_tasks=True))).job
            )
            for j in jobs
        }
        machines = (await client.ListMachines(borgmaster_pb2.ListMachinesRequest())).machines
        after = (await client.GetLeader(borgmaster_pb2.GetLeaderRequest())).leader.log_sequence
        if before == after:
            view = {
                "jobs": [MessageToDict(j) for j in jobs],
                "detail": detail,
                "machines": [MessageToDict(m) for m in machines],
            }
            return before, _strip(view)
        await asyncio.sleep(0.1)


async def _replay(database_url: str, *args: str) -> Any:
    result = await asyncio.to_thread(
        CliRunner().invoke, app, ["replay", "--database-url", database_url, "--json", *args]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


async def _cellpilot(database_url: str, *args: str) -> Any:
    from cellpilot.cli.main import app as cellpilot

    command = ["borgmaster", "replay", "--database-url", database_url, *args]
    return await asyncio.to_thread(CliRunner().invoke, cellpilot, command)


async def _replayed_view(database_url: str, seq: int) -> dict[str, Any]:
    jobs = await _replay(database_url, "--to", str(seq), "jobs")
    detail = {j["jobId"]: await _replay(database_url, "--to", str(seq), "job", j["jobId"]) for j in jobs}
    machines = await _replay(database_url, "--to", str(seq), "machines")
    return _strip({"jobs": jobs, "detail": detail, "machines": machines})


async def _settled(client: borgmaster_pb2_grpc.BorgmasterStub, pending: int) -> bool:
    jobs = (await client.ListJobs(borgmaster_pb2.ListJobsRequest())).jobs
    return sum(j.task_counts.pending for j in jobs) == pending


async def test_replay_at_earlier_positions_equals_what_the_live_master_reported(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    # No Borglets answer here: polls are far apart so the machines stay up.
    async with replicas(fresh_database_url, endpoints, 1, poll_interval_s=600) as (master,):
        await leader_of([master])
        channel, client = stub(master.address)
        async with channel:
            await grant(client, "alice")
            await grant(client, "bob")
            for i in range(3):
                spec = machine(f"m{i}", cpu=4000, memory=8 << 30)
                await client.RegisterMachine(
                    borgmaster_pb2.RegisterMachineRequest(request_id=f"m{i}", spec=spec)
                )
            submitted = await client.SubmitJob(
                borgmaster_pb2.SubmitJobRequest(request_id="a", spec=simulated_job("web", tasks=3, cpu=1000))
            )
            await client.SubmitJob(
                borgmaster_pb2.SubmitJobRequest(
                    request_id="b", spec=simulated_job("batch", user="bob", priority=4, tasks=4, cpu=1500)
                )
            )
            await eventually(lambda: _settled(client, 0), 10, "everything scheduled")
            first_seq, first = await _live_view(client)

            snapshot_seq = await master.replica.write_snapshot()
            await client.UpdateJob(
                borgmaster_pb2.UpdateJobRequest(
                    request_id="u",
                    job_id="alice/web",
                    spec=simulated_job("web", tasks=5, cpu=1000),
                    update_mask=FieldMask(paths=["task_count"]),
                )
            )
            await client.SubmitJob(
                borgmaster_pb2.SubmitJobRequest(
                    request_id="c", spec=simulated_job("big", priority=10, tasks=2, cpu=3000)
                )
            )
            await client.KillJob(borgmaster_pb2.KillJobRequest(request_id="k", job_id="bob/batch"))
            await asyncio.sleep(0.5)
            second_seq, second = await _live_view(client)
            assert second_seq > snapshot_seq >= first_seq

            assert await _replayed_view(fresh_database_url, first_seq) == first, "from the log alone"
            assert await _replayed_view(fresh_database_url, second_seq) == second, (
                "from the snapshot and the log"
            )

            summary = await _replay(fresh_database_url, "--to", str(second_seq))
            assert summary["from_snapshot"] == snapshot_seq
            assert summary["log_sequence"] == second_seq

            # Through the registered `cellpilot` command: the human-readable answer, and a clear
            # error for a position the log does not hold.
            head = master.replica.state.last_sequence
            table = await _cellpilot(fresh_database_url, "--to", str(first_seq), "jobs")
            assert table.exit_code == 0, table.output
            assert "alice/web" in table.output
            assert "bob/batch" in table.output
            beyond = await _cellpilot(fresh_database_url, "--to", str(head + 1000))
            assert beyond.exit_code != 0
            assert "the log holds positions" in beyond.output

            # "Schedule all pending" offline, at the position just after the first submission.
            offline = await _replay(
                fresh_database_url, "--to", str(submitted.log_sequence), "--schedule-pending"
            )
            assert offline["pending"] == 3
            assert len(offline["placements"]) == 3
            assert {p["machine"] for p in offline["placements"]} <= {"m0", "m1", "m2"}
