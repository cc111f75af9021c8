"""The Monitoring gRPC API (``monitoring.proto``), answered from the aggregator's history tables.

When PostgreSQL cannot be reached a query fails with UNAVAILABLE naming it (the aggregator's
server installs :class:`cellpilot.platform.store_outage.StoreOutageInterceptor`), which
clients retry — not with UNKNOWN and a driver traceback.
"""

from __future__ import annotations

from typing import Any

import grpc

from cellpilot.api.v1 import monitoring_pb2, monitoring_pb2_grpc
from cellpilot.platform.request_validation import (
    InvalidField,
    first_page,
    invalid_fields_refused,
    requested_page,
)
from cellpilot_services.aggregator import convert
from cellpilot_services.aggregator.history_store import HistoryStore, WindowPage

DEFAULT_PAGE = 288  # one day of 5-minute windows (monitoring.proto)
MAX_PAGE = 2_000


def _window_page(request: Any) -> WindowPage:
    """The page of windows a request (``start_ms``, ``end_ms``, ``page_size``, ``page_token``) asks for."""
    if request.end_ms < 0:
        raise InvalidField("end_ms", "must be >= 0")
    if request.end_ms and request.end_ms < request.start_ms:
        raise InvalidField("end_ms", "must not be before start_ms")
    size, after = requested_page(request, DEFAULT_PAGE, MAX_PAGE, int, -(2**62))
    return WindowPage(request.start_ms, request.end_ms, after, size)


class MonitoringServicer(monitoring_pb2_grpc.MonitoringServicer):
    def __init__(self, store: HistoryStore) -> None:
        self.store = store

    async def GetHistogramHistory(  # noqa: N802
        self, request: monitoring_pb2.GetHistogramHistoryRequest, context: grpc.aio.ServicerContext
    ) -> monitoring_pb2.GetHistogramHistoryResponse:
        async with invalid_fields_refused(context):
            if not request.job_id:
                raise InvalidField("job_id", "is required")
            convert.resource_in(request.resource)
            page = _window_page(request)
        if request.HasField("task_index"):
            groups = await self.store.task_windows(request.job_id, request.task_index, page)
            read = [convert.task_histogram_message(rows, request.resource) for rows in groups]
        else:
            records = await self.store.job_histograms(request.job_id, request.resource, page)
            read = [convert.job_histogram_message(row) for row in records]
        histograms, token = first_page(((h.window_start_ms, h) for h in read), page.size)
        return monitoring_pb2.GetHistogramHistoryResponse(histograms=histograms, next_page_token=token)

    async def GetTaskUsage(  # noqa: N802
        self, request: monitoring_pb2.GetTaskUsageRequest, context: grpc.aio.ServicerContext
    ) -> monitoring_pb2.GetTaskUsageResponse:
        async with invalid_fields_refused(context):
            if not request.job_id:
                raise InvalidField("job_id", "is required")
            if request.task_index < 0:
                raise InvalidField("task_index", "must be >= 0")
            page = _window_page(request)
        groups = await self.store.task_windows(request.job_id, request.task_index, page)
        windows, token = first_page(
            ((w.window_start_ms, w) for w in map(convert.task_usage_window, groups)), page.size
        )
        return monitoring_pb2.GetTaskUsageResponse(windows=windows, next_page_token=token)

    async def GetBucketScheme(  # noqa: N802
        self, request: monitoring_pb2.GetBucketSchemeRequest, context: grpc.aio.ServicerContext
    ) -> monitoring_pb2.GetBucketSchemeResponse:
        try:
            scheme = convert.bucket_scheme_message(request.scheme_id, request.version)
        except InvalidField as error:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(error))
        return monitoring_pb2.GetBucketSchemeResponse(scheme=scheme)
