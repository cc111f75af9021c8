"""The forger: a local process with no key of the stack's, writing the streams with a plain client.

What any account that can reach the broker's port can do (docs/security.md): write records to
any topic and copy the records it reads. :func:`forge` writes, on the running stack,

* actuations for the probe job with a fencing token of 10^12 and a CPU limit of 7 777 m (were
  one applied, the job would run at 7 777 m and the actuator's highest token would fence out the
  real Autopilot master: nothing it decides would be applied again);
* a usage-sample batch for a job nobody submitted, on one of the stack's real machines;
* a recommendation set for that job;
* a copy of the newest genuine actuation and of the newest genuine sample batch, with their
  signatures (a replay).

On the durable broker an anonymous client is refused at the door (docs/security.md), so there
the forger is a compromised service: it logs in with the broker password of the dashboard (a
reader of every stream that writes none of them) and holds no record-signing key of any writer.

None of them may change anything (``forged_records_applied``) and each must be refused by the
services that read its topic, which file it on ``deadletter`` (``forged_records_unrefused``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from cellpilot.api.v1 import actuation_pb2, job_pb2, recommendation_pb2, resources_pb2, usage_pb2
from cellpilot.chaos.stream_ledger import ACTUATIONS, RECOMMENDATIONS, SAMPLES, value_digest
from cellpilot.chaos.workload import PROBE_JOB
from cellpilot.demo import DEMO_USER
from cellpilot.platform.stream_access import Broker, client_options, producer_options

FORGED_TOKEN = 10**12
FORGED_CPU_MILLICORES = 7_777
FORGED_KEY_PREFIX = "forged-"
FORGED_JOB = f"{DEMO_USER}/forged"  # a job nobody submitted
FORGED_MACHINE = "machine-r0-0000"  # one of `cellpilot run`'s machines (Borglet fleet replica 0)
FORGED_ACTUATIONS = 3


@dataclass
class Forgery:
    """What the forger wrote: (topic, digest of the value) of each record, and what each was."""

    written: list[tuple[str, str, str]] = field(default_factory=list)  # (topic, value digest, what)
    replays_missing: list[str] = field(default_factory=list)  # topics with no genuine record to copy

    def add(self, topic: str, value: bytes, what: str) -> None:
        self.written.append((topic, value_digest(value), what))


def forged_actuation(index: int, event_time_ms: int) -> actuation_pb2.Actuation:
    return actuation_pb2.Actuation(
        idempotency_key=f"{FORGED_KEY_PREFIX}{index}",
        job_id=PROBE_JOB,
        cpu_limit_millicores=FORGED_CPU_MILLICORES,
        reason="forged",
        fencing_token=FORGED_TOKEN,
        leader_id="forger",
        event_time_ms=event_time_ms,
    )


def forged_samples(event_time_ms: int) -> usage_pb2.UsageSampleBatch:
    batch = usage_pb2.UsageSampleBatch(machine_id=FORGED_MACHINE, batch_sequence=10**15)
    for second in range(60):
        batch.samples.add(
            job_id=FORGED_JOB,
            task_index=0,
            incarnation=1,
            event_time_ms=event_time_ms + second * 1000,
            cpu_millicores=FORGED_CPU_MILLICORES,
            memory_bytes=1 << 30,
        )
    return batch


def forged_recommendations(window_end_ms: int) -> recommendation_pb2.RecommendationSet:
    recommendation = recommendation_pb2.Recommendation(
        recommendation_id=f"{FORGED_JOB}/cpu/forged/{window_end_ms}",
        job_id=FORGED_JOB,
        resource=resources_pb2.RESOURCE_CPU,
        recommender=job_pb2.RecommenderRef(kind=job_pb2.RECOMMENDER_KIND_MOVING_WINDOW_MAX),
        value=FORGED_CPU_MILLICORES,
        raw_value=FORGED_CPU_MILLICORES,
        window_end_ms=window_end_ms,
    )
    return recommendation_pb2.RecommendationSet(
        job_id=FORGED_JOB, window_end_ms=window_end_ms, vertical=[recommendation], producer="forger"
    )


async def newest_record(broker: Broker, topic: str) -> tuple[bytes, bytes, list[tuple[str, bytes]]] | None:
    """The newest record of ``topic`` (key, value, headers) over all partitions, read with a plain client."""
    reader = AIOKafkaConsumer(**client_options(broker), enable_auto_commit=False, group_id=None)
    await reader.start()
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(reader.partitions_for_topic(topic) or [])]
        if not partitions:
            await reader.topics()
            partitions = [TopicPartition(topic, p) for p in sorted(reader.partitions_for_topic(topic) or [])]
        reader.assign(partitions)
        ends = await reader.end_offsets(partitions)
        newest = None
        for tp in partitions:
            if ends[tp] == 0:
                continue
            reader.seek(tp, ends[tp] - 1)
            fetched = await reader.getmany(tp, timeout_ms=2000)
            for message in fetched.get(tp, []):
                if newest is None or message.timestamp > newest.timestamp:
                    newest = message
        if newest is None:
            return None
        return newest.key or b"", newest.value or b"", list(newest.headers or ())
    finally:
        await reader.stop()


async def forge(broker: Broker, now_ms: int) -> Forgery:
    """Write the forged and replayed records (module docstring) with a plain, keyless producer."""
    forgery = Forgery()
    originals = {topic: await newest_record(broker, topic) for topic in (ACTUATIONS, SAMPLES)}
    producer = AIOKafkaProducer(**producer_options(broker))
    await producer.start()
    try:
        sends = []
        for index in range(FORGED_ACTUATIONS):
            value = forged_actuation(index, now_ms).SerializeToString()
            sends.append(await producer.send(ACTUATIONS, value, key=PROBE_JOB.encode()))
            forgery.add(ACTUATIONS, value, f"actuation {FORGED_KEY_PREFIX}{index}, token {FORGED_TOKEN}")
        value = forged_samples(now_ms - 120_000).SerializeToString()
        sends.append(await producer.send(SAMPLES, value, key=FORGED_MACHINE.encode()))
        forgery.add(SAMPLES, value, f"samples of {FORGED_JOB} on {FORGED_MACHINE}")
        value = forged_recommendations(now_ms).SerializeToString()
        sends.append(await producer.send(RECOMMENDATIONS, value, key=FORGED_JOB.encode()))
        forgery.add(RECOMMENDATIONS, value, f"recommendations for {FORGED_JOB}")
        for topic, original in originals.items():
            if original is None:
                forgery.replays_missing.append(topic)
                continue
            key, value, headers = original
            sends.append(await producer.send(topic, value, key=key, headers=headers))
            forgery.add(topic, value, f"a copy of a genuine {topic} record")
        await asyncio.gather(*sends)
    finally:
        await producer.stop()
    return forgery
