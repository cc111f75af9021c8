"""Lifetime-aware placement in the Borgmaster core (LAVA §3-4): history from the log, training,
LAVA host states as logged data that a new master loads, and LARS-ordered drains."""

from __future__ import annotations

import numpy as np
import pytest
from borg_builders import Master, job_spec, machine_spec, replay

from cellpilot.borg.decisions import KillJob, SetMachineState, SubmitJob, drain_step
from cellpilot.borg.lifecycle import TaskEvent
from cellpilot.borg.lifetime_tracker import LifetimeTracker
from cellpilot.borg.model import MachineAvailability
from cellpilot.borg.mutations import LifetimeModelTrained, TaskStateChanged
from cellpilot.borg.scheduling_view import SchedulingView
from cellpilot.borg.task_lifetimes import (
    LifetimeHistory,
    TooLittleHistory,
    TrainedModel,
    class_name,
    drain_plan,
    lars_order,
    predict,
    task_features,
    train_lifetime_model,
)
from cellpilot.job_vocabulary import PriorityBand
from cellpilot.lifetimes.distribution_model import DistributionModel
from cellpilot.lifetimes.lifetime_classes import lifetime_class
from cellpilot.lifetimes.predictors import DEFAULT_CLASS_RISK, estimate_lifetimes
from cellpilot.schedule import SchedulerConfig, default_profile
from cellpilot.schedule.lifetime_aware.lava import EMPTY, OPEN

HOUR_MS = 3_600_000
SHORT_H, LONG_H = 0.5, 20.0  # LC1 and LC3 (LAVA §4.3)


def _lava_master(tracker: LifetimeTracker, placement: str = "lava") -> Master:
    profile = default_profile("best-fit", 0.0, placement, tracker)
    return Master(view=SchedulingView(profile, SchedulerConfig.naive()))


def _history(master: Master, rounds: int = 3) -> None:
    """Rounds of a short-lived (0.5 h, 250 m) and a long-lived (20 h, 2 cores) job, killed by their user."""
    master.add_machines(*(machine_spec(f"m{i}", cpu=64_000, ram_gib=256) for i in range(4)))
    master.grant("alice", PriorityBand.PRODUCTION, cores=10_000, ram_gib=10_000)
    for r in range(rounds):
        master.accept(SubmitJob(f"s{r}", job_spec(f"short-{r}", task_count=10, cpu=250)))
        master.accept(SubmitJob(f"l{r}", job_spec(f"long-{r}", task_count=10, cpu=2000)))
        master.schedule()
        master.now_ms += int(SHORT_H * HOUR_MS)
        master.accept(KillJob(f"ks{r}", f"alice/short-{r}"))
        master.now_ms += int((LONG_H - SHORT_H) * HOUR_MS)
        master.accept(KillJob(f"kl{r}", f"alice/long-{r}"))


def _trained(master: Master) -> TrainedModel:
    history = LifetimeHistory()
    history.feed(master.log)
    trained = train_lifetime_model(history, min_runs=20)
    assert isinstance(trained, TrainedModel)
    return trained


def _with_model(master: Master) -> TrainedModel:
    _history(master)
    trained = _trained(master)
    master.commit([LifetimeModelTrained(trained.model.to_json(), trained.runs, master.now_ms)])
    return trained


def test_history_has_the_runs_that_finished_or_were_killed_not_those_the_system_cut_short() -> None:
    master = Master()
    _history(master, rounds=1)
    master.accept(SubmitJob("e", job_spec("evicted", task_count=2, cpu=100)))
    master.schedule()
    machine = master.state.jobs["alice/evicted"].tasks[0].machine_id
    master.accept(SetMachineState("d", machine, MachineAvailability.DRAINING))
    master.commit(drain_step(master.state, 100))
    history = LifetimeHistory()
    history.feed(master.log)
    assert history.runs == 20
    assert sorted(set(np.round(np.array(history.lifetimes_s) / 3600, 1))) == [SHORT_H, LONG_H]
    assert history.jobs == {"alice/short-0", "alice/long-0"}


