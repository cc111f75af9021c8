"""Connection and runtime settings every service shares (docs/architecture.md rule 3).

Values come from environment variables prefixed ``CELLPILOT_`` and, underneath them,
from the embedded stack's ``stack.env`` file (``CELLPILOT_STACK_ENV`` names it; the
default is ``.cellpilot/stack/stack.env``). A service builds its settings once, in its
entry point, and passes them down.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_STACK_ENV = Path(".cellpilot/stack/stack.env")


class PlatformSettings(BaseSettings):
    """Where the shared infrastructure is, and how a service reports about itself."""

    model_config = SettingsConfigDict(env_prefix="CELLPILOT_", extra="ignore")

    kafka_bootstrap: str = "127.0.0.1:9092"
    # Store URLs without a user: each service connects as its own account (postgres_url_for,
    # redis_url_for). A URL that names a user is used as given (an operator's explicit credential).
    postgres_url: str = "postgresql+asyncpg://127.0.0.1:5432/cellpilot"
    redis_url: str = "redis://127.0.0.1:6379/0"
    # Where `cellpilot certs issue` wrote the certificates and each account's store password
    # (<account>.password, mode 0600): the same CELLPILOT_CERTS_DIR as SecuritySettings.
    certs_dir: Path = Path(".cellpilot/certs")
    # OTLP/gRPC collector endpoint (e.g. http://127.0.0.1:4317); unset means no export.
    otlp_endpoint: str | None = None
    log_level: str = "INFO"
    # How often (wall seconds) every Kafka consumer checks its stored positions against the
    # broker's partition logs, records or not (cellpilot.platform.kafka.LogPositions).
    log_check_interval_s: float = Field(default=5.0, gt=0)
    # JSON log lines (for machines) or plain text (for people at a terminal).
    log_json: bool = True

    def postgres_url_for(self, account: str) -> str:
        """The PostgreSQL URL as ``account``'s role (cellpilot.platform.store_accounts)."""
        from cellpilot.platform.store_accounts import service_postgres_url

        return service_postgres_url(self.postgres_url, account, self.certs_dir)

    def redis_url_for(self, account: str) -> str:
        """The Redis URL as ``account``'s ACL user (cellpilot.platform.store_accounts)."""
        from cellpilot.platform.store_accounts import service_redis_url

        return service_redis_url(self.redis_url, account, self.certs_dir)

    @classmethod
    def load(cls, env_file: Path | None = None) -> PlatformSettings:
        """Environment first, then the stack's env file (if it exists), then defaults."""
        path = env_file or Path(os.environ.get("CELLPILOT_STACK_ENV", str(DEFAULT_STACK_ENV)))
        if path.exists():
            return cls(_env_file=path)  # type: ignore[call-arg]
        return cls()
