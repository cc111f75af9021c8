"""A test's own embedded broker (the stack's ``kafka`` component), to restart at will.

The embedded broker keeps messages in memory only: a restart loses every topic's records
and offsets begin again at 0. Tests restart this one, never the session stack's broker,
which every other test shares; PostgreSQL and Redis still come from the session stack.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from cellpilot.platform.kafka import ensure_topics
from cellpilot.platform.topics import Topic
from cellpilot.stack import StackConfig, StackEndpoints, components
from cellpilot.stack.config import free_port, port_in_use


class OwnBroker:
    def __init__(self, data_dir: Path, topics: list[Topic]) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = data_dir
        self.config = StackConfig(data_dir, kafka_port=free_port())
        self.component = components.broker(self.config)
        self.bootstrap = f"{self.config.host}:{self.config.kafka_port}"
        self.topics = topics
        self.restarts = 0
        self._process: subprocess.Popen[bytes] | None = None

    def endpoints(self, base: StackEndpoints) -> StackEndpoints:
        """The session stack's PostgreSQL and Redis, with this broker."""
        return replace(base, kafka_bootstrap=self.bootstrap)

    def _spawn(self) -> subprocess.Popen[bytes]:
        with open(self.data_dir / "broker.log", "ab") as log:
            return subprocess.Popen(
                self.component.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.component.env},
                cwd=self.data_dir,
            )

    async def start(self) -> None:
        self._process = await asyncio.to_thread(self._spawn)
        deadline = time.monotonic() + 30
        while not port_in_use(self.config.host, self.config.kafka_port):
            assert time.monotonic() < deadline, "the broker did not start listening"
            await asyncio.sleep(0.05)
        await ensure_topics(self.bootstrap, self.topics)  # as `cellpilot stack up` does

    async def stop(self) -> None:
        if self._process is not None:
            self._process.send_signal(self.component.stop_signal)
            await asyncio.to_thread(self._process.wait, 20)
            self._process = None
        deadline = time.monotonic() + 20
        while port_in_use(self.config.host, self.config.kafka_port):
            assert time.monotonic() < deadline, "the broker's port was not released"
            await asyncio.sleep(0.05)

    async def restart(self) -> None:
        """Stop and start the broker: its topics come back empty, offsets from 0."""
        await self.stop()
        await self.start()
        self.restarts += 1

    async def __aenter__(self) -> OwnBroker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