def test_too_little_history_is_refused_naming_min_runs() -> None:
    master = Master()
    _history(master, rounds=1)
    history = LifetimeHistory()
    history.feed(master.log)
    outcome = train_lifetime_model(history, min_runs=50)
    assert outcome == TooLittleHistory(20, 50)
    assert "20 finished task runs" in str(outcome)
    assert "min_runs" in str(outcome)


def test_the_model_trained_on_the_cell_separates_short_and_long_jobs() -> None:
    trained = _trained(_history_master())
    assert (trained.runs, trained.jobs) == (60, 6)
    assert trained.runs_per_class == (30, 0, 30, 0)
    short = job_spec("x", cpu=250)
    long = job_spec("y", cpu=2000)
    at_start = predict(trained.model, [(short, 0, 0.0), (long, 0, 0.0)])
    assert [lt.lifetime_class for lt in at_start] == [0, 2]
    assert class_name(at_start[1].lifetime_class) == "LC3 (10-100 h)"


def _history_master() -> Master:
    master = Master()
    _history(master)
    return master


def test_lava_host_states_are_logged_and_a_new_master_loads_the_same_states() -> None:
    tracker = LifetimeTracker()
    master = _lava_master(tracker)
    _with_model(master)
    master.accept(SubmitJob("a", job_spec("batchy", task_count=4, cpu=2000)))
    now = master.now_ms / 1000
    tracker.sync(master.state, master.view.cell, now)
    tracker.expect_pending(master.state, master.view.cell, master.now_ms)
    plan = master.view.plan(master.state, master.now_ms)
    tracker.sync(master.state, master.view.cell, now)
    change = tracker.changes(master.state)
    assert change is not None
    master.commit([*plan.mutations, change])
    hosts = master.state.lava_hosts
    machines = {t.machine_id for t in master.state.jobs["alice/batchy"].tasks.values()}
    assert set(hosts) == machines, "LAVA packs the class onto the host it opened"
    assert all(
        h.state == OPEN and h.lifetime_class == 2 and h.deadline_ms > master.now_ms for h in hosts.values()
    )

    # A new master: state replayed from the log, a fresh copy of the cell, a fresh tracker.
    successor = LifetimeTracker()
    state = replay(master.log)
    view = SchedulingView(default_profile("best-fit", 0.0, "lava", successor))
    view.rebuild(state)
    successor.sync(state, view.cell, now)
    assert state.lava_hosts == hosts
    assert successor.hosts() == hosts
    assert successor.changes(state) is None


def test_a_host_past_its_deadline_moves_one_class_up_and_empties_when_its_tasks_leave() -> None:
    tracker = LifetimeTracker()
    master = _lava_master(tracker)
    _with_model(master)
    master.accept(SubmitJob("a", job_spec("quick", task_count=1, cpu=250)))
    tracker.sync(master.state, master.view.cell, master.now_ms / 1000)
    tracker.expect_pending(master.state, master.view.cell, master.now_ms)
    master.schedule()
    tracker.sync(master.state, master.view.cell, master.now_ms / 1000)
    master.commit([tracker.changes(master.state)])  # type: ignore[list-item]
    (host,) = master.state.lava_hosts.values()
    assert host.lifetime_class == 0
    later = host.deadline_ms / 1000 + 1
    tracker.repredict(master.state, later)
    tracker.advance(later)
    master.commit([tracker.changes(master.state)])  # type: ignore[list-item]
    assert master.state.lava_hosts[host.machine_id].lifetime_class == 1  # §4.3 Figure 5c
    master.accept(KillJob("k", "alice/quick"))
    tracker.sync(master.state, master.view.cell, later)
    change = tracker.changes(master.state)
    assert change is not None
    assert change.hosts[0].state == EMPTY
    master.commit([change])
    assert master.state.lava_hosts == {}


