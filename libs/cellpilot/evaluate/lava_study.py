"""The LAVA study: LA-Binary, LAS and LAVA against best fit, with the model and an oracle.

Reproduces the comparisons of the LAVA paper on a trace:

* the lifetime model's accuracy (§3, §6.4, §6.5): precision and recall of the 7-day
  short/long split at creation, precision at 70 % recall, and Figure 9's F1 by
  uptime quantile, measured on the replayed trace (the model never sees it);
* Figure 6: empty hosts of each policy x predictor against best fit, with CPU and
  memory stranding (§2.3) and the migrations each run needed (§4.4);
* Table 2 / §6.3: the migrations of a separate best-fit run with rolling maintenance
  drains (§5.1's modified simulator), replayed in trace order and in LARS order (oracle
  and model predictions).

The model is trained on a *history*: for the synthetic trace, another trace drawn
from the same generator with a different seed; for a real trace, the part before the
replayed window. Everything here is pure: :func:`run_study` returns plain data and
the CLI writes it out (via :mod:`cellpilot.evaluate.report`); an Azure table is read by the
caller (``cellpilot.traces.azure``) and passed in. Each policy x predictor run, and the LARS
maintenance run, is one shard of a :class:`~cellpilot.evaluate.sharding.ShardRunner`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from cellpilot.evaluate.lava_simulator import (
    DrainConfig,
    SimulationConfig,
    SimulationResult,
    simulate,
)
from cellpilot.evaluate.sharding import IN_PROCESS, ShardRunner
from cellpilot.lifetimes.accuracy import (
    SEVEN_DAYS,
    f1_by_uptime_quantile,
    long_lived_scores,
    precision_at_recall,
)
from cellpilot.lifetimes.calibration import calibration_report
from cellpilot.lifetimes.distribution import LifetimeDistribution
from cellpilot.lifetimes.distribution_model import DistributionModel, DistributionParams
from cellpilot.lifetimes.features import vm_features
from cellpilot.lifetimes.lifetime_classes import LIFETIME_CLASS_UPPER, NUM_LIFETIME_CLASSES, lifetime_class
from cellpilot.lifetimes.model import LifetimeModel, TrainingParams
from cellpilot.lifetimes.predictors import (
    DEFAULT_CLASS_RISK,
    DistributionPredictor,
    LifetimePredictor,
    ModelPredictor,
    OraclePredictor,
)
from cellpilot.lifetimes.vm_table import DAY, HOUR, VmTrace, lifetime_shape, thin_to_pool, window_trace
from cellpilot.schedule.lifetime_aware.host_pool import HostShape
from cellpilot.schedule.lifetime_aware.lars import MigrationOrder, MigrationRequests, replay_migrations
from cellpilot.schedule.lifetime_aware.policies import BASELINE, placement_names, placement_policy
from cellpilot.workloads.vm_trace import VmTraceConfig, generate_vm_trace

PREDICTORS = ("model", "oracle")
MODELS = ("distribution", "point")  # §3's lifetime distributions, or one E[T_r | T_u] value
SYNTHETIC_TRACES = ("synthetic", "synthetic-shifted")
# The held-out synthetic population: other lifetime modes, categories and tiers, other owners.
SHIFTED = {
    "population": "shifted",
    "owners": 150,
    "world_seed": 7,
    "owner_effect": 1.5,
    "daily_amplitude": 0.6,
}
Model = LifetimeModel | DistributionModel
StudyProgress = Callable[[str, float], None]


@dataclass(frozen=True)
class StudyConfig:
    trace: str = "synthetic"  # "synthetic", "synthetic-shifted" or "azure:PATH"
    hosts: int = 100
    days: float = 14.0
    seed: int = 0
    policies: tuple[str, ...] = field(default_factory=placement_names)  # every registered policy
    predictors: tuple[str, ...] = PREDICTORS
    host_shape: HostShape = field(default_factory=HostShape)
    utilisation: float = 0.7  # synthetic demand (and Azure thinning) target, share of cores
    history_days: float = 21.0  # length of the training history
    warmup_days: float = 1.0
    model: str = "distribution"  # one of MODELS
    training: TrainingParams = field(default_factory=TrainingParams)  # the point model's
    distribution: DistributionParams = field(default_factory=DistributionParams)
    # LAVA's class from a distribution: the shortest class the VM outlives with at most this
    # probability (see DistributionPredictor).
    class_risk: float = DEFAULT_CLASS_RISK
    # Drains in the policy runs (Figure 6). §6.1 replays creations and exits only; the
    # defragmenter (§4.4) drains hosts when empty hosts run short, which is itself a result
    # of the policy. Rolling maintenance drains, off here by default, reshuffle every pool
    # the same way and wash the placement differences out (see docs/results/lava.md).
    drain: DrainConfig = field(default_factory=lambda: DrainConfig(defrag_below_pct=5.0))
    # §5.1's "modified simulator" for LARS (§6.3): a separate best-fit run with rolling
    # maintenance, whose migration requests are replayed in trace order and LARS order.
    lars_drain: DrainConfig = field(
        default_factory=lambda: DrainConfig(maintenance_every=6 * HOUR, maintenance_hosts=2)
    )
    stranding_every_hours: float = 6.0

    def __post_init__(self) -> None:
        known = placement_names()
        unknown = [p for p in self.policies if p not in known]
        if unknown or not self.policies:
            raise ValueError(f"unknown policies {unknown}; known: {', '.join(known)}")
        bad = [p for p in self.predictors if p not in PREDICTORS]
        if bad or not self.predictors:
            raise ValueError(f"unknown predictors {bad}; known: {', '.join(PREDICTORS)}")
        if not (self.trace in SYNTHETIC_TRACES or self.trace.startswith("azure:")):
            raise ValueError(f"trace must be one of {', '.join(SYNTHETIC_TRACES)} or 'azure:PATH'")
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; known: {', '.join(MODELS)}")
        if not 0 < self.class_risk < 1:
            raise ValueError("class_risk must be in (0, 1)")
        if self.hosts < 1 or self.days <= 0 or self.history_days <= 0 or not 0 < self.utilisation < 1:
            raise ValueError("hosts >= 1, days > 0, history_days > 0, utilisation in (0, 1)")

    def runs(self) -> list[tuple[str, str | None]]:
        """(policy, predictor) pairs: best fit once, lifetime-aware policies per predictor."""
        out: list[tuple[str, str | None]] = []
        for policy in self.policies:
            if placement_policy(policy).needs_lifetimes:
                out.extend((policy, p) for p in self.predictors)
            else:
                out.append((policy, None))
        return out


@dataclass(frozen=True)
class StudyInputs:
    trace: VmTrace  # the replayed trace
    history: VmTrace  # VMs with known lifetimes the model trains on


def load_inputs(config: StudyConfig, table: VmTrace | None = None) -> StudyInputs:
    """The replayed trace and the training history (see module doc); ``table``: the Azure VM
    table of an ``azure:PATH`` study, already read."""
    capacity = config.hosts * config.host_shape.cores
    if config.trace in SYNTHETIC_TRACES:
        shape = config.host_shape
        population: dict[str, Any] = SHIFTED if config.trace == "synthetic-shifted" else {}
        base = VmTraceConfig(
            **population,
            days=config.days,
            hosts=config.hosts,
            host_cores=shape.cores,
            host_memory_gib=shape.memory_gib,
            host_ssd_gib=shape.ssd_gib,
            target_core_utilisation=config.utilisation,
        )
        trace = generate_vm_trace(np.random.default_rng([config.seed, 1]), base)
        history = generate_vm_trace(
            np.random.default_rng([config.seed, 2]), replace(base, days=config.history_days)
        )
        return StudyInputs(trace, history.subset(history.created >= 0.0))
    if table is None:
        raise ValueError(f"{config.trace}: the Azure VM table must be read first (cellpilot.traces.azure)")
    full = table
    split = min(config.history_days * DAY, 0.5 * full.horizon)
    end = min(split + config.days * DAY, full.horizon)
    history = full.subset((full.created >= 0.0) & (full.created < split))
    window = window_trace(full, split, end)
    trace = thin_to_pool(window, np.random.default_rng([config.seed, 3]), capacity, config.utilisation)
    return StudyInputs(trace, history)


def train_model(config: StudyConfig, history: VmTrace) -> Model:
    """The study's lifetime model, trained on ``history`` (VMs in creation order)."""
    if config.model == "point":
        return LifetimeModel.train(vm_features(history), history.lifetime, config.training)
    return DistributionModel.train(vm_features(history), history.lifetime, config.distribution)


