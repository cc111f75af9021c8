"""The asynchronous Python client of the v1 API (Borgmaster, Autopilot, Monitoring).

    async with CellpilotClient(borgmaster=["127.0.0.1:50051", "127.0.0.1:50052"]) as client:
        job = await client.borgmaster.submit_job(spec)

Every method takes and returns the v1 protobuf messages (typed through the generated stubs).
Mutations get a request id once per logical call, so retries after a failover or an outage
never apply twice. A request larger than ``max_request_bytes`` (the servers' limit, 4 MiB by
default) is refused before it is sent. Errors are :mod:`cellpilot.client.errors` exceptions
(the table in :mod:`cellpilot.client` says which status is which, and what is retried).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Protocol, Self, TypeVar, cast

import grpc
from google.protobuf.field_mask_pb2 import FieldMask
from google.protobuf.message import Message

from cellpilot.api.v1 import (
    autopilot_pb2,
    autopilot_pb2_grpc,
    borgmaster_pb2,
    borgmaster_pb2_grpc,
    job_pb2,
    lifetimes_pb2,
    machine_pb2,
    monitoring_pb2,
    monitoring_pb2_grpc,
    recommendation_pb2,
    state_pb2,
    usage_pb2,
)
from cellpilot.client.errors import RequestTooLargeError
from cellpilot.client.failover import ReplicaChannels, RetryPolicy
from cellpilot.security.tls import DEFAULT_MAX_REQUEST_BYTES

R = TypeVar("R", bound=Message)
T = TypeVar("T")


class _PageRequest(Protocol):
    page_token: str


class _Page(Protocol):
    next_page_token: str


def new_request_id() -> str:
    return uuid.uuid4().hex


class _ServiceClient:
    def __init__(
        self,
        replicas: ReplicaChannels,
        policy: RetryPolicy,
        metadata: Sequence[tuple[str, str]],
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        self._replicas = replicas
        self._policy = policy
        self._metadata = tuple(metadata)
        self._max_request_bytes = max_request_bytes

    def with_metadata(self, metadata: Sequence[tuple[str, str]]) -> Self:
        """The same replicas and policy, calling with ``metadata`` instead (e.g. a service
        forwarding its caller's ``authorization`` header so a write is made as that user)."""
        return type(self)(self._replicas, self._policy, metadata, self._max_request_bytes)

    async def _call(self, stub_type: type, method: str, request: Message, response: type[R]) -> R:
        size = request.ByteSize()
        if size > self._max_request_bytes:
            raise RequestTooLargeError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "refused by the client before sending",
                method,
                size_bytes=size,
                limit_bytes=self._max_request_bytes,
            )

        async def attempt(channel: grpc.aio.Channel, deadline_s: float) -> R:
            rpc = getattr(stub_type(channel), method)
            call = rpc(request, timeout=deadline_s, metadata=self._metadata)
            result = cast(R, await call)
            # A follower answering a read names the master: later calls go there, where the
            # soft state (usage, readiness, last contact) is fresh.
            self._replicas.note_leader(await call.trailing_metadata())
            return result

        return await self._replicas.call(method, attempt, self._policy, request_bytes=size)

    async def _all_pages(
        self,
        stub_type: type,
        method: str,
        request: Message,
        response: type[R],
        items: Callable[[R], Iterable[T]],
    ) -> list[T]:
        """Every page of a paged call, concatenated: each page names the next by its token."""
        collected: list[T] = []
        while True:
            page = await self._call(stub_type, method, request, response)
            collected.extend(items(page))
            next_page_token = cast(_Page, page).next_page_token
            if not next_page_token:
                return collected
            cast(_PageRequest, request).page_token = next_page_token


