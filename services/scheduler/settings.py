"""The scheduler's one settings class (environment prefix ``CELLPILOT_SCHEDULER_``).

Built once in ``__main__`` and passed down. It serves gRPC health on ``base_port`` (7700 by
default) and Prometheus ``/metrics`` on the gRPC port + 1000 (8700). The cell's scheduling
policy — packing, placement policy (LAS/LAVA), GPA's rho, the seed — is the Borgmaster's
(``CELLPILOT_BORGMASTER_*``, :class:`BorgmasterSettings`): the master judges proposals with the
same policy the scheduler plans with, so one setting configures both.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from cellpilot.platform.settings import BORGMASTER_ADDRESSES, AddressList, MeteredReplicaSettings


class SchedulerSettings(MeteredReplicaSettings):
    model_config = SettingsConfigDict(env_prefix="CELLPILOT_SCHEDULER_", extra="ignore")
    service_name = "scheduler"

    base_port: int = Field(default=7700, ge=1, le=65_000)
    # The Borgmaster replicas (comma-separated in the environment): proposals go to the master.
    borgmaster_addresses: AddressList = Field(default_factory=lambda: list(BORGMASTER_ADDRESSES))

    tail_interval_s: float = Field(default=0.05, gt=0)  # how often an idle scheduler reads the log
    soft_state_interval_s: float = Field(default=1.0, gt=0)  # the master's reservations and moments
    force_pass_interval_s: float = Field(default=2.0, gt=0)  # a pass even if the log did not move
    # Tasks one pass takes from the head of the pending queue. Passes are pipelined with the
    # proposals (the next plans while the master judges the last), so a smaller pass starts the
    # flow of placements sooner (after a restart, or a burst of submissions) at no loss of rate.
    max_tasks_per_pass: int = Field(default=2_000, ge=1)
    # Placements per ProposePlacements call: the master judges one call in one batch, so a
    # smaller call keeps its other work (client writes, Borglet reports) flowing between them.
    proposal_max: int = Field(default=500, ge=1)
    call_timeout_s: float = Field(default=30.0, gt=0)
