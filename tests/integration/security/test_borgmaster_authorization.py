"""Who may change what, against a real Borgmaster and a real Borglet fleet over mTLS (Borg §2.5).

Table-driven: every mutating Borgmaster RPC is refused UNAUTHENTICATED without a token or
with a forged one, and PERMISSION_DENIED for a user who does not own the object or lacks the
admin capability; a refused call changes nothing. The actuator's service identity may change
only the limits/task counts Autopilot actuates (mode ON) and nothing else; a Borglet may
register only the machines its certificate names, while the fleet of ``borglet-r0`` registers
its own machines and is polled.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.message import Message

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "borgmaster"))

from borgmaster_harness import borglet, eventually, grant, leader_of, machine, replicas, simulated_job, stub
from stack_security import security, service_channel, user_channel

from cellpilot.api.v1 import borgmaster_pb2, borgmaster_pb2_grpc, job_pb2, machine_pb2, resources_pb2
from cellpilot.stack import StackEndpoints

pytestmark = pytest.mark.timeout(120)
OWNER, INTRUDER = "alice", "mallory"


@dataclass(frozen=True)
class Case:
    """One mutating RPC: the request a legitimate caller could make, and who that is."""

    method: str
    build: Callable[[], Message]
    rightful: str  # "owner" (OWNER's own object) or "admin"


def update(job_id: str, path: str, **spec: Any) -> borgmaster_pb2.UpdateJobRequest:
    new = job_pb2.JobSpec(**spec)
    if path == "task.limits.cpu_millicores":
        new.task.limits.cpu_millicores = 700
    if path == "task.limits.memory_bytes":
        new.task.limits.memory_bytes = 3 << 30
    return borgmaster_pb2.UpdateJobRequest(
        request_id=uuid.uuid4().hex, job_id=job_id, spec=new, update_mask=FieldMask(paths=[path])
    )


CASES = [
    Case(
        "SubmitJob",
        lambda: borgmaster_pb2.SubmitJobRequest(
            request_id=uuid.uuid4().hex, spec=simulated_job(f"new-{uuid.uuid4().hex[:6]}", OWNER)
        ),
        "owner",
    ),
    Case("UpdateJob", lambda: update(f"{OWNER}/plain", "task_count", task_count=2), "owner"),
    Case("KillJob", lambda: borgmaster_pb2.KillJobRequest(request_id="k", job_id=f"{OWNER}/plain"), "owner"),
    Case(
        "RegisterMachine",
        lambda: borgmaster_pb2.RegisterMachineRequest(request_id="r", spec=machine("machine-r0-0900")),
        "admin",
    ),
    Case(
        "SetMachineState",
        lambda: borgmaster_pb2.SetMachineStateRequest(
            request_id="s", machine_id="machine-r0-0000", state=machine_pb2.MACHINE_STATE_DRAINING
        ),
        "admin",
    ),
    Case(
        "SetQuota",
        lambda: borgmaster_pb2.SetQuotaRequest(
            request_id="q",
            user=INTRUDER,
            band=job_pb2.PRIORITY_BAND_PRODUCTION,
            limit=resources_pb2.Resources(cpu_millicores=10**9, memory_bytes=1 << 50),
        ),
        "admin",
    ),
]


@pytest.fixture
async def cell(fresh_database_url: str, endpoints: StackEndpoints) -> AsyncIterator[str]:
    """A Borgmaster, the ``borglet-r0`` fleet (machines machine-r0-*), two of OWNER's jobs."""
    async with replicas(fresh_database_url, endpoints) as masters:
        master = await leader_of(masters)
        async with borglet(
            endpoints, [master.address], identity="borglet-r0", machine_id_prefix="machine", fleet_size=2
        ) as fleet:
            assert fleet.settings.resolved_machine_ids() == ["machine-r0-0000", "machine-r0-0001"]
            channel, admin = stub(master.address)
            async with channel:

                async def registered() -> bool:
                    listed = await admin.ListMachines(borgmaster_pb2.ListMachinesRequest())
                    return len(listed.machines) == 2

                await eventually(registered, 15, "the borglet-r0 fleet registered")
                await grant(admin, OWNER)
                auto = simulated_job("auto", OWNER)
                auto.autopilot.cpu.mode = job_pb2.SCALING_MODE_ON
                async with user_channel(master.address, OWNER) as owner_channel:
                    owner = borgmaster_pb2_grpc.BorgmasterStub(owner_channel)
                    for spec in (simulated_job("plain", OWNER), auto):
                        await owner.SubmitJob(
                            borgmaster_pb2.SubmitJobRequest(request_id=spec.name, spec=spec)
                        )
                yield master.address


async def snapshot(address: str) -> tuple[Any, ...]:
    """Everything the refused calls could have changed."""
    async with user_channel(address) as channel:
        admin = borgmaster_pb2_grpc.BorgmasterStub(channel)
        jobs = (await admin.ListJobs(borgmaster_pb2.ListJobsRequest())).jobs
        machines = (await admin.ListMachines(borgmaster_pb2.ListMachinesRequest())).machines
        quota = await admin.GetQuota(borgmaster_pb2.GetQuotaRequest(user=INTRUDER))
        return (
            sorted((j.job_id, j.spec_version, j.spec.SerializeToString(deterministic=True)) for j in jobs),
            sorted((m.spec.machine_id, m.state) for m in machines),
            quota.SerializeToString(deterministic=True),
        )


