"""Periodic snapshots bound recovery (Borg §3.1): the master writes one after N records or after an
interval; each equals the log replayed to its position; a replica starting later loads from it."""

from __future__ import annotations

from borgmaster_harness import eventually, grant, leader_of, replicas, settings, simulated_job, stub

from cellpilot.api.v1 import borgmaster_pb2
from cellpilot.borg.cell_state import CellState
from cellpilot.borg_wire.checkpoint import snapshot_out
from cellpilot.checkpoint_store import PostgresCheckpointStore, StoredSnapshot
from cellpilot.stack import StackEndpoints
from cellpilot_services.borgmaster.borgmaster_service import Borgmaster

EVERY_RECORDS = 10
INTERVAL_S = 1.5


async def _replayed_to(log: PostgresCheckpointStore, seq: int) -> CellState:
    state = CellState()
    state.apply_all(await log.read(0, up_to_seq=seq, limit=1_000_000))
    return state


async def test_snapshots_are_taken_by_record_count_and_interval_and_a_new_replica_loads_one(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    log = PostgresCheckpointStore.connect(fresh_database_url, pool_size=1)
    overrides = {
        "snapshot_every_records": EVERY_RECORDS,
        "snapshot_interval_s": INTERVAL_S,
        "poll_interval_s": 600,
    }
    try:
        async with replicas(fresh_database_url, endpoints, 1, **overrides) as (master,):
            await leader_of([master])
            channel, client = stub(master.address)
            async with channel:
                await grant(client, "alice")
                for i in range(EVERY_RECORDS):
                    await client.SubmitJob(
                        borgmaster_pb2.SubmitJobRequest(request_id=f"s{i}", spec=simulated_job(f"j{i}"))
                    )

                async def by_count() -> StoredSnapshot | None:
                    return await log.latest_snapshot()

                first = await eventually(by_count, 5, f"a snapshot after {EVERY_RECORDS} records")
                first_seq = first.sequence
                assert first_seq >= EVERY_RECORDS
                epoch = master.replica.epoch
                expected = await _replayed_to(log, first_seq)
                assert snapshot_out(first.state, epoch) == snapshot_out(expected, epoch), (
                    "the snapshot is the log replayed to its position"
                )

                # A couple of records, far fewer than the count: the interval takes the next one.
                for i in range(2):
                    await client.SubmitJob(
                        borgmaster_pb2.SubmitJobRequest(request_id=f"t{i}", spec=simulated_job(f"t{i}"))
                    )
                head = master.replica.state.last_sequence
                assert head - first_seq < EVERY_RECORDS

                async def by_interval() -> StoredSnapshot | None:
                    latest = await log.latest_snapshot()
                    return latest if latest is not None and latest.sequence == head else None

                await eventually(by_interval, INTERVAL_S + 3, "a snapshot after the interval")

                later = Borgmaster(settings(fresh_database_url, endpoints, 1, **overrides))
                await later.start()
                try:
                    assert later.replica.core.loaded_snapshot_seq == head, "recovery starts at the snapshot"
                    assert later.replica.state.last_sequence == head
                    assert sorted(later.replica.state.jobs) == sorted(master.replica.state.jobs)
                finally:
                    await later.stop()
    finally:
        await log.close()
