"""Shared pytest configuration: where test artifacts (screenshots, reports) go."""

from __future__ import annotations

from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``slow`` first (in their collection order), then the rest: the parallel
    workers start the long ones at once instead of finishing on them one after another."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
