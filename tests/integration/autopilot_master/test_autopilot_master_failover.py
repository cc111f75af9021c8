"""Two Autopilot master processes elected through the Redis lock (docs/architecture.md rule 7): only the
leader actuates; SIGKILL it and the other takes over with a larger fencing token and goes on
from the stored state; a follower answers reads and redirects writes to the leader; an
actuation still carrying the deposed leader's token is refused by the actuator."""

from __future__ import annotations

import grpc
import pytest
from autopilot_master_harness import (
    GIB,
    AutopilotProcess,
    Publisher,
    Scenario,
    TopicReader,
    actuator,
    api_client,
    borgmaster,
    eventually,
    grant,
    job_spec,
    job_status,
    vertical_set,
    window,
)
from stack_security import user_channel

from cellpilot.api.v1 import actuation_pb2, autopilot_pb2, autopilot_pb2_grpc, job_pb2, resources_pb2
from cellpilot.platform.leadership import Leadership
from cellpilot.platform.redis_client import connect_redis
from cellpilot.stack import StackEndpoints

ON = job_pb2.SCALING_MODE_ON


async def test_leader_kill_hands_over_and_the_deposed_token_is_fenced(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    scenario = Scenario(endpoints)
    await scenario.create_topics()
    redis = connect_redis(endpoints.redis_url)
    processes: list[AutopilotProcess] = []
    try:
        async with borgmaster(fresh_database_url, scenario) as bm:
            client = api_client([bm.address])
            await grant(client, scenario.user)
            job = await client.borgmaster.submit_job(
                job_spec("web", scenario.user, cpu_mode=ON, memory_mode=ON)
            )
            processes = [AutopilotProcess(scenario, [bm.address], i) for i in range(2)]
            by_id = {p.replica_id: p for p in processes}

            async def leader() -> Leadership | None:
                raw = await redis.get(f"{scenario.autopilot_prefix}:leader")
                return None if raw is None else Leadership.parse(raw)

            first = await eventually(leader, 30, "an elected Autopilot master")
            follower = next(p for p in processes if p.replica_id != first.holder)
            async with (
                actuator(scenario.actuator_settings([bm.address])) as act,
                Publisher(scenario) as publish,
                TopicReader(endpoints.kafka_bootstrap, scenario.actuations, actuation_pb2.Actuation) as seen,
            ):
                # The follower answers reads and names the leader when asked to write.
                async with user_channel(follower.address) as channel:
                    stub = autopilot_pb2_grpc.AutopilotStub(channel)
                    listed = await stub.ListRecommenders(autopilot_pb2.ListRecommendersRequest())
                    assert len(listed.recommenders) == 7
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await stub.RegisterRecommender(
                            autopilot_pb2.RegisterRecommenderRequest(
                                name="x", resources=[resources_pb2.RESOURCE_CPU]
                            )
                        )
                    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
                    assert dict(refused.value.trailing_metadata() or ())["cellpilot-leader"] == first.address
                # The client follows the redirect to the leader.
                both = api_client(autopilot=[follower.address, by_id[first.holder].address])
                registered = await both.autopilot.register_recommender(
                    autopilot_pb2.RegisterRecommenderRequest(name="x", resources=[resources_pb2.RESOURCE_CPU])
                )
                assert registered.recommender.ref.custom_name == "x"

                await publish.recommendations(vertical_set(job.job_id, window(0), cpu=700, memory=GIB))

                async def cpu_is(value: int) -> bool:
                    return (await job_status(client, job.job_id)).spec.task.limits.cpu_millicores == value

                await eventually(lambda: cpu_is(700), 20, "the first leader's actuation applied")
                before_kill = await eventually(lambda: _seen(seen, job.job_id, 700), 15, "actuations read")
                assert {(a.leader_id, a.fencing_token) for a in before_kill} == {
                    (first.holder, first.token)
                }, "only the leader actuates"

                by_id[first.holder].kill()
                second = await eventually(
                    lambda: _new_leader(leader, first.token), 30, "the other replica elected"
                )
                assert second.holder == follower.replica_id
                assert second.token > first.token

                # The new leader continues from the stored state and actuates with its token.
                await publish.recommendations(vertical_set(job.job_id, window(1), cpu=1100, memory=GIB))
                await eventually(lambda: cpu_is(1100), 30, "the new leader's actuation applied")
                await eventually(lambda: _seen(seen, job.job_id, 1100), 15, "the new leader's actuation read")
                after = [a for a in seen.for_job(job.job_id) if a not in before_kill]
                assert after
                assert {(a.leader_id, a.fencing_token) for a in after} == {(second.holder, second.token)}
                tokens = [a.fencing_token for a in seen.for_job(job.job_id)]
                assert tokens == sorted(tokens), "tokens never go back"
                view = (await both.autopilot.get_recommendation(job.job_id, False)).recommendations
                cpu = next(v for v in view.vertical if v.resource == resources_pb2.RESOURCE_CPU)
                assert cpu.chosen.value == 1100
                assert cpu.last_actuation_key == after[-1].idempotency_key

                # A decision of the deposed leader arriving late: the actuator refuses it.
                stale = actuation_pb2.Actuation()
                stale.CopyFrom(before_kill[0])
                stale.idempotency_key = f"{job.job_id}/{first.token}/late"
                stale.cpu_limit_millicores = 300
                stale.based_on_spec_version = 0
                await publish.actuation(stale)
                result = await eventually(
                    lambda: act.results.result(stale.idempotency_key), 15, "the stale actuation settled"
                )
                assert result.outcome == actuation_pb2.ACTUATION_OUTCOME_FENCED
                assert await cpu_is(1100)
                # The registration outlived the first leader; the client finds the new one.
                await both.autopilot.unregister_recommender("x")
                listed = (await both.autopilot.list_recommenders()).recommenders
                assert "x" not in {r.ref.custom_name for r in listed}
                await both.close()
            await client.close()
    finally:
        for process in processes:
            process.stop()
        await redis.aclose()


async def _new_leader(leader: object, old_token: int) -> Leadership | None:
    current = await leader()  # type: ignore[operator]
    return current if current is not None and current.token > old_token else None


async def _seen(reader: TopicReader, job_id: str, cpu: int) -> list[actuation_pb2.Actuation]:
    """The job's actuations read so far, once one setting the CPU limit to ``cpu`` is among them."""
    found = list(reader.for_job(job_id))
    return found if any(a.cpu_limit_millicores == cpu for a in found) else []
