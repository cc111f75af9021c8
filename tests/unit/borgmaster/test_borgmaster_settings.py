"""The Borgmaster's GPA and placement settings: validated with one line naming them (GPA §4, LAVA §4)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from cellpilot_services.borgmaster.settings import BorgmasterSettings


@pytest.mark.parametrize("rho", [0.0, 0.01, 0.25])
def test_gpa_rho_accepts_off_and_overflow_probabilities(rho: float) -> None:
    settings = BorgmasterSettings(gpa_rho=rho, gpa_min_samples=5)
    assert settings.gpa_rho == rho
    assert settings.cpu_learning.min_samples == 5


@pytest.mark.parametrize("rho", [-0.1, 0.5, 1.0])
def test_gpa_rho_out_of_range_is_refused_naming_the_setting(rho: float) -> None:
    with pytest.raises(ValidationError, match="CELLPILOT_BORGMASTER_GPA_RHO"):
        BorgmasterSettings(gpa_rho=rho)


def test_the_service_refuses_to_start_with_one_line_naming_the_bad_setting() -> None:
    env = {**os.environ, "CELLPILOT_BORGMASTER_GPA_RHO": "0.7"}
    done = subprocess.run(
        [sys.executable, "-m", "cellpilot_services.borgmaster"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("invalid Borgmaster settings: gpa_rho:")
    assert "must be in (0, 0.5); got 0.7" in lines[0]


@pytest.mark.parametrize("policy", ["best-fit", "las", "lava"])
def test_placement_policy_accepts_the_baseline_las_and_lava(policy: str) -> None:
    assert BorgmasterSettings(placement_policy=policy).placement_policy == policy


@pytest.mark.parametrize("policy", ["LAVA", "lars", "worst-fit", ""])
def test_an_unknown_placement_policy_is_refused_naming_the_setting(policy: str) -> None:
    with pytest.raises(ValidationError, match="CELLPILOT_BORGMASTER_PLACEMENT_POLICY"):
        BorgmasterSettings(placement_policy=policy)


def test_the_service_refuses_to_start_with_an_unknown_placement_policy() -> None:
    env = {**os.environ, "CELLPILOT_BORGMASTER_PLACEMENT_POLICY": "lars"}
    done = subprocess.run(
        [sys.executable, "-m", "cellpilot_services.borgmaster"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("invalid Borgmaster settings: placement_policy:")
    assert "must be one of best-fit, las, lava; got 'lars'" in lines[0]
