"""asyncpg_dsn: the DSN the services' raw asyncpg pools connect with, from a SQLAlchemy URL."""

from __future__ import annotations

import pytest
from asyncpg.connect_utils import _parse_connect_dsn_and_args

from cellpilot.platform.postgres import asyncpg_dsn


def _targets(dsn: str) -> tuple[list[object], str, str]:
    """What asyncpg makes of ``dsn``: its addresses, database and target_session_attrs."""
    addrs, params = _parse_connect_dsn_and_args(
        dsn=dsn, host=None, port=None, user=None, password=None, passfile=None, database=None,
        ssl=None, direct_tls=None, server_settings=None, target_session_attrs=None,
        krbsrvname=None, gsslib=None, service=None, servicefile=None,
    )  # fmt: skip
    return list(addrs), params.database, str(params.target_session_attrs.value)


@pytest.mark.parametrize(
    ("url", "addresses"),
    [
        ("postgresql+asyncpg://u:p@127.0.0.1:5432/cellpilot", [("127.0.0.1", 5432)]),
        (
            "postgresql+asyncpg://u:p@/cellpilot?host=pg-0:5432&host=pg-1:5433&target_session_attrs=read-write",
            [("pg-0", 5432), ("pg-1", 5433)],
        ),
    ],
)
def test_every_host_of_the_url_is_an_address_asyncpg_tries(url: str, addresses: list[object]) -> None:
    addrs, database, _ = _targets(asyncpg_dsn(url))
    assert addrs == addresses
    assert database == "cellpilot"


def test_a_multi_host_url_keeps_asking_for_the_member_that_accepts_writes() -> None:
    url = "postgresql+asyncpg://u:p%40ss@/cellpilot?host=pg-0:5432&host=pg-1:5432&target_session_attrs=read-write"
    assert _targets(asyncpg_dsn(url))[2] == "read-write"
    assert "u:p%40ss@" in asyncpg_dsn(url)


def test_a_socket_directory_stays_one_host() -> None:
    addrs, database, _ = _targets(asyncpg_dsn("postgresql+asyncpg://postgres@/cellpilot?host=/run/pg/socket"))
    assert database == "cellpilot"
    assert [str(a) for a in addrs] == ["/run/pg/socket/.s.PGSQL.5432"]
