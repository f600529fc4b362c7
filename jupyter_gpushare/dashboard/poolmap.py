"""The pool map (step 2): every GPU of the train and build pools, who holds it and how much of
it they use now, from ``api/pool`` as an admin reads it."""

from __future__ import annotations

from html import escape

from ..text import idle_text, percent, size
from .drain import drain_link, drained_words
from .forms import cancel_link
from .markup import fraction

SOURCES = {
    "nvml": "GPU use is read through NVML on this machine.",
    "standin": "GPU use is played by the NVML stand-in: the GPUs are simulated, there is no "
               "GPU on this machine.",
    "off": "This service reads no GPU itself: node agents post their readings (api/samples).",
}


def pool_map(pool: dict, jobs: dict[str, dict], idle_threshold: float,
             base: str | None = None, offset: float = 0.0) -> str:
    """``jobs``: running jobs by id (their names); ``idle_threshold`` 0–1 of a holder's share;
    ``base``: the service's prefix, for the admin's links, a cancel on each job and a drain…
    or undrain on each train node (None: none); ``offset``: the service's UTC offset, for
    when a node was drained."""
    readings = {(g["node"], g["index"]): g for g in pool.get("gpus") or ()}
    train = {n["name"]: n for n in pool.get("nodes") or ()}
    nodes = [(n["name"], n["gpus"], "train") for n in train.values()] + \
        [(n["name"], n["gpus"], "build") for n in (pool.get("build") or {}).get("nodes") or ()]
    known = {(name, i) for name, count, _ in nodes for i in range(count)}
    extra: dict[str, list] = {}
    for (node, index), g in sorted(readings.items()):
        if (node, index) not in known:
            extra.setdefault(node, []).append(index)
    lent = {(g.get("node"), g.get("gpu")): g for g in (pool.get("build") or {}).get("lent") or ()}
    parts = [f'<p class="source">{escape(SOURCES.get(pool.get("usage_source", ""), ""))}</p>']
    notes = pool.get("usage_notes") or []
    if notes:
        parts.append('<ul class="notes">' + "".join(f"<li>{escape(n)}</li>" for n in notes)
                     + "</ul>")
    for name, count, kind in nodes + [(n, ix, "") for n, ix in extra.items()]:
        indices = range(count) if isinstance(count, int) else count
        held = sum(1 for i in indices if (readings.get((name, i)) or {}).get("held"))
        label = f"{kind} pool · " if kind else ""
        tiles = "".join(gpu_tile(readings.get((name, i)), name, i, jobs, idle_threshold, base,
                                 lent.get((name, i)) if kind == "build" else None)
                        for i in indices)
        node = train.get(name) if kind == "train" else None
        drained = drained_words(node, offset) if node else ""
        end = (f' <span class="flag drained">{escape(drained)}</span>' if drained else "") + \
            (f" {drain_link(base, node)}" if node and base is not None else "")
        parts.append(f'<div class="node{" drained" if drained else ""}" '
                     f'data-node="{escape(name)}"><h3>{escape(name)} '
                     f'<span class="muted">{label}{len(indices)} GPU'
                     f'{"" if len(indices) == 1 else "s"}, {held} held</span>{end}</h3>'
                     f'<div class="gpus">{tiles}</div></div>')
    return "".join(parts)


def gpu_tile(g: dict | None, node: str, index: int, jobs: dict[str, dict],
             idle_threshold: float, cancel: str | None = None, lent: dict | None = None) -> str:
    """``lent``: the build GPU is lent to train jobs (``api/pool``'s ``build.lent`` entry)."""
    where = f"{node}/{index}"
    if g is None:
        return (f'<div class="gpu unread" data-gpu="{escape(where)}"><div class="gpu-head">'
                f'<b>GPU {index}</b> <span class="util">–</span></div>'
                f'<div class="muted">not measured</div>{lent_line(lent, jobs)}</div>')
    util = g.get("utilization")
    holders = g.get("holders") or []
    classes = ["gpu"]
    if g.get("lost"):
        classes.append("lost")
    if holders:
        classes.append("held")
        if all(_idle(h, idle_threshold) for h in holders):
            classes.append("idle")
    else:
        classes.append("free")
    used, total = g.get("memory_used_bytes"), g.get("memory_total_bytes")
    width = 0 if util is None else max(0.0, min(1.0, util)) * 100
    title = f'{g.get("name") or "GPU"} {g.get("uuid") or ""}'.strip()
    rows = [holder_line(h, jobs, cancel) for h in holders] or ['<li class="muted">free</li>']
    outside = g.get("outside") or {}
    if outside.get("processes"):
        n = outside["processes"]
        rows.append(f'<li class="outside">{n} process{"" if n == 1 else "es"} outside '
                    f'gpushare, {escape(size(outside.get("memory_bytes")))}</li>')
    if g.get("lost"):
        rows.insert(0, '<li class="bad">lost: the GPU no longer answers</li>')
    if lent is not None:
        classes.append("lent")
        rows.insert(0, lent_line(lent, jobs, "li"))
    shown = "n/a" if util is None else percent(util)
    return (f'<div class="{" ".join(classes)}" data-gpu="{escape(where)}" title="{escape(title)}">'
            f'<div class="gpu-head"><b>GPU {index}</b> <span class="util">{shown}</span></div>'
            f'<div class="bar" title="SM utilization now"><span style="width:{width:.0f}%">'
            f'</span></div>'
            f'<div class="mem">{escape(size(used))} of {escape(size(total))}</div>'
            f'<ul class="holders">{"".join(rows)}</ul></div>')


def lent_line(lent: dict | None, jobs: dict[str, dict], tag: str = "div") -> str:
    """"lent to job resnet", "lent to train jobs, free", and whether it is being taken back."""
    if lent is None:
        return ""
    job = lent.get("job")
    words = f"lent to job {(jobs.get(job) or {}).get('name') or job}" if job else \
        "lent to a train job" if lent.get("held") else "lent to train jobs, free"
    if lent.get("taking_back"):
        words += "; being taken back for a notebook server"
    return f'<{tag} class="lent">{escape(words)}</{tag}>'


def _share(h: dict) -> float | None:
    """The holder's SM utilization of what it holds (a ¼ slice using 20 % of its GPU: 0.8)."""
    sm, gpus = h.get("sm"), h.get("gpus") or 0
    return None if sm is None or not gpus else sm / min(gpus, 1.0)


def _idle(h: dict, threshold: float) -> bool:
    share = _share(h)
    return share is not None and share < threshold


def holder_line(h: dict, jobs: dict[str, dict], cancel: str | None = None) -> str:
    share = _share(h)
    flag = idle_text(h.get("idle_for_s"))
    if h.get("kind") == "job":
        job = jobs.get(h.get("job") or "") or {}
        name = job.get("name") or h.get("job") or "a job"
        who = f'job <b>{escape(name)}</b> · {escape(h.get("user") or "?")} · ' \
              f'{escape(h.get("project") or "?")}'
    else:
        who = f'{fraction(h.get("gpus"))} slice · <b>{escape(h.get("user") or "?")}</b>'
    use = "SM n/a" if share is None else f"SM {percent(share)}"
    end = ""
    if cancel is not None and h.get("kind") == "job" and h.get("job"):
        end = " · " + cancel_link(cancel, {"id": h["job"], "name": name})
    return (f'<li class="{escape(h.get("kind") or "")}">{who} · {use}'
            + (f' <span class="flag">{escape(flag)}</span>' if flag else "") + end + "</li>")
