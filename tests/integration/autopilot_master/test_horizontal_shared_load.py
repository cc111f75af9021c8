"""Horizontal Autopilot converging on a job whose load is shared, through the whole pipeline in
event time (Autopilot §3.3), every hop over mTLS:

Borglet fleet (simulated tasks sharing the job's diurnal demand; each Borglet reads which tasks
take traffic from the Borgmaster, as a load balancer would, Borg §2.6) -> usage.samples ->
aggregator -> usage.histograms -> recommender worker (r_S over the job's own 10-minute horizon,
learnt from the Borgmaster's job events) -> recommendations -> Autopilot master (stabilisers)
-> actuations -> actuator -> Borgmaster UpdateJob -> more or fewer tasks on the Borglets.

The event clock runs 300x (a 5-minute window per wall second); the job is submitted at the
trough of its 3-hour "day" (36 wall seconds), which peaks 18 wall seconds later. Adding tasks
lowers each task's load, so the count settles near demand / (r* x limit) at the peak instead of
running to the maximum, and after the peak, once deferred downscaling has passed, tasks are
removed again.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
from autopilot_master_harness import (
    BORGMASTER_FAST,
    GIB,
    Scenario,
    actuator,
    api_client,
    autopilot,
    eventually,
    grant,
    job_status,
)
from cell_scheduler import scheduler

from cellpilot.api.v1 import job_pb2, resources_pb2, state_pb2
from cellpilot.platform.kafka import ensure_topics
from cellpilot.platform.topics import Topic
from cellpilot.stack import StackEndpoints

pytestmark = pytest.mark.slow  # started first (tests/conftest.py)

PARTITIONS = 3
SPEEDUP = 300.0
PERIOD_S = 3 * 3600  # the job's "day": 36 wall seconds
QUIET = {"cpu_noise": 0.0, "memory_noise": 0.0}


@asynccontextmanager
async def shared_load_cell(scenario: Scenario, database_url: str) -> AsyncIterator[dict[str, object]]:
    """A Borgmaster publishing its job events, a 2-machine Borglet fleet publishing samples and
    reading the Borgmaster's view of each job, an aggregator and a recommender worker."""
    from cellpilot_services.aggregator.aggregator_service import Aggregator
    from cellpilot_services.aggregator.settings import AggregatorSettings
    from cellpilot_services.borglet.borglet_service import Borglet
    from cellpilot_services.borglet.settings import BorgletSettings
    from cellpilot_services.borgmaster.borgmaster_service import Borgmaster
    from cellpilot_services.borgmaster.settings import BorgmasterSettings
    from cellpilot_services.recommender.settings import RecommenderSettings
    from cellpilot_services.recommender.worker import RecommenderWorker

    suffix = uuid.uuid4().hex[:8]
    samples, histograms, events = (
        f"{name}.{suffix}" for name in ("usage.samples", "usage.histograms", "borg.events")
    )
    await ensure_topics(
        scenario.endpoints.kafka_bootstrap,
        [
            Topic(samples, PARTITIONS, "machine id", "test"),
            Topic(histograms, PARTITIONS, "job id", "test"),
            Topic(events, PARTITIONS, "job id", "test"),
        ],
    )
    async with AsyncExitStack() as stack:
        master = Borgmaster(
            BorgmasterSettings(
                platform=scenario.platform(database_url),
                port=0,
                apply_migrations=False,
                publish_events=True,
                events_topic=events,
                **BORGMASTER_FAST,  # type: ignore[arg-type]
            )
        )
        await master.start()
        stack.push_async_callback(master.stop)
        await eventually(lambda: _true(master.replica.is_leader), 15, "the Borgmaster elected")
        await stack.enter_async_context(scheduler([master.address], master.settings))
        fleet = Borglet(
            BorgletSettings(
                platform=scenario.platform(),
                machine_id_prefix=f"hz-{suffix[:6]}",
                fleet_size=2,
                borgmaster_addresses=[master.address],
                cgroup_root="none",
                cpu_millicores=64_000,
                memory_bytes=256 * GIB,
                speedup=SPEEDUP,
                publish_interval_s=0.2,
                load_balancer_refresh_s=0.2,
            )
        )
        assert fleet.publisher is not None
        fleet.publisher.topic = samples
        aggregator = Aggregator(
            AggregatorSettings(
                platform=scenario.platform(database_url),
                port=0,
                metrics_port=0,
                apply_migrations=False,
                samples_topic=samples,
                sample_partitions=PARTITIONS,
                histograms_topic=histograms,
                consumer_group=f"aggregator-{suffix}",
                checkpoint_interval_s=1.0,
                idle_after_s=1.0,
                job_stage_interval_s=0.2,
            )
        )
        worker = RecommenderWorker(
            RecommenderSettings(
                platform=scenario.platform(),
                port=0,
                metrics_port=0,
                histograms_topic=histograms,
                histogram_partitions=PARTITIONS,
                events_topic=events,
                recommendations_topic=scenario.recommendations,
                consumer_group=f"recommender-{suffix}",
                state_prefix=f"test:{suffix}:recommender",
                poll_timeout_ms=50,
            )
        )
        for service in (worker, aggregator, fleet):
            await service.start()
            stack.push_async_callback(service.stop)
        yield {"master": master, "fleet": fleet}


