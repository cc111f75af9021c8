"""Store passwords: issued once (mode 0600) by ``cellpilot certs issue``, turned into the URLs a
service connects with and into the verifiers the servers keep; never a password in a server file."""

from __future__ import annotations

import base64
import hashlib
import hmac
import stat
from pathlib import Path

import pytest
from sqlalchemy import make_url
from typer.testing import CliRunner

from cellpilot.cli.certs import app
from cellpilot.platform.settings import PlatformSettings
from cellpilot.platform.store_accounts import REDIS_ACL_FILE, redis_acl_text
from cellpilot.security.store_secrets import (
    STORE_ACCOUNTS,
    StoreSecretError,
    ensure_store_passwords,
    password_path,
    read_store_password,
    scram_sha256_verifier,
)


def test_certs_issue_writes_one_private_password_per_account_and_keeps_them(tmp_path: Path) -> None:
    out = tmp_path / "certs"
    assert CliRunner().invoke(app, ["issue", "--out", str(out), "--services", "client"]).exit_code == 0
    first = {account: read_store_password(out, account) for account in STORE_ACCOUNTS}
    assert len(set(first.values())) == len(STORE_ACCOUNTS), "one password per account"
    for account in STORE_ACCOUNTS:
        assert stat.S_IMODE(password_path(out, account).stat().st_mode) == 0o600
    assert ensure_store_passwords(out) == []
    assert {account: read_store_password(out, account) for account in STORE_ACCOUNTS} == first
    acl = (out / REDIS_ACL_FILE).read_text()
    assert "user default off" in acl
    assert not any(password in acl for password in first.values()), "hashes only"


def test_a_missing_password_names_its_file_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(StoreSecretError, match=r"borgmaster.*borgmaster\.password.*cellpilot certs issue"):
        read_store_password(tmp_path, "borgmaster")


def test_a_service_url_gets_its_account_unless_the_url_names_a_user(tmp_path: Path) -> None:
    ensure_store_passwords(tmp_path)
    settings = PlatformSettings(
        postgres_url="postgresql+asyncpg://db:5432/cellpilot",
        redis_url="redis://cache:6379/0",
        certs_dir=tmp_path,
    )
    postgres = make_url(settings.postgres_url_for("borgmaster"))
    assert (postgres.username, postgres.password) == (
        "cellpilot_borgmaster",
        read_store_password(tmp_path, "borgmaster"),
    )
    assert (postgres.host, postgres.port, postgres.database) == ("db", 5432, "cellpilot")
    password = read_store_password(tmp_path, "dashboard")
    assert settings.redis_url_for("dashboard") == f"redis://dashboard:{password}@cache:6379/0"
    explicit = settings.model_copy(
        update={
            "postgres_url": "postgresql+asyncpg://ops:secret@db/cellpilot",
            "redis_url": "redis://ops:x@cache/0",
        }
    )
    assert explicit.postgres_url_for("borgmaster") == "postgresql+asyncpg://ops:secret@db/cellpilot"
    assert explicit.redis_url_for("dashboard") == "redis://ops:x@cache/0"


def test_the_scram_verifier_is_the_rfc_5802_stored_form() -> None:
    salt = b"0123456789abcdef"
    verifier = scram_sha256_verifier("pencil", salt=salt, iterations=4096)
    method, rest = verifier.split("$", 1)
    counts, keys = rest.split("$")
    iterations, salt_b64 = counts.split(":")
    stored_b64, server_b64 = keys.split(":")
    assert (method, iterations, base64.b64decode(salt_b64)) == ("SCRAM-SHA-256", "4096", salt)
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", salt, 4096)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    assert base64.b64decode(stored_b64) == hashlib.sha256(client_key).digest()
    assert base64.b64decode(server_b64) == hmac.new(salted, b"Server Key", hashlib.sha256).digest()


def test_the_acl_limits_each_service_to_its_prefix(tmp_path: Path) -> None:
    ensure_store_passwords(tmp_path)
    lines = {line.split()[1]: line for line in redis_acl_text(tmp_path).splitlines()}
    assert "~cellpilot:recommender:*" in lines["recommender"]
    assert "-@dangerous" in lines["recommender"]
    assert "~*" not in lines["recommender"]
    assert "~*" in lines["admin"]
    # Only Autopilot WAITs (for its fencing token to reach the replicas).
    assert lines["autopilot"].endswith("+wait")
    assert "+wait" not in lines["recommender"]
