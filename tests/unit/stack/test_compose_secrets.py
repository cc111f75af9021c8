"""docker-compose.yml gives each container only its own secrets, and the registry path's broker
authenticates every client and authorises it by the producer table.

Checked on the file itself (always) and on ``docker compose config`` (where a Compose is
installed): no container but the ``certs`` job mounts the whole certificates volume; each
mounts one ``secrets-*`` volume whose bundle (cellpilot.stack.compose_secrets) holds its own
key, signing key and password and nobody else's; the broker's listener for clients is SASL_SSL
with SCRAM and an authorizer, and the users and ACLs its access job sets match the producer
table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from compose_config import COMPOSE_FILE, compose_commands, compose_config, mounts

from cellpilot.platform.topics import SERVICE_KINDS, TOPICS
from cellpilot.security.certificates import IdentityRequest, issue_all
from cellpilot.security.store_secrets import ensure_store_passwords
from cellpilot.stack.compose_secrets import BUNDLES, distribute
from cellpilot.stack.kafka_access import BROKER_USERS, access_script, group_acls, topic_acls

BUNDLE_OF = {b.name: b for b in BUNDLES}
SECRET_FILES = (".key", ".password")


def resolved() -> dict[str, Any]:
    """``docker compose config`` of the file (the Compose here), else the file as YAML: the
    registry path, so never the ``.env`` that ``make images`` writes for the offline one."""
    for command in compose_commands():
        return compose_config(command, [COMPOSE_FILE], "compose-secrets-test")
    return dict(yaml.safe_load(COMPOSE_FILE.read_text()))


@pytest.mark.skipif(not compose_commands(), reason="no docker compose / docker-compose installed")
def test_docker_compose_config_accepts_the_file() -> None:
    assert "certs" in resolved()["services"]


def test_only_the_certs_job_mounts_the_whole_certificates_volume() -> None:
    services = resolved()["services"]
    whole = sorted(name for name, svc in services.items() if "certs" in mounts(svc).values())
    assert whole == ["certs"]
    # ...and it fills every bundle's volume.
    assert {f"secrets-{b.name}" for b in BUNDLES} <= set(mounts(services["certs"]).values())


@pytest.mark.parametrize(
    ("service", "bundle", "identity", "account"),
    [
        ("borgmaster-0", "borgmaster", "borgmaster", "borgmaster"),
        ("borgmaster-2", "borgmaster", "borgmaster", "borgmaster"),
        ("borglet-1", "borglet-1", "borglet-r1", "borglet"),
        ("aggregator", "aggregator", "aggregator", "aggregator"),
        ("recommender-2", "recommender", "recommender", "recommender"),
        ("autopilot-1", "autopilot", "autopilot", "autopilot"),
        ("actuator", "actuator", "actuator", "actuator"),
        ("dashboard", "dashboard", "dashboard", "dashboard"),
    ],
)
def test_each_service_container_mounts_only_its_own_secrets(
    service: str, bundle: str, identity: str, account: str
) -> None:
    assert mounts(resolved()["services"][service]) == {"/certs": f"secrets-{bundle}"}
    secrets = {f for f in BUNDLE_OF[bundle].files if f.endswith(SECRET_FILES)}
    assert secrets == {
        f"{identity}.key",
        f"{identity}.signing.key",
        f"{account}.password",
        "token-secret.key",
        "client.key",
    }


def test_the_registry_path_broker_authenticates_and_authorises_every_client() -> None:
    kafka = resolved()["services"]["kafka"]
    env = kafka["environment"]
    protocols = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    listeners = env["KAFKA_LISTENERS"].split(",")
    assert protocols["CLIENTS"] == "SASL_SSL"
    for listener in listeners:  # every plaintext listener is on the container's loopback
        name, address = listener.split("://")
        assert protocols[name] == "SASL_SSL" or address.startswith("127.0.0.1:"), listener
    assert env["KAFKA_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
    assert env["KAFKA_AUTHORIZER_CLASS_NAME"].endswith("StandardAuthorizer")
    assert env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert "SSL://" not in env["KAFKA_ADVERTISED_LISTENERS"], "the image would ask for a JKS keystore"
    access = resolved()["services"]["kafka-access"]
    assert access["network_mode"] == "service:kafka"
    services = resolved()["services"]
    assert services["aggregator"]["environment"]["CELLPILOT_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"


def test_the_broker_acls_are_the_producer_table() -> None:
    writes = {(a.principal, a.name) for a in topic_acls() if "Write" in a.operations}
    reads = {(a.principal, a.name) for a in topic_acls() if "Read" in a.operations}
    assert writes == {(kind, t.name) for t in TOPICS for kind in t.writers}
    assert reads == {(kind, t.name) for t in TOPICS for kind in t.readers}
    assert ("borglet", "usage.samples") in writes
    assert ("recommender", "actuations") not in writes
    assert ("autopilot", "actuations") in writes
    assert {a.principal for a in group_acls()} <= set(SERVICE_KINDS)
    script = access_script()
    for user in BROKER_USERS:
        assert f"--entity-name {user} --add-config-file /secrets/scram-{user}.properties" in script
    assert "password=" not in script, "no password on a command line"


def test_distribute_copies_each_bundle_and_nothing_else(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    identities = [
        "borgmaster",
        "scheduler",
        "borglet-r0",
        "borglet-r1",
        "borglet-r2",
        "aggregator",
        "recommender",
    ]
    identities += ["autopilot", "actuator", "dashboard", "client", "kafka"]
    issue_all(certs, [IdentityRequest(i) for i in identities], valid_days=2)
    ensure_store_passwords(certs)
    (certs / "token-secret.key").write_text("00\n")
    (certs / "redis-users.acl").write_text("user default off\n")
    bundles = tmp_path / "bundles"
    (bundles / "aggregator").mkdir(parents=True)
    (bundles / "aggregator" / "actuator.key").write_text("left over")  # from an older layout
    distribute(certs, bundles)
    aggregator = {p.name for p in (bundles / "aggregator").iterdir()}
    assert "actuator.key" not in aggregator
    assert {"aggregator.signing.key", "aggregator.password", "ca.crt"} <= aggregator
    assert not any(name.startswith(("actuator", "autopilot", "borgmaster")) for name in aggregator)
    assert (bundles / "aggregator" / "aggregator.signing.key").stat().st_mode & 0o777 == 0o600
    keystore = (bundles / "kafka" / "kafka.keystore.pem").read_text()
    assert "PRIVATE KEY" in keystore
    assert "CERTIFICATE" in keystore
    scram = (bundles / "kafka-access" / "scram-borglet.properties").read_text()
    assert (
        scram
        == f"SCRAM-SHA-512=iterations=8192,password={(certs / 'borglet.password').read_text().strip()}\n"
    )
