"""Usage samples on Kafka ``usage.samples``: every task, every event-second, batched per machine."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

from borglet_builders import MIB, BorgletFactory, collect_samples, simulated_task

from cellpilot.api.v1 import borglet_pb2, usage_pb2
from cellpilot.stack import StackEndpoints
from cellpilot.world.usage_models import evaluate_usage

LEAK = {"memory_start_bytes": 64 * MIB, "leak_bytes_per_second": 1 * MIB, "memory_noise": 0, "cpu_noise": 0}


async def test_samples_every_event_second_batched_per_machine_when_sped_up(
    borglet_factory: BorgletFactory, endpoints: StackEndpoints
) -> None:
    # 20 event-seconds per wall second, published every 0.5 s: about 10 event-seconds per
    # message. Nobody polls: the tasks run and report anyway.
    async with borglet_factory(speedup=20, publish_interval_s=0.5, fleet_size=2) as (borglet, stub):
        started: dict[tuple[str, int], int] = {}
        for machine_index, index in [(0, 0), (0, 1), (1, 2)]:
            machine = borglet.profiles[machine_index].machine_id
            reply = await stub.StartTask(
                borglet_pb2.StartTaskRequest(
                    master_epoch=1,
                    machine_id=machine,
                    task=simulated_task("s/leak", index, model="leak", params=LEAK, seed=42),
                )
            )
            started[(machine, index)] = reply.task.started_ms
        machines = {p.machine_id for p in borglet.profiles}
        records = await collect_samples(endpoints.kafka_bootstrap, machines, enough=3 * 80)

    per_task: dict[tuple[str, int], list[usage_pb2.UsageSample]] = defaultdict(list)
    sequences: dict[str, list[int]] = defaultdict(list)
    seconds_per_message = []
    for record, batch in records:
        assert batch.machine_id == record.key
        sequences[record.key].append(batch.batch_sequence)
        seconds_per_message.append(len({s.event_time_ms for s in batch.samples}))
        for sample in batch.samples:
            per_task[(record.key, sample.task_index)].append(sample)
    assert set(per_task) == set(started)
    for key, samples in per_task.items():
        times = [s.event_time_ms for s in samples]
        # One sample per event-second, starting at the first whole second after the start.
        assert times[0] == math.ceil(started[key] / 1000) * 1000
        assert all(b - a == 1000 for a, b in itertools.pairwise(times)), times
        # The usage is the model's at that event time (no noise: the leak line exactly).
        _, memory = evaluate_usage("leak", LEAK, 42, key[1], [t / 1000 for t in times], started[key] / 1000)
        assert [s.memory_bytes for s in samples] == memory.tolist()
        assert all(s.incarnation == 1 for s in samples)
    for seqs in sequences.values():
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    assert max(seconds_per_message) >= 5  # several event-seconds per message when sped up