async def _true(value: bool) -> bool:
    return value


def frontend(user: str, now_s: float) -> job_pb2.JobSpec:
    """The demo's frontend, on a 3-hour day: 0.6-4.2 cores of demand, 1-core tasks, r* = 0.6;
    its day starts at its trough now (event time ``now_s``) and peaks half a day later."""
    demand = job_pb2.SharedDemand(
        usage_model="diurnal",
        params={
            "cpu_mean_millicores": 2400.0,
            "cpu_amplitude": 0.75,
            "period_seconds": float(PERIOD_S),
            "peak_seconds": (now_s + PERIOD_S / 2) % PERIOD_S,
            **QUIET,
        },
    )
    runtime = job_pb2.SimulatedRuntime(
        usage_model="steady",
        params={"cpu_millicores": 50.0, "memory_bytes": 200e6, **QUIET},
        seed=3,
        startup_seconds=120,
        demand=demand,
    )
    return job_pb2.JobSpec(
        name="frontend",
        user=user,
        priority=9,
        app_class=job_pb2.APP_CLASS_LATENCY_SENSITIVE,
        task_count=2,
        task=job_pb2.TaskSpec(
            limits=resources_pb2.Resources(cpu_millicores=1000, memory_bytes=GIB),
            runtime=job_pb2.RuntimeSpec(simulated=runtime),
        ),
        autopilot=job_pb2.AutopilotConfig(
            horizontal=job_pb2.HorizontalScalingConfig(
                mode=job_pb2.SCALING_MODE_ON,
                min_tasks=2,
                max_tasks=10,
                target_utilization=0.6,
                horizon_seconds=600,
                deferred_downscaling_seconds=900,
                slow_decay_half_period_seconds=600,
                max_initializing_fraction=0.5,
            )
        ),
    )


async def test_a_shared_diurnal_load_scales_up_at_its_peak_and_back_down_after_it(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    scenario = Scenario(endpoints)
    await scenario.create_topics()
    async with shared_load_cell(scenario, fresh_database_url) as cell:
        master = cell["master"]
        address = master.address  # type: ignore[attr-defined]
        client = api_client([address])
        await grant(client, scenario.user)
        fleet = cell["fleet"]
        now_s = fleet.clock.now_ms() / 1000  # type: ignore[attr-defined]
        job = await client.borgmaster.submit_job(frontend(scenario.user, now_s))
        counts: list[tuple[float, int, int]] = []  # (wall s, task count, running and ready)
        started = time.monotonic()
        async with (
            autopilot(scenario.autopilot_settings([address], hold_grace_s=0.5)),
            actuator(scenario.actuator_settings([address])),
        ):

            async def observe() -> state_pb2.JobStatus:
                status = await job_status(client, job.job_id, tasks=True)
                ready = sum(1 for t in status.tasks if t.state == state_pb2.TASK_STATE_RUNNING and t.ready)
                counts.append((time.monotonic() - started, status.spec.task_count, ready))
                return status

            async def scaled_up() -> bool:
                return (await observe()).spec.task_count >= 6

            await eventually(scaled_up, 40, "the job scaled up towards its peak")
            peak = max(c for _, c, _ in counts)

            async def scaled_down() -> bool:
                return (await observe()).spec.task_count <= 3

            await eventually(scaled_down, 45, "the job scaled down after its peak")
        await client.close()
    print("timeline (wall s, task count, ready):", [(round(t, 1), c, r) for t, c, r in counts[::10]])
    history = [c for _, c, _ in counts]
    top = history.index(max(history))
    # Up, then down: the count rose to its maximum and fell after it, never beyond demand's
    # needs (4.2 cores / 0.6 per task, plus idle: 8 tasks), far from the maximum of 10.
    assert 6 <= peak <= max(history) <= 8, counts
    assert history[-1] <= 3, counts
    assert top < len(history) - 1, counts
    assert all(a <= b for a, b in itertools.pairwise(history[: top + 1])), counts
