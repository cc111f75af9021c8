"""The actuator (Autopilot §3.1): a replayed actuation is a no-op (same key published again,
or the whole topic re-read after its position was lost); a stale fencing token is refused;
UpdateJob is retried while the Borgmaster is away and lands once it is back."""

from __future__ import annotations

import asyncio

from autopilot_master_harness import (
    Publisher,
    Scenario,
    actuator,
    api_client,
    borgmaster,
    eventually,
    grant,
    job_spec,
    job_status,
)

from cellpilot.api.v1 import actuation_pb2, job_pb2
from cellpilot.platform.redis_client import connect_redis
from cellpilot.stack import StackEndpoints

APPLIED = actuation_pb2.ACTUATION_OUTCOME_APPLIED
FENCED = actuation_pb2.ACTUATION_OUTCOME_FENCED
CONFLICT = actuation_pb2.ACTUATION_OUTCOME_CONFLICT
ON = job_pb2.SCALING_MODE_ON  # the actuator may change only Autopiloted dimensions


def _actuation(job_id: str, key: str, token: int, cpu: int) -> actuation_pb2.Actuation:
    return actuation_pb2.Actuation(
        idempotency_key=key, job_id=job_id, cpu_limit_millicores=cpu, fencing_token=token, leader_id="test"
    )


async def test_replayed_actuations_are_no_ops_and_stale_tokens_are_fenced(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    scenario = Scenario(endpoints)
    await scenario.create_topics()
    async with borgmaster(fresh_database_url, scenario) as bm, Publisher(scenario) as publish:
        client = api_client([bm.address])
        await grant(client, scenario.user)
        job = await client.borgmaster.submit_job(job_spec("web", scenario.user, cpu_mode=ON))
        settings = scenario.actuator_settings([bm.address])
        first = _actuation(job.job_id, "k1", 5, 700)
        async with actuator(settings) as act:
            await publish.actuation(first)

            async def settled(key: str) -> actuation_pb2.ActuationResult | None:
                return await act.results.result(key)

            result = await eventually(lambda: settled("k1"), 15, "k1 applied")
            assert result.outcome == APPLIED
            assert result.attempts == 1
            version = (await job_status(client, job.job_id)).spec_version
            assert (await job_status(client, job.job_id)).spec.task.limits.cpu_millicores == 700

            # The same decision published again: recognised by its key, nothing sent.
            await publish.actuation(first)
            await eventually(lambda: _replays(act, "k1", 1), 15, "the replay recognised")
            assert (await job_status(client, job.job_id)).spec_version == version

            # A newer leader (token 6) acts; then a deposed one (token 5) tries: fenced.
            await publish.actuation(_actuation(job.job_id, "k2", 6, 800))
            await eventually(lambda: settled("k2"), 15, "k2 applied")
            await publish.actuation(_actuation(job.job_id, "k3", 5, 300))
            stale = await eventually(lambda: settled("k3"), 15, "k3 settled")
            assert stale.outcome == FENCED
            assert "deposed" in stale.detail
            status = await job_status(client, job.job_id)
            assert status.spec.task.limits.cpu_millicores == 800
            assert status.fencing_token == 6
            version = status.spec_version

        # Restarted with its position: nothing is re-read.
        async with actuator(settings) as again:
            await asyncio.sleep(1.0)
            assert sum(again.outcomes.values()) == 0

        # Position lost (offsets gone): every record is read again, every one a no-op.
        redis = connect_redis(endpoints.redis_url)
        await redis.delete(f"{scenario.actuator_prefix}:offsets")
        await redis.aclose()
        async with actuator(settings) as replayed:
            await eventually(lambda: _count(replayed, "duplicate", 4), 15, "all four records replayed")
            assert set(replayed.outcomes) == {"duplicate"}
        status = await job_status(client, job.job_id)
        assert status.spec_version == version
        assert status.spec.task.limits.cpu_millicores == 800
        await client.close()


async def test_actuator_retries_while_the_borgmaster_is_down(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    scenario = Scenario(endpoints)
    await scenario.create_topics()
    async with Publisher(scenario) as publish:
        async with borgmaster(fresh_database_url, scenario) as bm:
            address = bm.address
            client = api_client([address])
            await grant(client, scenario.user)
            job = await client.borgmaster.submit_job(job_spec("web", scenario.user, cpu_mode=ON))
            await client.close()
        # The Borgmaster is gone; the actuation waits, retrying with backoff.
        settings = scenario.actuator_settings(
            [address], call_budget_s=0.5, max_attempts=40, max_backoff_s=0.5
        )
        async with actuator(settings) as act:
            await publish.actuation(_actuation(job.job_id, "k1", 3, 900))
            await asyncio.sleep(2.0)
            assert await act.results.result("k1") is None, "still retrying, not given up"
            port = int(address.rsplit(":", 1)[1])
            async with borgmaster(fresh_database_url, scenario, port=port) as back:
                result = await eventually(lambda: act.results.result("k1"), 30, "k1 applied after failover")
                assert result.outcome == APPLIED
                assert result.attempts > 1
                client = api_client([back.address])
                assert (await job_status(client, job.job_id)).spec.task.limits.cpu_millicores == 900
                await client.close()


async def _replays(act: object, key: str, count: int) -> bool:
    return bool(await act.results.replays(key) >= count)  # type: ignore[attr-defined]


async def _count(act: object, outcome: str, count: int) -> bool:
    return bool(act.outcomes[outcome] >= count)  # type: ignore[attr-defined]


async def test_decisions_made_on_one_spec_version_apply_in_order_until_a_user_edits_the_job(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    """The master decides again before its previous actuation landed, so consecutive
    actuations name the same spec version: each goes onto the version its predecessor made;
    a change by someone else in between still refuses the next one (CONFLICT)."""
    scenario = Scenario(endpoints)
    await scenario.create_topics()
    async with borgmaster(fresh_database_url, scenario) as bm, Publisher(scenario) as publish:
        client = api_client([bm.address])
        await grant(client, scenario.user)
        job = await client.borgmaster.submit_job(job_spec("web", scenario.user, cpu_mode=ON, memory_mode=ON))
        observed = (await job_status(client, job.job_id)).spec_version

        def decided(key: str, cpu: int) -> actuation_pb2.Actuation:
            actuation = _actuation(job.job_id, key, 5, cpu)
            actuation.based_on_spec_version = observed
            return actuation

        async with actuator(scenario.actuator_settings([bm.address])) as act:
            for key, cpu in (("d1", 600), ("d2", 700), ("d3", 800)):
                await publish.actuation(decided(key, cpu))
            results = [
                await eventually(lambda k=key: act.results.result(k), 15, f"{key} settled")  # type: ignore[misc]
                for key in ("d1", "d2", "d3")
            ]
            assert [r.outcome for r in results] == [APPLIED] * 3, [r.detail for r in results]
            assert [r.spec_version for r in results] == [observed + 1, observed + 2, observed + 3]
            status = await job_status(client, job.job_id)
            assert status.spec.task.limits.cpu_millicores == 800

            # A user edits the memory limit; a decision made before that edit is refused.
            edit = job_pb2.JobSpec()
            edit.task.limits.memory_bytes = 3 << 30
            await client.borgmaster.update_job(job.job_id, edit, ["task.limits.memory_bytes"])
            await publish.actuation(decided("d4", 900))
            late = await eventually(lambda: act.results.result("d4"), 15, "d4 settled")
            assert late.outcome == CONFLICT, late.detail
            status = await job_status(client, job.job_id)
            assert status.spec.task.limits.cpu_millicores == 800
            assert status.spec.task.limits.memory_bytes == 3 << 30
