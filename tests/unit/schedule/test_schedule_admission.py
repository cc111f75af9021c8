"""Priority bands, who may preempt whom, and quota admission (Borg §2.5)."""

from __future__ import annotations

import pytest
from schedule_builders import shape

from cellpilot.job_vocabulary import PriorityBand
from cellpilot.schedule import Admitted, PlacementJob, QuotaBook, Rejected, Resources, band_of, may_preempt
from cellpilot.schedule.priority import is_prod
from cellpilot.units import GIB


@pytest.mark.parametrize(
    ("priority", "band", "prod"),
    [(0, PriorityBand.BEST_EFFORT, False), (1, PriorityBand.BEST_EFFORT, False),
     (2, PriorityBand.BATCH, False), (8, PriorityBand.BATCH, False), (9, PriorityBand.PRODUCTION, True),
     (10, PriorityBand.PRODUCTION, True), (11, PriorityBand.MONITORING, True)],
    ids=["p0", "p1", "p2", "p8", "p9", "p10", "p11"],
)  # fmt: skip
def test_bands_follow_the_trace_levels(priority: int, band: PriorityBand, prod: bool) -> None:
    assert band_of(priority) == band
    assert is_prod(priority) == prod


@pytest.mark.parametrize(
    ("preemptor", "victim", "allowed"),
    [
        (5, 4, True),  # batch over lower batch
        (5, 5, False),  # never an equal priority
        (4, 5, False),  # never a higher priority
        (9, 8, True),  # production over batch
        (10, 9, False),  # production never preempts production (§2.5)
        (11, 10, True),  # monitoring over production
        (11, 11, False),
        (2, 1, True),  # batch over best effort
        (1, 0, True),
    ],
    ids=[
        "batch>batch",
        "equal",
        "lower",
        "prod>batch",
        "prod>prod",
        "mon>prod",
        "mon>mon",
        "batch>free",
        "free>free",
    ],
)
def test_who_may_preempt(preemptor: int, victim: int, allowed: bool) -> None:
    assert may_preempt(preemptor, victim) == allowed


def job(name: str, priority: int, count: int, cores: float, ram: float, user: str = "alice") -> PlacementJob:
    return PlacementJob(name, user, count, shape(priority=priority, cores=cores, ram_gib=ram))


QUOTA = Resources.of(100, 400, 1000, 100)


@pytest.mark.parametrize(
    ("new_job", "admitted", "resource", "over_by"),
    [
        (job("fits", 9, 10, 5, 20), True, None, 0.0),
        (job("exact", 9, 10, 10, 40), True, None, 0.0),
        (job("cpu", 9, 11, 10, 1), False, "cpu", 10_000.0),  # 110 cores asked, 100 left
        (job("ram", 9, 2, 1, 250), False, "ram", 100 * GIB),  # 500 GiB asked, 400 left
        (job("other-band", 5, 1, 1, 1), False, "cpu", 1000.0),  # no batch quota at all
        (job("free", 0, 10_000, 64, 1024), True, None, 0.0),  # infinite quota at priority 0
    ],
    ids=["fits", "exact", "cpu-over", "ram-over", "no-quota-in-band", "priority-zero"],
)
def test_admission_checks_quota_per_band(
    new_job: PlacementJob, admitted: bool, resource: str | None, over_by: float
) -> None:
    book = QuotaBook()
    book.set_quota("alice", PriorityBand.PRODUCTION, QUOTA)
    verdict = book.admit(new_job)
    assert isinstance(verdict, Admitted) == admitted
    if not admitted:
        assert isinstance(verdict, Rejected)
        assert verdict.resource == resource
        assert verdict.over_by == pytest.approx(over_by)
        assert resource in verdict.reason
        assert "over by" in verdict.reason


def test_admission_charges_and_release_refunds() -> None:
    book = QuotaBook()
    book.set_quota("alice", PriorityBand.PRODUCTION, QUOTA)
    assert isinstance(book.admit(job("a", 9, 6, 10, 1)), Admitted)  # 60 cores
    second = book.admit(job("b", 10, 5, 10, 1))  # 50 more: 10 over
    assert isinstance(second, Rejected)
    assert second.available == pytest.approx(40_000.0)
    book.release("a")
    assert isinstance(book.admit(job("b", 10, 5, 10, 1)), Admitted)
    assert book.used("alice", PriorityBand.PRODUCTION).cpu == pytest.approx(50_000.0)


def test_update_replaces_the_old_demand() -> None:
    book = QuotaBook()
    book.set_quota("alice", PriorityBand.PRODUCTION, QUOTA)
    book.admit(job("a", 9, 8, 10, 1))  # 80 cores
    assert isinstance(book.update(job("a", 9, 10, 10, 1)), Admitted)  # 100: fits once the 80 are returned
    assert isinstance(book.update(job("a", 9, 11, 10, 1)), Rejected)
    assert book.used("alice", PriorityBand.PRODUCTION).cpu == pytest.approx(100_000.0)


def test_jobs_in_an_alloc_set_are_not_charged_again() -> None:
    book = QuotaBook()
    inside = PlacementJob("inside", "alice", 100, shape(priority=9, cores=50, alloc_set="allocs"))
    assert isinstance(book.admit(inside), Admitted)
