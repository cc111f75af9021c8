"""The synthetic VM trace (LAVA §2.1, Figure 2) and the Azure VM table reader."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from lava_builders import HOUR, trace

from cellpilot.lifetimes.vm_table import DAY, VmTrace, lifetime_shape, thin_to_pool, window_trace
from cellpilot.traces.azure import parse_azure_vm_table, read_azure_vm_table
from cellpilot.workloads.vm_trace import VmTraceConfig, generate_vm_trace

SMALL = VmTraceConfig(days=3.0, hosts=20, calibration_samples=20_000)


@pytest.fixture(scope="module")
def synthetic() -> VmTrace:
    return generate_vm_trace(np.random.default_rng(7), SMALL)


def test_same_seed_same_trace_and_other_seed_differs(synthetic: VmTrace) -> None:
    again = generate_vm_trace(np.random.default_rng(7), SMALL)
    np.testing.assert_array_equal(again.created, synthetic.created)
    np.testing.assert_array_equal(again.deleted, synthetic.deleted)
    other = generate_vm_trace(np.random.default_rng(8), SMALL)
    assert len(other) != len(synthetic) or not np.array_equal(other.created, synthetic.created)


def test_table_invariants(synthetic: VmTrace) -> None:
    assert np.all(np.diff(synthetic.created) >= 0)
    assert np.all(synthetic.deleted >= synthetic.created)
    assert synthetic.horizon == 3 * DAY
    running = synthetic.created < 0
    assert running.any()  # the steady-state population at the start
    assert np.all(synthetic.deleted[running] > 0)
    assert np.all(synthetic.created[~running] < synthetic.horizon)
    assert set(np.unique(synthetic.cores)) <= {1.0, 2.0, 4.0, 8.0, 16.0, 32.0}


def test_most_vms_short_most_core_hours_long(synthetic: VmTrace) -> None:
    shape = lifetime_shape(synthetic)
    assert shape["vm_share_short"] > 0.75  # §2.1: 88 % of VMs live under an hour
    assert shape["core_hours_share_long"] > 0.9  # §2.1: 98 % of core-hours in VMs of an hour or more


def test_lifetimes_depend_on_features_only_partly(synthetic: VmTrace) -> None:
    # VMs with identical features still live anywhere from minutes to days (a mixture, §2.1/§3).
    keys = np.column_stack(
        [synthetic.category, synthetic.owner, synthetic.tier, synthetic.cores, synthetic.ssd_gib]
    )
    _, group, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    group = group.reshape(-1)
    big = np.flatnonzero(counts >= 10)
    assert big.size
    spreads = [np.ptp(np.log10(synthetic.lifetime[group == g])) for g in big]
    assert max(spreads) > 2.0  # over 100x between the shortest and longest VM of one feature vector


def test_demand_is_near_the_target(synthetic: VmTrace) -> None:
    t = np.linspace(0, synthetic.horizon, 50)
    cores = [synthetic.cores[(synthetic.created <= s) & (synthetic.deleted > s)].sum() for s in t]
    share = np.mean(cores) / (SMALL.hosts * SMALL.host_cores)
    assert 0.4 < share < 1.1  # target 0.75; the heavy tail makes small pools noisy


def test_lifetime_shape_by_hand() -> None:
    t = trace([(0.0, 0.5 * HOUR, 1.0, 1.0), (0.0, 0.5 * HOUR, 1.0, 1.0), (0.0, 9 * DAY, 1.0, 1.0)])
    shape = lifetime_shape(t)
    assert shape["vm_share_short"] == pytest.approx(2 / 3)
    assert shape["core_hours_share_long"] == pytest.approx(216 / 217)
    assert shape["remaining_after_1d_days"] == pytest.approx(8.0)
    assert shape["remaining_after_7d_days"] == pytest.approx(2.0)


def test_window_and_thinning() -> None:
    t = trace([(0.0, 1 * HOUR, 1.0, 1.0), (2 * HOUR, 5 * HOUR, 4.0, 1.0), (6 * HOUR, 7 * HOUR, 1.0, 1.0)])
    w = window_trace(t, 3 * HOUR, 6 * HOUR)
    np.testing.assert_allclose(w.created, [-1 * HOUR])
    np.testing.assert_allclose(w.deleted, [2 * HOUR])
    assert w.horizon == 3 * HOUR
    # The window holds 1 core for 2 of its 3 hours: light enough for a 4-core pool at 90 %.
    thinned = thin_to_pool(w, np.random.default_rng(0), capacity_cores=4.0, utilisation=0.9)
    assert len(thinned) == 1  # already light enough: unchanged
    many = trace([(0.0, 10 * HOUR, 1.0, 1.0)] * 400)
    kept = thin_to_pool(many, np.random.default_rng(0), capacity_cores=100.0, utilisation=0.5)
    assert 30 < len(kept) < 75  # 400 cores on average, 50 wanted: about one VM in eight kept


AZURE_ROWS = [
    "vm-a,sub-1,dep-1,0,3600,90.0,10.0,50.0,Interactive,2,4",
    "vm-b,sub-1,dep-1,300,7200,90.0,10.0,50.0,Delay-insensitive,>24,>64",
    "vm-c,sub-2,dep-2,600,2592000,90.0,10.0,50.0,Unknown,8,32",
    "broken,row",
    "vm-d,sub-3,dep-3,900,600,90.0,10.0,50.0,Interactive,2,4",  # deleted before created: skipped
]


def test_parse_headerless_azure_rows() -> None:
    t = parse_azure_vm_table(AZURE_ROWS)
    assert len(t) == 3
    np.testing.assert_allclose(t.created, [0, 300, 600])
    np.testing.assert_allclose(t.lifetime, [3600, 6900, 2592000 - 600])
    np.testing.assert_allclose(t.cores, [2, 48, 8])  # ">24" read as 2 x 24
    np.testing.assert_allclose(t.memory_gib, [4, 128, 32])
    assert [t.category_names[c] for c in t.category] == ["Interactive", "Delay-insensitive", "Unknown"]
    np.testing.assert_array_equal(t.owner, [0, 0, 1])  # sub-1 is the most frequent subscription
    np.testing.assert_array_equal(t.censored, [False, False, True])  # alive at the last timestamp


def test_parse_with_a_header_in_any_order() -> None:
    header = "vmcreated,vmid,subscriptionid,deploymentid,vmdeleted,maxcpu,avgcpu,p95maxcpu,"
    header += "vmcategory,vmcorecountbucket,vmmemorybucket"
    t = parse_azure_vm_table([header, "100,vm-x,s,d,700,1,1,1,Interactive,4,8"])
    np.testing.assert_allclose([t.created[0], t.deleted[0], t.cores[0], t.memory_gib[0]], [100, 700, 4, 8])


def test_rare_subscriptions_share_an_owner_code() -> None:
    rows = [f"v{i},sub-{i % 5},d,{i},{i + 10},1,1,1,Unknown,2,4" for i in range(20)]
    t = parse_azure_vm_table(rows, max_owners=3)
    assert set(t.owner.tolist()) == {0, 1, 2}


def test_read_plain_and_gzip_files(tmp_path: Path) -> None:
    plain = tmp_path / "vmtable.csv"
    plain.write_text("\n".join(AZURE_ROWS) + "\n")
    packed = tmp_path / "vmtable.csv.gz"
    with gzip.open(packed, "wt") as handle:
        handle.write("\n".join(AZURE_ROWS) + "\n")
    a, b = read_azure_vm_table(plain), read_azure_vm_table(packed)
    np.testing.assert_array_equal(a.created, b.created)
    assert a.source == "azure:vmtable.csv"


def test_empty_table_is_an_error() -> None:
    with pytest.raises(ValueError, match="no VM rows"):
        parse_azure_vm_table(["garbage"])


def test_the_shifted_population_is_a_different_world() -> None:
    # The held-out population (LAVA study "synthetic-shifted") moves every lifetime mode.
    base = VmTraceConfig(days=1.0, hosts=10, calibration_samples=5000)
    default = generate_vm_trace(np.random.default_rng(0), base)
    shifted = generate_vm_trace(
        np.random.default_rng(0), VmTraceConfig(**{**base.__dict__, "population": "shifted"})
    )
    inside_d, inside_s = default.created >= 0, shifted.created >= 0
    assert np.median(shifted.lifetime[inside_s]) > 1.5 * np.median(default.lifetime[inside_d])
    assert shifted.category_names == default.category_names
    with pytest.raises(ValueError, match="unknown population"):
        VmTraceConfig(population="martian")
