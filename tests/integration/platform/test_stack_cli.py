"""`cellpilot stack up|status|down` as a user runs it, including data surviving a restart."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from sqlalchemy import text

from cellpilot.platform.postgres import create_engine
from cellpilot.platform.redis_client import ping_redis
from cellpilot.stack import Stack, StackConfig, StackEndpoints
from cellpilot.stack.config import port_in_use

pytestmark = pytest.mark.slow  # started first (tests/conftest.py)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cellpilot.cli.main", "stack", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def status(data_dir: Path) -> tuple[int, list[dict[str, object]]]:
    result = cli("status", "--data-dir", str(data_dir), "--json")
    return result.returncode, json.loads(result.stdout)["units"]


async def _write_marker(endpoints: StackEndpoints) -> None:
    engine = create_engine(endpoints.postgres_url)
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE IF NOT EXISTS stack_test (v text)"))
        await conn.execute(text("INSERT INTO stack_test VALUES ('kept')"))
    await engine.dispose()


async def _read_marker(endpoints: StackEndpoints) -> list[str]:
    engine = create_engine(endpoints.postgres_url)
    async with engine.connect() as conn:
        values = list((await conn.scalars(text("SELECT v FROM stack_test"))).all())
    await engine.dispose()
    return values


def test_up_status_down_and_up_again_keeps_data(tmp_path: Path, endpoints: StackEndpoints) -> None:
    data_dir = tmp_path / "stack"
    up = cli("up", "--data-dir", str(data_dir))
    assert up.returncode == 0, up.stderr
    code, rows = status(data_dir)
    assert code == 0
    assert {row["name"] for row in rows} == {"kafka", "postgres", "redis"}
    assert all(row["state"] == "running" and row["listening"] for row in rows)
    pids = [int(row["pid"]) for row in rows]  # type: ignore[call-overload]
    ports = [int(row["port"]) for row in rows]  # type: ignore[call-overload]
    written = StackEndpoints.read_env_file(data_dir / "stack.env")
    assert written.kafka_bootstrap != endpoints.kafka_bootstrap, "a second stack must not share ports"
    # The marker is written as the administrator (the services' accounts may create nothing).
    mine = StackConfig(data_dir).with_ports_resolved().admin_endpoints()

    asyncio.run(_write_marker(mine))
    import redis

    redis.Redis.from_url(mine.redis_url).set("stack-test", b"kept")

    down = cli("down", "--data-dir", str(data_dir))
    assert down.returncode == 0, down.stderr
    assert not any(
        psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids
    )
    assert not any(port_in_use("127.0.0.1", port) for port in ports), "ports must be released"
    code, rows = status(data_dir)
    assert code == 1
    assert all(row["state"] == "stopped" for row in rows)

    again = cli("up", "--data-dir", str(data_dir))
    assert again.returncode == 0, again.stderr
    try:
        assert StackEndpoints.read_env_file(data_dir / "stack.env") == written, (
            "the same data dir reuses its ports"
        )
        assert asyncio.run(_read_marker(mine)) == ["kept"]
        assert ping_redis(mine.redis_url)
        assert redis.Redis.from_url(mine.redis_url).get("stack-test") == b"kept"
    finally:
        assert cli("down", "--data-dir", str(data_dir)).returncode == 0


def test_a_taken_port_is_refused_with_a_clear_message(tmp_path: Path, endpoints: StackEndpoints) -> None:
    taken = int(endpoints.redis_url.rsplit(":", 1)[1].split("/")[0])
    stack = Stack(StackConfig(tmp_path / "clash", redis_port=taken))
    with pytest.raises(Exception, match=f"port {taken} for redis is taken"):
        stack.up()
    stack.down()
