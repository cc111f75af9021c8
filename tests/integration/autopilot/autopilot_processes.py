"""Helpers for the Autopilot services' integration tests: service processes, topics, polling."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TypeVar

from stream_writers import observer

from cellpilot.platform.kafka import Record, ensure_topics
from cellpilot.platform.kafka_consumers import MessageConsumer
from cellpilot.platform.topics import Topic
from cellpilot.stack import StackEndpoints

T = TypeVar("T")
LOG_DIR = Path(__file__).resolve().parents[3] / "test-artifacts" / "autopilot-logs"


class ServiceProcess:
    """One ``python -m cellpilot_services.<module>`` process with its own log file."""

    def __init__(self, module: str, name: str, env: dict[str, str], endpoints: StackEndpoints) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = LOG_DIR / f"{name}-{uuid.uuid4().hex[:6]}.log"
        full_env = {
            **os.environ,
            **endpoints.as_env(),
            "CELLPILOT_STACK_ENV": "/nonexistent",
            "CELLPILOT_LOG_JSON": "false",
            **env,
        }
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", f"cellpilot_services.{module}"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                start_new_session=True,
            )

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """A crash: SIGKILL, no chance to checkpoint or leave the consumer group."""
        if self.alive:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.alive:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def stop_all(processes: Iterable[ServiceProcess]) -> None:
    for process in processes:
        process.stop()


async def wait_for(
    probe: Callable[[], Awaitable[T | None]], timeout_s: float, what: str, every_s: float = 0.5
) -> T:
    """Poll ``probe`` until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r})")


async def new_topics(bootstrap: str, *specs: tuple[str, int]) -> list[str]:
    """Fresh uniquely named topics (so tests sharing the stack never see each other's records)."""
    suffix = uuid.uuid4().hex[:8]
    names = [f"{base}.{suffix}" for base, _ in specs]
    await ensure_topics(
        bootstrap,
        [Topic(name, partitions, "test", "test") for name, (_, partitions) in zip(names, specs, strict=True)],
    )
    return names


async def read_all(bootstrap: str, topic: str, idle_s: float = 3.0, timeout_s: float = 60.0) -> list[Record]:
    """Every record of a topic, read by a throw-away group until nothing new for ``idle_s``."""
    consumer = MessageConsumer(observer(bootstrap), [topic], group_id=f"reader-{uuid.uuid4().hex[:8]}")
    await consumer.start()
    records: list[Record] = []
    deadline = time.monotonic() + timeout_s
    last_new = time.monotonic()
    try:
        async for batch in consumer.batches(timeout_ms=200):
            now = time.monotonic()
            if batch:
                records.extend(batch)
                last_new = now
            elif consumer.assignment() and now - last_new >= idle_s:
                break
            if now > deadline:
                break
    finally:
        await consumer.stop()
    return records
