"""Every service's settings class reads the same environment variables through the shared bases."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from cellpilot.platform.settings import MeteredReplicaSettings, ReplicaServerSettings, ServiceSettings
from cellpilot_services.actuator.settings import ActuatorSettings
from cellpilot_services.aggregator.settings import AggregatorSettings
from cellpilot_services.autopilot.settings import AutopilotSettings
from cellpilot_services.borglet.settings import BorgletSettings
from cellpilot_services.borgmaster.settings import BorgmasterSettings
from cellpilot_services.dashboard.settings import DashboardSettings
from cellpilot_services.recommender.settings import RecommenderSettings

SERVED = [
    pytest.param(ActuatorSettings, "ACTUATOR", 7600, id="actuator"),
    pytest.param(AggregatorSettings, "AGGREGATOR", 7300, id="aggregator"),
    pytest.param(AutopilotSettings, "AUTOPILOT", 7400, id="autopilot"),
    pytest.param(RecommenderSettings, "RECOMMENDER", 7500, id="recommender"),
    pytest.param(BorgmasterSettings, "BORGMASTER", 7100, id="borgmaster"),
]
EVERY = [
    *SERVED,
    pytest.param(BorgletSettings, "BORGLET", None, id="borglet"),
    pytest.param(DashboardSettings, "DASHBOARD", None, id="dashboard"),
]


@pytest.mark.parametrize(("settings_class", "service", "base_port"), EVERY)
def test_the_replica_index_comes_from_the_services_variable_before_the_shared_one(
    monkeypatch: pytest.MonkeyPatch,
    settings_class: type[ServiceSettings],
    service: str,
    base_port: int | None,
) -> None:
    monkeypatch.setenv("CELLPILOT_REPLICA_INDEX", "2")
    assert settings_class().replica_index == 2
    monkeypatch.setenv(f"CELLPILOT_{service}_REPLICA_INDEX", "1")
    assert settings_class().replica_index == 1
    assert settings_class.service_name == service.lower()


@pytest.mark.parametrize(("settings_class", "service", "base_port"), SERVED)
def test_replica_i_listens_on_the_base_port_plus_i_and_is_named_after_the_service(
    monkeypatch: pytest.MonkeyPatch, settings_class: type[ReplicaServerSettings], service: str, base_port: int
) -> None:
    monkeypatch.setenv(f"CELLPILOT_{service}_REPLICA_INDEX", "1")
    monkeypatch.setenv(f"CELLPILOT_{service}_LISTEN_HOST", "0.0.0.0")
    settings = settings_class()
    assert (settings.resolved_port, settings.listen_host) == (base_port + 1, "0.0.0.0")
    assert settings.resolved_replica_id == f"{service.lower()}-1"
    monkeypatch.setenv(f"CELLPILOT_{service}_PORT", "9000")
    monkeypatch.setenv(f"CELLPILOT_{service}_REPLICA_ID", "mine")
    settings = settings_class()
    assert (settings.resolved_port, settings.resolved_replica_id) == (9000, "mine")
    if isinstance(settings, MeteredReplicaSettings):
        assert settings.metrics_port_to_serve() == 10_000
        monkeypatch.setenv(f"CELLPILOT_{service}_METRICS_PORT", "0")
        assert settings_class().metrics_port_to_serve() == 0
    else:
        assert settings.metrics_port_to_serve() is None


@pytest.mark.parametrize(
    ("settings_class", "variable", "field"),
    [
        pytest.param(
            ActuatorSettings, "CELLPILOT_ACTUATOR_BORGMASTER_ADDRESSES", "borgmaster_addresses", id="actuator"
        ),
        pytest.param(
            AutopilotSettings,
            "CELLPILOT_AUTOPILOT_BORGMASTER_ADDRESSES",
            "borgmaster_addresses",
            id="autopilot",
        ),
        pytest.param(
            BorgletSettings, "CELLPILOT_BORGLET_BORGMASTER_ADDRESSES", "borgmaster_addresses", id="borglet"
        ),
        pytest.param(BorgletSettings, "CELLPILOT_BORGLET_MACHINE_IDS", "machine_ids", id="borglet-machines"),
        pytest.param(
            DashboardSettings,
            "CELLPILOT_DASHBOARD_MONITORING_ADDRESSES",
            "monitoring_addresses",
            id="dashboard",
        ),
    ],
)
def test_lists_are_comma_separated_in_the_environment(
    monkeypatch: pytest.MonkeyPatch, settings_class: type[BaseModel], variable: str, field: str
) -> None:
    monkeypatch.setenv(variable, "a:1, b:2,,c:3")
    assert getattr(settings_class(), field) == ["a:1", "b:2", "c:3"]


def test_the_platform_and_security_settings_are_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELLPILOT_KAFKA_BOOTSTRAP", "broker:9")
    monkeypatch.setenv("CELLPILOT_TLS_MODE", "plaintext-dev")
    for settings in (ActuatorSettings(), BorgletSettings(), DashboardSettings()):
        assert settings.platform.kafka_bootstrap == "broker:9"
        assert settings.security.plaintext
