"""Hypothesis fuzzing of every Borgmaster request type against a running Borgmaster process.

For each request type a few hundred arbitrary messages (extreme numbers, NaN, unknown enums,
odd and oversized strings, deep nesting; see proto_strategies.py) are sent by the admin or by
a user who owns nothing; malformed ones aimed at the cell's own jobs and machines too. After
all of them: the process still serves, no call failed with an internal error, the jobs that
were there are unchanged, and replaying the checkpoint log (``cellpilot borgmaster replay``'s
``load_state``) gives the same jobs and machines as the live master reports.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "borgmaster"))

from borgmaster_harness import ReplicaProcess, machine, simulated_job
from proto_strategies import messages
from stack_security import user_credentials

from cellpilot.api.v1 import borgmaster_pb2, borgmaster_pb2_grpc, job_pb2, resources_pb2
from cellpilot.cli.borgmaster import load_state
from cellpilot.stack import StackEndpoints

pytestmark = pytest.mark.timeout(180)
EXAMPLES = 300
JOBS = ("alice/web", "bob/batch")
MACHINES = ("fuzz-m0", "fuzz-m1")
INTERESTING = (
    *JOBS,
    *MACHINES,
    "alice",
    "bob",
    "web",
    "root",
    "task_count",
    "priority",
    "task.limits.cpu_millicores",
)
# Fails the service, not the caller: never an answer to any input.
BROKEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE}
REQUESTS = [
    (method.name, method.input_type)
    for method in borgmaster_pb2.DESCRIPTOR.services_by_name["Borgmaster"].methods
]


class Cell:
    def __init__(self, address: str, database_url: str) -> None:
        self.address = address
        self.database_url = database_url
        self.channels = {
            user: grpc.secure_channel(address, user_credentials(user)) for user in ("root", "mallory")
        }
        self.codes: dict[str, set[grpc.StatusCode]] = {}

    def stub(self, user: str = "root") -> borgmaster_pb2_grpc.BorgmasterStub:
        return borgmaster_pb2_grpc.BorgmasterStub(self.channels[user])

    def jobs(self) -> dict[str, tuple[int, bytes, int]]:
        listed = self.stub().ListJobs(borgmaster_pb2.ListJobsRequest(), timeout=10).jobs
        return {
            j.job_id: (j.spec_version, j.spec.SerializeToString(deterministic=True), j.state) for j in listed
        }


@pytest.fixture(scope="module")
def cell(endpoints: StackEndpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cell]:
    from sqlalchemy import make_url

    from cellpilot.platform.postgres import apply_migrations, drop_database, ensure_database

    url = str(make_url(endpoints.postgres_url).set(database=f"fuzz_{uuid.uuid4().hex[:10]}"))
    asyncio.run(ensure_database(url))
    asyncio.run(apply_migrations(url))
    # No Borglets: machines stay up (polls far apart), tasks stay where the scheduler put them.
    process = ReplicaProcess(
        url, endpoints, 0, tmp_path_factory.mktemp("fuzz"), CELLPILOT_BORGMASTER_POLL_INTERVAL_S="600"
    )
    process.start()
    cell = Cell(process.address, url)
    try:
        grpc.channel_ready_future(cell.channels["root"]).result(timeout=30)
        admin = cell.stub()
        for _ in range(100):
            try:
                admin.GetLeader(borgmaster_pb2.GetLeaderRequest(), timeout=2)
                if admin.GetLeader(borgmaster_pb2.GetLeaderRequest(), timeout=2).leader.address:
                    break
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        for user in ("alice", "bob"):
            for band in (job_pb2.PRIORITY_BAND_PRODUCTION, job_pb2.PRIORITY_BAND_BATCH):
                limit = resources_pb2.Resources(
                    cpu_millicores=100_000, memory_bytes=1 << 40, disk_bytes=1 << 50, ports=1000
                )
                admin.SetQuota(
                    borgmaster_pb2.SetQuotaRequest(
                        request_id=f"q-{user}-{band}", user=user, band=band, limit=limit
                    ),
                    timeout=10,
                )
        for machine_id in MACHINES:
            admin.RegisterMachine(
                borgmaster_pb2.RegisterMachineRequest(request_id=machine_id, spec=machine(machine_id)),
                timeout=10,
            )
        for job_id in JOBS:
            user, name = job_id.split("/")
            admin.SubmitJob(
                borgmaster_pb2.SubmitJobRequest(request_id=job_id, spec=simulated_job(name, user, tasks=2)),
                timeout=10,
            )
        yield cell
    finally:
        for channel in cell.channels.values():
            channel.close()
        process.stop()
        asyncio.run(drop_database(url))


def _aim(request: Message, caller: str, target: str | None) -> Message:
    """Mallory's requests may name the cell's jobs; the admin's must not (the admin may change them)."""
    for field in ("job_id",):
        if field in request.DESCRIPTOR.fields_by_name:
            if caller == "mallory" and target is not None:
                setattr(request, field, target)
            elif caller == "root" and getattr(request, field) in JOBS:
                setattr(request, field, "fuzz/none")
    if caller == "root":
        spec = getattr(request, "spec", None)
        if isinstance(spec, job_pb2.JobSpec) and f"{spec.user}/{spec.name}" in JOBS:
            spec.name = "fuzzed"
        if getattr(request, "machine_id", "") in MACHINES:
            request.machine_id = "fuzz-none"  # type: ignore[attr-defined]
        spec_machine = getattr(getattr(request, "spec", None), "machine_id", "")
        if spec_machine in MACHINES:
            request.spec.machine_id = "fuzz-none"  # type: ignore[attr-defined]
    return request


