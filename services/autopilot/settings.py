"""The Autopilot master's one settings class (environment prefix ``CELLPILOT_AUTOPILOT_``).

Built once in ``__main__`` and passed down. Replica ``i`` serves the Autopilot API on
``base_port + i`` (7400, 7401 by default) unless ``port`` is set; its id is
``autopilot-<i>``.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from cellpilot.autopilot.selection import AutoMl
from cellpilot.platform.redis_keys import AUTOPILOT_PREFIX
from cellpilot.platform.settings import BORGMASTER_ADDRESSES, AddressList, MeteredReplicaSettings
from cellpilot.units import GIB


class AutopilotSettings(MeteredReplicaSettings):
    model_config = SettingsConfigDict(env_prefix="CELLPILOT_AUTOPILOT_", extra="ignore")
    service_name = "autopilot"

    base_port: int = Field(default=7400, ge=1, le=65_000)
    advertise_host: str = "127.0.0.1"
    # The Borgmaster replicas (comma-separated in the environment); writes follow its master.
    borgmaster_addresses: AddressList = Field(default_factory=lambda: list(BORGMASTER_ADDRESSES))

    # Election (docs/architecture.md rule 7): a Redis lock whose every acquisition INCRs a fencing token.
    redis_prefix: str = AUTOPILOT_PREFIX
    lock_ttl_s: float = Field(default=3.0, gt=0)
    renew_interval_s: float = Field(default=1.0, gt=0)
    # A new term's token must be on this many Redis replicas (WAIT) before it is used, so a
    # Sentinel failover can never hand out the same token again (leader_lock): 0 for the
    # embedded stack's single server, 1 where Redis has a replica (compose's Sentinel setup).
    min_token_replicas: int = Field(default=0, ge=0)
    token_replica_timeout_s: float = Field(default=1.0, gt=0)

    recommendations_topic: str = "recommendations"
    actuations_topic: str = "actuations"
    max_poll_records: int = Field(default=500, ge=1)

    # Held jobs (§3.1): released with their first recommendation, or after this long with
    # their own limits when no recommender has anything for them (no usage history yet).
    hold_grace_s: float = Field(default=30.0, ge=0)
    hold_scan_interval_s: float = Field(default=1.0, gt=0)

    # Decision policy (cellpilot.autopilot.decisions.DecisionPolicy).
    min_increase_fraction: float = Field(default=0.01, ge=0)
    min_decrease_fraction: float = Field(default=0.05, ge=0, lt=1)
    resend_after_s: float = Field(default=900.0, ge=0)  # event time
    machine_cpu_millicores: float | None = None  # the largest machine caps recommendations
    machine_memory_bytes: float | None = None
    # When AUTO picks ML over the §3.2.2 table (Autopilot §4.2): never / serving_memory / always.
    auto_ml: AutoMl = AutoMl.SERVING_MEMORY
    # What a "machine" is when sizing a job for the default OOM tolerance (§3.2.2).
    reference_machine_memory_bytes: float = Field(default=64.0 * GIB, gt=0)
