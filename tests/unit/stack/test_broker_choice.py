"""Which broker a stack runs, how it is started, and what its clients are told."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from cellpilot.stack import StackConfig, StackEndpoints, broker_build, components
from cellpilot.stack.config import BROKER_ENV


@pytest.fixture
def no_durable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A cache with nothing built in it, and no choice in the environment."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(broker_build.BINARY_ENV, raising=False)
    monkeypatch.delenv(BROKER_ENV, raising=False)
    return tmp_path


def _build_fake(root: Path) -> Path:
    binary = broker_build.cache_root() / "bin" / "tansu"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    return binary


def test_auto_takes_the_durable_broker_once_built(no_durable: Path) -> None:
    assert StackConfig(no_durable / "a").with_ports_resolved().broker == "memory"
    binary = _build_fake(no_durable)
    config = StackConfig(no_durable / "a").with_ports_resolved()
    assert config.broker == "durable"
    argv = components.broker(config).argv
    assert argv[0] == str(binary)
    assert "sqlite://kafka/broker.db?maintenance_interval=30s" in argv  # from the data directory
    assert argv[-1] == "--authentication"
    assert "--authentication" not in components.broker(config, authentication=False).argv


def test_the_environment_and_the_config_choose(no_durable: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _build_fake(no_durable)
    monkeypatch.setenv(BROKER_ENV, "memory")
    assert StackConfig(no_durable / "a").with_ports_resolved().broker == "memory"
    assert StackConfig(no_durable / "a", broker="durable").with_ports_resolved().broker == "durable"
    monkeypatch.setenv(BROKER_ENV, "kafka")
    with pytest.raises(ValueError, match="expected durable, memory or auto"):
        StackConfig(no_durable / "a").with_ports_resolved()


def test_a_running_stack_keeps_its_broker(no_durable: Path) -> None:
    """Built while a memory-broker stack runs: a broker restarted mid-run stays the memory one."""
    data = no_durable / "a"
    data.mkdir()
    (data / "stack.json").write_text(json.dumps({"pids": {"kafka": 1}, "broker": "memory"}))
    _build_fake(no_durable)
    assert StackConfig(data).with_ports_resolved().broker == "memory"
    (data / "stack.json").write_text(json.dumps({"pids": {}, "broker": "memory"}))
    assert StackConfig(data).with_ports_resolved().broker == "durable", "stopped: the next up takes it"


def test_clients_are_told_to_log_in_on_the_durable_broker(no_durable: Path) -> None:
    durable = StackConfig(no_durable / "a", broker="durable").with_ports_resolved().endpoints()
    env = durable.as_env()
    assert env["CELLPILOT_KAFKA_SECURITY_PROTOCOL"] == "SASL_PLAINTEXT"
    assert env["CELLPILOT_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
    path = no_durable / "stack.env"
    durable.write_env_file(path)
    assert StackEndpoints.read_env_file(path) == durable
    memory = StackConfig(no_durable / "b", broker="memory").with_ports_resolved().endpoints()
    assert "CELLPILOT_KAFKA_SECURITY_PROTOCOL" not in memory.as_env()
    assert memory.broker_login("aggregator").client_options() == {}
