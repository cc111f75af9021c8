"""The whole system under docker compose, faulted with Docker itself.

Jobs go in through the published Borgmaster port with the project's client; then a master
container is stopped (no acknowledged write lost, a new master takes over), a Borglet
container is paused past the down timeout (its tasks are rescheduled), the broker is
restarted (the usage pipeline resumes), a recommender is cut off the network (the others
carry on) and Autopilot is watched resizing a job. The tests run in file order on one stack.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from compose_stack import RunningStack

from cellpilot.api.v1 import (
    borgmaster_pb2,
    job_pb2,
    machine_pb2,
    monitoring_pb2,
    resources_pb2,
    state_pb2,
)
from cellpilot.client import CellpilotClient
from cellpilot.client.errors import CellpilotError
from cellpilot.stack.compose_project import DockerError, run
from cellpilot.stack.store_failovers import grant_quota

pytestmark = [pytest.mark.containers, pytest.mark.timeout(600)]

T = TypeVar("T")
GIB = 1 << 30
RUNNING = state_pb2.TASK_STATE_RUNNING
UP, DOWN = machine_pb2.MACHINE_STATE_UP, machine_pb2.MACHINE_STATE_DOWN
FLEETS = ("borglet-0", "borglet-1", "borglet-2")
# Borgmaster defaults (services/borgmaster/settings.py): a machine missing 5 polls 2 s apart is down.
DOWN_TIMEOUT_S = 5 * 2.0


async def eventually(check: Callable[[], Awaitable[T | None]], within: float, what: str) -> T:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f} s waiting for {what}")
        await asyncio.sleep(0.5)


def fleet_of(machine_id: str) -> str:
    """The Borglet container hosting a machine ("machine-r<replica>-<i>", borglet settings)."""
    return f"borglet-{machine_id.split('-')[1].removeprefix('r')}"


def simulated_job(
    user: str, name: str, tasks: int, cpu: int = 1000, memory: int = GIB, **kw: object
) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name=name,
        user=user,
        priority=9,  # production band (Borg §2.5)
        app_class=job_pb2.APP_CLASS_LATENCY_SENSITIVE,
        task_count=tasks,
        task=job_pb2.TaskSpec(
            limits=resources_pb2.Resources(cpu_millicores=cpu, memory_bytes=memory),
            runtime=job_pb2.RuntimeSpec(simulated=job_pb2.SimulatedRuntime(usage_model="steady")),
        ),
        **kw,  # type: ignore[arg-type]
    )


async def running_tasks(client: CellpilotClient, job_id: str) -> list[state_pb2.TaskStatus] | None:
    job = (await client.borgmaster.get_job(job_id, include_tasks=True)).job
    tasks = list(job.tasks)
    return tasks if tasks and all(t.state == RUNNING and t.machine_id for t in tasks) else None


async def leader_id(client: CellpilotClient) -> str:
    reply = await client.borgmaster.get_leader()
    return reply.leader.replica_id if reply.HasField("leader") else ""


@pytest.fixture(scope="module")
def user() -> str:
    return f"ct{uuid.uuid4().hex[:6]}"


def test_services_are_healthy_and_published_on_localhost_only(stack: RunningStack) -> None:
    print(f"clean -> healthy: {stack.clean_to_healthy_s:.1f} s")
    stack.compose.wait_healthy(stack.started, timeout_s=30)
    states = stack.compose.states()
    for service in stack.started:
        ports = json.loads(run(["docker", "inspect", "--format", "{{json .NetworkSettings.Ports}}",
                                states[service].container_id]))  # fmt: skip
        bindings = [b for published in (ports or {}).values() for b in (published or [])]
        host = stack.compose.env["CELLPILOT_PUBLISH_HOST"]  # 127.0.0.1 unless a local stack holds it
        assert host.startswith("127."), f"published on {host}, not a loopback address"
        assert all(b["HostIp"] == host for b in bindings), f"{service} publishes {bindings}"
    volume_names = {v.split("_", 1)[-1] for v in stack.compose.volumes()}
    assert {"pg-0-data", "pg-1-data"} <= volume_names, "each PostgreSQL member keeps its data in a volume"
    assert {"redis-0-data", "redis-1-data", "redis-2-data"} <= volume_names, "so does each Redis node"


def test_every_service_of_the_compose_file_runs(stack: RunningStack) -> None:
    assert not stack.missing, "services that cannot start: " + "; ".join(
        f"{s}: {why}" for s, why in stack.missing.items()
    )


async def test_jobs_submitted_through_the_published_port_run(
    stack: RunningStack, client: CellpilotClient, user: str
) -> None:
    stack.require("borgmaster-0", "borgmaster-1", "borgmaster-2", "scheduler", *FLEETS)
    expected = 3 * int(stack.compose.env["CELLPILOT_BORGLET_FLEET_SIZE"])

    async def registered() -> bool:
        machines = await client.borgmaster.list_machines()
        return sum(1 for m in machines if m.state == UP) == expected

    await eventually(registered, 60, f"{expected} machines of 3 Borglet fleets registered and up")
    await grant_quota(client, user)
    reply = await client.borgmaster.submit_job(simulated_job(user, "web", tasks=6))
    assert reply.job_id == f"{user}/web"
    tasks = await eventually(lambda: running_tasks(client, reply.job_id), 60, "6 tasks running")
    assert {fleet_of(t.machine_id) for t in tasks} <= set(FLEETS)


async def test_autopilot_resizes_an_oversized_job(
    stack: RunningStack, client: CellpilotClient, user: str
) -> None:
    stack.require("aggregator", "recommender-0", "autopilot-0", "actuator")
    on = job_pb2.VerticalScalingConfig(mode=job_pb2.SCALING_MODE_ON)
    spec = simulated_job(user, "oversized", tasks=2, cpu=8000, memory=8 * GIB)
    spec.autopilot.CopyFrom(job_pb2.AutopilotConfig(cpu=on, memory=on))
    job_id = (await client.borgmaster.submit_job(spec)).job_id

    async def resized() -> resources_pb2.Resources | None:
        job = (await client.borgmaster.get_job(job_id)).job
        limits = job.spec.task.limits
        return limits if job.spec_version > 1 and limits.cpu_millicores < 8000 else None

    # The steady model uses ~500 millicores and 256 MiB (cellpilot.world.usage_models).
    limits = await eventually(resized, 240, "Autopilot to lower the job's 8-core CPU limit")
    assert limits.cpu_millicores < 8000
    recommendation = (await client.autopilot.get_recommendation(job_id)).recommendations
    assert recommendation.vertical, "the applied limits come from a visible recommendation"


async def test_stopping_the_master_container_loses_no_acknowledged_write(
    stack: RunningStack, client: CellpilotClient, user: str
) -> None:
    stack.require("borgmaster-0", "borgmaster-1", "borgmaster-2")
    old = await eventually(lambda: leader_id(client), 30, "an elected master")
    acknowledged: list[str] = []
    failed: list[str] = []
    stopped_at: list[float] = []
    after_stop: list[float] = []
    warmed_up = asyncio.Event()  # a few writes acknowledged before the fault

    async def submit(i: int) -> None:
        try:
            reply = await client.borgmaster.submit_job(simulated_job(user, f"burst-{i}", tasks=1, cpu=100))
        except CellpilotError:
            failed.append(f"{user}/burst-{i}")
            return
        acknowledged.append(reply.job_id)
        if len(acknowledged) >= 9:
            warmed_up.set()
        if stopped_at:
            after_stop.append(time.monotonic())

    async def writers() -> None:
        for i in range(0, 60, 3):
            await asyncio.gather(*(submit(i + k) for k in range(3)))

    async def stop_master() -> None:
        await warmed_up.wait()
        stopped_at.append(time.monotonic())
        await asyncio.to_thread(stack.compose.stop, old)

    await asyncio.gather(writers(), stop_master())
    try:
        new = await eventually(lambda: leader_id(client), 30, "a new master")
        assert new != old, f"{old} was stopped, yet it is still reported master"
        assert after_stop, "no write was acknowledged after the master stopped"
        print(f"first write after stopping {old}: {min(after_stop) - stopped_at[0]:.1f} s; new master {new}")
        jobs = {j.job_id for j in await client.borgmaster.list_jobs(borgmaster_pb2.ListJobsRequest())}
        lost = [job_id for job_id in acknowledged if job_id not in jobs]
        assert not lost, f"acknowledged writes lost in the failover: {lost}"
        assert len(acknowledged) + len(failed) == 60
    finally:
        await asyncio.to_thread(stack.compose.start, old)
        await asyncio.to_thread(stack.compose.wait_healthy, [old], 120)


async def test_pausing_a_borglet_past_the_down_timeout_reschedules_its_tasks(
    stack: RunningStack, client: CellpilotClient, user: str
) -> None:
    stack.require(*FLEETS)
    job_id = (await client.borgmaster.submit_job(simulated_job(user, "spread", tasks=9))).job_id
    tasks = await eventually(lambda: running_tasks(client, job_id), 60, "9 tasks running")
    by_fleet: dict[str, int] = {}
    for task in tasks:
        by_fleet[fleet_of(task.machine_id)] = by_fleet.get(fleet_of(task.machine_id), 0) + 1
    victim = max(by_fleet, key=lambda fleet: by_fleet[fleet])
    await asyncio.to_thread(stack.compose.pause, victim)
    paused_at = time.monotonic()
    try:

        async def rescheduled() -> list[state_pb2.TaskStatus] | None:
            now = await running_tasks(client, job_id)
            return now if now and all(fleet_of(t.machine_id) != victim for t in now) else None

        moved = await eventually(rescheduled, 90, f"tasks of paused {victim} running elsewhere")
        elapsed = time.monotonic() - paused_at
        print(f"{by_fleet[victim]} tasks of {victim} rescheduled {elapsed:.1f} s after the pause")
        assert elapsed >= DOWN_TIMEOUT_S * 0.8, "rescheduled before the machine could be declared down"
        assert len(moved) == 9
        machines = await client.borgmaster.list_machines()
        assert all(m.state == DOWN for m in machines if fleet_of(m.spec.machine_id) == victim)
    finally:
        await asyncio.to_thread(stack.compose.unpause, victim)

    async def back_up() -> bool:
        machines = await client.borgmaster.list_machines()
        return all(m.state == UP for m in machines if fleet_of(m.spec.machine_id) == victim)

    await eventually(back_up, 60, f"machines of {victim} up again after unpausing")


async def _histogram_windows(client: CellpilotClient, job_id: str) -> int:
    request = monitoring_pb2.GetHistogramHistoryRequest(job_id=job_id, resource=resources_pb2.RESOURCE_CPU)
    return len(await client.monitoring.histogram_history(request))


# Run inside the local broker image: the sum of borg.events' log-end offsets, as the admin user.
BORG_EVENTS_END = """
import asyncio
from aiokafka import AIOKafkaConsumer, TopicPartition
from cellpilot.platform.stream_access import BrokerLogin, StreamAccess
password = open("/users/admin.password").read().strip()
login = BrokerLogin("SASL_PLAINTEXT", "SCRAM-SHA-512", "admin", password)
async def main():
    reader = AIOKafkaConsumer(**StreamAccess.admin("127.0.0.1:9092", login).client_options())
    await reader.start()
    try:
        parts = [TopicPartition("borg.events", p) for p in reader.partitions_for_topic("borg.events") or ()]
        print(sum((await reader.end_offsets(parts)).values()))
    finally:
        await reader.stop()
