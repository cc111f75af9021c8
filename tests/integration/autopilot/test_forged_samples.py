"""Forged usage samples are not aggregated: only a Borglet writes ``usage.samples``, and only for
the machines its certificate names.

An aggregator process reads a fresh samples topic. The stack's Borglet ``borglet-r0`` (whose
certificate names ``machine-r0-*``) sends genuine samples of one job; then come samples of
another job: signed by the same Borglet for a machine of another fleet, signed for its own
machine but holding another machine's batch, and written by a plain Kafka client with no
signature. Only the genuine job is aggregated; each forgery is filed on ``deadletter`` and the
refusals are counted, per topic and reason, on the aggregator's ``/metrics``.
"""

from __future__ import annotations

import urllib.request

import asyncpg
from aiokafka import AIOKafkaProducer
from autopilot_processes import ServiceProcess, new_topics, read_all, wait_for
from prometheus_client.parser import text_string_to_metric_families
from stream_writers import as_service

from cellpilot.api.v1 import usage_pb2
from cellpilot.platform.kafka import DEADLETTER_TOPIC, MessageProducer
from cellpilot.platform.postgres import asyncpg_dsn
from cellpilot.stack import StackEndpoints
from cellpilot.stack.config import free_port

W = 60_000
T0 = 28_333_334 * W
SECONDS = 30


def batch(machine: str, job: str, sequence: int) -> usage_pb2.UsageSampleBatch:
    message = usage_pb2.UsageSampleBatch(machine_id=machine, batch_sequence=sequence)
    for second in range(SECONDS):
        message.samples.add(
            job_id=job,
            task_index=0,
            incarnation=1,
            event_time_ms=T0 + second * 1000,
            cpu_millicores=250.0,
            memory_bytes=64 << 20,
        )
    return message


def refused_counts(metrics_port: int) -> dict[tuple[str, str], float]:
    """``cellpilot_records_refused_total`` by (topic, reason), scraped from ``/metrics``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return {
        (sample.labels["topic"], sample.labels["reason"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "cellpilot_records_refused_total"
    }


async def test_forged_samples_for_a_machine_the_writer_does_not_own_are_not_aggregated(
    endpoints: StackEndpoints, fresh_database_url: str
) -> None:
    bootstrap = endpoints.kafka_bootstrap
    samples_topic, histograms_topic = await new_topics(
        bootstrap, ("usage.samples", 1), ("usage.histograms", 1)
    )
    metrics_port = free_port()
    aggregator = ServiceProcess(
        "aggregator",
        "aggregator-forged",
        {
            "CELLPILOT_POSTGRES_URL": fresh_database_url,
            "CELLPILOT_AGGREGATOR_SAMPLES_TOPIC": samples_topic,
            "CELLPILOT_AGGREGATOR_SAMPLE_PARTITIONS": "1",
            "CELLPILOT_AGGREGATOR_HISTOGRAMS_TOPIC": histograms_topic,
            "CELLPILOT_AGGREGATOR_CONSUMER_GROUP": f"agg-{samples_topic}",
            "CELLPILOT_AGGREGATOR_WINDOW_MS": str(W),
            "CELLPILOT_AGGREGATOR_OUT_OF_ORDERNESS_MS": "0",
            "CELLPILOT_AGGREGATOR_IDLE_AFTER_S": "2",
            "CELLPILOT_AGGREGATOR_CHECKPOINT_INTERVAL_S": "1",
            "CELLPILOT_AGGREGATOR_PORT": str(free_port()),
            "CELLPILOT_AGGREGATOR_METRICS_PORT": str(metrics_port),
        },
        endpoints,
    )
    borglet = MessageProducer(as_service(bootstrap, "borglet-r0"))  # certificate: machine-r0-*
    forger = AIOKafkaProducer(bootstrap_servers=bootstrap)
    db = await asyncpg.connect(asyncpg_dsn(fresh_database_url))
    await borglet.start()
    await forger.start()
    try:
        await wait_for(
            lambda: db.fetchval("SELECT count(*) FROM aggregator_partitions WHERE owner <> ''"),
            60,
            "the aggregator to claim its partition",
        )
        await borglet.send(samples_topic, "machine-r0-0001", batch("machine-r0-0001", "t/genuine", 1))
        # Signed by the Borglet, for a machine its certificate does not name.
        await borglet.send(samples_topic, "machine-r1-0001", batch("machine-r1-0001", "t/forged", 1))
        # Signed for its own machine, holding another machine's batch.
        await borglet.send(samples_topic, "machine-r0-0002", batch("machine-r1-0002", "t/forged", 2))
        # No signature at all: any local process with a Kafka client.
        plain = batch("machine-r0-0003", "t/forged", 3).SerializeToString()
        await forger.send_and_wait(samples_topic, plain, key=b"machine-r0-0003")

        async def windows_written() -> list[str] | None:
            rows = await db.fetch("SELECT DISTINCT job_id FROM usage_task_windows")
            return [r["job_id"] for r in rows] or None

        assert sorted(await wait_for(windows_written, 60, "the genuine window flushed")) == ["t/genuine"]
        accepted = await db.fetchval("SELECT sum(accepted_samples) FROM aggregator_partitions")
        assert accepted == SECONDS, "only the genuine batch's samples were folded in"

        letters = await read_all(bootstrap, DEADLETTER_TOPIC, idle_s=1.0)
        ours = [
            dict(r.headers) for r in letters if dict(r.headers).get("source-topic") == samples_topic.encode()
        ]
        reasons = sorted(h.get("refusal", b"").decode() or h["reason"].decode()[:20] for h in ours)
        assert reasons == ["a batch for machine ", "not-its-machine", "unsigned"], reasons

        counts = await wait_for(lambda: _async(refused_counts(metrics_port)), 15, "the refusals on /metrics")
        assert counts.get((samples_topic, "not-its-machine")) == 1.0
        assert counts.get((samples_topic, "unsigned")) == 1.0
        assert await db.fetchval("SELECT count(*) FROM usage_task_windows WHERE job_id = 't/forged'") == 0
    finally:
        await borglet.stop()
        await forger.stop()
        await db.close()
        aggregator.stop()
        print(aggregator.log_tail())


async def _async(value: dict[tuple[str, str], float]) -> dict[tuple[str, str], float] | None:
    return value or None
