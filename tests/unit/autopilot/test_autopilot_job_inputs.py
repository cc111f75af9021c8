"""What the Autopilot master keeps of a job's recommenders (:mod:`cellpilot.autopilot.job_inputs`)
and their wire form: every output read in and written back the same, field for field."""

from __future__ import annotations

import math

import pytest
from test_autopilot_job_recommendations import CONFIG, stream

from cellpilot.api.v1 import job_pb2, recommendation_pb2, resources_pb2
from cellpilot.autopilot.decisions import Candidate, HorizontalConfig, HorizontalInput
from cellpilot.autopilot.job_inputs import JobInputs
from cellpilot.autopilot.job_recommendations import RecommenderState, apply_histograms
from cellpilot.autopilot.selection import RecommenderRef
from cellpilot.autopilot.vertical_targets import ClampReason
from cellpilot.job_vocabulary import HorizontalSource, RecommenderKind
from cellpilot.usage.buckets import Resource
from cellpilot_services.autopilot import convert
from cellpilot_services.recommender.convert import recommendation_set

P95 = RecommenderRef.builtin(RecommenderKind.MOVING_WINDOW_P95)


def candidate(
    end_ms: int, value: float, ref: RecommenderRef = P95, resource: Resource = Resource.CPU
) -> Candidate:
    return Candidate(ref, resource, value, value, 0.0, end_ms, f"{ref.label}/{end_ms}/{value}")


def test_a_newer_window_replaces_an_older_one_and_an_older_one_is_ignored() -> None:
    inputs = JobInputs()
    for offered in (candidate(2, 500.0), candidate(1, 900.0), candidate(2, 600.0)):
        inputs.offer_vertical(offered)
    assert [c.value for c in inputs.vertical.values()] == [600.0]  # the later of window 2
    inputs.offer_horizontal(HorizontalInput(5, "h5", usage_statistic=10.0))
    inputs.offer_horizontal(HorizontalInput(4, "h4", usage_statistic=99.0))
    assert inputs.horizontal["builtin"].recommendation_id == "h5"
    assert inputs.newest_window_ms == 5


def test_a_new_batch_replaces_what_is_stored_key_by_key() -> None:
    custom = RecommenderRef.custom("mine")
    stored = JobInputs.of(
        [candidate(9, 100.0), candidate(9, 200.0, custom), candidate(9, 1e9, resource=Resource.MEMORY)],
        [HorizontalInput(9, "hs", usage_statistic=1.0)],
    )
    # The batch's output replaces the stored one of its key even if its window is older (a
    # recommender restarted on an older window is believed, as the master always did).
    batch = JobInputs.of(
        [candidate(3, 300.0)], [HorizontalInput(8, "hc", raw_task_count=4.0, producer="mine")]
    )
    known = stored.updated_with(batch)
    cpu = known.candidates()[Resource.CPU]
    assert {label: c.value for label, c in cpu.items()} == {P95.label: 300.0, custom.label: 200.0}
    assert [c.value for c in known.candidates()[Resource.MEMORY].values()] == [1e9]
    assert set(known.horizontal) == {"builtin", "custom:mine"}
    assert stored.vertical[candidate(0, 0).key].value == 100.0  # the stored inputs are not changed
    assert not JobInputs()
    assert known


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (HorizontalConfig(), "hs"),
        (HorizontalConfig(source=HorizontalSource.TARGET_SIZE, target_size_recommender="mine"), "hc"),
        (HorizontalConfig(source=HorizontalSource.TARGET_SIZE, target_size_recommender="other"), None),
    ],
    ids=["cpu-signal", "its-target-size-recommender", "another-recommender"],
)
def test_the_signal_is_that_of_the_jobs_horizontal_source(
    config: HorizontalConfig, expected: str | None
) -> None:
    inputs = JobInputs.of(
        [], [HorizontalInput(9, "hs", usage_statistic=1.0), HorizontalInput(8, "hc", 3.0, 4.0, "mine")]
    )
    signal = inputs.signal(config)
    assert (signal.recommendation_id if signal is not None else None) == expected


# ----- the wire form, as the master reads it from Kafka and keeps it in Redis --------------------


