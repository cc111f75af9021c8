"""The Autopilot master and actuator against a real Borgmaster (Autopilot §3.1, §5):
an Autopiloted job is held until its first recommendation and released with it; a
dry-run job is released at once and its limits never change although its
recommendations stay visible; custom recommenders register and publish through the API."""

from __future__ import annotations

import asyncio

import pytest
from autopilot_master_harness import (
    GIB,
    Publisher,
    Scenario,
    TopicReader,
    actuator,
    api_client,
    autopilot,
    borgmaster,
    eventually,
    grant,
    job_spec,
    job_status,
    vertical_set,
    window,
)

from cellpilot.api.v1 import (
    actuation_pb2,
    autopilot_pb2,
    job_pb2,
    recommendation_pb2,
    resources_pb2,
    state_pb2,
)
from cellpilot.client.errors import InvalidArgumentError, PermissionDeniedError
from cellpilot.stack import StackEndpoints

ON, DRY = job_pb2.SCALING_MODE_ON, job_pb2.SCALING_MODE_DRY_RUN
HELD = state_pb2.JOB_STATE_HELD_FOR_AUTOPILOT


async def test_held_job_released_with_first_recommendation_and_dry_run_never_actuated(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    scenario = Scenario(endpoints)
    await scenario.create_topics()
    async with borgmaster(fresh_database_url, scenario) as bm:
        client = api_client([bm.address])
        await grant(client, scenario.user)
        on = await client.borgmaster.submit_job(job_spec("web", scenario.user, cpu_mode=ON, memory_mode=ON))
        dry = await client.borgmaster.submit_job(
            job_spec("shadow", scenario.user, cpu_mode=DRY, memory_mode=DRY)
        )
        assert on.state == HELD, "Autopiloted jobs are held at submission"
        assert dry.state == HELD
        settings = scenario.autopilot_settings([bm.address])
        async with (
            autopilot(settings) as master,
            actuator(scenario.actuator_settings([bm.address])) as act,
            Publisher(scenario) as publish,
            TopicReader(
                endpoints.kafka_bootstrap, scenario.actuations, actuation_pb2.Actuation
            ) as actuations,
        ):
            ap_client = api_client([bm.address], [master.address])

            async def released(job_id: str) -> state_pb2.JobStatus | None:
                status = await job_status(client, job_id)
                return status if status.state != HELD else None

            # A dry-run job has nothing to wait for: released at once, with its own limits.
            shadow = await eventually(lambda: released(dry.job_id), 15, "the dry-run job released")
            assert shadow.spec.task.limits.cpu_millicores == 500
            # The ON job waits for its first recommendation (the hold grace is 600 s here).
            await asyncio.sleep(1.5)
            assert (await job_status(client, on.job_id)).state == HELD

            await publish.recommendations(vertical_set(on.job_id, window(0), cpu=700, memory=2 * GIB))
            web = await eventually(lambda: released(on.job_id), 15, "the ON job released")
            # Latency-sensitive (HIGH) CPU -> S_p95 (§3.2.2); a serving job's memory -> ML (§4.2).
            assert web.spec.task.limits.cpu_millicores == 700
            assert web.spec.task.limits.memory_bytes == int(2 * GIB * 1.05)

            # The dry-run job's recommendations move; its limits never do.
            before = await job_status(client, dry.job_id)
            for i in range(4):
                await publish.recommendations(
                    vertical_set(dry.job_id, window(i), cpu=300 + 200 * i, memory=GIB // 2)
                )

            async def shown() -> autopilot_pb2.JobRecommendations | None:
                view = (await ap_client.autopilot.get_recommendation(dry.job_id)).recommendations
                cpu = [v for v in view.vertical if v.resource == resources_pb2.RESOURCE_CPU]
                return view if cpu and cpu[0].chosen.value == 900 else None

            view = await eventually(shown, 15, "the dry-run job's latest recommendation visible")
            cpu = next(v for v in view.vertical if v.resource == resources_pb2.RESOURCE_CPU)
            assert cpu.mode == DRY
            assert cpu.selected.kind == job_pb2.RECOMMENDER_KIND_MOVING_WINDOW_P95
            assert cpu.current_limit == 500
            assert cpu.last_actuation_key == ""
            assert len(cpu.candidates) == 7, "every recommender's output is shown"
            assert cpu.chosen.explanation.note.startswith("S_p95") or "auto" in cpu.chosen.explanation.note
            await asyncio.sleep(1.0)
            after = await job_status(client, dry.job_id)
            assert after.spec.task.limits == before.spec.task.limits
            assert after.spec_version == before.spec_version
            for a in actuations.for_job(dry.job_id):
                assert not a.HasField("cpu_limit_millicores"), a
                assert not a.HasField("memory_limit_bytes"), a
                assert not a.HasField("task_count")
            assert [a.release_hold for a in actuations.for_job(dry.job_id)] == [True]

            # Lists filter by mode; the ON job's view names what was sent.
            dry_only = await ap_client.autopilot.list_recommendations(
                autopilot_pb2.ListRecommendationsRequest(user=scenario.user, modes=[DRY])
            )
            assert [v.job_id for v in dry_only] == [dry.job_id]
            web_view = (await ap_client.autopilot.get_recommendation(on.job_id, False)).recommendations
            assert all(v.last_actuation_key for v in web_view.vertical)
            assert act.outcomes["applied"] >= 2

            # The actuator's identity may not change a dry-run job's limits, even when asked to.
            forged = actuation_pb2.Actuation()
            forged.CopyFrom(actuations.for_job(on.job_id)[-1])
            forged.job_id, forged.idempotency_key = dry.job_id, f"{dry.job_id}/forged"
            forged.based_on_spec_version, forged.release_hold = 0, False
            forged.cpu_limit_millicores = 123
            await publish.actuation(forged)
            refused = await eventually(
                lambda: act.results.result(forged.idempotency_key), 15, "the forged actuation settled"
            )
            assert refused.outcome == actuation_pb2.ACTUATION_OUTCOME_INVALID
            assert "Autopilot is not ON" in refused.detail
            assert (await job_status(client, dry.job_id)).spec.task.limits == before.spec.task.limits
            await ap_client.close()
        await client.close()


async def test_custom_recommender_registers_publishes_and_is_selected(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    """Custom recommenders (§5.4) through the client, with Cellpilot's authorisation: only a
    recommender's owner publishes for it; Autopilot configs change as the job's owner."""
    scenario = Scenario(endpoints)
    await scenario.create_topics()
    async with borgmaster(fresh_database_url, scenario) as bm:
        client = api_client([bm.address])
        await grant(client, scenario.user)
        spec = job_spec("batch", scenario.user, cpu_mode=ON)
        spec.autopilot.cpu.recommender.kind = job_pb2.RECOMMENDER_KIND_CUSTOM
        spec.autopilot.cpu.recommender.custom_name = "my-sizer"
        job = await client.borgmaster.submit_job(spec)
        async with (
            autopilot(scenario.autopilot_settings([bm.address])) as master,
            actuator(scenario.actuator_settings([bm.address])),
        ):
            await eventually(lambda: _leader(master), 10, "the master elected")
            clients = [api_client([bm.address], [master.address], user=u) for u in (scenario.user, "mallory")]
            owner, other = (c.autopilot for c in clients)
            with pytest.raises(InvalidArgumentError, match="name"):
                await owner.register_recommender(
                    autopilot_pb2.RegisterRecommenderRequest(name="Bad Name", owner=scenario.user)
                )
            sizer = autopilot_pb2.RegisterRecommenderRequest(
                name="my-sizer", owner=scenario.user, resources=[resources_pb2.RESOURCE_CPU]
            )
            with pytest.raises(PermissionDeniedError, match="only as owner"):
                await other.register_recommender(sizer)
            await owner.register_recommender(sizer)
            listed = (await other.list_recommenders()).recommenders
            assert listed[-1].ref.custom_name == "my-sizer"
            assert listed[-1].owner == scenario.user
            assert len(listed) == 8
            effective = await owner.get_config(job.job_id)
            assert effective.effective.cpu.recommender.custom_name == "my-sizer"
            # Changing a job's Autopilot config is the owner's (forwarded to the Borgmaster as them).
            config = job_pb2.AutopilotConfig()
            config.CopyFrom(effective.config)
            config.memory.mode = DRY
            with pytest.raises(PermissionDeniedError):
                await other.set_config(job.job_id, config)
            changed = await owner.set_config(job.job_id, config)
            assert changed.config.memory.mode == DRY
            assert changed.config.cpu.recommender.custom_name == "my-sizer"
            assert changed.spec_version > job.spec_version

            rec = recommendation_pb2.Recommendation(
                resource=resources_pb2.RESOURCE_CPU,
                recommender=job_pb2.RecommenderRef(
                    kind=job_pb2.RECOMMENDER_KIND_CUSTOM, custom_name="my-sizer"
                ),
                value=1234,
            )
            bad_rec = recommendation_pb2.Recommendation()
            bad_rec.CopyFrom(rec)
            bad_rec.resource = resources_pb2.RESOURCE_MEMORY

            def output(*recs: recommendation_pb2.Recommendation) -> recommendation_pb2.RecommendationSet:
                return recommendation_pb2.RecommendationSet(
                    job_id=job.job_id, window_end_ms=window(0), vertical=list(recs)
                )

            with pytest.raises(InvalidArgumentError, match=r"vertical\[0\]\.resource"):
                await owner.publish_recommendations("my-sizer", output(bad_rec))
            with pytest.raises(PermissionDeniedError, match="my-sizer"):
                await other.publish_recommendations("my-sizer", output(rec))
            done = await owner.publish_recommendations("my-sizer", output(rec))
            assert done.accepted == 1

            async def sized() -> bool:
                status = await job_status(client, job.job_id)
                return status.state != HELD and status.spec.task.limits.cpu_millicores == 1234

            await eventually(sized, 15, "the custom recommendation actuated")
            await owner.unregister_recommender("my-sizer")
            await asyncio.gather(*(c.close() for c in clients))
        await client.close()


async def _leader(master: object) -> bool:
    return bool(getattr(master, "is_leader", False))
