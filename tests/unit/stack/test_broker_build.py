"""Where the durable broker is looked for, and what `make broker` says without cargo."""

from __future__ import annotations

import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cellpilot.stack import broker_build


def test_the_cache_is_named_after_the_build(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(broker_build.BINARY_ENV, raising=False)
    assert broker_build.cache_root() == tmp_path / "cellpilot" / "tansu-0.6.0-libsql"
    assert broker_build.durable_tansu_binary() is None, "nothing built there yet"
    binary = broker_build.cache_root() / "bin" / "tansu"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    assert broker_build.durable_tansu_binary() is None, "not executable"
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    assert broker_build.durable_tansu_binary() == binary


def test_without_cargo_one_line_and_the_warning(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(broker_build.BINARY_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no cargo on it
    said: list[str] = []
    assert broker_build.build(said.append) is None
    assert said[0] == "broker: cargo is not installed, so the durable broker cannot be built"
    assert "lost on every broker restart" in said[1]
    assert "authenticates no one" in said[1]
    assert not list(tmp_path.iterdir()), "nothing built, nothing written"


def test_builders_at_the_same_time_wait_for_one_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Parallel test workers (or a second `make broker`) must not start builds of their own."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(broker_build.BINARY_ENV, raising=False)
    tools = tmp_path / "tools"
    tools.mkdir()
    calls = tmp_path / "cargo-calls"
    cargo = tools / "cargo"
    # A stand-in for `cargo install ... --root DIR`: slow enough for the others to arrive.
    cargo.write_text(
        "#!/bin/sh\n"
        f'echo called >> "{calls}"\n'
        'while [ "$1" != "--root" ]; do shift; done\n'
        "sleep 1\n"
        'mkdir -p "$2/bin" && printf "#!/bin/sh\\n" > "$2/bin/tansu" && chmod +x "$2/bin/tansu"\n'
        'echo "Finished"\n'
    )
    cargo.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    with ThreadPoolExecutor(3) as pool:
        built = list(pool.map(lambda _: broker_build.build(lambda _line: None), range(3)))
    assert built == [broker_build.cache_root() / "bin" / "tansu"] * 3
    assert calls.read_text().count("called") == 1
