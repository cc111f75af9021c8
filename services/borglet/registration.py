"""Registering hosted machines with the Borgmaster (``Borgmaster.RegisterMachine``).

Any replica may be asked; a replica that is not the elected master refuses the write with
FAILED_PRECONDITION and names the master in the ``cellpilot-leader`` trailing metadata
(``borgmaster.proto``), which is tried next. When no replica answers, the Borglet backs off
(exponentially, with jitter) and tries again until one does — it keeps serving its tasks
meanwhile (Borg §3.3). A refusal that retrying cannot fix (INVALID_ARGUMENT) is logged and
given up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from collections.abc import Sequence

import grpc

from cellpilot.api.v1 import borgmaster_pb2, borgmaster_pb2_grpc, machine_pb2
from cellpilot.platform.error_reasons import leader_named
from cellpilot.platform.grpc_channels import ChannelPool

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 5.0
_GIVE_UP = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
}


class BorgmasterLocator:
    """The Borgmaster replicas, a channel to each, and the last one known to be master."""

    def __init__(
        self,
        addresses: Sequence[str],
        credentials: grpc.ChannelCredentials | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        """``credentials`` None: plaintext; ``metadata`` goes with every call (a service token)."""
        self.addresses = list(addresses)
        self.metadata = tuple(metadata)
        self.leader: str | None = None
        self._channels = ChannelPool(credentials)

    def stub(self, address: str) -> borgmaster_pb2_grpc.BorgmasterStub:
        return borgmaster_pb2_grpc.BorgmasterStub(self._channels.channel(address))

    def round(self) -> deque[str]:
        first = [self.leader] if self.leader else []
        return deque(dict.fromkeys([*first, *self.addresses]))

    async def close(self) -> None:
        await self._channels.close()


async def register_machine(
    locator: BorgmasterLocator,
    spec: machine_pb2.MachineSpec,
    request_id: str,
    stop: asyncio.Event,
    backoff_initial_s: float = 0.2,
    backoff_max_s: float = 5.0,
) -> borgmaster_pb2.RegisterMachineResponse | None:
    """Register until a master accepts (its response), retrying cannot help, or ``stop`` (None)."""
    request = borgmaster_pb2.RegisterMachineRequest(request_id=request_id, spec=spec)
    delay = backoff_initial_s
    while not stop.is_set():
        queue = locator.round()
        tried: set[str] = set()
        while queue and not stop.is_set():
            address = queue.popleft()
            if address in tried:
                continue
            tried.add(address)
            try:
                response = await locator.stub(address).RegisterMachine(
                    request, timeout=CALL_TIMEOUT_S, metadata=locator.metadata
                )
            except grpc.aio.AioRpcError as error:
                code = error.code()
                if code == grpc.StatusCode.FAILED_PRECONDITION:
                    leader = leader_named(error.trailing_metadata())
                    if leader and leader not in tried:
                        queue.appendleft(leader)
                    continue
                if code in _GIVE_UP:
                    log.error(
                        "the Borgmaster refused the machine registration",
                        extra={"machine_id": spec.machine_id, "code": code.name, "error": error.details()},
                    )
                    return None
                continue
            locator.leader = address
            log.info(
                "machine registered",
                extra={"machine_id": spec.machine_id, "master": address, "cause_id": request_id},
            )
            return response
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=delay * random.uniform(0.5, 1.0))
        delay = min(delay * 2, backoff_max_s)
    return None


async def register_all(
    locator: BorgmasterLocator,
    specs: Sequence[machine_pb2.MachineSpec],
    boot_id: str,
    stop: asyncio.Event,
    backoff_initial_s: float = 0.2,
    backoff_max_s: float = 5.0,
    concurrency: int = 32,
) -> int:
    """Register every machine (a few at a time); returns how many a master accepted."""
    gate = asyncio.Semaphore(concurrency)

    async def one(spec: machine_pb2.MachineSpec) -> bool:
        async with gate:
            response = await register_machine(
                locator, spec, f"register:{spec.machine_id}:{boot_id}", stop, backoff_initial_s, backoff_max_s
            )
            return response is not None

    results = await asyncio.gather(*(one(spec) for spec in specs))
    return sum(results)
