"""Group commit's decisions: a batch decided together ends where deciding one by one ends."""

from __future__ import annotations

from dataclasses import replace

import pytest
from borg_builders import Master, job_spec, machine_spec

from cellpilot.borg.batch_decisions import BatchDecider, footprint
from cellpilot.borg.decisions import Accepted, Command, KillJob, Result, SetQuota, SubmitJob, UpdateJob
from cellpilot.borg.rejection import Code, Rejection
from cellpilot.job_vocabulary import PriorityBand
from cellpilot.schedule import Resources
from cellpilot.units import GIB


def _master(quota_cores: float = 10) -> Master:
    master = Master()
    master.add_machines(machine_spec("m0", cpu=8000, ram_gib=64), machine_spec("m1", cpu=8000, ram_gib=64))
    for band in (PriorityBand.PRODUCTION, PriorityBand.BATCH):
        master.grant("alice", band, cores=quota_cores)
        master.grant("bob", band, cores=quota_cores)
    return master


def _batched(master: Master, commands: list[Command]) -> tuple[list[Result], list[int]]:
    """Runs ``commands`` as the group committer does: batch, decide, commit, the rest next."""
    results: dict[int, Result] = {}
    sizes: list[int] = []
    waiting = list(enumerate(commands))
    while waiting:
        decider = BatchDecider(master.state, master.now_ms, master.view)
        batch = [(i, c) for i, c in waiting if decider.admits(c)]
        taken = {i for i, _ in batch}
        waiting = [(i, c) for i, c in waiting if i not in taken]
        decided = [(i, c, decider.decide(c)) for i, c in batch]
        for i, command, result in decided:  # nothing is applied before the whole batch is decided
            results[i] = result
            if isinstance(result, Accepted) and result.mutations and result.already_applied is None:
                master.commit(result.mutations, command)
        sizes.append(len(batch))
    return [results[i] for i in range(len(commands))], sizes


def _serial(master: Master, commands: list[Command]) -> list[Result]:
    return [master.run(c) for c in commands]


def _outcome(result: Result) -> tuple[str, str]:
    if isinstance(result, Rejection):
        return result.code.value, result.field
    return "accepted", result.subject


def _cell(master: Master) -> tuple[object, ...]:
    state = master.state
    return (
        sorted((j.job_id, j.state.value, j.spec_version, j.spec.task_count) for j in state.jobs.values()),
        [
            state.quota_used(u, b)
            for u in ("alice", "bob")
            for b in (PriorityBand.PRODUCTION, PriorityBand.BATCH)
        ],
        sorted(state.applied_requests),
    )


def _update(request_id: str, job_id: str, tasks: int) -> UpdateJob:
    return UpdateJob(request_id, job_id, job_spec(task_count=tasks), ("task_count",))


CASES = {
    # Jobs of 2 tasks x 1 core against 10 cores: the sixth is over quota.
    "one user's submissions share quota": [SubmitJob(f"r{i}", job_spec(f"j{i}")) for i in range(6)],
    "two users": [SubmitJob(f"r{i}", job_spec(f"j{i}", user=u)) for i in range(3) for u in ("alice", "bob")],
    "same request id twice (a retry)": [SubmitJob("same", job_spec("a")), SubmitJob("same", job_spec("a"))],
    "same request id, another payload": [
        SubmitJob("same", job_spec("a"), payload_digest="d1"),
        SubmitJob("same", job_spec("b"), payload_digest="d2"),
    ],
    "submit then kill then resubmit": [
        SubmitJob("s1", job_spec("a")),
        KillJob("k1", "alice/a"),
        SubmitJob("s2", job_spec("a", task_count=3)),
    ],
    "a bad spec among good ones": [
        SubmitJob("g1", job_spec("g1")),
        SubmitJob("bad", replace(job_spec("bad"), priority=12)),
        SubmitJob("g2", job_spec("g2")),
    ],
    "a quota cut between submissions": [
        SubmitJob("q1", job_spec("q1")),
        SetQuota("cut", "alice", PriorityBand.PRODUCTION, Resources(2500, 100 * GIB, 1e15, 1000)),
        SubmitJob("q2", job_spec("q2")),
    ],
    "updates growing one job": [
        SubmitJob("u0", job_spec("u")),
        _update("u1", "alice/u", 4),
        _update("u2", "alice/u", 6),
        SubmitJob("u3", job_spec("v", task_count=3)),
    ],
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_batch_decides_as_one_by_one_would(name: str) -> None:
    commands = CASES[name]
    serial, batched = _master(), _master()
    expected = _serial(serial, commands)
    results, _ = _batched(batched, commands)
    assert [_outcome(r) for r in results] == [_outcome(r) for r in expected]
    assert _cell(batched) == _cell(serial)


def test_submissions_of_one_user_share_a_batch_and_quota_still_binds() -> None:
    master = _master()
    results, sizes = _batched(master, CASES["one user's submissions share quota"])
    assert sizes == [6]
    assert [_outcome(r)[0] for r in results] == ["accepted"] * 5 + [Code.RESOURCE_EXHAUSTED.value]
    assert master.state.quota_used("alice", PriorityBand.PRODUCTION).cpu == 10_000


def test_a_reused_request_id_waits_for_the_next_batch_and_is_refused() -> None:
    master = _master()
    results, sizes = _batched(master, CASES["same request id, another payload"])
    assert sizes == [1, 1]
    assert isinstance(results[1], Rejection)
    assert (results[1].code, results[1].field) == (Code.ALREADY_EXISTS, "request_id")


def test_deciding_never_changes_the_state() -> None:
    master = _master()
    before = _cell(master)
    decider = BatchDecider(master.state, master.now_ms, master.view)
    for i in range(4):
        assert isinstance(decider.decide(SubmitJob(f"r{i}", job_spec(f"j{i}"))), Accepted)
    assert _cell(master) == before


def test_footprints_name_jobs_machines_and_request_ids() -> None:
    master = _master()
    master.accept(SubmitJob("s", job_spec("a", task_count=1)))
    master.schedule()
    machine = master.state.jobs["alice/a"].tasks[0].machine_id
    keys = footprint(master.state, _update("u", "alice/a", 2))
    assert {"request:u", "job:alice/a", f"machine:{machine}"} <= keys
    assert not any(k.startswith("quota:") for k in keys)  # quota is carried, not a conflict
