"""The Autopilot gRPC API (autopilot.proto) over one master replica.

Reads (recommendations, configs, recommenders) are answered by every replica from Redis
and the Borgmaster. Writes (config changes, custom recommenders and their output) are
taken by the elected leader only; another replica refuses them with FAILED_PRECONDITION
and names the leader in the ``cellpilot-leader`` trailing metadata, as the Borgmaster
does, so :mod:`cellpilot.client.failover` follows it. While no leader holds the lock (an
election, or Redis unreachable) writes get UNAVAILABLE, which clients retry; a call that
fails because Redis cannot be reached gets UNAVAILABLE naming Redis (the service's
``StoreOutageInterceptor``). The Borgmaster's refusals are passed on with their reason.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc

from cellpilot.api.v1 import autopilot_pb2, autopilot_pb2_grpc, job_pb2, recommendation_pb2, resources_pb2
from cellpilot.autopilot.recommender_registry import BUILTIN_REGISTRY
from cellpilot.autopilot.selection import RecommenderRef
from cellpilot.client.async_client import BorgmasterClient
from cellpilot.client.errors import CellpilotError
from cellpilot.job_vocabulary import RecommenderKind
from cellpilot.platform.error_reasons import LEADER_METADATA_KEY, NO_MASTER, reason_metadata
from cellpilot.platform.redis_client import FencedWrites
from cellpilot.platform.request_validation import abort, invalid_fields_refused, page_token, requested_page
from cellpilot.security.authentication import AUTHORIZATION_HEADER
from cellpilot_services.autopilot import convert
from cellpilot_services.autopilot.replica import AutopilotReplica

log = logging.getLogger(__name__)
DEFAULT_PAGE = 100
MAX_PAGE = 5_000
NAME_PATTERN = re.compile(r"^[a-z0-9_.-]+$")


class AutopilotServicer(autopilot_pb2_grpc.AutopilotServicer):
    def __init__(self, replica: AutopilotReplica) -> None:
        self.replica = replica
        self._owners: dict[str, str] = {}  # custom recommender -> owner, for authorisation
        self._owner_writes = 0  # a refresh that raced a (un)registration keeps the newer map

    # ------------------------------------------------------------------ plumbing
    def recommender_owner(self, name: str) -> str | None:
        """The owner of a registered custom recommender (the security interceptor's lookup:
        only its owner or an admin may publish for it or unregister it)."""
        return self._owners.get(name)

    async def refresh_owners(self) -> None:
        writes = self._owner_writes
        owners = {name: info.owner for name, info in (await self.replica.store.recommenders()).items()}
        if writes == self._owner_writes:
            self._owners = owners

    def _as_caller(self, context: grpc.aio.ServicerContext) -> BorgmasterClient:
        """The Borgmaster client calling with the caller's bearer token, so a job is changed as
        the user who asked (the policy checks them), over this service's own mTLS connection."""
        forwarded = [
            (key, value if isinstance(value, str) else value.decode("ascii", "replace"))
            for key, value in context.invocation_metadata() or ()
            if key.lower() == AUTHORIZATION_HEADER
        ]
        return self.replica.borgmaster.with_metadata(forwarded)

    async def _leader_only(self, context: grpc.aio.ServicerContext) -> None:
        if self.replica.lock.holds():
            return
        current = await self.replica.lock.current()
        leader = (
            current.address if current is not None and current.address != self.replica.lock.address else ""
        )
        if not leader:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                "no elected Autopilot master at the moment (an election is under way); retry",
                trailing_metadata=reason_metadata(NO_MASTER),
            )
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"not the elected Autopilot master; the master is {leader}",
            trailing_metadata=((LEADER_METADATA_KEY, leader),),
        )

    @asynccontextmanager
    async def _borgmaster_refusals_passed_on(self, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        """Run the block; a Borgmaster refusal it meets ends the call with the same code and reason."""
        try:
            yield
        except CellpilotError as error:
            await abort(context, error.code, f"Borgmaster: {error.details}", error.reason)

    # ------------------------------------------------------------------ recommendations
    async def _with_candidates(self, view: autopilot_pb2.JobRecommendations) -> None:
        inputs = await self.replica.store.inputs(view.job_id)
        by_resource: dict[int, list[recommendation_pb2.Recommendation]] = {}
        for candidate in inputs.vertical.values():
            rec = convert.candidate_out(candidate)
            by_resource.setdefault(rec.resource, []).append(rec)
        present = {v.resource for v in view.vertical}
        for resource in (resources_pb2.RESOURCE_CPU, resources_pb2.RESOURCE_MEMORY):
            if resource not in present and resource in by_resource:
                view.vertical.add(resource=resource, mode=job_pb2.SCALING_MODE_OFF)
        for entry in view.vertical:
            entry.candidates.extend(by_resource.get(entry.resource, []))

    async def GetRecommendation(  # noqa: N802
        self, request: autopilot_pb2.GetRecommendationRequest, context: grpc.aio.ServicerContext
    ) -> autopilot_pb2.GetRecommendationResponse:
        if not request.job_id:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "job_id: required")
        view = await self.replica.store.view(request.job_id)
        if view is None:
            if not await self.replica.store.has_candidates(request.job_id):
                await abort(
                    context, grpc.StatusCode.NOT_FOUND, f"job_id: no recommendation for {request.job_id!r}"
                )
            view = autopilot_pb2.JobRecommendations(job_id=request.job_id)
        if request.include_candidates:
            await self._with_candidates(view)
        return autopilot_pb2.GetRecommendationResponse(recommendations=view)

    async def ListRecommendations(  # noqa: N802
        self, request: autopilot_pb2.ListRecommendationsRequest, context: grpc.aio.ServicerContext
    ) -> autopilot_pb2.ListRecommendationsResponse:
        async with invalid_fields_refused(context):
            size, after = requested_page(request, DEFAULT_PAGE, MAX_PAGE, str, "")
        modes = set(request.modes)
        ids = [
            j
            for j in await self.replica.store.view_ids()
            if j > after and (not request.user or j.startswith(f"{request.user}/"))
        ]
        response = autopilot_pb2.ListRecommendationsResponse()
        for start in range(0, len(ids), size):
            for view in await self.replica.store.views(ids[start : start + size]):
                if modes:
                    view_modes = {v.mode for v in view.vertical}
                    if view.HasField("horizontal"):
                        view_modes.add(view.horizontal.mode)
                    if not view_modes & modes:
                        continue
                if len(response.recommendations) == size:
                    response.next_page_token = page_token(response.recommendations[-1].job_id)
                    return response
                if request.include_candidates:
                    await self._with_candidates(view)
                response.recommendations.append(view)
        return response

    # ------------------------------------------------------------------ configuration
    async def _effective(self, spec: job_pb2.JobSpec) -> job_pb2.AutopilotConfig:
        """The job's Autopilot configuration as it is applied (defaults and bounds resolved)."""
        traits = convert.traits_in(spec, self.replica.settings.reference_machine_memory_bytes)
        registered = sorted(await self.replica.store.recommenders())
        return convert.effective_config_out(spec.autopilot, traits, registered, self.replica.settings.auto_ml)

    async def SetAutopilotConfig(  # noqa: N802
        self, request: autopilot_pb2.SetAutopilotConfigRequest, context: grpc.aio.ServicerContext
    ) -> autopilot_pb2.SetAutopilotConfigResponse:
        if not request.job_id:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "job_id: required")
        async with invalid_fields_refused(context):
            convert.check_config(request.config)
        await self._leader_only(context)
        async with self._borgmaster_refusals_passed_on(context):
            updated = await self._as_caller(context).update_job(
                request.job_id,
                job_pb2.JobSpec(autopilot=request.config),
                ["autopilot"],
                request_id=request.request_id,
            )
        spec = updated.job.spec
        return autopilot_pb2.SetAutopilotConfigResponse(
            config=spec.autopilot,
            effective=await self._effective(spec),
            spec_version=updated.job.spec_version,
        )

    async def GetAutopilotConfig(  # noqa: N802
        self, request: autopilot_pb2.GetAutopilotConfigRequest, context: grpc.aio.ServicerContext
    ) -> autopilot_pb2.GetAutopilotConfigResponse:
        if not request.job_id:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "job_id: required")
        async with self._borgmaster_refusals_passed_on(context):
            job = (await self.replica.borgmaster.get_job(request.job_id)).job
        return autopilot_pb2.GetAutopilotConfigResponse(
            config=job.spec.autopilot, effective=await self._effective(job.spec)
        )

    # ------------------------------------------------------------------ custom recommenders (§5.4)
    async def RegisterRecommender(  # noqa: N802
        self, request: autopilot_pb2.RegisterRecommenderRequest, context: grpc.aio.ServicerContext
    ) -> autopilot_pb2.RegisterRecommenderResponse:
        if not NAME_PATTERN.match(request.name):
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "name: must match [a-z0-9-_.]+")
        if not request.resources and not request.horizontal:
            await abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, "resources: name a resource or set horizontal"
            )
        async with invalid_fields_refused(context):
            for i, resource in enumerate(request.resources):
                convert.resource_in(resource, f"resources[{i}]")
        await self._leader_only(context)
        info = autopilot_pb2.RecommenderInfo(
            ref=job_pb2.RecommenderRef(kind=job_pb2.RECOMMENDER_KIND_CUSTOM, custom_name=request.name),
            description=request.description,
            owner=request.owner,
            resources=list(request.resources),
            horizontal=request.horizontal,
            registered_ms=int(time.time() * 1000),
        )
        existing = (await self.replica.store.recommenders()).get(request.name)
        if existing is not None:
            same = (existing.owner, list(existing.resources), existing.horizontal) == (
                info.owner,
                list(info.resources),
                info.horizontal,
            )
            if not same:
                await abort(
                    context, grpc.StatusCode.ALREADY_EXISTS, f"name: recommender {request.name!r} exists"
                )
            return autopilot_pb2.RegisterRecommenderResponse(recommender=existing)
        writes = FencedWrites()
        writes.hset(self.replica.store.recommenders_key, request.name, info.SerializeToString())
        if not await self.replica.store.commit(writes, self._lock_value()):
            await self._leader_only(context)
        self._owners[request.name] = info.owner
        self._owner_writes += 1
        log.info(
            "custom recommender registered",
            extra={"cause_id": request.request_id, "recommender": request.name},
        )
        return autopilot_pb2.RegisterRecommenderResponse(recommender=info)

    def _lock_value(self) -> str:
        return self.replica.lock.held.encode() if self.replica.lock.held is not None else ""

    async def UnregisterRecommender(  # noqa: N802
        self, request: autopilot_pb2.UnregisterRecommenderRequest, context: grpc.aio.ServicerContext
    ) -> autopilot_pb2.UnregisterRecommenderResponse:
        if not request.name:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "name: required")
        await self._leader_only(context)
        if request.name not in await self.replica.store.recommenders():
            await abort(context, grpc.StatusCode.NOT_FOUND, f"name: no recommender {request.name!r}")
        writes = FencedWrites()
        writes.hdel(self.replica.store.recommenders_key, request.name)
        if not await self.replica.store.commit(writes, self._lock_value()):
            await self._leader_only(context)
        self._owners.pop(request.name, None)
        self._owner_writes += 1
        return autopilot_pb2.UnregisterRecommenderResponse()

    async def ListRecommenders(  # noqa: N802
        self, request: autopilot_pb2.ListRecommendersRequest, context: grpc.aio.ServicerContext
    ) -> autopilot_pb2.ListRecommendersResponse:
        response = autopilot_pb2.ListRecommendersResponse()
        for registration in BUILTIN_REGISTRY.registrations:
            response.recommenders.add(
                ref=convert.ref_out(RecommenderRef.builtin(RecommenderKind(registration.kind))),
                description=registration.description,
                resources=[resources_pb2.RESOURCE_CPU, resources_pb2.RESOURCE_MEMORY],
            )
        custom = await self.replica.store.recommenders()
        response.recommenders.extend(custom[name] for name in sorted(custom))
        return response

    async def PublishRecommendations(  # noqa: N802
        self, request: autopilot_pb2.PublishRecommendationsRequest, context: grpc.aio.ServicerContext
    ) -> autopilot_pb2.PublishRecommendationsResponse:
        name = request.recommender_name
        info = (await self.replica.store.recommenders()).get(name)
        if info is None:
            await abort(context, grpc.StatusCode.NOT_FOUND, f"recommender_name: {name!r} is not registered")
        rs = request.recommendations
        if not rs.job_id:
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, "recommendations.job_id: required")
        allowed = set(info.resources)
        for i, rec in enumerate(rs.vertical):
            field = f"recommendations.vertical[{i}]"
            if rec.recommender.kind != job_pb2.RECOMMENDER_KIND_CUSTOM or rec.recommender.custom_name != name:
                await abort(
                    context, grpc.StatusCode.INVALID_ARGUMENT, f"{field}.recommender: must be CUSTOM {name!r}"
                )
            if rec.job_id and rec.job_id != rs.job_id:
                await abort(
                    context, grpc.StatusCode.INVALID_ARGUMENT, f"{field}.job_id: differs from the set's"
                )
            if rec.resource not in allowed:
                await abort(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{field}.resource: not registered for {name!r}",
                )
            if rec.value <= 0:
                await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{field}.value: must be > 0")
        for i, hrec in enumerate(rs.horizontal):
            field = f"recommendations.horizontal[{i}]"
            if not info.horizontal:
                await abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {name!r} is not horizontal")
            if (
                hrec.recommender.kind != job_pb2.RECOMMENDER_KIND_CUSTOM
                or hrec.recommender.custom_name != name
            ):
                await abort(
                    context, grpc.StatusCode.INVALID_ARGUMENT, f"{field}.recommender: must be CUSTOM {name!r}"
                )
            if hrec.raw_task_count < 0:
                await abort(
                    context, grpc.StatusCode.INVALID_ARGUMENT, f"{field}.raw_task_count: must be >= 0"
                )
        await self._leader_only(context)
        out = recommendation_pb2.RecommendationSet()
        out.CopyFrom(rs)
        out.producer = name
        for rec in out.vertical:
            rec.job_id = rs.job_id
            if not rec.window_end_ms:
                rec.window_end_ms = rs.window_end_ms
        for hrec in out.horizontal:
            hrec.job_id = rs.job_id
            if not hrec.window_end_ms:
                hrec.window_end_ms = rs.window_end_ms
        await self.replica.producer.send(self.replica.settings.recommendations_topic, rs.job_id, out)
        return autopilot_pb2.PublishRecommendationsResponse(accepted=len(out.vertical) + len(out.horizontal))
