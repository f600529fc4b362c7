"""A picture of a simulation: allocated GPUs per project over time, the GPUs' utilization
(utilized GPUs: each running job's GPUs × its utilization), and the queue."""

from __future__ import annotations

from ..policy.model import GPU
from .engine import SimRun

MAX_POINTS = 2000


def plot_run(run: SimRun, path: str) -> None:
    plt = _pyplot()
    utilized = run.utilized_timeline or [0.0] * len(run.timeline)
    points = _downsample([(*point, u) for point, u in zip(run.timeline, utilized)])
    days = [(t - run.start) / 86400 for t, _, _, _ in points]
    projects = sorted({p for _, alloc, _, _ in points for p in alloc})
    stacks = [[alloc.get(p, 0) / GPU for _, alloc, _, _ in points] for p in projects]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 1]})
    if projects:
        top.stackplot(days, stacks, labels=projects, step="post")
    top.step(days, [u / GPU for _, _, _, u in points], where="post", color="black",
             linewidth=0.9, label="utilized")
    top.axhline(run.config.capacity_gpus, color="black", linewidth=0.8, linestyle="--")
    top.set_ylabel("allocated GPUs (utilized: line)")
    top.set_title(f"{run.config.policy}: {run.config.capacity_gpus} GPUs")
    if len(projects) <= 20:
        top.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, title="project")
    bottom.step(days, [q for _, _, q, _ in points], where="post", color="tab:red")
    bottom.set_ylabel("pending jobs")
    bottom.set_xlabel("days since the trace start")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'jupyter-gpushare[plot]'") from None
    return plt


def _downsample(timeline):
    if len(timeline) <= MAX_POINTS:
        return timeline
    step = len(timeline) / MAX_POINTS
    return [timeline[int(i * step)] for i in range(MAX_POINTS)] + [timeline[-1]]


def plot_team(result: dict, path: str) -> None:
    """The team scenario: average GPU utilization day by day at the calibration point (the
    shape of the case's before/after figures), and over the demand sweep."""
    plt = _pyplot()
    configs = ("static", "pooled", "gpushare")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7.5))
    calibration = result["calibration"]
    if calibration:
        for config in configs:
            hourly = calibration[config]["series"]
            daily = [sum(hourly[d:d + 24]) / len(hourly[d:d + 24])
                     for d in range(0, len(hourly), 24)]
            top.step(range(len(daily)), [100 * u for u in daily], where="post",
                     label=f"{config}: {calibration[config]['avg_utilization']:.1%} on average")
        top.set_title(f"GPU utilization day by day, demand {calibration['demand']} "
                      f"({calibration['demand_gpus']} GPUs), where static averages 28 %")
        top.legend(loc="upper right", fontsize=8)
    else:
        top.set_title(result["calibration_note"])
    top.set_xlabel("day (weekends are days 5-6, 12-13, ...)")
    top.set_ylabel("utilized GPUs, % of all")
    sweep = result["sweep"]
    demand = [row["demand_gpus"] for row in sweep]
    twin = bottom.twinx()
    for k, config in enumerate(configs):
        color = f"C{k}"
        bottom.plot(demand, [100 * row[config]["avg_utilization"] for row in sweep], "o-",
                    color=color, label=f"{config} utilization")
        twin.plot(demand, [row[config]["experiments_completed"] for row in sweep], "s--",
                  color=color, alpha=0.6, label=f"{config} experiments")
    bottom.set_xlabel("demand: the GPUs the team's experiments would keep busy on an "
                      "unlimited pool")
    bottom.set_ylabel("average GPU utilization, %")
    twin.set_ylabel("experiments completed (dashed)")
    bottom.legend(loc="upper left", fontsize=8)
    fig.suptitle(f"Team scenario, job activity {result['activity']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
