"""The dashboard's one settings class (environment prefix ``CELLPILOT_DASHBOARD_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, Field
from pydantic_settings import NoDecode, SettingsConfigDict

from cellpilot.platform.settings import BORGMASTER_ADDRESSES, AddressList, ServiceSettings, comma_separated


class DashboardSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="CELLPILOT_DASHBOARD_", extra="ignore")
    service_name = "dashboard"

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65_535)
    borgmaster_addresses: AddressList = Field(default_factory=lambda: list(BORGMASTER_ADDRESSES))
    autopilot_addresses: AddressList = Field(default_factory=lambda: ["127.0.0.1:7400", "127.0.0.1:7401"])
    monitoring_addresses: AddressList = Field(default_factory=lambda: ["127.0.0.1:7300", "127.0.0.1:7301"])
    # How long one page keeps trying an unreachable service before it shows what it has.
    call_budget_s: float = Field(default=2.0, gt=0)
    # Read borg.events and recommendations (from the start) for limit, recommender and OOM history.
    follow_streams: bool = True
    events_topic: str = "borg.events"
    recommendations_topic: str = "recommendations"
    max_points_per_series: int = Field(default=5_000, ge=10)
    # Evaluation reports: markdown files in results_dir, and summary.json files under eval_out_dirs.
    results_dir: Path = Path("docs/results")
    eval_out_dirs: Annotated[list[Path], NoDecode, BeforeValidator(comma_separated)] = Field(
        default_factory=list
    )
    # Job page: the last this many hours of event time (0 = all history the Monitoring API keeps).
    default_hours: float = Field(default=24.0, ge=0)
    # Open pages fetch their live sections again this often (seconds; 0 = never).
    refresh_s: float = Field(default=15.0, ge=0)
    # A browser session lasts this long (never longer than the token it was started with).
    session_hours: float = Field(default=8.0, gt=0, le=24 * 30)
