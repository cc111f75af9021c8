"""A gRPC server built with the scaffolding answers the health check and reflection."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from cellpilot.api.v1 import monitoring_pb2_grpc
from cellpilot.platform.grpc_server import GrpcServer, ServiceBinding

MONITORING = ServiceBinding(
    "cellpilot.api.v1.Monitoring",
    monitoring_pb2_grpc.add_MonitoringServicer_to_server,
    monitoring_pb2_grpc.MonitoringServicer(),
)


async def _list_services(channel: grpc.aio.Channel) -> set[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)

    async def requests():  # type: ignore[no-untyped-def]
        yield reflection_pb2.ServerReflectionRequest(list_services="")

    names: set[str] = set()
    async for response in stub.ServerReflectionInfo(requests()):
        names |= {service.name for service in response.list_services_response.service}
    return names


async def test_health_reports_serving_then_not_serving_on_shutdown() -> None:
    server = GrpcServer([MONITORING], address="127.0.0.1:0")
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            reply = await health.Check(health_pb2.HealthCheckRequest(service=MONITORING.full_name))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            await server.set_serving("", False)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await server.stop(0.1)


async def test_reflection_lists_the_registered_health_and_reflection_services() -> None:
    server = GrpcServer([MONITORING], address="127.0.0.1:0")
    port = await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            names = await _list_services(channel)
        assert MONITORING.full_name in names
        assert "grpc.health.v1.Health" in names
        assert "grpc.reflection.v1alpha.ServerReflection" in names
    finally:
        await server.stop(0.1)