def test_a_drain_evicts_in_lars_order_longest_predicted_remaining_lifetime_first() -> None:
    tracker = LifetimeTracker()
    master = _lava_master(tracker, placement="best-fit")
    _with_model(master)
    master.add_machines(machine_spec("solo", cpu=64_000, ram_gib=256))
    for m in ("m0", "m1", "m2", "m3"):
        master.accept(SetMachineState(f"off-{m}", m, MachineAvailability.DRAINING))
    master.accept(SubmitJob("s", job_spec("brief", task_count=3, cpu=250)))
    master.accept(SubmitJob("l", job_spec("lasting", task_count=3, cpu=2000)))
    master.schedule()
    assert {
        t.machine_id for j in ("alice/brief", "alice/lasting") for t in master.state.jobs[j].tasks.values()
    } == {"solo"}
    tracker.sync(master.state, master.view.cell, master.now_ms / 1000)
    plan = drain_plan(master.state, ["solo"], tracker.predicted)
    assert plan.order == "lars"
    assert [key[0] for key, _ in plan.moves] == ["alice/lasting"] * 3 + ["alice/brief"] * 3
    remaining = [lt.remaining_s for _, lt in plan.moves if lt is not None]
    assert remaining == sorted(remaining, reverse=True)
    master.accept(SetMachineState("d", "solo", MachineAvailability.DRAINING))
    first = drain_step(master.state, 2, lars_order(tracker.predicted))
    assert all(isinstance(m, TaskStateChanged) and m.reason is TaskEvent.EVICTED for m in first)
    assert [m.job_id for m in first] == ["alice/lasting", "alice/lasting"]  # type: ignore[union-attr]


def test_without_a_model_a_drain_keeps_the_machine_order() -> None:
    master = Master()
    master.add_machines(machine_spec("m0"))
    master.grant("alice", PriorityBand.PRODUCTION)
    master.accept(SubmitJob("a", job_spec("web", task_count=2, cpu=500)))
    master.schedule()
    plan = drain_plan(master.state, ["m0"], {})
    assert plan.order == "machine"
    assert [key for key, _ in plan.moves] == [("alice/web", 0), ("alice/web", 1)]


@pytest.mark.parametrize("placement", ["lava ", "first-fit", ""], ids=["space", "unknown", "empty"])
def test_an_unknown_placement_policy_is_refused_naming_the_choices(placement: str) -> None:
    with pytest.raises(ValueError, match="placement policy must be one of best-fit, las, lava"):
        default_profile(placement=placement, lifetimes=LifetimeTracker())


def test_las_and_lava_need_a_source_of_predictions() -> None:
    with pytest.raises(ValueError, match="needs a source of lifetime predictions"):
        default_profile(placement="las")


def test_the_levels_sit_right_above_packing() -> None:
    names = default_profile("best-fit", 0.0, "lava", LifetimeTracker()).scoring.names
    assert names[-3:] == ("lava", "las", "best-fit")
    assert default_profile("best-fit").scoring.names[-2:] == ("weighted", "best-fit")


def test_host_states_and_the_model_round_trip_through_records_and_snapshots() -> None:
    from cellpilot.borg_wire import checkpoint as checkpoint_codec

    tracker = LifetimeTracker()
    master = _lava_master(tracker)
    _with_model(master)
    master.accept(SubmitJob("a", job_spec("batchy", task_count=2, cpu=2000)))
    tracker.sync(master.state, master.view.cell, master.now_ms / 1000)
    tracker.expect_pending(master.state, master.view.cell, master.now_ms)
    plan = master.view.plan(master.state, master.now_ms)
    tracker.sync(master.state, master.view.cell, master.now_ms / 1000)
    master.commit([*plan.mutations, tracker.changes(master.state)])  # type: ignore[list]
    for record in master.log:
        assert checkpoint_codec.record_in(checkpoint_codec.record_out(record).SerializeToString()) == record
    data = checkpoint_codec.snapshot_out(master.state, 1).SerializeToString()
    restored = checkpoint_codec.snapshot_in(data)
    assert restored.lava_hosts == master.state.lava_hosts != {}
    assert restored.lifetime_model == master.state.lifetime_model is not None
    assert restored.describe() == master.state.describe()