def model_accuracy(model: Model, trace: VmTrace, quantiles: int = 20) -> dict[str, Any]:
    """§3/§6.4/§6.5 accuracy and calibration on the VMs created inside ``trace`` (uncensored ones)."""
    test = trace.subset((trace.created >= 0.0) & ~trace.censored)
    features = vm_features(test)
    at_creation = model.predict_remaining(features, np.zeros(len(test)))
    distribution = None
    if isinstance(model, DistributionModel):
        dist_model = model

        def distribution(rows: np.ndarray, uptime: float) -> LifetimeDistribution:
            return dist_model.predict_distribution(features[rows], uptime)

    def point(rows: np.ndarray, uptime: float) -> np.ndarray:
        return model.predict_remaining(features[rows], uptime)

    calibration = calibration_report(distribution, point, test.lifetime, LIFETIME_CLASS_UPPER, lifetime_class)
    scores = long_lived_scores(at_creation, test.lifetime, SEVEN_DAYS)
    precision70, recall70 = precision_at_recall(at_creation, test.lifetime, 0.7, SEVEN_DAYS)
    return {
        "test_vms": len(test),
        "long_lived_vms": scores.positives,
        "precision_7d": scores.precision,
        "recall_7d": scores.recall,
        "f1_7d": scores.f1,
        "precision_at_70_recall": precision70,
        "recall_at_that_point": recall70,
        "f1_by_uptime_quantile": f1_by_uptime_quantile(model, features, test.lifetime, quantiles).tolist(),
        "class_confusion": class_confusion(at_creation, test.lifetime).tolist(),
        "calibration": calibration,
    }


