"""The client finds the master, follows redirects, retries unreachable replicas, keeps request ids.

The servers here are real gRPC servers with tiny Borgmaster servicers that inject the
failures (a follower's refusal, an unreachable replica); the real Borgmaster is exercised
in tests/integration/borgmaster.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from cellpilot.api.v1 import borgmaster_pb2, borgmaster_pb2_grpc, job_pb2
from cellpilot.client import (
    CellpilotClient,
    InvalidArgumentError,
    RetryPolicy,
    SyncCellpilotClient,
    UnavailableError,
)
from cellpilot.platform.error_reasons import STORE_UNAVAILABLE, reason_metadata
from cellpilot.platform.grpc_server import GrpcServer, ServiceBinding
from cellpilot.stack.config import free_port


class Replica(borgmaster_pb2_grpc.BorgmasterServicer):
    def __init__(self, leader_address: str | None) -> None:
        self.leader_address = leader_address  # None: this replica is the master
        self.request_ids: list[str] = []
        self.reads = 0

    async def GetJob(self, request, context):  # type: ignore[no-untyped-def]
        # Followers answer reads, naming the master like the real Borgmaster does.
        self.reads += 1
        if self.leader_address is not None:
            context.set_trailing_metadata((("cellpilot-leader", self.leader_address),))
        return borgmaster_pb2.GetJobResponse()

    async def SubmitJob(self, request, context):  # type: ignore[no-untyped-def]
        self.request_ids.append(request.request_id)
        if self.leader_address is not None:
            context.set_trailing_metadata((("cellpilot-leader", self.leader_address),))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not the master")
        if not request.spec.name:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "spec.name: must not be empty")
        return borgmaster_pb2.SubmitJobResponse(
            job_id=f"{request.spec.user}/{request.spec.name}", spec_version=1
        )


class StoreDown(Replica):
    """A master whose store is down for the first ``outage`` calls, then back; or that never
    answers at all (``hang``)."""

    def __init__(self, outage: int, hang: bool = False) -> None:
        super().__init__(None)
        self.outage = outage
        self.hang = hang

    async def SubmitJob(self, request, context):  # type: ignore[no-untyped-def]
        if self.hang:
            self.request_ids.append(request.request_id)
            await asyncio.sleep(3600)
        if len(self.request_ids) < self.outage:
            self.request_ids.append(request.request_id)
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                "PostgreSQL is unreachable (ConnectionRefusedError); retry with the same request_id",
                trailing_metadata=reason_metadata(STORE_UNAVAILABLE),
            )
        return await super().SubmitJob(request, context)


async def _serve(servicer: Replica, port: int) -> GrpcServer:
    server = GrpcServer(
        [
            ServiceBinding(
                "cellpilot.api.v1.Borgmaster", borgmaster_pb2_grpc.add_BorgmasterServicer_to_server, servicer
            )
        ],
        address=f"127.0.0.1:{port}",
    )
    await server.start()
    return server


SPEC = job_pb2.JobSpec(name="web", user="alice", priority=9, task_count=1)
FAST = RetryPolicy(budget_s=3.0, initial_backoff_s=0.05, max_backoff_s=0.2, call_timeout_s=1.0)


async def test_a_follower_redirects_writes_to_the_master() -> None:
    leader_port, follower_port = free_port(), free_port()
    leader = Replica(None)
    follower = Replica(f"127.0.0.1:{leader_port}")
    servers = [await _serve(leader, leader_port), await _serve(follower, follower_port)]
    try:
        async with CellpilotClient(borgmaster=[f"127.0.0.1:{follower_port}"], policy=FAST) as client:
            reply = await client.borgmaster.submit_job(SPEC, request_id="req-1")
            assert reply.job_id == "alice/web"
            again = await client.borgmaster.submit_job(SPEC, request_id="req-2")
        assert again.job_id == "alice/web"
        assert follower.request_ids == ["req-1"], "once the master is known, writes go straight to it"
        assert leader.request_ids == ["req-1", "req-2"]
    finally:
        for server in servers:
            await server.stop(0)


async def test_reads_move_to_the_master_a_follower_names_when_it_is_a_configured_replica() -> None:
    follower_port, leader_port = free_port(), free_port()
    leader = Replica(None)
    follower = Replica(f"127.0.0.1:{leader_port}")
    stranger = Replica("borgmaster-2:7102")  # a container-network name: not followed
    stranger_port = free_port()
    servers = [
        await _serve(follower, follower_port),
        await _serve(leader, leader_port),
        await _serve(stranger, stranger_port),
    ]
    try:
        addresses = [f"127.0.0.1:{follower_port}", f"127.0.0.1:{leader_port}"]
        async with CellpilotClient(borgmaster=addresses, policy=FAST) as client:
            for _ in range(3):
                await client.borgmaster.get_job("alice/web")
        assert (follower.reads, leader.reads) == (1, 2), "after the first answer, reads go to the master"
        async with CellpilotClient(borgmaster=[f"127.0.0.1:{stranger_port}"], policy=FAST) as client:
            for _ in range(2):
                await client.borgmaster.get_job("alice/web")
        assert stranger.reads == 2
    finally:
        for server in servers:
            await server.stop(0)


async def test_an_unreachable_replica_is_skipped_and_the_request_id_is_kept() -> None:
    dead_port, leader_port = free_port(), free_port()
    leader = Replica(None)
    server = await _serve(leader, leader_port)
    try:
        addresses = [f"127.0.0.1:{dead_port}", f"127.0.0.1:{leader_port}"]
        async with CellpilotClient(borgmaster=addresses, policy=FAST) as client:
            reply = await client.borgmaster.submit_job(SPEC, request_id="same-id")
        assert reply.job_id == "alice/web"
        assert leader.request_ids == ["same-id"]
    finally:
        await server.stop(0)


async def test_a_redirect_to_an_unresolvable_master_name_falls_back_to_the_configured_replicas() -> None:
    # Inside a compose network the master names itself "borgmaster-2:7102", which the host
    # cannot resolve; the client must go on through the addresses it was given.
    follower_port, dead_port, leader_port = free_port(), free_port(), free_port()
    leader = Replica(None)
    follower = Replica("no-such-host.invalid:7102")
    servers = [await _serve(follower, follower_port), await _serve(leader, leader_port)]
    try:
        addresses = [f"127.0.0.1:{p}" for p in (follower_port, dead_port, leader_port)]
        async with CellpilotClient(borgmaster=addresses, policy=FAST) as client:
            reply = await client.borgmaster.submit_job(SPEC, request_id="via-fallback")
        assert reply.job_id == "alice/web"
        assert leader.request_ids == ["via-fallback"]
    finally:
        for server in servers:
            await server.stop(0)


async def test_bad_input_is_not_retried_and_names_the_field() -> None:
    port = free_port()
    leader = Replica(None)
    server = await _serve(leader, port)
    try:
        async with CellpilotClient(borgmaster=[f"127.0.0.1:{port}"], policy=FAST) as client:
            with pytest.raises(InvalidArgumentError, match=r"spec\.name"):
                await client.borgmaster.submit_job(job_pb2.JobSpec(user="alice"))
        assert len(leader.request_ids) == 1
    finally:
        await server.stop(0)


async def test_a_store_outage_is_retried_with_the_same_request_id_until_it_ends() -> None:
    port = free_port()
    master = StoreDown(outage=4)
    server = await _serve(master, port)
    try:
        async with CellpilotClient(borgmaster=[f"127.0.0.1:{port}"], policy=FAST) as client:
            reply = await client.borgmaster.submit_job(SPEC, request_id="during-outage")
        assert reply.job_id == "alice/web"
        assert master.request_ids == ["during-outage"] * 5, "four refusals, then the same request applied"
    finally:
        await server.stop(0)


async def test_an_outage_longer_than_the_budget_ends_in_unavailable_error_naming_the_store() -> None:
    port = free_port()
    server = await _serve(StoreDown(outage=1_000), port)
    try:
        async with CellpilotClient(borgmaster=[f"127.0.0.1:{port}"], policy=FAST) as client:
            with pytest.raises(UnavailableError, match="PostgreSQL is unreachable") as gave_up:
                await client.borgmaster.submit_job(SPEC)
        assert gave_up.value.reason == STORE_UNAVAILABLE
    finally:
        await server.stop(0)


async def test_no_attempt_outlives_the_call_budget() -> None:
    port = free_port()
    master = StoreDown(outage=0, hang=True)
    server = await _serve(master, port)
    policy = RetryPolicy(budget_s=1.0, initial_backoff_s=0.05, call_timeout_s=30.0)
    try:
        async with CellpilotClient(borgmaster=[f"127.0.0.1:{port}"], policy=policy) as client:
            started = time.monotonic()
            with pytest.raises(UnavailableError):
                await client.borgmaster.submit_job(SPEC)
            assert time.monotonic() - started < 10, "a 30 s attempt was not cut to the 1 s budget"
        assert master.request_ids, "the request was sent"
    finally:
        await server.stop(0)


async def test_no_replica_answering_gives_unavailable_after_the_budget() -> None:
    async with CellpilotClient(borgmaster=[f"127.0.0.1:{free_port()}"], policy=FAST) as client:
        with pytest.raises(UnavailableError, match="no replica"):
            await client.borgmaster.get_leader()


def test_the_blocking_client_behaves_like_the_async_one() -> None:
    import asyncio
    import threading

    port = free_port()
    leader = Replica(None)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    holder: dict[str, GrpcServer] = {}

    def serve() -> None:
        # The loop runs until the test stops it, so stopping the server is always scheduled.
        asyncio.set_event_loop(loop)
        holder["server"] = loop.run_until_complete(_serve(leader, port))
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        with SyncCellpilotClient(borgmaster=[f"127.0.0.1:{port}"], policy=FAST) as client:
            assert client.borgmaster.submit_job(SPEC, request_id="sync-1").job_id == "alice/web"
            with pytest.raises(InvalidArgumentError):
                client.borgmaster.submit_job(job_pb2.JobSpec(user="alice"))
    finally:
        asyncio.run_coroutine_threadsafe(holder["server"].stop(0), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
    assert leader.request_ids[0] == "sync-1"
