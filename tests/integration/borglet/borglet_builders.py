"""Builders for Borglet integration tests: task assignments as a master would send them, and
polling helpers (the in-process Borglet fixture is in conftest.py)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from stream_writers import observer

from cellpilot.api.v1 import borglet_pb2, borglet_pb2_grpc, job_pb2, resources_pb2, usage_pb2
from cellpilot.platform.kafka import Record
from cellpilot.platform.kafka_consumers import MessageConsumer

MIB = 1 << 20
WORKLOAD = [sys.executable, "-m", "cellpilot_services.borglet.workload_program"]

BorgletFactory = Callable[..., Any]


def process_task(
    job_id: str,
    profile: str,
    memory_limit: int,
    *,
    index: int = 0,
    incarnation: int = 1,
    hard: bool = True,
    priority: int = 0,
    cpu_limit: int = 0,
    extra_args: tuple[str, ...] = ("--grow-rate", "64MiB"),
    env: dict[str, str] | None = None,
) -> borglet_pb2.TaskAssignment:
    """A task running the bundled workload program with ``profile``."""
    return command_task(
        job_id,
        [*WORKLOAD, "--profile", profile, *extra_args],
        memory_limit,
        index=index,
        incarnation=incarnation,
        hard=hard,
        priority=priority,
        cpu_limit=cpu_limit,
        env=env,
    )


def command_task(
    job_id: str,
    argv: list[str],
    memory_limit: int = 0,
    *,
    index: int = 0,
    incarnation: int = 1,
    hard: bool = True,
    priority: int = 0,
    cpu_limit: int = 0,
    env: dict[str, str] | None = None,
) -> borglet_pb2.TaskAssignment:
    """A process task running ``argv`` (command and arguments) with ``env`` from its spec."""
    return borglet_pb2.TaskAssignment(
        job_id=job_id,
        task_index=index,
        incarnation=incarnation,
        priority=priority,
        spec=job_pb2.TaskSpec(
            limits=resources_pb2.Resources(cpu_millicores=cpu_limit, memory_bytes=memory_limit),
            memory_limit_kind=job_pb2.MEMORY_LIMIT_KIND_HARD if hard else job_pb2.MEMORY_LIMIT_KIND_SOFT,
            runtime=job_pb2.RuntimeSpec(
                process=job_pb2.ProcessRuntime(command=argv[0], args=argv[1:], env=env or {})
            ),
        ),
    )


def simulated_task(
    job_id: str,
    index: int = 0,
    *,
    model: str = "steady",
    params: dict[str, float] | None = None,
    seed: int = 0,
    incarnation: int = 1,
    priority: int = 0,
    memory_limit: int = 0,
    cpu_limit: int = 0,
) -> borglet_pb2.TaskAssignment:
    return borglet_pb2.TaskAssignment(
        job_id=job_id,
        task_index=index,
        incarnation=incarnation,
        priority=priority,
        spec_version=1,
        spec=job_pb2.TaskSpec(
            limits=resources_pb2.Resources(cpu_millicores=cpu_limit, memory_bytes=memory_limit),
            runtime=job_pb2.RuntimeSpec(
                simulated=job_pb2.SimulatedRuntime(usage_model=model, params=params or {}, seed=seed)
            ),
        ),
    )


async def poll(
    stub: borglet_pb2_grpc.BorgletStub, machine_id: str, epoch: int = 1, **fields: Any
) -> borglet_pb2.PollResponse:
    return await stub.Poll(borglet_pb2.PollRequest(machine_id=machine_id, master_epoch=epoch, **fields))


def task_in(response: borglet_pb2.PollResponse, job_id: str, index: int = 0) -> borglet_pb2.TaskReport:
    matches = [t for t in response.tasks if t.job_id == job_id and t.task_index == index]
    assert matches, f"{job_id}/{index} not reported by {response.machine_id}"
    return matches[0]


async def poll_until(
    stub: borglet_pb2_grpc.BorgletStub,
    machine_id: str,
    condition: Callable[[borglet_pb2.PollResponse], bool],
    timeout_s: float = 20.0,
    interval_s: float = 0.25,
) -> borglet_pb2.PollResponse:
    """Poll as a master would until ``condition`` holds (fails the test after ``timeout_s``)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        response = await poll(stub, machine_id)
        if condition(response):
            return response
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s; last poll: {response}")
        await asyncio.sleep(interval_s)


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not true within {timeout_s} s")
        await asyncio.sleep(0.2)


async def collect_samples(
    bootstrap: str, machine_ids: set[str], enough: int, timeout_s: float = 40.0
) -> list[tuple[Record, usage_pb2.UsageSampleBatch]]:
    """Records of ``usage.samples`` keyed by one of ``machine_ids``, until ``enough`` samples."""
    consumer = MessageConsumer(
        observer(bootstrap), ["usage.samples"], group_id=f"test-{uuid.uuid4().hex[:8]}"
    )
    await consumer.start()
    got: list[tuple[Record, usage_pb2.UsageSampleBatch]] = []

    async def read() -> None:
        count = 0
        async for batch in consumer.batches(timeout_ms=200):
            for record in batch:
                if record.key in machine_ids:
                    message = record.decode(usage_pb2.UsageSampleBatch)
                    got.append((record, message))
                    count += len(message.samples)
            if count >= enough:
                return

    try:
        await asyncio.wait_for(read(), timeout_s)
    finally:
        await consumer.stop()
    return got
