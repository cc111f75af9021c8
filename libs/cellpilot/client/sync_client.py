"""A blocking facade over :class:`CellpilotClient` for scripts and notebooks.

It runs the asynchronous client on a private event loop in a background thread, so the
failover, retry and error behaviour are exactly the async client's. Every method of
``client.borgmaster``, ``client.autopilot`` and ``client.monitoring`` is available with the
same arguments, returning the result instead of a coroutine.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any

from cellpilot.client.async_client import CellpilotClient


class _BlockingService:
    def __init__(self, service: object, run: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
        self._service = service
        self._run = run

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._service, name)
        if name.startswith("_") or not callable(method):
            raise AttributeError(name)

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._run(method(*args, **kwargs))

        call.__doc__ = method.__doc__
        return call


class SyncCellpilotClient:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cellpilot-client", daemon=True)
        self._thread.start()
        self._client: CellpilotClient = self._run(self._make(*args, **kwargs))
        self.borgmaster = _BlockingService(self._client.borgmaster, self._run)
        self.autopilot = _BlockingService(self._client.autopilot, self._run)
        self.monitoring = _BlockingService(self._client.monitoring, self._run)

    @staticmethod
    async def _make(*args: Any, **kwargs: Any) -> CellpilotClient:
        return CellpilotClient(*args, **kwargs)  # channels bind to the loop they are made on

    def _run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self._client.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> SyncCellpilotClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
