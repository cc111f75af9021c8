"""The event-driven replay (LAVA §5.1): empty hosts, failed placements, drains and migrations."""

from __future__ import annotations

import numpy as np
import pytest
from lava_builders import HOUR, MINUTE, SHAPE, trace

from cellpilot.evaluate.lava_simulator import DrainConfig, SimulationConfig, simulate
from cellpilot.lifetimes.predictors import OraclePredictor
from cellpilot.schedule.lifetime_aware.lars import MigrationOrder
from cellpilot.workloads.vm_trace import VmTraceConfig, generate_vm_trace


def config(hosts: int = 2, **kw: object) -> SimulationConfig:
    return SimulationConfig(hosts=hosts, host_shape=SHAPE, warmup=0.0, **kw)  # type: ignore[arg-type]


def test_empty_hosts_over_time_by_hand() -> None:
    # A (6 cores, 0-10 h) lands on host 0; B (6 cores, 1-2 h) does not fit next to it: host 1;
    # C (2 cores, 3-5 h) goes next to A (best fit).
    t = trace([(0.0, 10 * HOUR, 6.0, 4.0), (1 * HOUR, 2 * HOUR, 6.0, 4.0), (3 * HOUR, 5 * HOUR, 2.0, 4.0)])
    result = simulate(t, "best-fit", None, config())
    assert (result.placements, result.failed) == (3, 0)
    # Brute force: a sample at time s sees the state after the events at s.
    hosts_of = [0, 1, 0]
    samples = np.arange(0.0, 10 * HOUR + 1, 600.0)
    expected = []
    for s in samples:
        busy = {hosts_of[i] for i in range(3) if t.created[i] <= s < t.deleted[i]}
        expected.append(100.0 * (2 - len(busy)) / 2)
    np.testing.assert_allclose(result.sample_times, samples)
    np.testing.assert_allclose(result.empty_pct, expected)


def test_vms_that_fit_nowhere_fail() -> None:
    t = trace([(0.0, HOUR, 8.0, 4.0), (0.0, HOUR, 8.0, 4.0), (1.0, HOUR, 8.0, 4.0), (2.0, HOUR, 20.0, 4.0)])
    result = simulate(t, "best-fit", None, config())
    assert (result.placements, result.failed) == (2, 2)


def test_vms_running_at_the_start_are_placed_first() -> None:
    t = trace(
        [(-5 * HOUR, 2 * HOUR, 6.0, 4.0), (-1 * HOUR, 3 * HOUR, 6.0, 4.0), (1 * HOUR, 4 * HOUR, 1.0, 1.0)]
    )
    result = simulate(t, "best-fit", None, config())
    assert result.placements == 3
    assert result.empty_pct[0] == 0.0  # both hosts busy at time 0


def drain_trace() -> object:
    # Row 0 (D) exits at 1 h 15 min; rows 1-3 live 100 h. All start on host 0 (1 core each).
    return trace([(0.0, 75 * MINUTE, 1.0, 1.0)] + [(0.0, 100 * HOUR, 1.0, 1.0)] * 3, horizon=1.9 * HOUR)


@pytest.mark.parametrize(
    ("order", "migrations"),
    [(MigrationOrder.TRACE, 4), (MigrationOrder.LARS, 3)],
    ids=["trace-order", "lars"],
)
def test_maintenance_drain_and_migration_order(order: MigrationOrder, migrations: int) -> None:
    # Maintenance at 1 h drains host 0. Trace order moves D, 1, 2 at once and 3 at 1 h 20; LARS
    # moves 1, 2, 3 first, and by 1 h 20 D has exited: one migration fewer (§6.3).
    t = drain_trace()
    drain = DrainConfig(maintenance_every=HOUR, maintenance_hosts=1, order=order)
    result = simulate(t, "las", OraclePredictor(t), config(drain=drain))
    assert result.migration_requests == 4
    assert result.migrations == migrations
    assert result.drain_rounds >= 1
    np.testing.assert_array_equal(result.request_rows[:4], [0, 1, 2, 3])
    # Host 0 is empty again (and available) once drained: one of the two hosts is empty at the end.
    assert result.empty_pct[-1] == 50.0