class BorgmasterClient(_ServiceClient):
    """Jobs, tasks, machines and quotas; writes go to the elected master wherever it is."""

    async def _bm(self, method: str, request: Message, response: type[R]) -> R:
        return await self._call(borgmaster_pb2_grpc.BorgmasterStub, method, request, response)

    async def submit_job(
        self, spec: job_pb2.JobSpec, request_id: str = ""
    ) -> borgmaster_pb2.SubmitJobResponse:
        request = borgmaster_pb2.SubmitJobRequest(request_id=request_id or new_request_id(), spec=spec)
        return await self._bm("SubmitJob", request, borgmaster_pb2.SubmitJobResponse)

    async def update_job(
        self,
        job_id: str,
        spec: job_pb2.JobSpec,
        paths: Sequence[str],
        *,
        expected_spec_version: int = 0,
        fencing_token: int = 0,
        release_hold: bool = False,
        max_disruptions: int = 0,
        request_id: str = "",
    ) -> borgmaster_pb2.UpdateJobResponse:
        request = borgmaster_pb2.UpdateJobRequest(
            request_id=request_id or new_request_id(),
            job_id=job_id,
            spec=spec,
            update_mask=FieldMask(paths=list(paths)),
            expected_spec_version=expected_spec_version,
            fencing_token=fencing_token,
            release_hold=release_hold,
            policy=borgmaster_pb2.UpdatePolicy(max_disruptions=max_disruptions),
        )
        return await self._bm("UpdateJob", request, borgmaster_pb2.UpdateJobResponse)

    async def kill_job(self, job_id: str, request_id: str = "") -> borgmaster_pb2.KillJobResponse:
        request = borgmaster_pb2.KillJobRequest(request_id=request_id or new_request_id(), job_id=job_id)
        return await self._bm("KillJob", request, borgmaster_pb2.KillJobResponse)

    async def get_job(self, job_id: str, include_tasks: bool = False) -> borgmaster_pb2.GetJobResponse:
        request = borgmaster_pb2.GetJobRequest(job_id=job_id, include_tasks=include_tasks)
        return await self._bm("GetJob", request, borgmaster_pb2.GetJobResponse)

    async def list_jobs(
        self, request: borgmaster_pb2.ListJobsRequest | None = None
    ) -> list[state_pb2.JobStatus]:
        """Every page of ListJobs, concatenated."""
        return await self._all_pages(
            borgmaster_pb2_grpc.BorgmasterStub,
            "ListJobs",
            request or borgmaster_pb2.ListJobsRequest(),
            borgmaster_pb2.ListJobsResponse,
            lambda page: page.jobs,
        )

    async def get_task(self, job_id: str, task_index: int) -> borgmaster_pb2.GetTaskResponse:
        request = borgmaster_pb2.GetTaskRequest(job_id=job_id, task_index=task_index)
        return await self._bm("GetTask", request, borgmaster_pb2.GetTaskResponse)

    async def why_pending(
        self, job_id: str, task_index: int | None = None
    ) -> borgmaster_pb2.WhyPendingResponse:
        request = borgmaster_pb2.WhyPendingRequest(job_id=job_id)
        if task_index is not None:
            request.task_index = task_index
        return await self._bm("WhyPending", request, borgmaster_pb2.WhyPendingResponse)

    async def list_machines(
        self, request: borgmaster_pb2.ListMachinesRequest | None = None
    ) -> list[machine_pb2.Machine]:
        return await self._all_pages(
            borgmaster_pb2_grpc.BorgmasterStub,
            "ListMachines",
            request or borgmaster_pb2.ListMachinesRequest(),
            borgmaster_pb2.ListMachinesResponse,
            lambda page: page.machines,
        )

    async def get_quota(self, user: str = "") -> borgmaster_pb2.GetQuotaResponse:
        return await self._bm(
            "GetQuota", borgmaster_pb2.GetQuotaRequest(user=user), borgmaster_pb2.GetQuotaResponse
        )

    async def set_quota(self, request: borgmaster_pb2.SetQuotaRequest) -> borgmaster_pb2.SetQuotaResponse:
        if not request.request_id:
            request.request_id = new_request_id()
        return await self._bm("SetQuota", request, borgmaster_pb2.SetQuotaResponse)

    async def get_leader(self) -> borgmaster_pb2.GetLeaderResponse:
        return await self._bm(
            "GetLeader", borgmaster_pb2.GetLeaderRequest(), borgmaster_pb2.GetLeaderResponse
        )

    async def get_cell_status(self) -> borgmaster_pb2.GetCellStatusResponse:
        """GPA's rho and the CPU overflow observed (the master's soft state: asked of the master)."""
        answer = await self._bm(
            "GetCellStatus", borgmaster_pb2.GetCellStatusRequest(), borgmaster_pb2.GetCellStatusResponse
        )
        if not answer.is_leader:  # a follower named the master: ask it
            answer = await self._bm(
                "GetCellStatus", borgmaster_pb2.GetCellStatusRequest(), borgmaster_pb2.GetCellStatusResponse
            )
        return answer

    async def train_lifetimes(self, min_runs: int = 0) -> lifetimes_pb2.TrainLifetimesResponse:
        """Trains the cell's lifetime model on its checkpoint log's finished task runs (LAVA §3)."""
        request = lifetimes_pb2.TrainLifetimesRequest(request_id=new_request_id(), min_runs=min_runs)
        return await self._bm("TrainLifetimes", request, lifetimes_pb2.TrainLifetimesResponse)

    async def drain_machine(self, machine_id: str, detail: str = "") -> lifetimes_pb2.DrainMachineResponse:
        """Drains a machine; the answer lists its tasks in the order they move (LARS, LAVA §4.4)."""
        request = lifetimes_pb2.DrainMachineRequest(
            request_id=new_request_id(), machine_id=machine_id, detail=detail
        )
        return await self._bm("DrainMachine", request, lifetimes_pb2.DrainMachineResponse)

    async def get_lifetimes(self) -> lifetimes_pb2.GetLifetimesResponse:
        """The placement policy, the lifetime model and LAVA's host states (§4.3)."""
        return await self._bm(
            "GetLifetimes", lifetimes_pb2.GetLifetimesRequest(), lifetimes_pb2.GetLifetimesResponse
        )