async def call(channel: grpc.aio.Channel, method: str, request: Message, **kw: Any) -> grpc.StatusCode:
    try:
        await getattr(borgmaster_pb2_grpc.BorgmasterStub(channel), method)(request, timeout=5, **kw)
    except grpc.aio.AioRpcError as error:
        return error.code()
    return grpc.StatusCode.OK


async def test_every_mutating_rpc_refuses_strangers_and_changes_nothing(cell: str) -> None:
    before = await snapshot(cell)
    transport = security().channel_credentials()
    assert transport is not None
    async with grpc.aio.secure_channel(cell, transport) as anonymous:
        for case in CASES:  # the client certificate alone says no user
            assert await call(anonymous, case.method, case.build()) == grpc.StatusCode.UNAUTHENTICATED, case
            forged = (("authorization", "Bearer cpt1.eyJzdWIiOiJyb290In0.forged"),)
            assert await call(anonymous, case.method, case.build(), metadata=forged) == (
                grpc.StatusCode.UNAUTHENTICATED
            ), case
    async with user_channel(cell, INTRUDER) as intruder, user_channel(cell, OWNER) as owner:
        for case in CASES:
            assert await call(intruder, case.method, case.build()) == grpc.StatusCode.PERMISSION_DENIED, case
            if case.rightful == "admin":  # the owner of jobs is no administrator either
                assert await call(owner, case.method, case.build()) == grpc.StatusCode.PERMISSION_DENIED, case
        # A user may not submit in another's name, nor give their job away.
        as_owner = borgmaster_pb2.SubmitJobRequest(request_id="x", spec=simulated_job("spoof", OWNER))
        assert await call(intruder, "SubmitJob", as_owner) == grpc.StatusCode.PERMISSION_DENIED
        give = update(f"{OWNER}/plain", "user", user=INTRUDER)
        assert await call(owner, "UpdateJob", give) == grpc.StatusCode.PERMISSION_DENIED
    async with service_channel(cell, "dashboard") as dashboard:  # a read-only service
        for case in CASES:
            assert await call(dashboard, case.method, case.build()) == grpc.StatusCode.PERMISSION_DENIED, case
    assert await snapshot(cell) == before, "a refused call changed the cell"

    async with user_channel(cell, OWNER) as owner, user_channel(cell) as admin:  # the rightful callers
        for case in CASES:
            caller = owner if case.rightful == "owner" else admin
            assert await call(caller, case.method, case.build()) == grpc.StatusCode.OK, case


async def test_the_actuator_changes_only_what_autopilot_actuates(cell: str) -> None:
    async with service_channel(cell, "actuator") as actuator:
        allowed = update(f"{OWNER}/auto", "task.limits.cpu_millicores")
        assert await call(actuator, "UpdateJob", allowed) == grpc.StatusCode.OK
        before = await snapshot(cell)
        refused = [
            ("UpdateJob", update(f"{OWNER}/auto", "task.limits.memory_bytes")),  # memory mode OFF
            ("UpdateJob", update(f"{OWNER}/auto", "task_count", task_count=5)),  # horizontal OFF
            ("UpdateJob", update(f"{OWNER}/auto", "priority", priority=200)),  # never the actuator's
            ("UpdateJob", update(f"{OWNER}/plain", "task.limits.cpu_millicores")),  # not Autopiloted
            ("UpdateJob", update(f"{OWNER}/missing", "task.limits.cpu_millicores")),
            *((c.method, c.build()) for c in CASES if c.method != "UpdateJob"),
        ]
        for method, request in refused:
            assert await call(actuator, method, request) == grpc.StatusCode.PERMISSION_DENIED, (
                method,
                request,
            )
    assert await snapshot(cell) == before
    async with user_channel(cell) as channel:
        job = await borgmaster_pb2_grpc.BorgmasterStub(channel).GetJob(
            borgmaster_pb2.GetJobRequest(job_id=f"{OWNER}/auto")
        )
    assert job.job.spec.task.limits.cpu_millicores == 700


async def test_a_borglet_registers_only_its_own_machines(cell: str, endpoints: StackEndpoints) -> None:
    async with service_channel(cell, "borglet-r0") as fleet:
        own = borgmaster_pb2.RegisterMachineRequest(request_id="own", spec=machine("machine-r0-0042"))
        assert await call(fleet, "RegisterMachine", own) == grpc.StatusCode.OK
        other = borgmaster_pb2.RegisterMachineRequest(request_id="other", spec=machine("machine-r1-0000"))
        assert await call(fleet, "RegisterMachine", other) == grpc.StatusCode.PERMISSION_DENIED
    # A real Borglet presenting borglet-r0 but hosting machines outside machine-r0-* is refused.
    async with borglet(endpoints, [cell], identity="borglet-r0", machine_ids=["rogue-1"]) as rogue:
        registered = await rogue._register()
        assert registered == 0
    async with user_channel(cell) as channel:
        listed = await borgmaster_pb2_grpc.BorgmasterStub(channel).ListMachines(
            borgmaster_pb2.ListMachinesRequest()
        )
    ids = {m.spec.machine_id for m in listed.machines}
    assert {"machine-r0-0000", "machine-r0-0001", "machine-r0-0042"} <= ids
    assert "machine-r1-0000" not in ids
    assert "rogue-1" not in ids
