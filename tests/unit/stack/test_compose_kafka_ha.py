"""docker-compose.kafka-ha.yml over docker-compose.yml: three Kafka brokers that replicate.

Checked on ``docker compose config`` of both files (skipped where no Compose is installed):
three apache/kafka brokers of one KRaft cluster, each a controller voter, with replication
factor 3 and two in-sync replicas for every topic; the single broker's security (SASL_SSL with
SCRAM for clients, an authorizer, ACLs set by kafka-access) and TLS with client certificates
between the brokers, whose certificate names them all; every Cellpilot service told all three
brokers, with idempotent writes and topics of three replicas; and every ``depends_on`` still
names a service that can satisfy it.
"""

from __future__ import annotations

import itertools
from functools import cache
from typing import Any

import pytest
from compose_config import COMPOSE_FILE, KAFKA_HA_FILE, compose_commands, compose_config, mounts

from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.stream_access import WriteDurability

pytestmark = pytest.mark.skipif(not compose_commands(), reason="no docker compose / docker-compose installed")

BROKERS = ("kafka", "kafka-2", "kafka-3")
CLIENT_PORT = 9092


@cache
def single() -> dict[str, Any]:
    return compose_config(compose_commands()[0], [COMPOSE_FILE], "kafka-ha-test")


@cache
def replicated() -> dict[str, Any]:
    return compose_config(compose_commands()[0], [COMPOSE_FILE, KAFKA_HA_FILE], "kafka-ha-test")


def services() -> dict[str, Any]:
    return dict(replicated()["services"])


def env(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in (services()[service].get("environment") or {}).items()}


def brokers(config: dict[str, Any]) -> list[str]:
    """The services that run a Kafka broker."""
    return sorted(
        name
        for name, service in config["services"].items()
        if "broker" in str((service.get("environment") or {}).get("KAFKA_PROCESS_ROLES", "")).split(",")
    )


def listeners(value: str) -> dict[str, str]:
    """NAME -> host:port of a KAFKA_LISTENERS / KAFKA_ADVERTISED_LISTENERS value."""
    return dict(item.split("://") for item in value.split(","))


