"""docker-compose.yml's replicated stores, checked on ``docker compose config`` (skipped where
no Compose is installed) and on the Patroni member's configuration (infra/images/postgres-ha):

PostgreSQL is two Patroni members over a three-member etcd, with synchronous replication and
pg_rewind, and every service's URL names both members and asks for the one that accepts
writes; Redis is a master and two replicas watched by three Sentinels (quorum two), and every
service reaches Redis through the Sentinels; the Autopilot master WAITs its fencing token onto
a replica; each member keeps its data on a volume of its own.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from compose_config import COMPOSE_FILE, REPO_ROOT, compose_commands, compose_config, mounts
from sqlalchemy import make_url
from sqlalchemy.dialects.postgresql.asyncpg import dialect as asyncpg_dialect

from cellpilot.platform.postgres import asyncpg_dsn
from cellpilot.platform.redis_client import SentinelTarget

needs_compose = pytest.mark.skipif(not compose_commands(), reason="no docker compose / docker-compose")

PG_MEMBERS = ("pg-0", "pg-1")
ETCD_MEMBERS = ("etcd-0", "etcd-1", "etcd-2")
REDIS_NODES = ("redis-0", "redis-1", "redis-2")
SENTINELS = ("sentinel-0", "sentinel-1", "sentinel-2")
CELLPILOT_SERVICES = ("borgmaster-0", "scheduler", "aggregator", "recommender-0", "autopilot-0", "actuator")


@cache
def services() -> dict[str, Any]:
    return dict(compose_config(compose_commands()[0], [COMPOSE_FILE], "stores-test")["services"])


def env(service: str) -> dict[str, str]:
    return {k: str(v) for k, v in (services()[service].get("environment") or {}).items()}


def patroni_node(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """infra/images/postgres-ha/patroni_node.py, its PostgreSQL found in a stand-in directory."""
    path = REPO_ROOT / "infra" / "images" / "postgres-ha" / "patroni_node.py"
    spec = importlib.util.spec_from_file_location("patroni_node", path)
    assert spec
    assert spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "bin_dir", lambda: "/usr/lib/postgresql/15/bin")
    return module


def test_a_patroni_member_replicates_synchronously_and_can_rewind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PG_HA_ETCD_HOSTS", "etcd-0:2379,etcd-1:2379,etcd-2:2379")
    config = patroni_node(monkeypatch).configuration("pg-1", "secret")
    dcs = config["bootstrap"]["dcs"]
    assert dcs["synchronous_mode"] is True, "a commit is acknowledged only once a standby has it"
    assert dcs["postgresql"]["use_pg_rewind"]
    assert dcs["postgresql"]["parameters"]["wal_log_hints"] == "on"
    # Patroni refuses a configuration where the loop and two retries outlast the leader key.
    assert dcs["loop_wait"] + 2 * dcs["retry_timeout"] <= dcs["ttl"]
    assert config["etcd3"]["hosts"] == ["etcd-0:2379", "etcd-1:2379", "etcd-2:2379"]
    assert config["postgresql"]["connect_address"] == "pg-1:5432"
    assert all("trust" not in line for line in config["postgresql"]["pg_hba"] if line.startswith("host"))


@needs_compose
def test_two_patroni_members_over_a_three_member_etcd() -> None:
    for member in ETCD_MEMBERS:
        cluster = env(member)["ETCD_INITIAL_CLUSTER"].split(",")
        assert sorted(c.split("=")[0] for c in cluster) == list(ETCD_MEMBERS)
        assert env(member)["ETCD_NAME"] == member
    for member in PG_MEMBERS:
        assert env(member)["PG_HA_NAME"] == member
        assert sorted(env(member)["PG_HA_ETCD_HOSTS"].split(",")) == [f"{m}:2379" for m in ETCD_MEMBERS]
        needs = services()[member]["depends_on"]
        assert all(needs[m]["condition"] == "service_healthy" for m in ETCD_MEMBERS)


@needs_compose
def test_every_service_connects_to_whichever_postgres_member_accepts_writes() -> None:
    for service in (*CELLPILOT_SERVICES, "postgres-setup"):
        url = make_url(env(service)["CELLPILOT_POSTGRES_URL"])
        args = asyncpg_dialect().create_connect_args(url.set(username="u", password="p"))[1]
        assert args["host"] == list(PG_MEMBERS)
        assert args["port"] == [5432, 5432]
        assert args["target_session_attrs"] == "read-write", service
        dsn = asyncpg_dsn(env(service)["CELLPILOT_POSTGRES_URL"])
        assert "pg-0:5432,pg-1:5432" in dsn
        assert "target_session_attrs=read-write" in dsn


@needs_compose
def test_every_service_reaches_redis_through_three_sentinels() -> None:
    for service in CELLPILOT_SERVICES:
        target = SentinelTarget.parse(env(service)["CELLPILOT_REDIS_URL"])
        assert target is not None, f"{service} names one Redis server"
        assert sorted(host for host, _ in target.sentinels) == list(SENTINELS)
        assert target.master_name == "cellpilot"
    for sentinel in SENTINELS:
        script = services()[sentinel]["command"][0]
        assert "sentinel monitor cellpilot redis-0 6379 2" in script, "a quorum of two of three"


@needs_compose
def test_two_redis_replicas_and_the_autopilot_token_waited_onto_one() -> None:
    for node in REDIS_NODES[1:]:
        assert env(node)["REDIS_REPLICA_OF"] == "redis-0"
    for replica in ("autopilot-0", "autopilot-1"):
        # Two replicas: after a failover the new master still has one to WAIT for.
        assert int(env(replica)["CELLPILOT_AUTOPILOT_MIN_TOKEN_REPLICAS"]) == 1


@needs_compose
def test_each_store_member_keeps_its_data_on_a_volume_of_its_own() -> None:
    data_paths = {
        **dict.fromkeys(PG_MEMBERS, "/var/lib/postgresql/data"),
        **dict.fromkeys(ETCD_MEMBERS, "/var/lib/etcd"),
        **dict.fromkeys(REDIS_NODES, "/data"),
    }
    volumes = [mounts(services()[m])[path] for m, path in data_paths.items()]
    assert len(set(volumes)) == len(volumes), volumes
    assert not Path(volumes[0]).is_absolute(), "named volumes, not host directories"
