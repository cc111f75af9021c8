"""The Kafka client settings every service uses: one place for the broker login.

Anonymous plaintext by default (the embedded broker); SASL as the service's own account, with
its password file, where the broker authenticates — over TLS trusting the stack's CA for the
registry path's Kafka. Every Kafka client (producer, consumers, admin) takes the same options.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.stream_access import BrokerLogin, StreamAccess, client_options
from cellpilot.security.certificates import IdentityRequest, issue_all
from cellpilot.security.store_secrets import StoreSecretError, ensure_store_passwords, read_store_password


@pytest.fixture
def certs(tmp_path: Path) -> Path:
    issue_all(tmp_path, [IdentityRequest("aggregator")], valid_days=2)
    ensure_store_passwords(tmp_path)
    return tmp_path


def test_plaintext_is_anonymous(certs: Path) -> None:
    settings = PlatformSettings(kafka_bootstrap="k:9092", certs_dir=certs)
    assert settings.broker_login("aggregator").client_options() == {}
    assert client_options("k:9092") == {"bootstrap_servers": "k:9092"}


def test_sasl_ssl_logs_in_as_the_service_s_own_account_and_trusts_the_stack_s_ca(certs: Path) -> None:
    settings = PlatformSettings(
        kafka_bootstrap="kafka:9092", kafka_security_protocol="SASL_SSL", certs_dir=certs
    )
    options = settings.broker_login("aggregator").client_options()
    context = options.pop("ssl_context")
    assert options == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "aggregator",
        "sasl_plain_password": read_store_password(certs, "aggregator"),
    }
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED
    assert context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "Cellpilot local CA"),),)]


def test_sasl_plaintext_for_a_broker_with_users_but_no_tls(certs: Path) -> None:
    login = BrokerLogin.of_account("SASL_PLAINTEXT", "SCRAM-SHA-256", "aggregator", certs)
    assert login.client_options()["security_protocol"] == "SASL_PLAINTEXT"
    assert login.client_options()["sasl_mechanism"] == "SCRAM-SHA-256"
    assert "ssl_context" not in login.client_options()


def test_every_client_of_a_service_gets_the_same_login(certs: Path) -> None:
    login = BrokerLogin.of_account("SASL_SSL", "SCRAM-SHA-512", "aggregator", certs)
    access = StreamAccess.service("kafka:9092", certs, "aggregator", login)
    options = access.client_options()
    assert options["bootstrap_servers"] == "kafka:9092"
    assert options["sasl_plain_username"] == "aggregator"
    assert client_options(access) == options
    assert repr(login).count(login.password) == 0, "the password is not in the repr"


def test_a_missing_password_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StoreSecretError, match="no store password for 'aggregator'"):
        BrokerLogin.of_account("SASL_SSL", "SCRAM-SHA-512", "aggregator", tmp_path)