def test_defragmentation_triggers_below_the_threshold() -> None:
    # Best fit: row 0 (2 cores) and row 1 (7 cores, exits at 1 h) on host 0, row 2 (3 cores) on
    # host 1. At 1 h one host of three is empty (33 % < 40 %): the defragmenter drains host 0
    # (one VM, most room), whose VM fits next to row 2, and host 0 is empty again.
    t = trace(
        [(0.0, 50 * HOUR, 2.0, 1.0), (0.0, 1 * HOUR, 7.0, 1.0), (0.0, 50 * HOUR, 3.0, 1.0)], horizon=4 * HOUR
    )
    drain = DrainConfig(defrag_below_pct=40.0, defrag_hosts=1)
    result = simulate(t, "best-fit", None, config(hosts=3, drain=drain))
    np.testing.assert_array_equal(result.request_rows, [0])
    assert result.migrations == 1
    assert result.empty_pct[-1] == pytest.approx(200 / 3)


def test_defragmentation_skips_hosts_whose_vms_fit_nowhere_else() -> None:
    # Two hosts holding 6 cores each and one empty host: merging is impossible, so no drain.
    t = trace([(0.0, 50 * HOUR, 6.0, 1.0), (0.0, 50 * HOUR, 6.0, 1.0)], horizon=4 * HOUR)
    result = simulate(t, "best-fit", None, config(hosts=3, drain=DrainConfig(defrag_below_pct=40.0)))
    assert (result.drain_rounds, result.migrations) == (0, 0)


@pytest.mark.parametrize("policy", ["best-fit", "la-binary", "las", "lava"])
def test_synthetic_replay_keeps_books(policy: str) -> None:
    t = generate_vm_trace(
        np.random.default_rng(5), VmTraceConfig(days=1.0, hosts=6, calibration_samples=5000)
    )
    predictor = None if policy == "best-fit" else OraclePredictor(t)
    drain = DrainConfig(defrag_below_pct=20.0, maintenance_every=4 * HOUR)
    result = simulate(t, policy, predictor, SimulationConfig(hosts=6, warmup=0.0, drain=drain))
    alive = int(np.sum((t.deleted > 0) & (t.created < t.horizon)))
    assert result.placements + result.failed == alive
    assert np.all((result.empty_pct >= 0) & (result.empty_pct <= 100))
    assert np.all(result.cpu_stranding_pct >= 0)
    assert result.migrations <= result.migration_requests
    row = result.summary()
    assert row["name"] == (policy if predictor is None else f"{policy}-oracle")


@pytest.mark.parametrize("policy", ["best-fit", "las", "lava"])
def test_occupancy_by_placement_reason_adds_up_to_the_non_empty_hosts(policy: str) -> None:
    # Each placement extends its host's (true) busy time by a known amount; over a run these
    # extensions add up to the busy host-time, so the breakdown by reason explains all of it.
    t = generate_vm_trace(
        np.random.default_rng(5), VmTraceConfig(days=1.0, hosts=6, calibration_samples=4000)
    )
    sim = SimulationConfig(hosts=6, warmup=0.2 * 86400.0, sample_every=60.0)
    result = simulate(t, policy, None if policy == "best-fit" else OraclePredictor(t), sim)
    d = result.summary()["diagnostics"]
    occupied = sum(sum(v.values()) for v in d["occupied_pp_by_reason"].values())
    assert occupied == pytest.approx(100.0 - float(np.mean(result.empty_pct)), abs=1.0)
    assert d["lost_empty_pp_total"] == 0.0  # the oracle never underpredicts
    if policy == "lava":
        assert set(d["occupied_pp_by_reason"]) <= {
            "gap_filler",
            "open_same_class",
            "non_empty_fallback",
            "empty_host",
        }
        assert "host_class_changes_per_host_day" in d
    else:
        assert set(d["occupied_pp_by_reason"]) == {"any"}
