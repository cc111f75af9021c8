"""A gRPC server as every Cellpilot service starts it: health checking, reflection, graceful stop.

The health service reports SERVING for the overall server ("") and for each registered
service name once :meth:`GrpcServer.start` returns, and NOT_SERVING while stopping, so
load balancers and compose health checks drain a replica before it goes away.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from cellpilot.platform.grpc_tracing import TraceContextServerInterceptor

log = logging.getLogger(__name__)

# Messages larger than this are refused before a handler sees them.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ServiceBinding:
    """A servicer and the generated function that adds it to a server."""

    full_name: str  # e.g. "cellpilot.api.v1.Borgmaster"
    add_to_server: Callable[[Any, grpc.aio.Server], None]
    servicer: Any


class GrpcServer:
    def __init__(
        self,
        bindings: Sequence[ServiceBinding],
        address: str = "127.0.0.1:0",
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        credentials: grpc.ServerCredentials | None = None,
        max_receive_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        """``credentials`` None listens in plaintext: pass them from
        ``cellpilot.security.tls.SecuritySettings.server_options`` (plaintext only in plaintext-dev)."""
        self.bindings = list(bindings)
        self.address = address
        self.credentials = credentials
        self.health = health.aio.HealthServicer()
        self.server = grpc.aio.server(
            interceptors=[TraceContextServerInterceptor(), *interceptors],  # trace context first
            options=[
                ("grpc.max_receive_message_length", max_receive_message_bytes),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        self.port = 0

    async def start(self) -> int:
        """Bind, start serving and mark every service SERVING; returns the bound port."""
        for binding in self.bindings:
            binding.add_to_server(binding.servicer, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [b.full_name for b in self.bindings]
        reflection.enable_server_reflection(
            [*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
            self.server,
        )
        if self.credentials is None:
            self.port = self.server.add_insecure_port(self.address)
        else:
            self.port = self.server.add_secure_port(self.address, self.credentials)
        if self.port == 0:
            raise RuntimeError(f"could not bind gRPC server to {self.address}")
        await self.server.start()
        for name in ["", *names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("gRPC server listening", extra={"address": self.address, "port": self.port})
        return self.port

    async def set_serving(self, name: str, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        await self.health.set(name, status)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Report NOT_SERVING, let in-flight calls finish for ``grace_s``, then stop."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
