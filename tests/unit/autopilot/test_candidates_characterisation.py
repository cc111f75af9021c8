"""The candidates' numbers, bit for bit, as the seven fixed columns computed them.

``data/candidates_characterisation.npz`` was recorded by :func:`record` from the code before
the recommenders became composable estimators (Autopilot §3.2.2 statistics + margin + the max
over the last hour; §3.2.3 ensemble + the max over the last hour). Every output of every step
of a few seeded job histories, with OOMs among them, and the final state's bytes must come
out exactly the same (numpy equality, NaN equal to NaN) from the composed code.

To record again (only when a change of the numbers is intended and explained)::

    .venv/bin/python -c "import tests.unit.autopilot.test_candidates_characterisation as t; t.record()"
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from cellpilot.autopilot.candidates import (
    CandidateConfig,
    CandidateState,
    apply_oom,
    initial_candidate_state,
    oom_bumped_value,
    update_candidates,
)
from cellpilot.recommend.ml_ensemble import EnsembleConfig, ModelGrid
from cellpilot.units import GIB
from cellpilot.usage.buckets import Resource

FIXTURE = Path(__file__).parent / "data" / "candidates_characterisation.npz"
FIVE_MIN = 300_000
JOBS, STEPS = 4, 36
SEEDS = (1, 2, 3)
BATCH_FIELDS = ("time_ms", "value", "raw_value", "margin", "raised_by_window_max", "ml_model", "ml_cost")
BATCH_FIELDS_WITH_OOM = (*BATCH_FIELDS, "oom_bumped")


def seeded_histories(resource: Resource, seed: int) -> list[npt.NDArray[np.float64]]:
    """Per step a (JOBS, K) histogram matrix: a few tasks' lognormal samples around a per-job
    level that steps up after a third of the steps and down after two thirds."""
    scheme = CandidateConfig.for_resource(resource).scheme
    rng = np.random.default_rng(seed)
    unit = 1000.0 if resource is Resource.CPU else GIB
    level = rng.uniform(0.1, 6.0, JOBS) * unit
    out = []
    for step in range(STEPS):
        factor = 1.6 if STEPS // 3 <= step < 2 * STEPS // 3 else 1.0
        tasks = int(rng.integers(3, 25))
        values = level[:, None] * factor * rng.lognormal(0.0, 0.3, (JOBS, tasks))
        counts = np.zeros((JOBS, scheme.size))
        for j in range(JOBS):
            np.add.at(counts[j], scheme.index_of(values[j]), 1.0)
        out.append(counts)
    return out


# A small ensemble whose models do switch on these histories (the defaults keep model 0 here).
SWITCHING_ENSEMBLE = EnsembleConfig(
    grid=ModelGrid.product((0.5, 0.1, 0.02), (0.0, 0.25, 1.0)),
    w_underrun=0.005,
    cost_at_previous_limit=True,
    normalise_histograms=True,
    cost_decay=0.1,
)


def scenarios() -> dict[str, CandidateConfig]:
    cpu = CandidateConfig.for_resource(Resource.CPU)
    memory = CandidateConfig.for_resource(Resource.MEMORY)
    return {
        "cpu": cpu,
        "cpu_switching_ml": CandidateConfig.for_resource(Resource.CPU, SWITCHING_ENSEMBLE),
        "memory": memory,
        "memory_switching_ml": CandidateConfig.for_resource(Resource.MEMORY, SWITCHING_ENSEMBLE),
        "memory_no_ml": replace(memory, with_ml=False),
        "memory_only_ml": replace(memory, with_window=False),
    }


def run(config: CandidateConfig, seed: int) -> dict[str, npt.NDArray[object]]:
    """Every batch output of every step (histograms and, for memory, OOMs) and the final state."""
    state = initial_candidate_state(config, JOBS)
    outputs: dict[str, list[npt.NDArray[object]]] = {}
    rng = np.random.default_rng(seed + 100)
    for step, counts in enumerate(seeded_histories(config.resource, seed)):
        end = (step + 1) * FIVE_MIN
        state, batch = update_candidates(config, state, counts, np.full(JOBS, end, dtype=np.int64))
        for name in BATCH_FIELDS_WITH_OOM:
            outputs.setdefault(f"update_{name}", []).append(getattr(batch, name))
        if config.resource is Resource.MEMORY and step % 7 == 5:
            limit = np.nan_to_num(batch.value[:, 0], nan=0.0)
            hit = rng.random(JOBS) < 0.5
            usage = np.where(hit, limit * 1.02, 0.0)
            bumped = oom_bumped_value(config, np.where(hit, limit, 0.0), usage)
            state, reaction = apply_oom(config, state, bumped, np.full(JOBS, end + 1_000, dtype=np.int64))
            for name in BATCH_FIELDS_WITH_OOM:
                outputs.setdefault(f"oom_{name}", []).append(getattr(reaction, name))
    arrays = {name: np.stack(values) for name, values in outputs.items()}
    arrays["state_bytes"] = np.frombuffer(state.to_bytes(), dtype=np.uint8)
    return arrays


def record() -> None:
    """Write the fixture from the code as it is (see the module's docstring)."""
    arrays = {
        f"{name}/{seed}/{key}": value
        for name, config in scenarios().items()
        for seed in SEEDS
        for key, value in run(config, seed).items()
    }
    np.savez_compressed(FIXTURE, **arrays)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def recorded() -> dict[str, npt.NDArray[object]]:
    with np.load(FIXTURE) as data:
        return {name: data[name] for name in data.files}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scenario", sorted(scenarios()))
def test_every_output_and_the_state_are_bit_for_bit_those_recorded(
    recorded: dict[str, npt.NDArray[object]], scenario: str, seed: int
) -> None:
    config = scenarios()[scenario]
    now = run(config, seed)
    prefix = f"{scenario}/{seed}/"
    expected = {key[len(prefix) :]: value for key, value in recorded.items() if key.startswith(prefix)}
    assert set(now) == set(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(now[key], value, err_msg=key, strict=True)
    # The recorded bytes (the layout the workers keep in Redis) read back as the same state.
    restored = CandidateState.from_bytes(expected["state_bytes"].tobytes())
    assert restored.to_bytes() == now["state_bytes"].tobytes()