class AutopilotClient(_ServiceClient):
    """Recommendations and per-job Autopilot configuration (Autopilot §3.1)."""

    async def _ap(self, method: str, request: Message, response: type[R]) -> R:
        return await self._call(autopilot_pb2_grpc.AutopilotStub, method, request, response)

    async def get_recommendation(
        self, job_id: str, include_candidates: bool = True
    ) -> autopilot_pb2.GetRecommendationResponse:
        request = autopilot_pb2.GetRecommendationRequest(job_id=job_id, include_candidates=include_candidates)
        return await self._ap("GetRecommendation", request, autopilot_pb2.GetRecommendationResponse)

    async def list_recommendations(
        self, request: autopilot_pb2.ListRecommendationsRequest | None = None
    ) -> list[autopilot_pb2.JobRecommendations]:
        return await self._all_pages(
            autopilot_pb2_grpc.AutopilotStub,
            "ListRecommendations",
            request or autopilot_pb2.ListRecommendationsRequest(),
            autopilot_pb2.ListRecommendationsResponse,
            lambda page: page.recommendations,
        )

    async def get_config(self, job_id: str) -> autopilot_pb2.GetAutopilotConfigResponse:
        request = autopilot_pb2.GetAutopilotConfigRequest(job_id=job_id)
        return await self._ap("GetAutopilotConfig", request, autopilot_pb2.GetAutopilotConfigResponse)

    async def set_config(
        self, job_id: str, config: job_pb2.AutopilotConfig, request_id: str = ""
    ) -> autopilot_pb2.SetAutopilotConfigResponse:
        request = autopilot_pb2.SetAutopilotConfigRequest(
            request_id=request_id or new_request_id(), job_id=job_id, config=config
        )
        return await self._ap("SetAutopilotConfig", request, autopilot_pb2.SetAutopilotConfigResponse)

    async def list_recommenders(self) -> autopilot_pb2.ListRecommendersResponse:
        return await self._ap(
            "ListRecommenders",
            autopilot_pb2.ListRecommendersRequest(),
            autopilot_pb2.ListRecommendersResponse,
        )

    async def register_recommender(
        self, request: autopilot_pb2.RegisterRecommenderRequest
    ) -> autopilot_pb2.RegisterRecommenderResponse:
        """Register a custom recommender (Autopilot §5.4); the same registration again is a no-op."""
        if not request.request_id:
            request.request_id = new_request_id()
        return await self._ap("RegisterRecommender", request, autopilot_pb2.RegisterRecommenderResponse)

    async def unregister_recommender(
        self, name: str, request_id: str = ""
    ) -> autopilot_pb2.UnregisterRecommenderResponse:
        request = autopilot_pb2.UnregisterRecommenderRequest(
            request_id=request_id or new_request_id(), name=name
        )
        return await self._ap("UnregisterRecommender", request, autopilot_pb2.UnregisterRecommenderResponse)

    async def publish_recommendations(
        self,
        recommender_name: str,
        recommendations: recommendation_pb2.RecommendationSet,
        request_id: str = "",
    ) -> autopilot_pb2.PublishRecommendationsResponse:
        """Publish a custom recommender's output for one job and window."""
        request = autopilot_pb2.PublishRecommendationsRequest(
            request_id=request_id or new_request_id(),
            recommender_name=recommender_name,
            recommendations=recommendations,
        )
        return await self._ap("PublishRecommendations", request, autopilot_pb2.PublishRecommendationsResponse)


