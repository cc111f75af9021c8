"""Calling a replicated service: find the master, follow redirects, retry with backoff.

The Borgmaster's followers refuse writes with FAILED_PRECONDITION and name the master in
the ``cellpilot-leader`` trailing metadata (see borgmaster.proto). The client moves to that
address at once. UNAVAILABLE (a replica unreachable or without a master, a store it needs
down) and DEADLINE_EXCEEDED are retried on the next replica, backing off exponentially,
until the call's retry budget is spent; no attempt outlives the budget. Retrying a mutation
is safe because the request (and its id) is built once per logical call and the server
answers a repeat with the first answer.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc

from cellpilot.client.errors import UnavailableError, error_from_status
from cellpilot.platform.error_reasons import leader_named, reason_of
from cellpilot.platform.grpc_server import MAX_MESSAGE_BYTES
from cellpilot.platform.grpc_tracing import client_interceptors

T = TypeVar("T")

RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


@dataclass(frozen=True)
class RetryPolicy:
    budget_s: float = 30.0  # the call's deadline: give up after this long, retries included
    initial_backoff_s: float = 0.1
    max_backoff_s: float = 2.0
    call_timeout_s: float = 10.0  # deadline of one attempt (cut to what is left of the budget)


def leader_hint(error: grpc.aio.AioRpcError) -> str | None:
    """The master's address a follower named, if this is a "not the master" refusal."""
    if error.code() != grpc.StatusCode.FAILED_PRECONDITION:
        return None
    return leader_named(error.trailing_metadata())


class ReplicaChannels:
    """Channels to the replicas of one service, remembering which one is the master."""

    def __init__(
        self,
        addresses: Sequence[str],
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, object]] = (),
    ) -> None:
        if not addresses:
            raise ValueError("at least one address is needed")
        self.addresses = list(addresses)
        self.credentials = credentials
        # Accept whatever a server may send (its send limit), so gRPC's message-size check only
        # ever refuses requests: a RESOURCE_EXHAUSTED without a reason means "request too large".
        self.options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), *options]
        self.preferred = 0
        self._named_leader: int | None = None  # set by note_leader during an attempt
        self._channels: dict[str, grpc.aio.Channel] = {}

    def channel(self, address: str) -> grpc.aio.Channel:
        if address not in self._channels:
            if self.credentials is None:
                self._channels[address] = grpc.aio.insecure_channel(
                    address, options=self.options, interceptors=client_interceptors()
                )
            else:
                self._channels[address] = grpc.aio.secure_channel(
                    address, self.credentials, self.options, interceptors=client_interceptors()
                )
        return self._channels[address]

    def note_leader(self, trailing_metadata: Sequence[tuple[str, str | bytes]] | None) -> None:
        """Prefer the master a successful reply named, if it is one of the configured addresses
        (a name only a container network resolves is not followed on a success)."""
        address = leader_named(trailing_metadata)
        if address in self.addresses:
            self._named_leader = self.addresses.index(address)

    def prefer(self, address: str) -> None:
        if address not in self.addresses:
            # A master may name an address we cannot reach (inside a container network);
            # try it first, but keep the configured ones to fall back on.
            self.addresses.append(address)
        self.preferred = self.addresses.index(address)

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    async def call(
        self,
        method: str,
        attempt: Callable[[grpc.aio.Channel, float], Awaitable[T]],
        policy: RetryPolicy,
        request_bytes: int | None = None,
    ) -> T:
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + policy.budget_s
        backoff = policy.initial_backoff_s
        index = self.preferred
        redirects = 0
        attempts = 0
        unreachable: set[str] = set()  # addresses that failed without naming a leader, this call
        last: grpc.aio.AioRpcError | None = None
        while True:
            address = self.addresses[index % len(self.addresses)]
            try:
                self._named_leader = None
                attempts += 1
                timeout = max(min(policy.call_timeout_s, deadline - loop.time()), 0.05)
                result = await attempt(self.channel(address), timeout)
                named, self._named_leader = self._named_leader, None
                self.preferred = named if named is not None else index % len(self.addresses)
                return result
            except grpc.aio.AioRpcError as error:
                last = error
                hint = leader_hint(error)
                if hint is None:
                    unreachable.add(address)
                if (
                    hint is not None
                    and hint != address
                    and hint not in unreachable  # e.g. a name only resolvable inside a container network
                    and redirects < len(self.addresses)
                ):
                    # Follow the redirect at once, but not forever: during an election two
                    # replicas may briefly name each other; then back off like any failure.
                    redirects += 1
                    self.prefer(hint)
                    index = self.preferred
                    continue
                redirects = 0
                if error.code() not in RETRYABLE and hint is None:
                    reason = reason_of(error.trailing_metadata())
                    raise error_from_status(
                        error.code(), error.details() or "", method, reason, request_bytes
                    ) from error
            if loop.time() + backoff > deadline:
                assert last is not None
                raise self._gave_up(method, last, attempts, loop.time() - started) from last
            await asyncio.sleep(backoff * (0.5 + random.random() / 2))
            backoff = min(backoff * 2, policy.max_backoff_s)
            index += 1

    def _gave_up(self, method: str, last: grpc.aio.AioRpcError, attempts: int, elapsed_s: float) -> Exception:
        """The error once the budget is spent: what the last attempt said, and that it was the last."""
        reason = reason_of(last.trailing_metadata())
        spent = f"no replica of {self.addresses} took the call in {elapsed_s:.1f} s ({attempts} attempts)"
        hint = leader_hint(last)
        if hint is not None:  # a master was named but could not be reached
            return UnavailableError(
                grpc.StatusCode.UNAVAILABLE, f"{spent}; the master {hint} is unreachable", method, reason
            )
        return error_from_status(last.code(), f"{spent}: {last.details()}", method, reason)
