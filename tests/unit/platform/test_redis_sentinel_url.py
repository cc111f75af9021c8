"""``redis+sentinel://`` URLs: which Sentinels, which master, which database and login; every
service's account is added to them like to a single server's URL."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio.sentinel import SentinelConnectionPool

from cellpilot.platform.redis_client import SentinelTarget, connect_redis
from cellpilot.platform.store_accounts import service_redis_url
from cellpilot.security.store_secrets import ensure_store_passwords, read_store_password


def test_a_sentinel_url_names_the_sentinels_the_master_and_the_database() -> None:
    target = SentinelTarget.parse("redis+sentinel://s1:26379,s2:26380,10.0.0.3:26381/cellpilot/2")
    assert target == SentinelTarget(
        (("s1", 26379), ("s2", 26380), ("10.0.0.3", 26381)), "cellpilot", db=2, username=None, password=None
    )


def test_the_database_defaults_to_zero_and_the_login_is_the_masters() -> None:
    target = SentinelTarget.parse("redis+sentinel://autopilot:p%40ss@s1:26379/cellpilot")
    assert target is not None
    assert (target.db, target.username, target.password) == (0, "autopilot", "p@ss")


def test_a_single_server_url_is_not_a_sentinel_target() -> None:
    assert SentinelTarget.parse("redis://127.0.0.1:6379/0") is None


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("redis+sentinel://s1/cellpilot/0", id="no-port"),
        pytest.param("redis+sentinel://s1:26379/", id="no-master-name"),
        pytest.param("redis+sentinel://s1:26379/cellpilot/zero", id="database-not-a-number"),
    ],
)
def test_a_malformed_sentinel_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match=r"Sentinel|master-name"):
        SentinelTarget.parse(url)


def test_each_service_logs_in_to_the_master_as_its_own_account(tmp_path: Path) -> None:
    ensure_store_passwords(tmp_path)
    url = service_redis_url("redis+sentinel://s1:26379,s2:26379/cellpilot/0", "autopilot", tmp_path)
    target = SentinelTarget.parse(url)
    assert target is not None
    assert target.sentinels == (("s1", 26379), ("s2", 26379))
    assert (target.username, target.password) == ("autopilot", read_store_password(tmp_path, "autopilot"))


async def test_connect_redis_follows_the_master_the_sentinels_name() -> None:
    client = connect_redis("redis+sentinel://autopilot:pw@s1:26379/cellpilot/1")
    try:
        pool = client.connection_pool
        assert isinstance(pool, SentinelConnectionPool)
        assert pool.service_name == "cellpilot"
        assert pool.is_master
        assert {k: pool.connection_kwargs[k] for k in ("db", "username", "password")} == {
            "db": 1,
            "username": "autopilot",
            "password": "pw",
        }
    finally:
        await client.aclose()
