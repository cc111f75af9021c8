"""One member of the replicated PostgreSQL: writes Patroni's configuration, then runs Patroni.

Run by Debian's python3 in the postgres-ha image (infra/images/Dockerfile), as root: it makes
the data directory the postgres account's, writes /etc/patroni/patroni.yml, and replaces itself
with Patroni running as postgres. Patroni then bootstraps the cluster (the first member to take
the initialize key in etcd runs initdb) or clones it from the leader (pg_basebackup), keeps the
leader key in etcd, and promotes a synchronous standby when the primary's key expires.

Settings (environment, set by docker-compose.yml; not ``PATRONI_*``, which Patroni itself reads):

* ``PG_HA_NAME``: this member's name and compose host name (pg-0, pg-1, ...);
* ``PG_HA_SCOPE``: the cluster's name in etcd (default ``cellpilot``);
* ``PG_HA_ETCD_HOSTS``: etcd's client endpoints, ``host:port,host:port,...``;
* ``PG_HA_PASSWORD_FILE``: the ``admin`` store password (the PostgreSQL superuser's, also
  used by the replication and rewind roles and the REST API's unsafe endpoints);
* ``PG_HA_TTL_S``: how long a leader key outlives its last renewal (default 10 s: a killed
  primary is replaced within ~12 s; docs/architecture.md, "Stores").

Why these settings: ``synchronous_mode`` makes every commit wait for one standby, so an
acknowledged write is on two nodes and only a synchronous standby may be promoted;
``use_pg_rewind`` with ``wal_log_hints`` lets an old primary that was cut off rejoin as a
standby of the new one after it comes back.
"""

from __future__ import annotations

import glob
import os
import pwd
import sys

import yaml

CONFIG = "/etc/patroni/patroni.yml"
DATA_DIR = "/var/lib/postgresql/data/pgdata"


def bin_dir() -> str:
    """Debian's PostgreSQL binaries (/usr/lib/postgresql/<major>/bin), the newest major."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    if not found:
        sys.exit("patroni-node: no PostgreSQL under /usr/lib/postgresql")
    return found[-1]


def configuration(name: str, password: str) -> dict[str, object]:
    ttl = int(os.environ.get("PG_HA_TTL_S", "10"))
    # Patroni requires loop_wait + 2 * retry_timeout <= ttl.
    loop_wait = 1
    retry_timeout = max(1, (ttl - loop_wait) // 2)
    return {
        "scope": os.environ.get("PG_HA_SCOPE", "cellpilot"),
        "name": name,
        "log": {"level": "INFO", "format": "%(asctime)s patroni %(levelname)s: %(message)s"},
        "restapi": {
            "listen": "0.0.0.0:8008",
            "connect_address": f"{name}:8008",
            "authentication": {"username": "admin", "password": password},
        },
        "etcd3": {"hosts": os.environ["PG_HA_ETCD_HOSTS"].split(",")},
        "bootstrap": {
            "dcs": {
                "ttl": ttl,
                "loop_wait": loop_wait,
                "retry_timeout": retry_timeout,
                "maximum_lag_on_failover": 1048576,
                "synchronous_mode": True,
                "postgresql": {
                    "use_pg_rewind": True,
                    "use_slots": True,
                    "parameters": {
                        "wal_log_hints": "on",
                        "password_encryption": "scram-sha-256",
                        "max_connections": 300,
                        "max_wal_senders": 10,
                        "max_replication_slots": 10,
                        "wal_keep_size": "256MB",
                    },
                },
            },
            "initdb": [{"encoding": "UTF8"}, {"auth-local": "trust"}, {"auth-host": "scram-sha-256"}],
        },
        "postgresql": {
            "listen": "0.0.0.0:5432",
            "connect_address": f"{name}:5432",
            "data_dir": DATA_DIR,
            "bin_dir": bin_dir(),
            "pgpass": "/tmp/pgpass",
            "authentication": {
                "superuser": {"username": "postgres", "password": password},
                "replication": {"username": "replicator", "password": password},
                "rewind": {"username": "rewinder", "password": password},
            },
            "pg_hba": [
                "local all all trust",
                "host replication replicator all scram-sha-256",
                "host all all all scram-sha-256",
            ],
            "parameters": {"unix_socket_directories": "/var/run/postgresql"},
        },
        "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
    }


def main() -> None:
    name = os.environ["PG_HA_NAME"]
    with open(os.environ.get("PG_HA_PASSWORD_FILE", "/certs/admin.password")) as handle:
        password = handle.read().strip()
    account = pwd.getpwnam("postgres")
    for directory in ("/var/lib/postgresql/data", "/var/run/postgresql", "/etc/patroni"):
        os.makedirs(directory, exist_ok=True)
        os.chown(directory, account.pw_uid, account.pw_gid)
    os.chmod("/var/lib/postgresql/data", 0o700)
    with open(CONFIG, "w") as handle:
        yaml.safe_dump(configuration(name, password), handle, sort_keys=False)
    os.chown(CONFIG, account.pw_uid, account.pw_gid)
    os.chmod(CONFIG, 0o600)
    os.setgroups([])
    os.setgid(account.pw_gid)
    os.setuid(account.pw_uid)
    os.environ.update(HOME=account.pw_dir, USER="postgres")
    print(f"patroni-node: {name} starts Patroni ({CONFIG})", flush=True)
    os.execv("/usr/bin/patroni", ["patroni", CONFIG])


if __name__ == "__main__":
    main()
