"""Charts of things over time besides a job's limits: the horizontal section of the job page
(Autopilot §3.3) and the cell's utilisation (Borg §5.5), as SVG like the other charts.

Element ids: ``horizontal-task-count``, ``horizontal-raw-<recommender>``, ``horizontal-decision``,
``horizontal-demand``, ``horizontal-statistic``, ``horizontal-target``; ``cell-used-<resource>``
(the total), ``cell-used-<resource>-<i>`` (each job's band), ``cell-capacity-<resource>``,
``cell-allocated-<resource>``.
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from cellpilot_services.dashboard import models
from cellpilot_services.dashboard.charts import RECOMMENDER_COLOURS, date_axis, scale_of, svg, time_number

JOB_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1")
DEMAND_COLOUR = "#2ca02c"


def _xs(points: list[models.SeriesPoint]) -> list[float]:
    return [time_number(p.t_ms) for p in points]


def _legend(axes: Axes) -> None:
    if axes.get_legend_handles_labels()[0]:
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", borderaxespad=0)


def horizontal_chart(history: models.HorizontalHistory) -> str:
    """Top: the job's task count, each recommender's raw recommendation n_r, and Autopilot's
    current choice n_s. Bottom: the demand (the tasks' summed CPU usage per window), the
    statistic r_S the recommendation follows, and what the current tasks serve at the target
    utilisation (task count x CPU limit x r*)."""
    figure = Figure(figsize=(10, 5.6))
    tasks, cpu = figure.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [1.0, 1.2]})
    top = 1.0
    if history.task_count:
        (line,) = tasks.step(
            _xs(history.task_count),
            [p.value for p in history.task_count],
            where="post",
            color="black",
            linewidth=2.2,
            label="task count",
        )
        line.set_gid("horizontal-task-count")
        top = max(top, *(p.value for p in history.task_count))
    for i, rec in enumerate(history.raw_recommendations):
        (line,) = tasks.step(
            _xs(rec.points),
            [p.value for p in rec.points],
            where="post",
            color=RECOMMENDER_COLOURS[i % len(RECOMMENDER_COLOURS)],
            linewidth=1.4,
            linestyle="--",
            marker="o" if len(rec.points) == 1 else None,
            label=f"raw recommendation n_r ({rec.recommender})",
        )
        line.set_gid(f"horizontal-raw-{rec.recommender}")
        top = max(top, *(p.value for p in rec.points))
    decision = history.decision
    if decision is not None:
        at = decision.decided_at_ms or (history.demand[-1].t_ms if history.demand else 0)
        if at:
            marks = tasks.scatter(
                [time_number(at)],
                [decision.recommended_task_count],
                marker="D",
                s=60,
                color="#d62728",
                zorder=5,
                label=f"Autopilot's choice n_s = {decision.recommended_task_count} ({decision.stabiliser})",
            )
            marks.set_gid("horizontal-decision")
            top = max(top, decision.recommended_task_count)
    tasks.set_ylim(0, top * 1.25)
    tasks.yaxis.set_major_locator(MaxNLocator(integer=True))
    tasks.set_ylabel("tasks")
    tasks.set_title(f"{history.job_id}: task count (horizontal Autopilot {history.mode})")
    _legend(tasks)

    scale, label = scale_of("cpu")
    cpu_top = 0.0
    if history.demand:
        xs, ys = _xs(history.demand), [p.value / scale for p in history.demand]
        cpu.fill_between(xs, ys, color=DEMAND_COLOUR, alpha=0.25, linewidth=0)
        (line,) = cpu.plot(xs, ys, color=DEMAND_COLOUR, linewidth=1.6, label="demand: CPU used by all tasks")
        line.set_gid("horizontal-demand")
        cpu_top = max(ys)
    else:
        cpu.text(0.5, 0.5, "no usage history yet", transform=cpu.transAxes, ha="center", color="grey")
    if history.demand_statistic:
        ys = [p.value / scale for p in history.demand_statistic]
        (line,) = cpu.plot(
            _xs(history.demand_statistic),
            ys,
            color="#9467bd",
            linestyle=":",
            linewidth=1.6,
            label="r_S (statistic)",
        )
        line.set_gid("horizontal-statistic")
        cpu_top = max(cpu_top, *ys)
    if history.target_utilization > 0 and history.task_count and history.cpu_limit_millicores:
        per_task = history.cpu_limit_millicores * history.target_utilization / scale
        ys = [p.value * per_task for p in history.task_count]
        (line,) = cpu.step(
            _xs(history.task_count),
            ys,
            where="post",
            color="black",
            linestyle="--",
            linewidth=1.2,
            label=f"tasks x limit x r* ({history.target_utilization:g})",
        )
        line.set_gid("horizontal-target")
        cpu_top = max(cpu_top, *ys)
    cpu.set_ylim(0, cpu_top * 1.15 if cpu_top > 0 else 1)
    cpu.set_ylabel(label)
    _legend(cpu)
    date_axis(figure, cpu)
    return svg(figure)


def cell_utilisation_chart(utilisation: models.CellUtilisation) -> str:
    """Per resource: each large job's usage stacked (the cell's total on top), against the
    capacity of the machines up now and the limits allocated on them now."""
    figure = Figure(figsize=(10, 5.6))
    rows = figure.subplots(2, 1, sharex=True)
    for axes, (resource, view) in zip(
        rows, (("cpu", utilisation.cpu), ("memory", utilisation.memory)), strict=True
    ):
        scale, label = scale_of(resource)
        top = max(view.capacity, view.allocated) / scale
        if view.used:
            xs = _xs(view.used)
            bands = axes.stackplot(
                xs,
                *([p.value / scale for p in job.points] for job in view.by_job),
                labels=[job.name for job in view.by_job],
                colors=[JOB_COLOURS[i % len(JOB_COLOURS)] for i in range(len(view.by_job))],
                alpha=0.8,
            )
            for i, band in enumerate(bands):
                band.set_gid(f"cell-used-{resource}-{i}")
            totals = [p.value / scale for p in view.used]
            (line,) = axes.plot(xs, totals, color="#333333", linewidth=0.9, label="used (all jobs)")
            line.set_gid(f"cell-used-{resource}")
            top = max(top, *totals)
        else:
            axes.text(0.5, 0.5, "no usage history yet", transform=axes.transAxes, ha="center", color="grey")
        capacity = axes.axhline(
            view.capacity / scale, color="black", linewidth=2.0, label="capacity (machines up)"
        )
        capacity.set_gid(f"cell-capacity-{resource}")
        allocated = axes.axhline(
            view.allocated / scale, color="#1f77b4", linewidth=1.4, linestyle="--", label="allocated (limits)"
        )
        allocated.set_gid(f"cell-allocated-{resource}")
        axes.set_ylim(0, top * 1.1 if top > 0 else 1)
        axes.set_ylabel(label)
        _legend(axes)
    rows[0].set_title("cell utilisation over time: used vs capacity")
    date_axis(figure, rows[-1])
    return svg(figure)
