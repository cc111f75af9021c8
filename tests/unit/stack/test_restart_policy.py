"""The supervisor's restart policy: exponential backoff per process, and giving up on a crash loop."""

from __future__ import annotations

import pytest

from cellpilot.stack.restart_policy import RestartHistory, RestartPolicy

POLICY = RestartPolicy(
    initial_backoff_s=1.0, max_backoff_s=8.0, max_restarts=5, window_s=100.0, stable_after_s=30.0
)


def deaths(history: RestartHistory, times_and_uptimes: list[tuple[float, float]]) -> list[float | None]:
    """The delay decided for each death, None where the history gave up."""
    decided: list[float | None] = []
    for now, uptime in times_and_uptimes:
        decision = history.decide(now, uptime)
        decided.append(None if decision.give_up else decision.delay_s)
    return decided


@pytest.mark.parametrize(
    ("times_and_uptimes", "expected"),
    [
        ([(10.0, 1.0)], [1.0]),
        ([(10.0, 1.0), (12.0, 1.0), (15.0, 1.0)], [1.0, 2.0, 4.0]),
        # The cap: 1, 2, 4, 8, 8 (the fifth restart is still within the limit of 5).
        ([(0.0, 1.0), (2.0, 1.0), (5.0, 1.0), (10.0, 1.0), (19.0, 1.0)], [1.0, 2.0, 4.0, 8.0, 8.0]),
        # A process that ran past stable_after_s starts the backoff over.
        ([(10.0, 1.0), (12.0, 1.0), (60.0, 45.0)], [1.0, 2.0, 1.0]),
    ],
    ids=["first-death", "doubles", "capped", "reset-after-stable-run"],
)
def test_backoff_doubles_per_quick_death_up_to_the_cap(
    times_and_uptimes: list[tuple[float, float]], expected: list[float]
) -> None:
    assert deaths(RestartHistory(POLICY), times_and_uptimes) == expected


def test_gives_up_when_restarted_max_restarts_times_within_the_window() -> None:
    history = RestartHistory(POLICY)
    quick = [(float(t), 0.5) for t in (0, 2, 5, 10, 19)]
    assert None not in deaths(history, quick)
    decision = history.decide(40.0, 0.5)
    assert decision.give_up
    assert decision.recent_restarts == 5
    assert history.restarts == 5, "giving up is not a restart"


def test_restarts_older_than_the_window_do_not_count() -> None:
    history = RestartHistory(POLICY)
    assert None not in deaths(history, [(float(t), 0.5) for t in (0, 2, 5, 10)])
    # Restarts happened at 1, 4, 9 and 18; 150 s later all are outside the 100 s window.
    decision = history.decide(150.0, 31.0)
    assert not decision.give_up
    assert decision.recent_restarts == 0
    assert decision.delay_s == 1.0, "it ran past stable_after_s, so the backoff started over"


def test_max_restarts_zero_never_restarts() -> None:
    history = RestartHistory(RestartPolicy(max_restarts=0))
    assert history.decide(5.0, 1.0).give_up
    assert history.restarts == 0


def test_a_long_crash_loop_does_not_overflow_the_backoff() -> None:
    history = RestartHistory(RestartPolicy(max_restarts=10_000, window_s=1.0, max_backoff_s=30.0))
    delays = deaths(history, [(t * 40.0, 0.1) for t in range(2_000)])
    assert delays[-1] == 30.0


@pytest.mark.parametrize(
    "arguments",
    [
        {"initial_backoff_s": -1.0},
        {"initial_backoff_s": 5.0, "max_backoff_s": 1.0},
        {"max_restarts": -1},
        {"window_s": 0.0},
        {"stable_after_s": 0.0},
    ],
    ids=["negative-backoff", "cap-below-initial", "negative-limit", "empty-window", "zero-stable"],
)
def test_an_invalid_policy_is_refused_naming_the_field(arguments: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(arguments))):
        RestartPolicy(**arguments)  # type: ignore[arg-type]