asyncio.run(main())
"""


def _durable_broker(stack: RunningStack) -> bool:
    """The local image built with `make broker` (the registry path's broker is apache/kafka)."""
    try:
        stack.compose.exec("kafka", ["test", "-x", "/opt/tansu-durable/tansu"], timeout_s=30)
    except DockerError:
        return False
    return True


async def test_restarting_the_broker_the_pipeline_resumes(
    stack: RunningStack, client: CellpilotClient, user: str
) -> None:
    stack.require("kafka", "aggregator", *FLEETS)
    job_id = f"{user}/web"  # running since the first test; its Borglets publish usage samples

    async def windows_at_least(count: int) -> int | None:
        seen = await _histogram_windows(client, job_id)
        return seen if seen >= count else None

    before = await eventually(lambda: windows_at_least(1), 120, "a first 5-minute histogram window")
    durable = _durable_broker(stack)
    events_before = int(stack.compose.exec("kafka", ["python", "-c", BORG_EVENTS_END])) if durable else 0
    await asyncio.to_thread(stack.compose.restart, "kafka")
    restarted_at = time.monotonic()
    await asyncio.to_thread(stack.compose.wait_healthy, ["kafka"], 120)
    if durable:
        # The durable broker kept its log: the offsets go on from where they were, not from 0.
        events_after = int(stack.compose.exec("kafka", ["python", "-c", BORG_EVENTS_END]))
        assert events_before > 0, "borg.events had records before the restart"
        assert events_after >= events_before, f"the log went back: {events_before} -> {events_after}"
    after = await eventually(lambda: windows_at_least(before + 3), 180, "new windows after the restart")
    print(f"histogram windows {before} -> {after}, {time.monotonic() - restarted_at:.1f} s after restart")
    # Writes and their borg.events keep flowing too.
    reply = await client.borgmaster.submit_job(simulated_job(user, "after-broker", tasks=1, cpu=100))
    await eventually(lambda: running_tasks(client, reply.job_id), 60, "a job submitted after the restart")


async def test_disconnecting_a_recommender_the_others_carry_on(
    stack: RunningStack, client: CellpilotClient, user: str
) -> None:
    stack.require("recommender-0", "recommender-1", "recommender-2", "autopilot-0", "aggregator")
    on = job_pb2.VerticalScalingConfig(mode=job_pb2.SCALING_MODE_DRY_RUN)
    spec = simulated_job(user, "observed", tasks=3, cpu=2000, memory=2 * GIB)
    spec.autopilot.CopyFrom(job_pb2.AutopilotConfig(cpu=on, memory=on))
    job_id = (await client.borgmaster.submit_job(spec)).job_id

    async def updated_after(ms: int) -> int | None:
        try:
            reply = await client.autopilot.get_recommendation(job_id)
        except CellpilotError:
            return None
        stamp = reply.recommendations.updated_ms
        return stamp if stamp > ms else None

    first = await eventually(lambda: updated_after(0), 180, "a first recommendation")
    await asyncio.to_thread(stack.compose.disconnect, "recommender-1")
    try:
        later = await eventually(lambda: updated_after(first), 180, "recommendations with one worker cut off")
        assert later > first
    finally:
        await asyncio.to_thread(stack.compose.connect, "recommender-1")
    await asyncio.to_thread(stack.compose.wait_healthy, ["recommender-1"], 120)