def class_confusion(predicted_remaining: np.ndarray, true_lifetime: np.ndarray) -> np.ndarray:
    """Counts of VMs by LAVA lifetime class (§4.3): rows true class, columns predicted at creation."""
    counts = np.zeros((NUM_LIFETIME_CLASSES, NUM_LIFETIME_CLASSES), dtype=np.int64)
    np.add.at(counts, (lifetime_class(true_lifetime), lifetime_class(predicted_remaining)), 1)
    return counts


def lars_replay(
    result: SimulationResult, trace: VmTrace, model: Model | None, config: DrainConfig
) -> dict[str, Any]:
    """§6.3: the run's migration requests in trace order vs LARS order (oracle, model)."""
    rows, times = result.request_rows, result.request_times
    exit_times = trace.deleted[rows]

    def count(order: MigrationOrder, predicted: np.ndarray) -> int:
        requests = MigrationRequests(times, exit_times, predicted, result.request_ranks)
        return replay_migrations(requests, order, config.slots, config.migration_seconds).migrated

    baseline = count(MigrationOrder.TRACE, exit_times)
    out: dict[str, Any] = {"source_run": result.name, "requests": int(rows.size), "trace_order": baseline}
    predictions = {"oracle": exit_times}
    if model is not None and rows.size:
        uptime = np.maximum(times - trace.created[rows], 0.0)
        predictions["model"] = times + model.predict_remaining(vm_features(trace)[rows], uptime)
    for name, predicted in predictions.items():
        migrated = count(MigrationOrder.LARS, predicted)
        out[f"lars_{name}"] = migrated
        out[f"lars_{name}_reduction_pct"] = 100.0 * (baseline - migrated) / baseline if baseline else 0.0
    return out


def _goals(rows: dict[str, dict[str, Any]], lars: dict[str, Any]) -> dict[str, dict[str, Any]]:
    def gain(name: str) -> float | None:
        row = rows.get(name)
        return None if row is None else float(row["empty_hosts_over_best_fit_pp"])

    def check(label: str, left: str, op: str, right: str | float) -> tuple[str, dict[str, Any]]:
        a = gain(left)
        b = gain(right) if isinstance(right, str) else right
        if a is None or b is None:
            return label, {"met": None, "detail": "not run"}
        met = a >= b if op == ">=" else a > b
        return label, {"met": bool(met), "detail": f"{left} {a:+.2f} pp {op} {right} {b:+.2f} pp"}

    goals = dict(
        [
            check("model: LAVA >= LAS", "lava-model", ">=", "las-model"),
            check("model: LAS > LA-Binary", "las-model", ">", "la-binary-model"),
            check("model: LA-Binary > best fit", "la-binary-model", ">", 0.0),
            check("oracle: LAS > LA-Binary", "las-oracle", ">", "la-binary-oracle"),
        ]
    )
    for name in ("oracle", "model"):
        key = f"lars_{name}"
        if key in lars:
            met = lars[key] < lars["trace_order"]
            goals[f"LARS ({name}) needs fewer migrations than trace order"] = {
                "met": bool(met),
                "detail": f"{lars[key]} vs {lars['trace_order']} of {lars['requests']} requested",
            }
    return goals


LARS_RUN = "LARS drain run"


@dataclass(frozen=True)
class RunContext:
    """What every simulation shard needs."""

    trace: VmTrace
    model: Model
    sim: SimulationConfig
    lars_drain: DrainConfig
    class_risk: float = DEFAULT_CLASS_RISK


def simulate_run(context: RunContext, run: tuple[str, str | None] | None) -> SimulationResult:
    """One shard: one policy x predictor run, or (``None``) §5.1's best-fit run with maintenance drains."""
    if run is None:
        return simulate(context.trace, BASELINE, None, replace(context.sim, drain=context.lars_drain))
    policy, predictor_name = run
    predictor: LifetimePredictor | None = None
    if predictor_name == "oracle":
        predictor = OraclePredictor(context.trace)
    elif predictor_name == "model" and isinstance(context.model, DistributionModel):
        predictor = DistributionPredictor(context.model, context.trace, context.class_risk)
    elif predictor_name == "model" and isinstance(context.model, LifetimeModel):
        predictor = ModelPredictor(context.model, context.trace)
    return simulate(context.trace, policy, predictor, context.sim)


