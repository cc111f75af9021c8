"""A database written by the previous version still loads (Borg §3.1 checkpoint).

The previous version stored snapshots in the first format (the API's statuses) and its INSERT
named no format. Migrating such a database keeps its snapshot readable; a replica of this
version, running as the ``cellpilot_borgmaster`` role, starts from that snapshot, and the
snapshots it takes are ``CellSnapshot`` rows.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from borgmaster_harness import eventually, grant, leader_of, machine, replicas, simulated_job, stub
from sqlalchemy import make_url, text

from cellpilot.api.v1 import borgmaster_pb2, machine_pb2
from cellpilot.borg.cell_state import CellState
from cellpilot.borg.model import MachineSpec
from cellpilot.borg.mutations import MachineRegistered, to_records
from cellpilot.borg_wire import snapshot_v1
from cellpilot.borg_wire.checkpoint import SNAPSHOT_FORMAT
from cellpilot.checkpoint_store import PostgresCheckpointStore
from cellpilot.platform.postgres import (
    MIGRATIONS_DIR,
    apply_migrations,
    drop_database,
    ensure_database,
    migration_files,
    query,
)
from cellpilot.platform.store_accounts import service_postgres_url
from cellpilot.schedule import Resources
from cellpilot.stack import Stack, StackEndpoints

# The Borgmaster snapshots only when told to (write_snapshot), and polls no Borglet.
QUIET = {"snapshot_every_records": 1_000_000, "snapshot_interval_s": 3600.0, "poll_interval_s": 600}


async def _replayed_to(store: PostgresCheckpointStore, seq: int) -> CellState:
    state = CellState()
    state.apply_all(await store.read(0, up_to_seq=seq, limit=1_000_000))
    return state


async def test_a_replica_loads_a_first_format_snapshot_and_writes_cell_snapshots(
    fresh_database_url: str, endpoints: StackEndpoints, embedded_stack: Stack
) -> None:
    database = make_url(fresh_database_url).database
    as_borgmaster = service_postgres_url(
        str(make_url(embedded_stack.endpoints.postgres_url).set(database=database)),
        "borgmaster",
        embedded_stack.config.certs_dir,
    )
    admin = PostgresCheckpointStore.connect(fresh_database_url, pool_size=1)
    try:
        # A cell as the previous version ran it: machines, quotas, jobs placed, one killed, one drained.
        async with replicas(fresh_database_url, endpoints, 1, **QUIET) as (previous,):
            await leader_of([previous])
            channel, client = stub(previous.address)
            async with channel:
                await grant(client, "alice")
                for m in ("m0", "m1"):
                    await client.RegisterMachine(
                        borgmaster_pb2.RegisterMachineRequest(request_id=f"reg-{m}", spec=machine(m))
                    )
                for name in ("web", "batch", "gone"):
                    await client.SubmitJob(
                        borgmaster_pb2.SubmitJobRequest(request_id=name, spec=simulated_job(name, tasks=2))
                    )

                # The scheduler is its own loop (Borg §3.4): placement follows the submissions.
                async def all_placed() -> bool:
                    tasks = [t for _, t in previous.replica.state.iter_tasks()]
                    return len(tasks) == 6 and all(t.machine_id for t in tasks)

                await eventually(all_placed, 60, "the six tasks placed by the scheduler")
                await client.KillJob(borgmaster_pb2.KillJobRequest(request_id="kill", job_id="alice/gone"))
                await client.SetMachineState(
                    borgmaster_pb2.SetMachineStateRequest(
                        request_id="drain", machine_id="m1", state=machine_pb2.MACHINE_STATE_DRAINING
                    )
                )
            # One synchronous step: nothing applies a record to the state meanwhile.
            state, epoch = previous.replica.state, previous.replica.epoch
            old_seq = state.last_sequence
            old_bytes = snapshot_v1.snapshot_out(state, epoch).SerializeToString()
        assert any(t.machine_id for _, t in state.iter_tasks()), "tasks were placed before the upgrade"
        # Stored as the previous version's INSERT did: it named no format.
        async with admin.engine.begin() as conn:
            await conn.execute(
                text("INSERT INTO checkpoint_snapshot (seq, epoch, state) VALUES (:seq, :epoch, :state)"),
                {"seq": old_seq, "epoch": epoch, "state": old_bytes},
            )
        stored = await admin.latest_snapshot()
        assert stored is not None
        assert stored.sequence == old_seq
        assert stored.state.describe() == (await _replayed_to(admin, old_seq)).describe()

        async with replicas(as_borgmaster, endpoints, 1, **QUIET) as (upgraded,):
            assert upgraded.replica.core.loaded_snapshot_seq == old_seq, "recovery starts at the old snapshot"
            await leader_of([upgraded])
            assert sorted(upgraded.replica.state.jobs) == ["alice/batch", "alice/gone", "alice/web"]
            assert upgraded.replica.state.machines["m1"].draining
            channel, client = stub(upgraded.address)
            async with channel:
                await client.SubmitJob(
                    borgmaster_pb2.SubmitJobRequest(request_id="after", spec=simulated_job("after"))
                )
            new_seq = await upgraded.replica.write_snapshot()
        assert new_seq > old_seq

        rows = await query(admin.engine, "SELECT seq, format FROM checkpoint_snapshot ORDER BY seq", {})
        assert [(r.seq, r.format) for r in rows] == [
            (old_seq, snapshot_v1.FORMAT),
            (new_seq, SNAPSHOT_FORMAT),
        ]
        latest = await admin.latest_snapshot()
        assert latest is not None
        assert latest.sequence == new_seq
        assert latest.state.describe() == (await _replayed_to(admin, new_seq)).describe()
        earlier = await admin.latest_snapshot(at_or_before=new_seq - 1)
        assert earlier is not None
        assert earlier.sequence == old_seq, "the old row is still read next to the new one"
    finally:
        await admin.close()


FORMAT_MIGRATION = "0014_snapshot_format.sql"


async def test_migrating_a_database_keeps_its_snapshots_readable(
    endpoints: StackEndpoints, tmp_path: Path
) -> None:
    """A database migrated before the format column existed, holding a snapshot, is upgraded: the
    row is read as the first format, and the store then writes CellSnapshot rows beside it."""
    before = tmp_path / "migrations"
    before.mkdir()
    for path in migration_files():
        if path.name < FORMAT_MIGRATION:
            shutil.copy(path, before / path.name)
    url = str(make_url(endpoints.postgres_url).set(database=f"test_{uuid.uuid4().hex[:12]}"))
    await ensure_database(url)
    store = PostgresCheckpointStore.connect(url, pool_size=1)
    try:
        await apply_migrations(url, before)
        state = CellState()
        state.apply_all(to_records(1, 1, 5_000, [MachineRegistered(_machine_spec("m0"))], cause_id="old"))
        async with store.engine.begin() as conn:
            await conn.execute(
                text("INSERT INTO checkpoint_snapshot (seq, epoch, state) VALUES (1, 1, :state)"),
                {"state": snapshot_v1.snapshot_out(state, 1).SerializeToString()},
            )
        assert FORMAT_MIGRATION in await apply_migrations(url, MIGRATIONS_DIR)

        loaded = await store.latest_snapshot()
        assert loaded is not None
        assert loaded.state.describe() == state.describe()
        state.apply_all(to_records(2, 1, 6_000, [MachineRegistered(_machine_spec("m1"))], cause_id="new"))
        assert await store.write_snapshot(state, 1) == 2
        rows = await query(store.engine, "SELECT seq, format FROM checkpoint_snapshot ORDER BY seq", {})
        assert [(r.seq, r.format) for r in rows] == [(1, snapshot_v1.FORMAT), (2, SNAPSHOT_FORMAT)]
        latest = await store.latest_snapshot()
        assert latest is not None
        assert latest.state.describe() == state.describe()
    finally:
        await store.close()
        await drop_database(url)


def _machine_spec(machine_id: str) -> MachineSpec:
    return MachineSpec(machine_id, "127.0.0.1:1", Resources(8000, 16 * 2**30, 2**40, 100), (("arch", "x86"),))


async def test_a_snapshot_row_is_of_the_position_its_bytes_are_of(fresh_database_url: str) -> None:
    """The row names the position of the state it encodes, so a replica loading it replays exactly
    the records after it. (The store encodes off the event loop; the replica keeps its copy still
    meanwhile — a live master's snapshots equal the log replayed to their position:
    test_borgmaster_snapshots.py.)"""
    store = PostgresCheckpointStore.connect(fresh_database_url, pool_size=1)
    try:
        state = CellState()
        state.apply_all(to_records(1, 1, 5_000, [MachineRegistered(_machine_spec("m0"))], cause_id="a"))
        assert await store.write_snapshot(state, 1) == 1
        state.apply_all(to_records(2, 1, 6_000, [MachineRegistered(_machine_spec("m1"))], cause_id="b"))
        assert await store.write_snapshot(state, 1) == 2
        stored = await store.latest_snapshot(at_or_before=1)
        assert stored is not None
        assert (stored.sequence, stored.state.last_sequence, sorted(stored.state.machines)) == (1, 1, ["m0"])
        latest = await store.latest_snapshot()
        assert latest is not None
        assert (latest.sequence, sorted(latest.state.machines)) == (2, ["m0", "m1"])
    finally:
        await store.close()
