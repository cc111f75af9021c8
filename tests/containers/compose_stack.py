"""What the container tests add to :mod:`cellpilot.stack.compose_project`: the running stack."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cellpilot.stack.compose_project import ComposeStack


@dataclass
class RunningStack:
    compose: ComposeStack
    started: list[str]
    missing: dict[str, str]  # service -> why it was not started
    clean_to_healthy_s: float

    def require(self, *services: str) -> None:
        absent = {s: self.missing[s] for s in services if s in self.missing}
        if absent:
            pytest.fail(
                "needs services that are not in this stack: "
                + "; ".join(f"{s}: {why}" for s, why in absent.items())
                + " (rebuild the images with `make images` once they exist)",
                pytrace=False,
            )
