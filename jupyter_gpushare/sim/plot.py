"""A picture of a simulation: allocated GPUs per project over time, the GPUs' utilization
(utilized GPUs: each running job's GPUs × its utilization), and the queue."""

from __future__ import annotations

from ..policy.model import GPU
from .engine import SimRun

MAX_POINTS = 2000


def plot_run(run: SimRun, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'jupyter-gpushare[plot]'") from None
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


def _downsample(timeline):
    if len(timeline) <= MAX_POINTS:
        return timeline
    step = len(timeline) / MAX_POINTS
    return [timeline[int(i * step)] for i in range(MAX_POINTS)] + [timeline[-1]]
