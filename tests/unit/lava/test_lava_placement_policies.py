"""Placement policies as registered data (LAVA §2.4, §4.2-4.3, §5.3): what each needs, and one
registration that the Borg scheduler's profile and the LAVA study both pick up."""

from __future__ import annotations

import numpy as np
import pytest
from lava_builders import SHAPE, FixedPredictor

from cellpilot.borg.lifetime_tracker import LifetimeTracker
from cellpilot.evaluate.lava_simulator import SimulationConfig, simulate
from cellpilot.evaluate.lava_study import StudyConfig
from cellpilot.lifetimes.predictors import OraclePredictor
from cellpilot.schedule import build_profile, default_profile
from cellpilot.schedule.lifetime_aware import policies
from cellpilot.schedule.lifetime_aware.borg_scorers import Reads
from cellpilot.schedule.lifetime_aware.host_pool import HostPool
from cellpilot.schedule.lifetime_aware.lifetime_ledger import LifetimeLedger
from cellpilot.schedule.lifetime_aware.policies import PlacementPolicy, placement_policy, register_placement
from cellpilot.schedule.lifetime_aware.pool_placement import PoolPlacement
from cellpilot.schedule.profile import PLACEMENT_POLICIES
from cellpilot.workloads.vm_trace import VmTraceConfig, generate_vm_trace


@pytest.mark.parametrize(
    ("name", "levels", "needs", "keeps_host_states"),
    [
        ("best-fit", (), set(), False),
        ("la-binary", ("la-binary",), {Reads.FIRST_PREDICTIONS}, False),
        ("las", ("las",), {Reads.PREDICTIONS}, False),
        ("lava", ("lava", "las"), {Reads.PREDICTIONS, Reads.HOST_STATES}, True),
    ],
)
def test_a_policy_needs_what_its_levels_read(
    name: str, levels: tuple[str, ...], needs: set[Reads], keeps_host_states: bool
) -> None:
    policy = placement_policy(name)
    assert policy.levels == levels
    assert policy.needs == needs
    assert policy.needs_lifetimes == bool(needs)
    assert policy.keeps_host_states == keeps_host_states


def test_the_borg_scheduler_runs_the_policies_its_cell_serves() -> None:
    # LA-Binary reads one-shot predictions that only the study's ledger keeps.
    assert PLACEMENT_POLICIES == ("best-fit", "las", "lava")
    with pytest.raises(ValueError, match="got 'la-binary', which needs first predictions"):
        default_profile(placement="la-binary", lifetimes=LifetimeTracker())


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of the registry, so a test's registrations do not outlive it."""
    monkeypatch.setattr(policies, "_POLICIES", dict(policies._POLICIES))


@pytest.mark.usefixtures("registry")
def test_one_registration_runs_in_the_borg_profile_and_the_study() -> None:
    register_placement(PlacementPolicy("lava-alone", ("lava",)))  # LAVA's preference, no LAS tie-break

    profile = default_profile("best-fit", 0.0, "lava-alone", LifetimeTracker())
    assert profile.scoring.names[-2:] == ("lava", "best-fit")

    t = generate_vm_trace(
        np.random.default_rng(5), VmTraceConfig(days=1.0, hosts=6, calibration_samples=4000)
    )
    sim = SimulationConfig(hosts=6, warmup=0.2 * 86400.0, sample_every=600.0)
    result = simulate(t, "lava-alone", OraclePredictor(t), sim)
    assert result.summary()["name"] == "lava-alone-oracle"
    # It keeps LAVA's host states, so the replay explains placements by LAVA's preference.
    diagnostics = result.summary()["diagnostics"]
    assert "host_class_changes_per_host_day" in diagnostics
    assert set(diagnostics["occupied_pp_by_reason"]) != {"any"}
    with pytest.raises(ValueError, match="needs a lifetime predictor"):
        simulate(t, "lava-alone", None, sim)
    # The study runs it once per predictor, as any policy that reads lifetimes.
    study = StudyConfig(policies=("best-fit", "lava-alone"), predictors=("model", "oracle"))
    assert study.runs() == [("best-fit", None), ("lava-alone", "model"), ("lava-alone", "oracle")]


def test_the_study_scores_with_the_scorers_the_borg_profile_stacks() -> None:
    pool = HostPool(2, SHAPE)
    ledger = LifetimeLedger(FixedPredictor([3600.0]), np.zeros(1), 2)  # type: ignore[arg-type]
    study = PoolPlacement(placement_policy("lava"), pool, ledger)
    live = default_profile("best-fit", 0.0, "lava", LifetimeTracker()).scoring.levels[-3:-1]
    assert [type(level) for level in study.levels] == [type(level.scorer) for level in live]


@pytest.mark.usefixtures("registry")
def test_registering_a_name_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="placement policy 'las' registered twice"):
        register_placement(PlacementPolicy("las", ("las",)))


@pytest.mark.parametrize(
    ("levels", "message"),
    [
        (("lars",), "unknown scorer 'lars'"),
        (("hybrid",), "scorer 'hybrid' is not lifetime-aware"),
    ],
    ids=["unknown", "packing"],
)
def test_a_policy_stacks_lifetime_aware_scorers_only(levels: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlacementPolicy("mine", levels)


def test_a_profile_naming_a_lifetime_scorer_without_a_source_is_refused() -> None:
    with pytest.raises(ValueError, match="scorer 'las' needs a source of lifetime predictions"):
        build_profile({"levels": [{"scorer": "las"}, {"scorer": "hybrid"}]})