class MonitoringClient(_ServiceClient):
    """Usage history: per-job histograms and per-task usage windows (Autopilot §3.2.1)."""

    async def histogram_history(
        self, request: monitoring_pb2.GetHistogramHistoryRequest
    ) -> list[usage_pb2.UsageHistogram]:
        return await self._all_pages(
            monitoring_pb2_grpc.MonitoringStub,
            "GetHistogramHistory",
            request,
            monitoring_pb2.GetHistogramHistoryResponse,
            lambda page: page.histograms,
        )

    async def task_usage(
        self, request: monitoring_pb2.GetTaskUsageRequest
    ) -> list[monitoring_pb2.TaskUsageWindow]:
        return await self._all_pages(
            monitoring_pb2_grpc.MonitoringStub,
            "GetTaskUsage",
            request,
            monitoring_pb2.GetTaskUsageResponse,
            lambda page: page.windows,
        )

    async def bucket_scheme(self, scheme_id: str, version: int) -> usage_pb2.BucketScheme:
        request = monitoring_pb2.GetBucketSchemeRequest(scheme_id=scheme_id, version=version)
        page = await self._call(
            monitoring_pb2_grpc.MonitoringStub,
            "GetBucketScheme",
            request,
            monitoring_pb2.GetBucketSchemeResponse,
        )
        return page.scheme


class CellpilotClient:
    """One client for the whole API. Pass the addresses of each service's replicas you use."""

    def __init__(
        self,
        borgmaster: Sequence[str] = ("127.0.0.1:50051",),
        autopilot: Sequence[str] = ("127.0.0.1:50061",),
        monitoring: Sequence[str] = ("127.0.0.1:50071",),
        *,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        policy: RetryPolicy = RetryPolicy(),
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    ) -> None:
        """``max_request_bytes``: the servers' request size limit (``CELLPILOT_MAX_REQUEST_BYTES``
        on their side); larger requests fail with RequestTooLargeError without being sent."""
        metadata = [("authorization", f"Bearer {token}")] if token else []
        self._replicas = [ReplicaChannels(a, credentials) for a in (borgmaster, autopilot, monitoring)]
        self.borgmaster = BorgmasterClient(self._replicas[0], policy, metadata, max_request_bytes)
        self.autopilot = AutopilotClient(self._replicas[1], policy, metadata, max_request_bytes)
        self.monitoring = MonitoringClient(self._replicas[2], policy, metadata, max_request_bytes)

    async def close(self) -> None:
        for replicas in self._replicas:
            await replicas.close()

    async def __aenter__(self) -> CellpilotClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()