@pytest.mark.parametrize(("method", "descriptor"), REQUESTS, ids=[m for m, _ in REQUESTS])
def test_malformed_requests_never_break_the_master_or_its_jobs(
    cell: Cell, method: str, descriptor: Any
) -> None:
    before = {j: v for j, v in cell.jobs().items() if j in JOBS}
    assert set(before) == set(JOBS)

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        request=messages(descriptor, INTERESTING),
        caller=st.sampled_from(["root", "mallory"]),
        target=st.sampled_from([None, *JOBS]),
    )
    def one(request: Message, caller: str, target: str | None) -> None:
        request = _aim(request, caller, target)
        code, details = grpc.StatusCode.OK, ""
        try:
            getattr(cell.stub(caller), method)(request, timeout=10)
        except grpc.RpcError as error:
            code, details = error.code(), error.details()  # type: ignore[attr-defined]
        assert code not in BROKEN, (method, caller, request, details)
        cell.codes.setdefault(method, set()).add(code)

    one()
    after = {j: v for j, v in cell.jobs().items() if j in JOBS}
    assert {j: v[:2] for j, v in after.items()} == {j: v[:2] for j, v in before.items()}, (
        "a stored job changed"
    )
    assert cell.stub().GetLeader(borgmaster_pb2.GetLeaderRequest(), timeout=5).leader.address


def test_the_checkpoint_log_replays_to_what_the_master_reports(cell: Cell) -> None:
    """Runs after the fuzzing (file order): everything that was accepted is in the log."""
    admin = cell.stub()
    while True:
        head = admin.GetLeader(borgmaster_pb2.GetLeaderRequest(), timeout=5).leader.log_sequence
        live_jobs = cell.jobs()
        machines = admin.ListMachines(borgmaster_pb2.ListMachinesRequest(), timeout=5).machines
        live_machines = {
            m.spec.machine_id: (m.state, m.spec.SerializeToString(deterministic=True)) for m in machines
        }
        if admin.GetLeader(borgmaster_pb2.GetLeaderRequest(), timeout=5).leader.log_sequence == head:
            break
    from cellpilot.borg_wire import statuses

    state, _snapshot, log_head = asyncio.run(load_state(cell.database_url, head))
    assert log_head >= head
    replayed_jobs = {}
    for job_id, record in state.jobs.items():
        status = statuses.job_status_out(record)
        replayed_jobs[job_id] = (
            status.spec_version,
            status.spec.SerializeToString(deterministic=True),
            status.state,
        )
    assert replayed_jobs == live_jobs
    replayed_machines = {}
    for machine_id in state.machines:
        out = statuses.machine_out(state, state.machines[machine_id])
        replayed_machines[machine_id] = (out.state, out.spec.SerializeToString(deterministic=True))
    assert replayed_machines == live_machines
    assert set(JOBS) <= set(replayed_jobs)
