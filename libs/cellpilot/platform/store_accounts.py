"""Least privilege in the stores: each service connects as its own account, allowed only what it does.

PostgreSQL: one role per service that uses it, ``cellpilot_<account>``. The roles and their
table grants are part of the schema (``infra/migrations/0013_service_roles.sql``, so every
database migrated has them); :func:`provision_postgres_roles` gives the roles LOGIN and their
passwords' SCRAM-SHA-256 verifiers (roles are cluster-wide, passwords live in the certificates
directory, so this is the administrator's step: ``cellpilot stack up``, compose's
``postgres-setup``).

Redis: one ACL user per service that uses it, limited to its own key prefix and to reads,
writes, scripts and transactions (never KEYS, FLUSHALL, CONFIG, DEBUG, ... : ``-@dangerous``);
the ``default`` user is off, ``admin`` may do anything. :func:`redis_acl_text` is the ACL file
the server loads (``--aclfile``); it holds SHA-256 hashes of the passwords, never a password.

A connection URL that names a user is used as given (an operator's or a test's explicit
credential); one without a user gets the service's account and its password file
(:func:`service_postgres_url`, :func:`service_redis_url`, through ``PlatformSettings``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

from sqlalchemy import make_url, text
from sqlalchemy.ext.asyncio import create_async_engine

from cellpilot.security.store_secrets import (
    ADMIN_ACCOUNT,
    read_store_password,
    redis_password_hash,
    scram_sha256_verifier,
)

POSTGRES_ROLE_PREFIX = "cellpilot_"
POSTGRES_SUPERUSER = "postgres"
# The accounts with a PostgreSQL role; what each may touch is in 0013_service_roles.sql. The
# dashboard, Autopilot, the actuator and the recommenders read and write no table.
POSTGRES_ACCOUNTS = ("borgmaster", "scheduler", "aggregator", "fauxmaster")

# Each Redis account's keys (the services' default prefixes; a prefix set elsewhere is refused
# with NOPERM). The Borgmaster, the aggregator and the Borglet use no Redis.
REDIS_KEY_PATTERNS: dict[str, tuple[str, ...]] = {
    "recommender": ("cellpilot:recommender:*",),
    "autopilot": ("cellpilot:autopilot:*",),
    "actuator": ("cellpilot:actuator:*",),
    "dashboard": ("dashboard:*",),
}
REDIS_SERVICE_COMMANDS = "-@all +@read +@write +@scripting +@transaction +@connection -@dangerous"
# Commands one account needs beyond those: Autopilot WAITs until a new fencing token is on the
# replicas before it uses it (cellpilot_services.autopilot.leader_lock).
REDIS_EXTRA_COMMANDS: dict[str, str] = {"autopilot": "+wait"}
REDIS_ACL_FILE = "redis-users.acl"


def postgres_role(account: str) -> str:
    return POSTGRES_ROLE_PREFIX + account


def service_postgres_url(url: str, account: str, certs_dir: Path) -> str:
    """``url`` as the account's role with its password, unless ``url`` already names a user."""
    parsed = make_url(url)
    if parsed.username:
        return url
    password = read_store_password(certs_dir, account)
    as_role = parsed.set(username=postgres_role(account), password=password)
    return as_role.render_as_string(hide_password=False)


def admin_postgres_url(url: str, certs_dir: Path) -> str:
    """``url`` as the superuser with the ``admin`` password (compose; the embedded stack uses peer)."""
    parsed = make_url(url)
    if parsed.username:
        return url
    password = read_store_password(certs_dir, ADMIN_ACCOUNT)
    return parsed.set(username=POSTGRES_SUPERUSER, password=password).render_as_string(hide_password=False)


def service_redis_url(url: str, account: str, certs_dir: Path) -> str:
    """``url`` as the account's ACL user with its password, unless ``url`` already names a user."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        return url
    password = read_store_password(certs_dir, account)
    netloc = f"{quote(account, safe='')}:{quote(password, safe='')}@{parts.netloc}"
    return urlunsplit(parts._replace(netloc=netloc))


def redis_acl_text(certs_dir: Path) -> str:
    """The Redis ACL file for the passwords in ``certs_dir`` (``redis-server --aclfile``)."""

    def secret(account: str) -> str:
        return "#" + redis_password_hash(read_store_password(certs_dir, account))

    lines = [
        "user default off resetpass resetkeys resetchannels -@all",
        f"user {ADMIN_ACCOUNT} on {secret(ADMIN_ACCOUNT)} ~* &* +@all",
    ]
    for account, patterns in REDIS_KEY_PATTERNS.items():
        keys = " ".join(f"~{pattern}" for pattern in patterns)
        commands = f"{REDIS_SERVICE_COMMANDS} {REDIS_EXTRA_COMMANDS.get(account, '')}".rstrip()
        lines.append(f"user {account} on {secret(account)} resetchannels {keys} {commands}")
    return "\n".join(lines) + "\n"


def write_redis_acl(certs_dir: Path) -> Path:
    """Write ``certs_dir/redis-users.acl`` (mode 0644: the Redis server may run as another user,
    e.g. the official image's ``redis``; the file holds hashes of 256-bit random passwords only)."""
    path = certs_dir / REDIS_ACL_FILE
    path.write_text(redis_acl_text(certs_dir))
    path.chmod(0o644)
    return path


async def provision_postgres_roles(
    admin_url: str, certs_dir: Path, accounts: Iterable[str] = POSTGRES_ACCOUNTS
) -> list[str]:
    """Give each account's role LOGIN and its password (as a SCRAM verifier); returns the roles.

    Creates a role the migrations have not created yet (a fresh cluster); the grants come from
    the migrations of each database."""
    engine = create_async_engine(admin_url, isolation_level="AUTOCOMMIT")
    roles = []
    try:
        async with engine.connect() as conn:
            for account in accounts:
                role = postgres_role(account)
                verifier = scram_sha256_verifier(read_store_password(certs_dir, account))
                exists = await conn.scalar(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role})
                # Utility statements take no bind parameters; the verifier is base64, '$' and ':'
                # (sent as is: text() would read ':...' as a parameter).
                verb = "ALTER" if exists else "CREATE"
                await conn.exec_driver_sql(f"{verb} ROLE \"{role}\" LOGIN PASSWORD '{verifier}'")
                roles.append(role)
    finally:
        await engine.dispose()
    return roles
