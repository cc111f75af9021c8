"""The monitoring half of the vertical loop, in-process on the embedded stack: a one-machine
Borglet fleet in event time publishing usage samples, an aggregator turning them into 5-minute
job histograms, and a recommender worker publishing recommendations for the Autopilot master
(Autopilot §3.1, §3.2.1). Each use gets its own topics, consumer groups and Redis prefixes."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

from autopilot_master_harness import GIB, Scenario

from cellpilot.platform.kafka import ensure_topics
from cellpilot.platform.topics import Topic

PARTITIONS = 3


@dataclass
class UsagePipeline:
    fleet: Any
    aggregator: Any
    worker: Any
    samples_topic: str
    histograms_topic: str


@asynccontextmanager
async def usage_pipeline(
    scenario: Scenario, database_url: str, masters: list[str], *, speedup: float
) -> AsyncIterator[UsagePipeline]:
    """A one-machine Borglet fleet publishing samples, an aggregator and a recommender worker."""
    from cellpilot_services.aggregator.aggregator_service import Aggregator
    from cellpilot_services.aggregator.settings import AggregatorSettings
    from cellpilot_services.borglet.borglet_service import Borglet
    from cellpilot_services.borglet.settings import BorgletSettings
    from cellpilot_services.recommender.settings import RecommenderSettings
    from cellpilot_services.recommender.worker import RecommenderWorker

    suffix = uuid.uuid4().hex[:8]
    samples, histograms = f"usage.samples.{suffix}", f"usage.histograms.{suffix}"
    await ensure_topics(
        scenario.endpoints.kafka_bootstrap,
        [Topic(samples, PARTITIONS, "machine id", "test"), Topic(histograms, PARTITIONS, "job id", "test")],
    )
    fleet = Borglet(
        BorgletSettings(
            platform=scenario.platform(),
            machine_id_prefix=f"e2e-{suffix[:6]}",
            fleet_size=1,
            borgmaster_addresses=masters,
            cgroup_root="none",
            cpu_millicores=64_000,
            memory_bytes=256 * GIB,
            speedup=speedup,
            publish_interval_s=0.2,
        )
    )
    # The Borglet publishes on usage.samples; this test's own topic keeps other tests' samples out.
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
            events_topic="",
            recommendations_topic=scenario.recommendations,
            consumer_group=f"recommender-{suffix}",
            state_prefix=f"test:{suffix}:recommender",
            poll_timeout_ms=50,
        )
    )
    async with AsyncExitStack() as stack:
        for service in (worker, aggregator, fleet):
            await service.start()
            stack.push_async_callback(service.stop)
        yield UsagePipeline(fleet, aggregator, worker, samples, histograms)