def _recommender_set() -> recommendation_pb2.RecommendationSet:
    states: dict[str, RecommenderState] = {}
    apply_histograms(CONFIG, states, stream({"j": 1.0}, windows=3))
    return recommendation_set("u/j", states["j"], 900_000, "worker-0", CONFIG)


def test_every_recommendation_of_a_worker_is_kept_byte_for_byte() -> None:
    rs = _recommender_set()
    assert any(rec.explanation.HasField("ml_model") for rec in rs.vertical)
    candidates = convert.candidates_in(rs)
    assert len(candidates) == len(rs.vertical) == 14
    for rec, kept in zip(rs.vertical, candidates, strict=True):
        assert convert.candidate_out(kept).SerializeToString() == rec.SerializeToString()
    ml = next(c for c in candidates if c.ref.kind is RecommenderKind.ML and c.ml_model is not None)
    assert ml.ml_model.decay_rate > 0
    assert {c.clamped_by for c in candidates} <= {ClampReason.NONE, ClampReason.LAST_HOUR_MAX}
    (signal,) = convert.horizontal_inputs_in(rs)
    assert (
        convert.horizontal_input_out(signal, rs.job_id).SerializeToString()
        == rs.horizontal[0].SerializeToString()
    )


def test_a_custom_recommenders_output_is_kept_whole_and_another_jobs_is_left_out() -> None:
    custom = job_pb2.RecommenderRef(kind=job_pb2.RECOMMENDER_KIND_CUSTOM, custom_name="mine")
    rec = recommendation_pb2.Recommendation(
        recommendation_id="u/j/memory/custom:mine/600000",
        job_id="u/j",
        resource=resources_pb2.RESOURCE_MEMORY,
        recommender=custom,
        value=3 << 30,
        raw_value=2 << 30,
        margin=1 << 30,
        explanation=recommendation_pb2.Explanation(
            ml_model=recommendation_pb2.MlModelChoice(
                model_index=0, decay_rate=0.5, safety_margin=0.0, cost=0.0
            ),
            clamped_by=recommendation_pb2.CLAMP_REASON_MAX_BOUND,
            unclamped_value=4 << 30,
            note="from the team's model",
        ),
        window_end_ms=600_000,
        history_start_ms=300_000,
    )
    foreign = recommendation_pb2.Recommendation()
    foreign.CopyFrom(rec)
    foreign.job_id = "u/other"
    no_value = recommendation_pb2.Recommendation(
        job_id="u/j", resource=resources_pb2.RESOURCE_CPU, recommender=custom, window_end_ms=1
    )
    rs = recommendation_pb2.RecommendationSet(job_id="u/j", vertical=[rec, foreign, no_value])
    kept, empty = convert.candidates_in(rs)
    assert kept.ml_model is not None  # present though every field of it is zero
    assert (kept.clamped_by, kept.history_start_ms, kept.key) == (
        ClampReason.MAX_BOUND,
        300_000,
        "memory|custom:mine",
    )
    assert convert.candidate_out(kept).SerializeToString() == rec.SerializeToString()
    assert math.isnan(empty.value)
    assert convert.candidate_out(empty).SerializeToString() == no_value.SerializeToString()

    hrec = recommendation_pb2.HorizontalRecommendation(
        recommendation_id="u/j/tasks/custom:mine/600000",
        job_id="u/j",
        recommender=custom,
        raw_task_count=0.0,  # a target-size recommender may ask for no task at all
        task_count=1,  # its own stabilised view: the master stabilises for itself and keeps n_r only
        window_end_ms=600_000,
    )
    unnamed = recommendation_pb2.HorizontalRecommendation(
        recommender=job_pb2.RecommenderRef(kind=job_pb2.RECOMMENDER_KIND_CUSTOM)
    )
    (signal,) = convert.horizontal_inputs_in(
        recommendation_pb2.RecommendationSet(job_id="u/j", horizontal=[hrec, unnamed])
    )
    assert (signal.label, signal.raw_task_count) == ("custom:mine", 0.0)
    again = convert.horizontal_input_in(convert.horizontal_input_out(signal, "u/j"))
    assert again == signal
