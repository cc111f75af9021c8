"""Whether the stack's broker still answers: a running broker process can serve nothing.

The durable Tansu 0.6 (SQLite engine) panics in a worker thread on an idempotent producer's
InitProducerId and from then on answers no request, while its process lives on; any client
that can log in can do that to it (docs/security.md). A process watch does not see it, so the
watchdog (cellpilot.stack.supervision) asks the broker for its topics every
``PROBE_EVERY_S`` and restarts a broker that has answered nothing for ``SILENT_LIMIT_S``.
"""

from __future__ import annotations

import asyncio

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from cellpilot.platform.stream_access import StreamAccess

PROBE_EVERY_S = 5.0
PROBE_TIMEOUT_S = 5.0
SILENT_LIMIT_S = 30.0  # six probes without an answer


async def _list_topics(access: StreamAccess, timeout_s: float) -> None:
    admin = AIOKafkaAdminClient(**access.client_options(), request_timeout_ms=int(timeout_s * 1000))
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            await admin.list_topics()
    finally:
        await admin.close()


def broker_answers(access: StreamAccess, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """True if the broker answers a metadata request within ``timeout_s``."""
    try:
        asyncio.run(_list_topics(access, timeout_s))
    except (KafkaError, OSError, TimeoutError, KeyError, ValueError):
        return False
    return True