def test_three_brokers_of_one_kraft_cluster_each_a_controller_voter() -> None:
    assert brokers(single()) == ["kafka"]
    assert brokers(replicated()) == sorted(BROKERS)
    node_of = {name: env(name)["KAFKA_NODE_ID"] for name in BROKERS}
    assert sorted(node_of.values()) == ["1", "2", "3"]
    assert node_of["kafka"] == "1", "the broker services already know keeps its node id"
    assert len({env(name)["CLUSTER_ID"] for name in BROKERS}) == 1
    for name in BROKERS:
        assert set(env(name)["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
        voters = dict(v.split("@") for v in env(name)["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(","))
        controller_port = listeners(env(name)["KAFKA_LISTENERS"])["CONTROLLER"].rsplit(":")[-1]
        assert voters == {node_of[b]: f"{b}:{controller_port}" for b in BROKERS}, name


def test_the_brokers_run_the_registry_image_docker_compose_yml_pulls() -> None:
    image = single()["services"]["kafka"]["image"]
    assert image.startswith("apache/kafka:")
    assert {services()[name]["image"] for name in (*BROKERS, "kafka-access")} == {image}


def test_every_topic_has_three_replicas_and_a_write_needs_two() -> None:
    for name in BROKERS:
        settings = env(name)
        assert settings["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3", name
        assert settings["KAFKA_MIN_INSYNC_REPLICAS"] == "2", name
        assert settings["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "3", name
        assert settings["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "3", name
        assert settings["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "2", name
        assert settings["KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE"] == "false", name
    assert env("kafka-topics")["CELLPILOT_KAFKA_REPLICATION_FACTOR"] == "3"


def test_each_broker_keeps_its_log_on_a_volume_of_its_own() -> None:
    volumes = {name: mounts(services()[name])[env(name)["KAFKA_LOG_DIRS"]] for name in BROKERS}
    assert len(set(volumes.values())) == 3
    assert set(volumes.values()) <= set(replicated()["volumes"])


def test_the_brokers_keep_the_single_broker_s_security_and_authenticate_each_other() -> None:
    single_env = single()["services"]["kafka"]["environment"]
    for name in BROKERS:
        settings = env(name)
        protocols = dict(p.split(":") for p in settings["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
        assert protocols["CLIENTS"] == "SASL_SSL"
        for listener, address in listeners(settings["KAFKA_LISTENERS"]).items():
            if address.startswith("127.0.0.1:"):
                continue  # the container's loopback: kafka-access, the health check
            assert protocols[listener] in ("SASL_SSL", "SSL"), f"{name}: {listener} is reachable in clear"
            if protocols[listener] == "SSL":
                key = f"KAFKA_LISTENER_NAME_{listener}_SSL_CLIENT_AUTH"
                assert settings.get(key) == "required", f"{name}: {listener} takes anyone the CA signed"
        assert settings["KAFKA_INTER_BROKER_LISTENER_NAME"] in protocols
        assert protocols[settings["KAFKA_INTER_BROKER_LISTENER_NAME"]] == "SSL"
        assert protocols[settings["KAFKA_CONTROLLER_LISTENER_NAMES"]] == "SSL"
        for key in (
            "KAFKA_SASL_ENABLED_MECHANISMS",
            "KAFKA_AUTHORIZER_CLASS_NAME",
            "KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND",
            "KAFKA_SSL_KEYSTORE_LOCATION",
            "KAFKA_SSL_TRUSTSTORE_LOCATION",
            "KAFKA_LISTENER_NAME_CLIENTS_SCRAM___SHA___512_SASL_JAAS_CONFIG",
        ):
            assert settings[key] == str(single_env[key]), f"{name}: {key}"
        assert settings["KAFKA_SUPER_USERS"].split(";") == ["User:ANONYMOUS", "User:admin", "User:CN=kafka"]
        advertised = listeners(settings["KAFKA_ADVERTISED_LISTENERS"])
        assert advertised["CLIENTS"] == f"{name}:{CLIENT_PORT}"
        assert advertised[settings["KAFKA_INTER_BROKER_LISTENER_NAME"]].split(":")[0] == name
        assert "SSL://" not in settings["KAFKA_ADVERTISED_LISTENERS"], (
            "the image would ask for a JKS keystore"
        )
        assert mounts(services()[name])["/secrets"] == "secrets-kafka"
    assert services()["kafka-access"]["network_mode"] == "service:kafka"


def test_the_broker_certificate_names_every_broker() -> None:
    command = services()["certs"]["command"]
    named: list[str] = []
    for option, value in itertools.pairwise(command):
        if option == "--hostnames" and value.startswith("kafka="):
            named += value.removeprefix("kafka=").split(";")
    assert {"kafka", *named} >= set(BROKERS), "a broker's TLS peers would refuse its host name"


def test_every_service_reaches_all_three_brokers_and_writes_idempotently(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clients = sorted(
        n
        for n, s in single()["services"].items()
        if "CELLPILOT_KAFKA_BOOTSTRAP" in (s.get("environment") or {})
    )
    assert "aggregator" in clients
    advertised = {listeners(env(b)["KAFKA_ADVERTISED_LISTENERS"])["CLIENTS"] for b in BROKERS}
    for name in clients:
        for key, value in env(name).items():
            monkeypatch.setenv(key, value)
        settings = PlatformSettings(_env_file=None)  # type: ignore[call-arg]
        assert set(settings.kafka_bootstrap.split(",")) == advertised, name
        assert settings.kafka_security_protocol == "SASL_SSL", name
        assert settings.write_durability() == WriteDurability(idempotence=True, replication_factor=3), name


def test_the_single_broker_path_writes_idempotently_with_one_replica() -> None:
    for name, service in single()["services"].items():
        environment = service.get("environment") or {}
        if "CELLPILOT_KAFKA_BOOTSTRAP" in environment:
            assert environment["CELLPILOT_KAFKA_BOOTSTRAP"] == f"kafka:{CLIENT_PORT}", name
            assert str(environment["CELLPILOT_KAFKA_IDEMPOTENCE"]) == "true", name
            assert "CELLPILOT_KAFKA_REPLICATION_FACTOR" not in environment, name


def _dependencies(service: dict[str, Any]) -> dict[str, str]:
    depends = service.get("depends_on") or {}
    if isinstance(depends, list):
        return dict.fromkeys(depends, "service_started")
    return {name: str(spec.get("condition", "service_started")) for name, spec in depends.items()}


def test_every_dependency_names_a_service_that_can_satisfy_it() -> None:
    for name, service in services().items():
        for target, condition in _dependencies(service).items():
            assert target in services(), f"{name} depends on {target}, which is no service"
            if condition == "service_healthy":
                assert "healthcheck" in services()[target], f"{name} waits for {target} to be healthy"
            if condition == "service_completed_successfully":
                assert services()[target].get("restart") in ("no", None), f"{target} never completes"
    access = _dependencies(services()["kafka-access"])
    assert all(access.get(b) == "service_healthy" for b in BROKERS), "the ACLs wait for all three"
    assert _dependencies(services()["kafka-topics"]) == {"kafka-access": "service_completed_successfully"}
    for name in BROKERS:
        assert _dependencies(services()[name]) == {"certs": "service_completed_successfully"}
