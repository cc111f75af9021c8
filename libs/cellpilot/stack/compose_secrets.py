"""Per-container secrets in compose: each container mounts a volume holding only what it needs.

The one-shot ``certs`` job issues everything into the ``certs`` volume (which only it mounts),
then copies each container's share into a volume of its own (``secrets-<bundle>``), mounted by
that container alone at ``/certs`` (:func:`distribute`, ``python -m cellpilot.stack.container
secrets``). A compromised service container holds its own key, record-signing key and
password, the CA certificate, the token secret (every service verifies bearer tokens with it)
and the ``client`` certificate its health check presents (transport only: it grants nothing
without a user's token) — never another service's key or password.

Infrastructure gets only its own: PostgreSQL the superuser's password (also its replication
role's), Redis its ACL file and the admin password its replicas and Sentinels log in with, the
broker its TLS key and certificate, the one-shot jobs the credentials they set up.
Their files are readable by any user of their container (0644): the official images run their
servers as other users than the job that writes the files, and no other container sees them.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cellpilot.platform.store_accounts import POSTGRES_ACCOUNTS, REDIS_ACL_FILE
from cellpilot.security.certificates import CA_CERT, SIGNING_SUFFIX
from cellpilot.security.store_secrets import ADMIN_ACCOUNT, password_path
from cellpilot.security.tokens import REVOKED_TOKENS_FILE, TOKEN_SECRET_FILE
from cellpilot.stack.kafka_access import BROKER_USERS, access_script, scram_config, scram_config_file

BROKER_IDENTITY = "kafka"  # the broker's TLS certificate (compose host name "kafka")
BROKER_KEYSTORE = "kafka.keystore.pem"  # its key and certificate in one PEM file (Kafka's PEM keystore)
ACCESS_SCRIPT = "kafka-access.sh"


@dataclass(frozen=True)
class Bundle:
    """What one container (or set of replicas) mounts: files copied from the certs volume."""

    name: str  # the volume is secrets-<name>
    files: tuple[str, ...]
    mode: int = 0o600
    optional: tuple[str, ...] = (REVOKED_TOKENS_FILE,)  # copied when they exist


def service_bundle(name: str, identity: str, account: str) -> Bundle:
    return Bundle(
        name,
        (
            CA_CERT,
            f"{identity}.crt",
            f"{identity}.key",
            f"{identity}{SIGNING_SUFFIX}.crt",
            f"{identity}{SIGNING_SUFFIX}.key",
            password_path(Path(), account).name,
            TOKEN_SECRET_FILE,
            "client.crt",
            "client.key",
        ),
    )


def _passwords(accounts: Iterable[str]) -> tuple[str, ...]:
    return tuple(password_path(Path(), account).name for account in accounts)


BUNDLES: tuple[Bundle, ...] = (
    service_bundle("borgmaster", "borgmaster", "borgmaster"),
    service_bundle("scheduler", "scheduler", "scheduler"),
    service_bundle("borglet-0", "borglet-r0", "borglet"),
    service_bundle("borglet-1", "borglet-r1", "borglet"),
    service_bundle("borglet-2", "borglet-r2", "borglet"),
    service_bundle("aggregator", "aggregator", "aggregator"),
    service_bundle("recommender", "recommender", "recommender"),
    service_bundle("autopilot", "autopilot", "autopilot"),
    service_bundle("actuator", "actuator", "actuator"),
    service_bundle("dashboard", "dashboard", "dashboard"),
    Bundle("postgres", _passwords([ADMIN_ACCOUNT]), 0o644, ()),
    # Every Redis node and Sentinel: the ACL file, and the admin password the replicas and the
    # Sentinels log in with (replication, failover).
    Bundle("redis", (REDIS_ACL_FILE, *_passwords([ADMIN_ACCOUNT])), 0o644, ()),
    # The superuser's password and the passwords of the roles it provisions.
    Bundle("postgres-setup", _passwords([ADMIN_ACCOUNT, *POSTGRES_ACCOUNTS]), 0o600, ()),
    Bundle("kafka-topics", (CA_CERT, *_passwords([ADMIN_ACCOUNT])), 0o600, ()),
    Bundle("kafka", (CA_CERT, BROKER_KEYSTORE), 0o644, ()),
    Bundle("kafka-access", (ACCESS_SCRIPT, *(scram_config_file(u) for u in BROKER_USERS)), 0o600, ()),
    # The offline image's durable broker creates its SCRAM users from these before it listens.
    Bundle("kafka-users", _passwords(BROKER_USERS), 0o600, ()),
)


def derived_files(certs_dir: Path, staging: Path) -> None:
    """Files made from the certs volume's: the broker's PEM keystore and the broker-access job's
    script and SCRAM configs (written into ``staging``)."""
    keystore = (certs_dir / f"{BROKER_IDENTITY}.key").read_text() + (
        certs_dir / f"{BROKER_IDENTITY}.crt"
    ).read_text()
    (staging / BROKER_KEYSTORE).write_text(keystore)
    (staging / ACCESS_SCRIPT).write_text(access_script())
    for user in BROKER_USERS:
        password = password_path(certs_dir, user).read_text().strip()
        (staging / scram_config_file(user)).write_text(scram_config(password))


def distribute(certs_dir: Path, bundles_root: Path, bundles: Iterable[Bundle] = BUNDLES) -> list[str]:
    """Copy each bundle's files into ``bundles_root/<name>`` (its volume), removing anything else
    there; returns one line per bundle."""
    staging = bundles_root / ".staging"
    staging.mkdir(parents=True, exist_ok=True)
    staging.chmod(0o700)
    derived_files(certs_dir, staging)
    lines = []
    for bundle in bundles:
        out = bundles_root / bundle.name
        out.mkdir(parents=True, exist_ok=True)
        out.chmod(0o755)
        wanted = [*bundle.files, *(f for f in bundle.optional if (certs_dir / f).exists())]
        for stale in out.iterdir():
            if stale.name not in wanted and stale.is_file():
                stale.unlink()
        for name in wanted:
            source = staging / name if (staging / name).exists() else certs_dir / name
            target = out / name
            shutil.copyfile(source, target)
            target.chmod(0o644 if name.endswith(".crt") else bundle.mode)
        lines.append(f"{bundle.name}: {', '.join(wanted)}")
    shutil.rmtree(staging)
    return lines
