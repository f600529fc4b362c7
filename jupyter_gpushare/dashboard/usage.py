"""Allocation and utilization per project over the window, and the top idle-allocated jobs and
slices (step 3), from ``api/usage`` answers. The figures are the API's own
(docs/explanation/utilization.md); nothing is recomputed here but GPUs from allocation ratios."""

from __future__ import annotations

from html import escape
from typing import Sequence

from ..charts import Frame, Series, colour, line_chart, stacked_chart
from ..text import SHOW_IDLE_AFTER_S, duration, idle_text, percent, size
from ..trainjob import RUNNING
from .markup import clock, fraction, table
from .window import Window


def project_colours(names: Sequence[str]) -> dict[str, str]:
    return {name: colour(i) for i, name in enumerate(sorted(set(names)))}


def _gpu_ticks(top: float) -> list[tuple[float, str]]:
    step = next(s for s in (1, 2, 4, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000)
                if top / s <= 5)
    ticks, v = [], 0.0
    while v <= top + 1e-9:
        ticks.append((v, f"{v:g}"))
        v += step
    return ticks


PERCENT_TICKS = [(0.0, "0%"), (0.25, "25%"), (0.5, "50%"), (0.75, "75%"), (1.0, "100%")]


def charts(usage: dict, projects: list[dict], capacity: float, window: Window,
           offset: float) -> str:
    """Two charts over the window: GPUs held per project (stacked) against the train pool,
    and the utilization of what each project held."""
    names = [p["name"] for p in projects] + [pt["project"] for pt in usage.get("series") or ()]
    colours = project_colours(names)
    by_project: dict[str, list] = {}
    for pt in usage.get("series") or ():
        by_project.setdefault(pt["project"], []).append(pt)
    frame = Frame(window.since, window.until, window.step, offset)
    held = [Series(name, tuple((pt["t"], (pt.get("allocation") or 0.0) * capacity)
                               for pt in by_project[name]), colours[name])
            for name in sorted(by_project)]
    top = max([capacity, 1.0] + [sum(v for s in held for t, v in s.points if t == t0)
                                 for t0 in {t for s in held for t, _ in s.points}])
    used = [Series(name, tuple((pt["t"], pt.get("utilization")) for pt in by_project[name]),
                   colours[name]) for name in sorted(by_project)]
    threshold = usage.get("idle_threshold")
    legend = "".join(f'<span class="key"><i style="background:{colours[n]}"></i>{escape(n)}</span>'
                     for n in sorted(colours))
    return (f'<div class="legend">{legend}</div><div class="charts"><figure>'
            + stacked_chart(frame, held, top, title="GPUs held per project",
                            y_ticks=_gpu_ticks(top), label="GPUs",
                            ceiling=(capacity, f"the train pool: {capacity:g} GPUs"))
            + "<figcaption>GPUs held per project (average over each "
            + f"{escape(_step_words(window.step))}); dashed: the train pool</figcaption></figure>"
            + "<figure>"
            + line_chart(frame, used, 1.0, title="Utilization of what each project held",
                         y_ticks=PERCENT_TICKS, label="utilization",
                         threshold=None if threshold is None else
                         (threshold, f"idle below {percent(threshold)}"))
            + "<figcaption>Utilization of what each project held (SM utilization of its "
            + "GPUs); dotted: the idle threshold</figcaption></figure></div>")


def _step_words(step: int) -> str:
    if step < 3600:
        return f"{step // 60} min"
    if step < 86400:
        return f"{step // 3600} h"
    return f"{step // 86400} d"


def pools_line(usage: dict) -> str:
    """The pools over the window, in the words ``gpushare usage`` prints."""
    out = []
    for name in ("train", "build"):
        p = (usage.get("pools") or {}).get(name)
        if not p or not p.get("capacity_gpu_seconds"):
            continue
        out.append(f'<div class="figures" data-pool="{name}"><b>{name} pool</b>: '
                   f'allocation <b>{percent(p.get("allocation"))}</b>, utilization '
                   f'<b>{percent(p.get("utilization"))}</b> of what was allocated (average GPU '
                   f'utilization {percent(p.get("average_utilization"))}), idle-allocated '
                   f'<b>{percent(p.get("idle_ratio"))}</b></div>')
    return "".join(out) or '<p class="empty">No GPU readings in this window.</p>'


