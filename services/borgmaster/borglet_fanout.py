"""Polling many Borglets at once (Borg §3.3): one Poll per machine, or one PollMachines per batch.

A Borglet normally hosts one machine and answers one Poll per machine. A Borglet in fleet
mode hosts many simulated machines behind one endpoint; their polls are sent to it together
(``PollMachines``, at most ``poll_batch_max`` per call; 1 = always one Poll per machine), which
is what lets one host simulate a 10 000-machine cell. Each machine's poll is answered and
judged as if alone: a refused one is that machine's failure, nothing else's. A Borglet that
does not know PollMachines (UNIMPLEMENTED) is polled one machine at a time.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from cellpilot.api.v1 import borglet_pb2, borglet_pb2_grpc
from cellpilot.platform.grpc_channels import ChannelPool
from cellpilot_services.borgmaster.settings import BorgmasterSettings


@dataclass(frozen=True)
class PollFailure:
    """Why a machine's poll got no report: the status code (name) and its message."""

    code: str
    message: str


PollOutcome = borglet_pb2.PollResponse | PollFailure


class BorgletFanout:
    """The channels to the Borglets and the concurrent polls over them (one per replica)."""

    def __init__(self, settings: BorgmasterSettings) -> None:
        self.settings = settings
        # The replica calls Borglets as the Borgmaster: its certificate (mTLS) or a service token.
        self.channels = ChannelPool(settings.security.channel_credentials("borgmaster"))
        self.metadata = settings.security.service_metadata("borgmaster")
        self.unbatched: set[str] = set()  # Borglets that answered PollMachines with UNIMPLEMENTED

    def stub(self, address: str) -> borglet_pb2_grpc.BorgletStub:
        return borglet_pb2_grpc.BorgletStub(self.channels.channel(address))

    async def close(self) -> None:
        await self.channels.close()

    async def poll(
        self, requests: Mapping[str, tuple[str, borglet_pb2.PollRequest]]
    ) -> dict[str, PollOutcome]:
        """Every machine's report or failure; ``requests`` maps machine id to (address, request)."""
        gate = asyncio.Semaphore(self.settings.poll_concurrency)
        by_address: dict[str, list[borglet_pb2.PollRequest]] = defaultdict(list)
        for address, request in requests.values():
            by_address[address].append(request)
        outcomes: dict[str, PollOutcome] = {}
        calls = []
        batch = self.settings.poll_batch_max
        for address, polls in by_address.items():
            if len(polls) > 1 and batch > 1 and address not in self.unbatched:
                calls += [
                    self._batch(address, polls[i : i + batch], gate, outcomes)
                    for i in range(0, len(polls), batch)
                ]
            else:
                calls += [self._one(address, poll, gate, outcomes) for poll in polls]
        await asyncio.gather(*calls)
        return outcomes

    async def _one(
        self,
        address: str,
        request: borglet_pb2.PollRequest,
        gate: asyncio.Semaphore,
        outcomes: dict[str, PollOutcome],
    ) -> None:
        async with gate:
            try:
                outcomes[request.machine_id] = await self.stub(address).Poll(
                    request, timeout=self.settings.poll_timeout_s, metadata=self.metadata
                )
            except grpc.aio.AioRpcError as error:
                outcomes[request.machine_id] = PollFailure(error.code().name, error.details() or "")

    async def _batch(
        self,
        address: str,
        polls: list[borglet_pb2.PollRequest],
        gate: asyncio.Semaphore,
        outcomes: dict[str, PollOutcome],
    ) -> None:
        async with gate:
            try:
                answer = await self.stub(address).PollMachines(
                    borglet_pb2.PollMachinesRequest(polls=polls),
                    timeout=self.settings.poll_timeout_s,
                    metadata=self.metadata,
                )
            except grpc.aio.AioRpcError as error:
                if error.code() is grpc.StatusCode.UNIMPLEMENTED:
                    self.unbatched.add(address)
                else:
                    for poll in polls:
                        outcomes[poll.machine_id] = PollFailure(error.code().name, error.details() or "")
                    return
        if address in self.unbatched:  # an older Borglet: one Poll per machine
            await asyncio.gather(*(self._one(address, poll, gate, outcomes) for poll in polls))
            return
        for response in answer.responses:
            outcomes[response.machine_id] = response
        for refusal in answer.refusals:
            outcomes[refusal.machine_id] = PollFailure(_status_name(refusal.code), refusal.message)
        for poll in polls:  # a machine the answer left out is a failed poll, never a silent one
            outcomes.setdefault(
                poll.machine_id, PollFailure("UNKNOWN", "missing from the PollMachines answer")
            )


def _status_name(code: int) -> str:
    return next((s.name for s in grpc.StatusCode if s.value[0] == code), "UNKNOWN")
