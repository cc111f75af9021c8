"""The actuator's one settings class (environment prefix ``CELLPILOT_ACTUATOR_``).

Built once in ``__main__`` and passed down. It serves gRPC health only, on ``base_port``
(7600 by default) unless ``port`` is set.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from cellpilot.platform.redis_keys import ACTUATOR_PREFIX
from cellpilot.platform.settings import BORGMASTER_ADDRESSES, AddressList, MeteredReplicaSettings


class ActuatorSettings(MeteredReplicaSettings):
    model_config = SettingsConfigDict(env_prefix="CELLPILOT_ACTUATOR_", extra="ignore")
    service_name = "actuator"

    base_port: int = Field(default=7600, ge=1, le=65_000)
    # The Borgmaster replicas (comma-separated in the environment); writes follow its master.
    borgmaster_addresses: AddressList = Field(default_factory=lambda: list(BORGMASTER_ADDRESSES))

    actuations_topic: str = "actuations"
    redis_prefix: str = ACTUATOR_PREFIX
    max_poll_records: int = Field(default=200, ge=1)
    result_ttl_s: int = Field(default=7 * 24 * 3600, ge=1)  # how long a settled key is remembered

    # Rate limits (token buckets): every limit change may move tasks (Autopilot §2.3), so
    # neither one job nor the whole cell is changed faster than this.
    per_job_rate_per_s: float = Field(default=1.0, gt=0)
    per_job_burst: float = Field(default=3.0, ge=1)
    global_rate_per_s: float = Field(default=200.0, gt=0)
    global_burst: float = Field(default=400.0, ge=1)

    # Retries while the Borgmaster fails over: each attempt follows the master for up to
    # call_budget_s; attempts back off exponentially from initial to max.
    max_attempts: int = Field(default=8, ge=1)
    call_budget_s: float = Field(default=5.0, gt=0)
    initial_backoff_s: float = Field(default=0.2, gt=0)
    max_backoff_s: float = Field(default=5.0, gt=0)
