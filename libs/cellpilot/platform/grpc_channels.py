"""Channels a service opens to another service's servers, by address.

With channel credentials a channel is TLS (mTLS with the service's certificate); without,
plaintext. :class:`ChannelPool` keeps one channel per address for a service that calls many
servers (the Borgmaster's replicas, a cell's Borglets), opened on first use.
"""

from __future__ import annotations

import contextlib

import grpc


def open_channel(address: str, credentials: grpc.ChannelCredentials | None) -> grpc.aio.Channel:
    """A channel to ``address``: TLS with ``credentials``, plaintext without."""
    if credentials is None:
        return grpc.aio.insecure_channel(address)
    return grpc.aio.secure_channel(address, credentials)


class ChannelPool:
    """One channel per address, opened on first use and kept until :meth:`close`."""

    def __init__(self, credentials: grpc.ChannelCredentials | None) -> None:
        self.credentials = credentials
        self._channels: dict[str, grpc.aio.Channel] = {}

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = open_channel(address, self.credentials)
        return channel

    async def close(self) -> None:
        """Close every channel; one that fails to close is let go."""
        for channel in self._channels.values():
            with contextlib.suppress(Exception):
                await channel.close()
        self._channels.clear()
