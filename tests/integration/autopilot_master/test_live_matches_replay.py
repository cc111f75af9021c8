"""The running pipeline and the replay reach the same limits on the same job (Autopilot §3.1, §5.1).

One Autopiloted serving job (two simulated tasks whose usage steps up an hour into their
lives, as after a roll-out, Autopilot §2.2) runs on a Borglet fleet in event time; its
samples go through the aggregator, a recommender worker, the Autopilot master and the
actuator to the Borgmaster. The same samples (read back from ``usage.samples``), cut into
the windows the aggregator closed, are fed to the replay's Autopilot decider
(:class:`cellpilot.evaluate.autopilot_deciders.AutopilotDecider`, the off-line studies'
code). Every limit the master actuated, for CPU (the §3.2.2 moving window) and memory (ML,
§4.2's AUTO choice for serving jobs), must equal what the replay wants after the window it
came from, within one histogram bucket; and the limits the Borgmaster ends with are such
limits. The comparison is made window by window, so it does not depend on how fast the
wall clock let the services go.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from autopilot_master_harness import (
    GIB,
    Scenario,
    TopicReader,
    actuator,
    api_client,
    autopilot,
    borgmaster,
    eventually,
    grant,
    job_spec,
    job_status,
)
from usage_pipeline import usage_pipeline

from cellpilot.api.v1 import actuation_pb2, job_pb2, resources_pb2, usage_pb2
from cellpilot.autopilot.ml_config import load_ml_config
from cellpilot.evaluate.autopilot_deciders import (
    AutopilotDecider,
    ChunkLayout,
    Observation,
    PolicyKind,
)
from cellpilot.stack import StackEndpoints
from cellpilot.usage.buckets import Resource, default_scheme
from cellpilot.workloads.task_signals import JobTraits
from cellpilot_services.autopilot.convert import traits_in
from cellpilot_services.autopilot.decision_loop import policy_of

pytestmark = pytest.mark.slow  # started first (tests/conftest.py)

ON = job_pb2.SCALING_MODE_ON
SPEEDUP = 1200.0  # four 5-minute windows per wall second
WINDOW_MS = 300_000
WINDOWS = 48  # four hours of event time
TASKS = 2
LIMIT_CPU, LIMIT_MEMORY = 4_000, 4 * GIB
STEP = {
    "cpu_before_millicores": 400.0,
    "cpu_after_millicores": 900.0,
    "memory_before_bytes": 300.0 * (1 << 20),
    "memory_after_bytes": 700.0 * (1 << 20),
    "step_after_seconds": 3600.0,
    "task_spread": 0.2,
}
RESOURCE_OF = {"cpu": Resource.CPU, "memory": Resource.MEMORY}


def stepping_job(user: str) -> job_pb2.JobSpec:
    spec = job_spec(
        "stepping", user, cpu_mode=ON, memory_mode=ON, tasks=TASKS, cpu=LIMIT_CPU, memory=LIMIT_MEMORY
    )
    runtime = spec.task.runtime.simulated
    runtime.usage_model = "step"
    runtime.seed = 7
    runtime.params.update(STEP)
    return spec


def source_windows(actuation: actuation_pb2.Actuation) -> dict[Resource, int]:
    """Per actuated resource, the window end of the recommendation it came from."""
    out = {}
    for source in actuation.source_recommendation_ids:
        _, resource, _, end = source.rsplit("/", 3)
        out[RESOURCE_OF[resource]] = int(end)
    return out


def replay_wanted(
    samples: list[usage_pb2.UsageSample],
    window_ends: list[int],
    spec: job_pb2.JobSpec,
    master_policy: object,
) -> dict[Resource, dict[int, float]]:
    """The replay decider's wanted limit (master units) after each closed window, per resource."""
    cpu: dict[tuple[int, int], list[float]] = defaultdict(list)
    memory: dict[tuple[int, int], float] = {}
    for s in samples:
        key = (s.task_index, (s.event_time_ms // WINDOW_MS + 1) * WINDOW_MS)
        cpu[key].append(float(s.cpu_millicores))  # millicores end to end (cellpilot.units)
        memory[key] = max(memory.get(key, 0.0), float(s.memory_bytes))
    traits = traits_in(spec, 64.0 * GIB)
    layout = ChunkLayout(
        np.zeros(TASKS, dtype=np.intp),
        np.array([0, TASKS], dtype=np.intp),
        (JobTraits(traits.job_class, traits.latency, traits.oom_tolerance),),
    )
    ensemble = load_ml_config()  # what the recommender workers load
    deciders = {
        r: AutopilotDecider(PolicyKind.AUTOPILOT, layout, r, ensemble, master_policy)  # type: ignore[arg-type]
        for r in Resource
    }
    limits = {Resource.CPU: float(LIMIT_CPU), Resource.MEMORY: float(LIMIT_MEMORY)}
    wanted: dict[Resource, dict[int, float]] = {r: {} for r in Resource}
    points_per_task = max(len(v) for v in cpu.values())
    for i, end in enumerate(window_ends):
        running = np.array([(t, end) in memory for t in range(TASKS)])
        points = np.zeros((TASKS, points_per_task))
        fractions = np.zeros((TASKS, points_per_task))
        for t in range(TASKS):
            values = cpu.get((t, end), [])
            points[t, : len(values)] = values
            fractions[t, : len(values)] = 1.0 / (WINDOW_MS / 1000.0)  # one second's share each
        peaks = np.array([memory.get((t, end), 0.0) for t in range(TASKS)])
        for resource, decider in deciders.items():
            obs = Observation(
                window=i,
                time_ms=end,
                running=running,
                observed=peaks if resource is Resource.MEMORY else (points * fractions).sum(axis=1),
                oom=np.zeros(TASKS, dtype=bool),
                task_limit=np.full(TASKS, limits[resource]),
                job_limit=np.full(1, np.nan),
                points=None if resource is Resource.MEMORY else points,
                fractions=None if resource is Resource.MEMORY else fractions,
            )
            decider.step(obs)
            wanted[resource][end] = float(decider.wanted[0])
    return wanted


def within_one_bucket(resource: Resource, live: float, replay: float) -> bool:
    """|live - replay| is at most the width of the histogram bucket holding the replay's value."""
    scheme = default_scheme(resource)
    k = int(scheme.index_of(np.array([replay]))[0])
    lower = scheme.boundaries[k - 1] if k > 0 else 0.0
    return abs(live - replay) <= scheme.boundaries[k] - lower


async def test_live_pipeline_actuates_the_limits_the_replay_decides(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    scenario = Scenario(endpoints)
    await scenario.create_topics()
    async with borgmaster(fresh_database_url, scenario) as bm:
        client = api_client([bm.address])
        await grant(client, scenario.user)
        spec = stepping_job(scenario.user)
        job = await client.borgmaster.submit_job(spec)
        settings = scenario.autopilot_settings([bm.address], hold_grace_s=0.5)
        bootstrap = endpoints.kafka_bootstrap
        async with (
            usage_pipeline(scenario, fresh_database_url, [bm.address], speedup=SPEEDUP) as pipeline,
            TopicReader(bootstrap, pipeline.samples_topic, usage_pb2.UsageSampleBatch) as batches,
            TopicReader(bootstrap, pipeline.histograms_topic, usage_pb2.UsageHistogram) as hists,
            TopicReader(bootstrap, scenario.actuations, actuation_pb2.Actuation) as actuations,
            autopilot(settings),
            actuator(scenario.actuator_settings([bm.address])),
        ):

            def closed_windows() -> list[int]:
                ends = [
                    h.window_end_ms
                    for h in hists.for_job(job.job_id)
                    if h.resource == resources_pb2.RESOURCE_MEMORY and not h.HasField("task_index")
                ]
                return sorted(set(ends))

            async def enough_windows() -> bool:
                return len(closed_windows()) >= WINDOWS

            await eventually(enough_windows, 120, f"{WINDOWS} windows of the job aggregated")

            async def settled() -> tuple[int, int, dict[Resource, int]] | None:
                """The Borgmaster's limits, once they are those of the latest actuation of each."""
                status = await job_status(client, job.job_id)
                limits = status.spec.task.limits
                latest: dict[Resource, tuple[int, int]] = {}  # resource -> (source window, value)
                for a in actuations.for_job(job.job_id):
                    for resource, end in source_windows(a).items():
                        value = a.cpu_limit_millicores if resource is Resource.CPU else a.memory_limit_bytes
                        if end >= latest.get(resource, (-1, 0))[0]:
                            latest[resource] = (end, value)
                if set(latest) != set(Resource):
                    return None
                if (limits.cpu_millicores, limits.memory_bytes) != (
                    latest[Resource.CPU][1],
                    latest[Resource.MEMORY][1],
                ):
                    return None
                return limits.cpu_millicores, limits.memory_bytes, {r: v[0] for r, v in latest.items()}

            cpu_limit, memory_limit, final_windows = await eventually(
                settled, 60, "the Borgmaster holding the latest actuated limits"
            )
            windows = closed_windows()
            sent = list(actuations.for_job(job.job_id))
            seen: set[tuple[str, int]] = set()
            samples = []
            for batch in batches.messages:
                if (batch.machine_id, batch.batch_sequence) in seen:
                    continue  # a repeated batch, as the aggregator drops it
                seen.add((batch.machine_id, batch.batch_sequence))
                samples.extend(s for s in batch.samples if s.job_id == job.job_id)
        await client.close()

    # Every window the aggregator closed up to the last one an actuation came from.
    last = max(end for a in sent for end in source_windows(a).values())
    assert last in windows
    wanted = replay_wanted(samples, [w for w in windows if w <= last], spec, policy_of(settings))

    # The master changed both limits: the step (and the first right-sizing) moved them.
    compared = dict.fromkeys(Resource, 0)
    for a in sent:
        for resource, end in source_windows(a).items():
            live = a.cpu_limit_millicores if resource is Resource.CPU else a.memory_limit_bytes
            replay = wanted[resource][end]
            assert within_one_bucket(resource, live, replay), (resource, end, live, replay)
            compared[resource] += 1
    assert compared[Resource.CPU] >= 2, compared
    assert compared[Resource.MEMORY] >= 2, compared
    # The limits the Borgmaster ends with are the replay's for the same windows.
    assert within_one_bucket(Resource.CPU, cpu_limit, wanted[Resource.CPU][final_windows[Resource.CPU]])
    assert within_one_bucket(
        Resource.MEMORY, memory_limit, wanted[Resource.MEMORY][final_windows[Resource.MEMORY]]
    )
    assert cpu_limit < LIMIT_CPU
    assert memory_limit < LIMIT_MEMORY
