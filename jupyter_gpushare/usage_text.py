"""GPU use in words and tables, the same for every front end (the gpushare command, the
notebook's ``%gpushare``): percentages, sizes, "idle 25 min", and the ``gpushare usage`` table.
It takes the API's JSON (``api/usage``, a job's or slice's ``usage``) and returns text."""

from __future__ import annotations

GiB, MiB = 2**30, 2**20
SHOW_IDLE_AFTER_S = 60  # shorter idle spells are not worth a flag


def percent(ratio) -> str:
    """``0.934`` → ``93%``; None (not measurable) → ``-``."""
    return "-" if ratio is None else f"{ratio * 100:.0f}%"


def size(n) -> str:
    """Bytes as ``11 GiB``, ``1.5 GiB``, ``300 MiB``; None → ``-``."""
    if n is None:
        return "-"
    if n >= 10 * GiB:
        return f"{n / GiB:.0f} GiB"
    if n >= GiB:
        return f"{n / GiB:.1f} GiB"
    return f"{n / MiB:.0f} MiB"


def idle_text(seconds) -> str:
    """``idle 25 min``, ``idle 3 h``; empty when not idle or idle less than a minute."""
    if seconds is None or seconds < SHOW_IDLE_AFTER_S:
        return ""
    minutes = int(seconds // 60)
    if minutes < 120:
        return f"idle {minutes} min"
    hours = minutes // 60
    return f"idle {hours} h" if hours < 48 else f"idle {hours // 24} d"


def sm_cell(usage) -> str:
    """A job's or slice's SM utilization now and over the last hour: ``93% (1h 88%)``."""
    if not usage:
        return "-"
    return f"{percent(usage.get('sm_now'))} (1h {percent(usage.get('sm_last_hour'))})"


def memory_cell(usage) -> str:
    return size(usage.get("memory_now_bytes")) if usage else "-"


def usage_line(usage) -> str:
    """One line for a panel or a status: ``SM 93% (1h 88%), 11 GiB, idle 25 min``."""
    if not usage:
        return "not measured yet"
    parts = [f"SM {sm_cell(usage)}", memory_cell(usage)]
    if idle_text(usage.get("idle_for_s")):
        parts.append(idle_text(usage.get("idle_for_s")))
    return ", ".join(parts)


HEADERS = {"project": "PROJECT", "user": "USER", "job": "JOB", "slice": "SLICE", "gpu": "GPU",
           "node": "NODE"}


def format_usage(answer: dict, table) -> str:
    """The ``gpushare usage`` table of an ``api/usage`` answer (``table`` aligns columns)."""
    by = answer.get("by", "project")
    names = {"project": ["project"], "user": ["user"], "job": ["job", "project", "user"],
             "slice": ["slice", "user"], "gpu": ["node", "gpu"]}[by]
    pools = answer.get("pools") or {}
    lines = []
    for name in ("train", "build"):
        p = pools.get(name)
        if p and p.get("capacity_gpu_seconds"):
            lines.append(f"{name} pool: allocation {percent(p.get('allocation'))}, utilization "
                         f"{percent(p.get('utilization'))} of what was allocated (average GPU "
                         f"utilization {percent(p.get('average_utilization'))}), idle-allocated "
                         f"{percent(p.get('idle_ratio'))}")
    rows = answer.get("rows") or []
    if not rows:
        lines.append("no GPU use in this window")
        return "\n".join(lines)
    headers = [HEADERS[n] for n in names] + ["GPU-HOURS", "ALLOCATION", "UTILIZATION",
                                             "IDLE-ALLOCATED", "PEAK MEMORY"]
    cells = [[str(r.get(n) or "-") for n in names]
             + [f"{r.get('allocated_gpu_seconds', 0) / 3600:.2f}", percent(r.get("allocation")),
                percent(r.get("utilization")), percent(r.get("idle_ratio")),
                size(r.get("memory_peak_bytes"))] for r in rows]
    lines.append(table(headers, cells, numeric=set(headers[len(names):])))
    return "\n".join(lines)