def _mixed_history(master: Master, rounds: int = 4) -> None:
    """Rounds of four jobs of one shape: three killed after 0.5 h, one after 20 h."""
    master.add_machines(*(machine_spec(f"m{i}", cpu=64_000, ram_gib=256) for i in range(4)))
    master.grant("alice", PriorityBand.PRODUCTION, cores=10_000, ram_gib=10_000)
    for r in range(rounds):
        for name in ("a", "b", "c", "d"):
            master.accept(SubmitJob(f"{name}{r}", job_spec(f"{name}-{r}", task_count=10, cpu=500)))
        master.schedule()
        master.now_ms += int(SHORT_H * HOUR_MS)
        for name in ("a", "b", "c"):
            master.accept(KillJob(f"k{name}{r}", f"alice/{name}-{r}"))
        master.now_ms += int((LONG_H - SHORT_H) * HOUR_MS)
        master.accept(KillJob(f"kd{r}", f"alice/d-{r}"))


def test_the_cell_predicts_with_the_studys_model_and_class_rule() -> None:
    """A task that lives 0.5 h three times in four and 20 h otherwise: its mean remaining lifetime
    (about 5.4 h) is LC2, but it outlives 10 h one time in four, so LAVA's risk class is LC3, as in
    the offline study (one rule: :func:`cellpilot.lifetimes.predictors.risk_classes`)."""
    master = Master()
    _mixed_history(master)
    trained = _trained(master)
    assert isinstance(trained.model, DistributionModel)
    spec = job_spec("x", cpu=500)
    (lifetime,) = predict(trained.model, [(spec, 0, 0.0)])
    assert lifetime_class(lifetime.remaining_s) == 1
    assert lifetime.lifetime_class == 2
    study = estimate_lifetimes(trained.model, task_features(spec, 0)[None, :], [0.0], DEFAULT_CLASS_RISK)
    assert (lifetime.remaining_s, lifetime.lifetime_class) == (
        float(study.remaining[0]),
        int(study.lifetime_class[0]),
    )
    # Once it has run 1 h, it is one of the long ones: E[T_r | T_u] and the class follow (§3).
    (later,) = predict(trained.model, [(spec, 0, 3600.0)])
    assert later.remaining_s > 5 * 3600
    assert later.lifetime_class == 2


def test_lava_places_a_task_by_its_risk_class() -> None:
    tracker = LifetimeTracker()
    master = _lava_master(tracker)
    _mixed_history(master)
    trained = _trained(master)
    master.commit([LifetimeModelTrained(trained.model.to_json(), trained.runs, master.now_ms)])
    master.accept(SubmitJob("n", job_spec("next", task_count=2, cpu=500)))
    tracker.sync(master.state, master.view.cell, master.now_ms / 1000)
    tracker.expect_pending(master.state, master.view.cell, master.now_ms)
    master.schedule()
    tracker.sync(master.state, master.view.cell, master.now_ms / 1000)
    master.commit([tracker.changes(master.state)])  # type: ignore[list-item]
    classes = [h.lifetime_class for h in master.state.lava_hosts.values()]
    assert classes
    assert set(classes) == {2}


def test_a_log_holding_a_model_of_another_format_leaves_the_tracker_idle() -> None:
    tracker = LifetimeTracker()
    master = _lava_master(tracker)
    _history(master, rounds=1)
    master.commit([LifetimeModelTrained('{"format": "cellpilot.lifetime-model/1"}', 20, master.now_ms)])
    tracker.sync(master.state, master.view.cell, master.now_ms / 1000)
    assert not tracker.active
    assert tracker.changes(master.state) is None
