"""The durable broker's tests each run their own embedded stack with it (one per test module).

The binary is built here when it is missing and ``cargo`` is at hand (20-30 minutes, once); the
tests skip, saying why, only when neither is.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from cellpilot.stack import Stack, StackConfig
from cellpilot.stack.broker_build import build, durable_tansu_binary


@pytest.fixture(scope="module")
def durable_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if durable_tansu_binary() is None:
        if shutil.which("cargo") is None:
            pytest.skip("the durable broker is not built and there is no cargo to build it (make broker)")
        assert build() is not None, "make broker built nothing"
    stack = Stack(StackConfig(tmp_path_factory.mktemp("durable-stack"), broker="durable"))
    stack.up()
    try:
        yield stack
    finally:
        stack.down()


@pytest.fixture(autouse=True)
def _settings_from_the_stack_env_file_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's shared stack exports its own ``CELLPILOT_CERTS_DIR`` (tests/integration/
    conftest.py) for the rest of the session, and the environment wins over a ``stack.env``: a
    durable stack's settings loaded here would then name the shared stack's passwords, and
    the broker rightly refused them. These tests load settings as the durable stack's own
    services see them."""
    for name in ("CELLPILOT_CERTS_DIR", "CELLPILOT_TLS_MODE", "CELLPILOT_BORGLET_IDENTITY"):
        monkeypatch.delenv(name, raising=False)
