"""Group commit (Borg §3.1): concurrent writes share fenced appends, and each is answered only
after its own records committed; a fenced batch acknowledges nothing."""

from __future__ import annotations

import asyncio
from collections import Counter

import grpc
from borgmaster_harness import grant, leader_of, replicas, simulated_job, stub

from cellpilot.api.v1 import borgmaster_pb2
from cellpilot.borg.decisions import SubmitJob
from cellpilot.borg.master_core import Stimulus, Tick
from cellpilot.borg_wire import specs
from cellpilot.checkpoint_store import PostgresCheckpointStore
from cellpilot.platform.postgres import create_engine
from cellpilot.stack import StackEndpoints
from cellpilot_services.borgmaster.replica import NotLeader

SUBMITS = 48


async def _logged_request_ids(database_url: str) -> Counter[str]:
    engine = create_engine(database_url, pool_size=1)
    try:
        records = await PostgresCheckpointStore(engine).read(0, limit=1_000_000)
    finally:
        await engine.dispose()
    return Counter(r.request_id for r in records if r.request_id)


async def test_concurrent_submits_share_appends_and_all_survive_failover(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    async with replicas(fresh_database_url, endpoints, 2) as masters:
        old = await leader_of(masters)
        channel, client = stub(old.address)
        async with channel:
            await grant(client, "alice")
            batches_before = old.replica.group_commit.stats.batches

            def submit(request_id: str, name: str, user: str = "alice") -> object:
                spec = simulated_job(name, user=user)
                return client.SubmitJob(borgmaster_pb2.SubmitJobRequest(request_id=request_id, spec=spec))

            calls = [submit(f"g-{i}", f"g{i}") for i in range(SUBMITS)]
            calls += [
                submit("twice", "twice"),  # one request id twice with one payload: a retry
                submit("twice", "twice"),
                submit("reused", "first"),  # ... and with another payload: refused
                submit("reused", "second"),
                submit("no-quota", "nq", user="nobody"),  # fails alone
            ]
            answers = await asyncio.gather(*calls, return_exceptions=True)

        accepted = answers[:SUBMITS]
        assert all(isinstance(a, borgmaster_pb2.SubmitJobResponse) for a in accepted), accepted
        assert len({a.log_sequence for a in accepted}) == SUBMITS
        appends = old.replica.group_commit.stats.batches - batches_before
        assert appends < SUBMITS, f"{SUBMITS} concurrent submits took {appends} appends"

        twice = answers[SUBMITS : SUBMITS + 2]
        assert all(isinstance(a, borgmaster_pb2.SubmitJobResponse) for a in twice), twice
        assert twice[0].log_sequence == twice[1].log_sequence
        reused = answers[SUBMITS + 2 : SUBMITS + 4]
        refusals = [a for a in reused if isinstance(a, grpc.aio.AioRpcError)]
        assert len(refusals) == 1
        assert refusals[0].code() == grpc.StatusCode.ALREADY_EXISTS
        assert "request_id" in (refusals[0].details() or "")
        no_quota = answers[-1]
        assert isinstance(no_quota, grpc.aio.AioRpcError)
        assert no_quota.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        await old.stop()  # releases the lease: the other replica takes over from the log
        new = await leader_of([m for m in masters if m is not old])
        jobs = new.replica.state.jobs
        assert all(f"alice/g{i}" in jobs for i in range(SUBMITS))
        assert "alice/twice" in jobs
        assert ("alice/first" in jobs) != ("alice/second" in jobs)
        assert "nobody/nq" not in jobs

    logged = await _logged_request_ids(fresh_database_url)
    assert all(logged[f"g-{i}"] == 1 for i in range(SUBMITS))
    assert logged["twice"] == 1
    assert logged["reused"] == 1
    assert "no-quota" not in logged


async def test_a_fenced_batch_acknowledges_none_of_its_writes(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    concurrent = 12
    async with replicas(fresh_database_url, endpoints, 2) as masters:
        old = await leader_of(masters)
        new = next(m for m in masters if m is not old)
        channel, client = stub(old.address)
        async with channel:
            await grant(client, "alice")
        assert old._election is not None
        old._election.cancel()  # the old master stalls: it stops renewing but still thinks it leads
        await leader_of([new], within=10)
        assert old.replica.is_leader, "nobody told the stalled master"
        batches_before = old.replica.group_commit.stats.batches
        commands = [
            SubmitJob(f"late-{i}", specs.job_spec_in(simulated_job(f"late{i}"))) for i in range(concurrent)
        ]
        # All queued before the flusher first runs: one batch, refused as a whole.
        answers = await asyncio.gather(
            *(old.replica.execute(c, c.request_id) for c in commands), return_exceptions=True
        )
        assert all(isinstance(a, NotLeader) for a in answers), answers
        # Every one was refused by the fenced append itself (not by a later "not the master").
        assert all("current epoch" in str(a) for a in answers), answers
        assert old.replica.group_commit.stats.batches == batches_before
        assert not old.replica.is_leader, "the refused append made it step down"
        assert not any(job.startswith("alice/late") for job in old.replica.state.jobs)

    logged = await _logged_request_ids(fresh_database_url)
    assert not any(r.startswith("late-") for r in logged)


async def test_a_write_waits_for_one_batch_of_its_own_not_for_every_one_queued_before_it(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    """Reports, proposals and timers are batches of their own; a client write queued behind
    several of them goes after the first, not after all (the master's writes stay quick while
    Borglet reports pour in)."""
    async with replicas(fresh_database_url, endpoints, 1) as masters:
        master = await leader_of(masters)
        channel, client = stub(master.address)
        async with channel:
            await grant(client, "alice")
        replica = master.replica
        finished: list[str] = []
        tasks = []
        async with replica._changing:  # the flusher waits here while the queue fills
            stimuli: list[tuple[str, Stimulus]] = [(f"tick-{i}", Tick(f"tick-{i}")) for i in range(4)]
            stimuli.append(("write", SubmitJob("write", specs.job_spec_in(simulated_job("jumps")))))
            for name, stimulus in stimuli:
                task = asyncio.create_task(replica.group_commit.submit(stimulus, name))
                task.add_done_callback(lambda _, name=name: finished.append(name))
                tasks.append(task)
            deadline = asyncio.get_running_loop().time() + 30
            while replica.group_commit.queued < len(stimuli):
                assert asyncio.get_running_loop().time() < deadline, "the stimuli never queued"
                await asyncio.sleep(0.01)
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
        assert finished.index("write") == 1, finished
        assert [n for n in finished if n != "write"] == [f"tick-{i}" for i in range(4)], (
            "ticks keep their order"
        )
        assert "alice/jumps" in replica.state.jobs