def run_label(run: tuple[str, str | None] | None) -> str:
    if run is None:
        return LARS_RUN
    policy, predictor = run
    return policy if predictor is None else f"{policy}-{predictor}"


def run_study(
    config: StudyConfig,
    progress: StudyProgress | None = None,
    *,
    runner: ShardRunner = IN_PROCESS,
    table: VmTrace | None = None,
) -> dict[str, Any]:
    """Runs every policy x predictor of ``config``; returns the summary as plain data.

    ``progress(label, fraction)`` tells when each run starts (0) and ends (1).
    """

    def tell(label: str, fraction: float) -> None:
        if progress is not None:
            progress(label, fraction)

    tell("loading trace", 0.0)
    inputs = load_inputs(config, table)
    trace = inputs.trace
    tell("loading trace", 1.0)
    tell("training the lifetime model", 0.0)
    history = inputs.history
    model = train_model(config, history)
    tell("training the lifetime model", 1.0)
    accuracy = {
        "training_vms": len(history),
        "kind": config.model,
        "label": config.training.label.value if config.model == "point" else "lifetime bins",
        **model_accuracy(model, trace),
    }
    sim = SimulationConfig(
        hosts=config.hosts,
        host_shape=config.host_shape,
        warmup=min(config.warmup_days * DAY, 0.25 * trace.horizon),
        end=trace.horizon,
        stranding_every=config.stranding_every_hours * HOUR,
        drain=config.drain,
        inflation_seed=config.seed,
    )
    lars_run = config.lars_drain.maintenance_every > 0 or config.lars_drain.defrag_below_pct > 0
    runs: list[tuple[str, str | None] | None] = [*config.runs(), *([None] if lars_run else [])]
    for run in runs:
        tell(run_label(run), 0.0)
    context = RunContext(trace, model, sim, config.lars_drain, config.class_risk)
    outcomes = runner.map(simulate_run, context, runs, on_done=lambda i: tell(run_label(runs[i]), 1.0))
    results = {run_label(run): result for run, result in zip(runs, outcomes, strict=True) if run is not None}
    baseline = results.get(BASELINE)
    rows: dict[str, dict[str, Any]] = {}
    for name, result in results.items():
        row = result.summary()
        row["empty_hosts_over_best_fit_pp"] = (
            row["empty_hosts_pct_mean"] - baseline.summary()["empty_hosts_pct_mean"] if baseline else None
        )
        rows[name] = row
    lars: dict[str, Any] = {}
    if lars_run:
        source = outcomes[-1]
        if source.migration_requests:
            lars = lars_replay(source, trace, model, config.lars_drain)
            lars["source_run"] = (
                f"{BASELINE}, maintenance {config.lars_drain.maintenance_hosts} hosts every "
                f"{config.lars_drain.maintenance_every / HOUR:g} h, defrag below "
                f"{config.lars_drain.defrag_below_pct:g} % empty"
            )
    return {
        "settings": {
            "trace": config.trace,
            "hosts": config.hosts,
            "days": trace.horizon / DAY,
            "seed": config.seed,
            "utilisation_target": config.utilisation,
            "host_shape": {
                "cores": config.host_shape.cores,
                "memory_gib": config.host_shape.memory_gib,
                "ssd_gib": config.host_shape.ssd_gib,
            },
            "model": config.model,
            "class_risk": config.class_risk if config.model == "distribution" else None,
            "uptime_input": config.distribution.uptime_input if config.model == "distribution" else None,
            "label": config.training.label.value if config.model == "point" else None,
            "label_cap_hours": config.training.label_cap_hours if config.model == "point" else None,
            "warmup_days": sim.warmup / DAY,
            "defrag_below_pct": config.drain.defrag_below_pct,
            "maintenance_every_hours": config.drain.maintenance_every / HOUR,
            "lars_maintenance_every_hours": config.lars_drain.maintenance_every / HOUR,
            "lars_maintenance_hosts": config.lars_drain.maintenance_hosts,
        },
        "trace": {
            "vms": len(trace),
            "running_at_start": int(np.sum(trace.created < 0)),
            **lifetime_shape(trace),
        },
        "model": accuracy,
        "rows": list(rows.values()),
        "lars": lars,
        "goals": _goals(rows, lars),
        "series": {
            name: {"t_days": (r.sample_times / DAY).tolist(), "empty_pct": r.empty_pct.tolist()}
            for name, r in results.items()
        },
    }