def project_table(usage: dict, projects: list[dict]) -> str:
    rows = {r["project"]: r for r in usage.get("rows") or ()}
    names = sorted({p["name"] for p in projects} | set(rows))
    quota = {p["name"]: p for p in projects}
    cells = []
    for name in names:
        r, p = rows.get(name, {}), quota.get(name, {})
        cells.append([
            escape(name), f'{p["quota"]:g}' if "quota" in p else "–",
            f'{p["in_use"]:g}' if "in_use" in p else "–",
            f'{r.get("allocated_gpu_seconds", 0) / 3600:.2f}', percent(r.get("allocation")),
            percent(r.get("utilization")), percent(r.get("idle_ratio")),
            escape(size(r.get("memory_peak_bytes")) if r else "–")])
    return table(["Project", "Quota", "In use now", "GPU-hours", "Allocation", "Utilization",
                  "Idle-allocated", "Peak memory"], cells, numeric={1, 2, 3, 4, 5, 6, 7},
                 empty="No projects.", cls="projects")


def idle_jobs_table(rows: list[dict], jobs: dict[str, dict]) -> str:
    """``rows``: ``api/usage?by=job&sort=idle``; ``jobs``: jobs known now (running, waiting) by
    id, for their names and state. Idle GPU time: GPU-seconds held idle, as a duration."""
    cells = []
    for r in rows:
        if not r.get("idle_gpu_seconds"):
            continue
        job = jobs.get(r.get("job") or "") or {}
        usage = job.get("usage") or {}
        if job.get("state") == RUNNING:
            now = escape(_now(usage))
        else:
            now = escape(job.get("state") or "ended")
        name = job.get("name") or r.get("job") or "?"
        cells.append([f'<b>{escape(name)}</b> <span class="muted">{escape(r.get("job") or "")}'
                      f'</span>', escape(r.get("user") or "?"), escape(r.get("project") or "?"),
                      escape(duration(r["idle_gpu_seconds"])), percent(r.get("idle_ratio")),
                      percent(r.get("utilization")), now])
    return table(["Job", "User", "Project", "Idle GPU time", "Idle share", "Utilization",
                  "Now"], cells, numeric={3, 4, 5}, empty="No job held GPUs idle in this window.",
                 cls="idle-jobs")


def _now(usage: dict) -> str:
    """``idle 25m``, ``idle under 5m`` or ``in use``."""
    idle = usage.get("idle_for_s")
    return idle_text(idle) or ("in use" if idle is None else
                               f"idle under {duration(SHOW_IDLE_AFTER_S)}")


def idle_slices_table(rows: list[dict], slices: dict[str, dict], offset: float) -> str:
    """``rows``: ``api/usage?by=slice&sort=idle``; ``slices``: the slices held now, by id."""
    cells = []
    for r in rows:
        if not r.get("idle_gpu_seconds"):
            continue
        held = slices.get(r.get("slice") or "")
        if held is None:
            now = "released"
        else:
            usage, cull = held.get("usage") or {}, held.get("cull")
            now = _now(usage)
            if cull:
                now += f", stopped at {clock(cull.get('cull_at'), offset)} unless used"
        server = (held or {}).get("server")
        what = f'{fraction((held or {}).get("gpus"))} slice' if held else "slice"
        cells.append([f'{what} <span class="muted">{escape(r.get("slice") or "")}</span>'
                      + (f' (server {escape(server)})' if server else ""),
                      f'<b>{escape(r.get("user") or "?")}</b>',
                      escape(duration(r["idle_gpu_seconds"])), percent(r.get("idle_ratio")),
                      percent(r.get("utilization")), escape(now)])
    return table(["Slice", "User", "Idle GPU time", "Idle share", "Utilization", "Now"], cells,
                 numeric={2, 3, 4}, empty="No build slice was held idle in this window.",
                 cls="idle-slices")
