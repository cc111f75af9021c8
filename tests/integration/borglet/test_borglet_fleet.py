"""Fleet mode: one ``python -m cellpilot_services.borglet`` process hosting 100 simulated machines,
registering them with the Borgmaster (through a follower's redirect, retrying until the master
is up), polled by machine id, publishing traced samples per machine."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from borglet_builders import collect_samples, eventually, poll, simulated_task
from stack_security import security, service_channel

from cellpilot.api.v1 import (
    borglet_pb2,
    borglet_pb2_grpc,
    borgmaster_pb2,
    borgmaster_pb2_grpc,
    machine_pb2,
    state_pb2,
)
from cellpilot.stack import StackEndpoints
from cellpilot.stack.config import free_port

MACHINES = 100
TASKS_PER_MACHINE = 20


class FakeBorgmaster(borgmaster_pb2_grpc.BorgmasterServicer):
    """A replica that either accepts registrations (the master) or redirects to the master."""

    def __init__(self, leader_address: str | None) -> None:
        self.leader_address = leader_address
        self.registered: dict[str, machine_pb2.MachineSpec] = {}
        self.calls = 0

    async def RegisterMachine(
        self, request: borgmaster_pb2.RegisterMachineRequest, context: Any
    ) -> borgmaster_pb2.RegisterMachineResponse:
        self.calls += 1
        if self.leader_address is not None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "not the master",
                trailing_metadata=(("cellpilot-leader", self.leader_address),),
            )
        self.registered[request.spec.machine_id] = request.spec
        return borgmaster_pb2.RegisterMachineResponse(
            machine=machine_pb2.Machine(spec=request.spec, state=machine_pb2.MACHINE_STATE_UP),
            log_sequence=len(self.registered),
        )


async def _serve(servicer: FakeBorgmaster, port: int) -> grpc.aio.Server:
    server = grpc.aio.server()
    borgmaster_pb2_grpc.add_BorgmasterServicer_to_server(servicer, server)
    credentials = security().server_credentials("borgmaster")  # the Borglet dials it over mTLS
    assert credentials is not None
    server.add_secure_port(f"127.0.0.1:{port}", credentials)
    await server.start()
    return server


@pytest.fixture
def fleet_process(endpoints: StackEndpoints, tmp_path: Any) -> Iterator[dict[str, Any]]:
    port, leader_port, follower_port, dead_port = (free_port() for _ in range(4))
    prefix = f"fleet-{uuid.uuid4().hex[:6]}"
    env = {
        **os.environ,
        "CELLPILOT_STACK_ENV": str(tmp_path / "no-stack.env"),
        "CELLPILOT_KAFKA_BOOTSTRAP": endpoints.kafka_bootstrap,
        "CELLPILOT_LOG_JSON": "false",
        "CELLPILOT_LOG_LEVEL": "WARNING",
        "CELLPILOT_BORGLET_LISTEN_ADDRESS": f"127.0.0.1:{port}",
        "CELLPILOT_BORGLET_FLEET_SIZE": str(MACHINES),
        "CELLPILOT_BORGLET_MACHINE_ID_PREFIX": prefix,
        "CELLPILOT_BORGLET_SPEEDUP": "5",
        "CELLPILOT_BORGLET_MEMORY_BYTES": str(64 << 30),
        "CELLPILOT_BORGLET_BORGMASTER_ADDRESSES": f"127.0.0.1:{dead_port},127.0.0.1:{follower_port}",
        "CELLPILOT_BORGLET_REGISTER_BACKOFF_MAX_S": "0.5",
        "CELLPILOT_BORGLET_CGROUP_ROOT": "none",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "cellpilot_services.borglet"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "borglet.log", "wb"),  # noqa: SIM115
        start_new_session=True,
    )
    try:
        yield {
            "process": process,
            "address": f"127.0.0.1:{port}",
            "leader_port": leader_port,
            "follower_port": follower_port,
            "machine_ids": [f"{prefix}-r0-{i:04d}" for i in range(MACHINES)],
            "log": tmp_path / "borglet.log",
        }
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def _wait_serving(stub: borglet_pb2_grpc.BorgletStub, machine_id: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await poll(stub, machine_id, epoch=1)
            return
        except grpc.aio.AioRpcError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


async def test_a_fleet_of_100_machines_registers_serves_polls_and_publishes(
    fleet_process: dict[str, Any], endpoints: StackEndpoints
) -> None:
    leader = FakeBorgmaster(None)
    follower = FakeBorgmaster(f"127.0.0.1:{fleet_process['leader_port']}")
    follower_server = await _serve(follower, fleet_process["follower_port"])
    leader_server = None
    try:
        machine_ids: list[str] = fleet_process["machine_ids"]
        async with service_channel(fleet_process["address"], "borgmaster") as channel:
            stub = borglet_pb2_grpc.BorgletStub(channel)
            await _wait_serving(stub, machine_ids[0])
            # The master comes up late: the Borglet keeps retrying through the follower's redirect.
            await asyncio.sleep(1.0)
            assert leader.registered == {}
            assert follower.calls > 0
            leader_server = await _serve(leader, fleet_process["leader_port"])

            async def all_registered() -> bool:
                return len(leader.registered) == MACHINES

            await eventually(all_registered, timeout_s=30)
            assert sorted(leader.registered) == sorted(machine_ids)
            spec = leader.registered[machine_ids[45]]
            assert spec.borglet_address == fleet_process["address"]
            assert spec.capacity.memory_bytes == 64 << 30
            assert spec.rack == "rack-r0-1"  # 40 machines per rack
            assert len({s.rack for s in leader.registered.values()}) == 3

            # The master polls every machine with its desired set: 20 simulated tasks each.
            def desired(m: int) -> borglet_pb2.DesiredTasks:
                tasks = [
                    simulated_task(f"fleet/job{m % 7}", m * TASKS_PER_MACHINE + i, memory_limit=1 << 30)
                    for i in range(TASKS_PER_MACHINE)
                ]
                return borglet_pb2.DesiredTasks(version=1, tasks=tasks)

            started = time.monotonic()
            replies = await asyncio.gather(
                *(poll(stub, mid, epoch=1, desired=desired(m)) for m, mid in enumerate(machine_ids))
            )
            first_cycle_s = time.monotonic() - started
            assert [r.machine_id for r in replies] == machine_ids
            assert all(len(r.tasks) == TASKS_PER_MACHINE for r in replies)
            started = time.monotonic()
            replies = await asyncio.gather(*(poll(stub, mid, epoch=1) for mid in machine_ids))
            steady_cycle_s = time.monotonic() - started
            assert all(r.desired_version == 1 for r in replies)
            assert all(t.state == state_pb2.TASK_STATE_RUNNING for r in replies for t in r.tasks)
            print(f"poll cycle over {MACHINES} machines: {first_cycle_s:.2f} s, then {steady_cycle_s:.2f} s")

            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await poll(stub, "not-in-this-fleet", epoch=1)
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

            # Many machines' polls in one call, each answered as alone; an older desired set
            # (a lagging link shard's) is ignored.
            stale = borglet_pb2.DesiredTasks(version=0)
            batch = borglet_pb2.PollMachinesRequest(
                polls=[
                    borglet_pb2.PollRequest(machine_id=machine_ids[0], master_epoch=1, desired=stale),
                    borglet_pb2.PollRequest(machine_id=machine_ids[1], master_epoch=1),
                    borglet_pb2.PollRequest(machine_id="not-in-this-fleet", master_epoch=1),
                ]
            )
            answer = await stub.PollMachines(batch)
            assert [r.machine_id for r in answer.responses] == machine_ids[:2]
            assert all(r.desired_version == 1 and len(r.tasks) == TASKS_PER_MACHINE for r in answer.responses)
            assert [(r.machine_id, r.code) for r in answer.refusals] == [
                ("not-in-this-fleet", grpc.StatusCode.NOT_FOUND.value[0])
            ]

            # Samples from every machine, with trace context in the record headers.
            records = await collect_samples(
                endpoints.kafka_bootstrap, set(machine_ids), enough=MACHINES * TASKS_PER_MACHINE * 3
            )
            assert {record.key for record, _ in records} == set(machine_ids)
            assert all(any(k == "traceparent" for k, _ in record.headers) for record, _ in records)
            times: dict[tuple[str, int], list[int]] = {}
            for record, batch in records:
                for sample in batch.samples:
                    times.setdefault((record.key, sample.task_index), []).append(sample.event_time_ms)
            assert len(times) == MACHINES * TASKS_PER_MACHINE
            for series in times.values():
                assert all(b - a == 1000 for a, b in itertools.pairwise(series))
    finally:
        await follower_server.stop(0)
        if leader_server is not None:
            await leader_server.stop(0)
    process = fleet_process["process"]
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == 0, fleet_process["log"].read_text()[-2000:]
