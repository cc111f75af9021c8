"""Replay diagnostics: per-class mispredictions, overstay, host-time by placement reason, lost empty hosts."""

from __future__ import annotations

import numpy as np
import pytest
from lava_builders import HOUR, pool, trace

from cellpilot.evaluate.lava_diagnostics import (
    EMPTY_HOST,
    FALLBACK,
    GAP_FILLER,
    OPEN_SAME,
    ReplayDiagnostics,
    placement_reason,
)
from cellpilot.schedule.lifetime_aware.lava import RANK_EMPTY, RANK_NON_EMPTY, RANK_OPEN_SAME


@pytest.mark.parametrize(
    ("rank", "reason"),
    [
        (0, GAP_FILLER),
        (2, GAP_FILLER),
        (RANK_OPEN_SAME, OPEN_SAME),
        (RANK_NON_EMPTY, FALLBACK),
        (RANK_EMPTY, EMPTY_HOST),
    ],
)
def test_placement_reasons_follow_lavas_order(rank: int, reason: int) -> None:
    assert placement_reason(rank, RANK_OPEN_SAME) == reason


def test_mispredictions_overstay_and_extensions() -> None:
    # VM 0 opens host 0 for 0-5 h, predicted 0.5 h (class 0, truly class 1: underpredicted,
    # 4 h past its class bound); VM 1 joins it for 1-3 h predicted 20 h (overpredicted) and
    # adds no busy time; VM 2 joins at 4 h until 8 h, extending the host by 3 h.
    t = trace(
        [(0.0, 5 * HOUR, 1.0, 1.0), (HOUR, 3 * HOUR, 1.0, 1.0), (4 * HOUR, 8 * HOUR, 1.0, 1.0)],
        horizon=10 * HOUR,
    )
    d = ReplayDiagnostics(t, n_hosts=1, warmup=0.0)
    d.placed(0, 0.0, 0.5 * HOUR, EMPTY_HOST, set())
    d.placed(1, HOUR, 20 * HOUR, GAP_FILLER, {0})
    d.placed(2, 4 * HOUR, 4 * HOUR, OPEN_SAME, {0})
    s = d.summary(10 / 24)
    assert s["class_confusion_at_placement"][0][1] == 1
    assert s["class_confusion_at_placement"][2][1] == 1
    assert s["underpredicted_share_by_class"][0] == 1.0
    assert s["overpredicted_share_by_class"][2] == 1.0
    assert s["underpredicted_vms"] == 1
    assert s["overstay_hours_median"] == pytest.approx(4.0)
    occupied = s["occupied_pp_by_reason"]
    assert occupied["empty_host"]["class_under"] == pytest.approx(50.0)  # 5 of 10 hours
    assert occupied["gap_filler"]["class_over"] == 0.0
    assert occupied["open_same_class"]["class_right"] == pytest.approx(30.0)


def test_a_host_held_only_by_overdue_vms_counts_as_lost() -> None:
    t = trace([(0.0, 5 * HOUR, 1.0, 1.0), (0.0, 5 * HOUR, 1.0, 1.0)], horizon=10 * HOUR)
    p = pool(2)
    d = ReplayDiagnostics(t, n_hosts=2, warmup=0.0)
    for row, (host, predicted) in enumerate([(0, 0.5), (1, 9.0)]):
        d.placed(row, 0.0, predicted * HOUR, EMPTY_HOST, set())
        p.place(host, row, np.array([1.0, 1.0, 0.0]))
    d.sample(2 * HOUR, p)  # host 0 should have been empty at 0.5 h; host 1 is still expected busy
    s = d.summary(1.0)
    assert s["lost_empty_pp_total"] == pytest.approx(50.0)
    assert s["lost_empty_pp_class_miss"]["empty_host"] == pytest.approx(50.0)  # predicted <1 h, lives 5 h
