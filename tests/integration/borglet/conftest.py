"""The in-process Borglet fixture for Borglet integration tests, on the embedded stack's Kafka."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from borglet_builders import BorgletFactory
from stack_security import service_channel

from cellpilot.api.v1 import borglet_pb2_grpc
from cellpilot.platform.settings import PlatformSettings
from cellpilot.stack import StackEndpoints
from cellpilot_services.borglet.borglet_service import Borglet
from cellpilot_services.borglet.settings import BorgletSettings


@pytest.fixture
def borglet_factory(endpoints: StackEndpoints) -> BorgletFactory:
    """``async with borglet_factory(**settings) as (borglet, stub):`` an in-process Borglet."""

    @asynccontextmanager
    async def start(**overrides: Any) -> AsyncIterator[tuple[Borglet, borglet_pb2_grpc.BorgletStub]]:
        values: dict[str, Any] = {
            "platform": PlatformSettings(kafka_bootstrap=endpoints.kafka_bootstrap, log_json=False),
            "machine_id_prefix": f"it-{uuid.uuid4().hex[:8]}",
            "cgroup_root": "none",
            **overrides,
        }
        borglet = Borglet(BorgletSettings(**values))
        port = await borglet.start()
        try:
            async with service_channel(f"127.0.0.1:{port}", "borgmaster") as channel:
                yield borglet, borglet_pb2_grpc.BorgletStub(channel)
        finally:
            await borglet.stop()

    return start
