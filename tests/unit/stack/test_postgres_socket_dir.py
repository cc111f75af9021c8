"""The embedded PostgreSQL's socket directory: in the data directory when a socket path fits."""

from __future__ import annotations

from pathlib import Path

from cellpilot.stack import StackConfig
from cellpilot.stack.config import MAX_SOCKET_DIR_CHARS


def test_a_short_data_directory_keeps_its_socket_inside() -> None:
    config = StackConfig(Path("/tmp/c"))
    assert config.postgres_socket_dir == Path("/tmp/c/postgres/socket")


def test_a_deep_data_directory_gets_a_short_private_socket_directory_of_its_own(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    socket_dir = StackConfig(deep).postgres_socket_dir
    assert len(str(socket_dir / ".s.PGSQL.65535")) < 108, "fits a Unix socket address"
    assert len(str(socket_dir)) <= MAX_SOCKET_DIR_CHARS
    assert socket_dir == StackConfig(deep).postgres_socket_dir, "the same data directory, the same socket"
    assert socket_dir != StackConfig(deep / "other").postgres_socket_dir
