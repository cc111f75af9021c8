"""A request over the server's size limit is RequestTooLargeError naming the size and the limit —
not QuotaExceededError, which stays for Borg quota admission (Borg §2.5). Both are gRPC
RESOURCE_EXHAUSTED; the client tells them apart by the server's ``cellpilot-error-reason``,
never by its words."""

from __future__ import annotations

import pytest
from borgmaster_harness import grant, leader_of, replicas, simulated_job, stub
from stack_security import client_options

from cellpilot.client import CellpilotClient, QuotaExceededError, RequestTooLargeError, RetryPolicy
from cellpilot.security.tls import SecuritySettings
from cellpilot.stack import StackEndpoints

FAST = RetryPolicy(budget_s=5.0, initial_backoff_s=0.05, max_backoff_s=0.2, call_timeout_s=2.0)
MIB = 1 << 20


async def test_a_5_mb_request_is_too_large_and_an_over_quota_job_is_over_quota(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    async with replicas(fresh_database_url, endpoints, 1) as masters:
        master = await leader_of(masters)
        channel, raw = stub(master.address)
        async with channel, CellpilotClient([master.address], policy=FAST, **client_options()) as client:
            await grant(raw, "alice", cores=2)
            huge = simulated_job("huge")
            huge.labels["blob"] = "x" * (5 * 1000 * 1000)
            with pytest.raises(RequestTooLargeError) as too_large:
                await client.borgmaster.submit_job(huge)
            assert not isinstance(too_large.value, QuotaExceededError)
            assert too_large.value.limit_bytes == 4 * MIB
            assert too_large.value.size_bytes is not None
            assert too_large.value.size_bytes > 5_000_000
            assert f"{too_large.value.size_bytes:,} bytes" in str(too_large.value)
            assert "4,194,304 bytes" in str(too_large.value)

            with pytest.raises(QuotaExceededError, match="cpu"):
                await client.borgmaster.submit_job(simulated_job("greedy", tasks=10, cpu=1000))
        assert set(master.replica.state.jobs) == set(), "neither request changed anything"


async def test_a_request_over_a_smaller_server_limit_is_too_large_as_the_server_refuses_it(
    fresh_database_url: str, endpoints: StackEndpoints
) -> None:
    small = SecuritySettings.load().model_copy(update={"max_request_bytes": 64 * 1024})
    async with replicas(fresh_database_url, endpoints, 1, security=small) as masters:
        master = await leader_of(masters)
        # The client does not know this server's smaller limit: gRPC's size check refuses the call.
        async with CellpilotClient([master.address], policy=FAST, **client_options()) as client:
            big = simulated_job("big")
            big.labels["blob"] = "x" * 200_000
            with pytest.raises(RequestTooLargeError) as too_large:
                await client.borgmaster.submit_job(big)
        assert too_large.value.limit_bytes == 64 * 1024
        assert too_large.value.size_bytes is not None
        assert too_large.value.size_bytes > 200_000
        assert "the server accepts at most 65,536 bytes" in str(too_large.value)
