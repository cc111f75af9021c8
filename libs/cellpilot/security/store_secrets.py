"""Passwords of the stores (PostgreSQL, Redis): one per service account, issued beside the certificates.

``cellpilot certs issue`` (and ``cellpilot stack up``) write ``<account>.password`` into the
certificates directory, mode 0600, once: a password that exists is kept, so a restarted stack
and its stores agree. A service reads its own file (never its command line, which ``ps`` shows)
through ``PlatformSettings`` (``cellpilot.platform.store_accounts``).

The accounts are the services that touch a store, plus two that are not services:

* ``admin``: the stores' administrator (Redis user ``admin``; in compose the PostgreSQL
  superuser's password). The embedded stack's PostgreSQL superuser has no password at all: it is
  reached only over the stack's Unix socket, by the operating-system account that runs the stack
  (peer authentication, ``cellpilot.stack.components``).
* ``fauxmaster``: ``cellpilot borgmaster replay`` reading the checkpoint log (Borg §3.1), read-only.

The ``scheduler`` account reads the checkpoint log too (its cached copy of the cell, Borg §3.4).

The servers never see a password: PostgreSQL gets a SCRAM-SHA-256 verifier (RFC 5802/7677, the
format ``ALTER ROLE ... PASSWORD`` stores), Redis the SHA-256 of the password (its ACL ``#`` form).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Iterable
from pathlib import Path

from cellpilot.security.certificates import write_private_file

ADMIN_ACCOUNT = "admin"
FAUXMASTER_ACCOUNT = "fauxmaster"
# Every account a stack issues a password for: each service's, for the stores it uses and for
# the broker where the broker authenticates (cellpilot.platform.stream_access.BrokerLogin).
STORE_ACCOUNTS = (
    ADMIN_ACCOUNT,
    "borgmaster",
    "borglet",
    "scheduler",
    "aggregator",
    "recommender",
    "autopilot",
    "actuator",
    "dashboard",
    FAUXMASTER_ACCOUNT,
)
PASSWORD_SUFFIX = ".password"
PASSWORD_BYTES = 32  # 256 random bits, URL-safe base64: no quoting needed in a URL or an ACL file
SCRAM_ITERATIONS = 4096  # PostgreSQL's default scram_iterations


class StoreSecretError(RuntimeError):
    """A store password that is missing or unreadable; the message names the file and the fix."""


def password_path(certs_dir: Path, account: str) -> Path:
    return certs_dir / f"{account}{PASSWORD_SUFFIX}"


def ensure_store_passwords(certs_dir: Path, accounts: Iterable[str] = STORE_ACCOUNTS) -> list[str]:
    """Issue a random password (mode 0600) for every account that has none; returns those issued."""
    certs_dir.mkdir(parents=True, exist_ok=True)
    issued = []
    for account in accounts:
        path = password_path(certs_dir, account)
        if path.exists():
            continue
        write_private_file(path, (secrets.token_urlsafe(PASSWORD_BYTES) + "\n").encode())
        issued.append(account)
    return issued


def read_store_password(certs_dir: Path, account: str) -> str:
    path = password_path(certs_dir, account)
    try:
        password = path.read_text().strip()
    except OSError as error:
        raise StoreSecretError(
            f"no store password for {account!r} at {path} ({error.strerror}): "
            f"run `cellpilot certs issue --out {certs_dir}` or `cellpilot stack up`"
        ) from None
    if not password:
        raise StoreSecretError(
            f"{path} is empty: delete it and run `cellpilot certs issue --out {certs_dir}`"
        )
    return password


def scram_sha256_verifier(
    password: str, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS
) -> str:
    """PostgreSQL's stored form of a SCRAM-SHA-256 password:
    ``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``.

    ``ALTER ROLE ... PASSWORD '<this>'`` stores it as given, so the password itself never
    reaches the server (nor its logs)."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def redis_password_hash(password: str) -> str:
    """The hex SHA-256 Redis ACL rules take after ``#`` instead of the password."""
    return hashlib.sha256(password.encode()).hexdigest()
