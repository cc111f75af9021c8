"""The Monitoring gRPC API (``monitoring.proto``), answered from the aggregator's history tables.

When PostgreSQL cannot be reached a query fails with UNAVAILABLE naming it (the aggregator's
server installs :class:`cellpilot.platform.store_outage.StoreOutageInterceptor`), which
clients retry — not with UNKNOWN and a driver traceback.
"""

from __future__ import annotations

from typing import NoReturn

import grpc

from cellpilot.api.v1 import monitoring_pb2, monitoring_pb2_grpc
from cellpilot.platform.request_validation import InvalidField, after_page_token, page_size, page_token
from cellpilot_services.aggregator import convert
from cellpilot_services.aggregator.history_store import HistoryStore

DEFAULT_PAGE = 288  # one day of 5-minute windows (monitoring.proto)
MAX_PAGE = 2_000


def _after(token: str) -> int:
    return after_page_token(token, int) if token else -(2**62)


def _check_range(start_ms: int, end_ms: int) -> None:
    if end_ms < 0:
        raise InvalidField("end_ms", "must be >= 0")
    if end_ms and end_ms < start_ms:
        raise InvalidField("end_ms", "must not be before start_ms")


class MonitoringServicer(monitoring_pb2_grpc.MonitoringServicer):
    def __init__(self, store: HistoryStore) -> None:
        self.store = store

    async def _invalid(self, context: grpc.aio.ServicerContext, error: Exception) -> NoReturn:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
        raise AssertionError("unreachable")  # pragma: no cover

    async def GetHistogramHistory(  # noqa: N802
        self, request: monitoring_pb2.GetHistogramHistoryRequest, context: grpc.aio.ServicerContext
    ) -> monitoring_pb2.GetHistogramHistoryResponse:
        try:
            if not request.job_id:
                raise InvalidField("job_id", "is required")
            convert.resource_in(request.resource)
            _check_range(request.start_ms, request.end_ms)
            size = page_size(request.page_size, DEFAULT_PAGE, MAX_PAGE)
            after = _after(request.page_token)
        except InvalidField as error:
            await self._invalid(context, error)
        response = monitoring_pb2.GetHistogramHistoryResponse()
        if request.HasField("task_index"):
            groups = await self.store.task_windows(
                request.job_id, request.task_index, request.start_ms, request.end_ms, after, size + 1
            )
            for rows in groups[:size]:
                response.histograms.append(convert.task_histogram_message(rows, request.resource))
            more = len(groups) > size
        else:
            records = await self.store.job_histograms(
                request.job_id, request.resource, request.start_ms, request.end_ms, after, size + 1
            )
            for row in records[:size]:
                response.histograms.append(convert.job_histogram_message(row))
            more = len(records) > size
        if more:
            response.next_page_token = page_token(response.histograms[-1].window_start_ms)
        return response

    async def GetTaskUsage(  # noqa: N802
        self, request: monitoring_pb2.GetTaskUsageRequest, context: grpc.aio.ServicerContext
    ) -> monitoring_pb2.GetTaskUsageResponse:
        try:
            if not request.job_id:
                raise InvalidField("job_id", "is required")
            if request.task_index < 0:
                raise InvalidField("task_index", "must be >= 0")
            _check_range(request.start_ms, request.end_ms)
            size = page_size(request.page_size, DEFAULT_PAGE, MAX_PAGE)
            after = _after(request.page_token)
        except InvalidField as error:
            await self._invalid(context, error)
        groups = await self.store.task_windows(
            request.job_id, request.task_index, request.start_ms, request.end_ms, after, size + 1
        )
        response = monitoring_pb2.GetTaskUsageResponse(
            windows=[convert.task_usage_window(rows) for rows in groups[:size]]
        )
        if len(groups) > size:
            response.next_page_token = page_token(response.windows[-1].window_start_ms)
        return response

    async def GetBucketScheme(  # noqa: N802
        self, request: monitoring_pb2.GetBucketSchemeRequest, context: grpc.aio.ServicerContext
    ) -> monitoring_pb2.GetBucketSchemeResponse:
        try:
            scheme = convert.bucket_scheme_message(request.scheme_id, request.version)
        except InvalidField as error:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(error))
        return monitoring_pb2.GetBucketSchemeResponse(scheme=scheme)
