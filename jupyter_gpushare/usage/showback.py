"""Showback: GPU-hours allocated, utilized and idle per group and calendar period, made only of
``api/usage`` answers (one per period), so that every figure is the API's own.

What flows in: the window's edges as dates and a step (day, week, month).
The steps: 1. ``periods``: the calendar periods that cover the window (weeks from Monday);
2. one ``api/usage`` answer per period (the caller asks); 3. ``showback_rows``: its rows
with the period, in GPU-seconds as the API gave them and in GPU-hours; 4. CSV or a table.
What flows out: rows and text. Pure: no I/O, no clock.
"""

from __future__ import annotations

import re
from datetime import date, timedelta

from .. import spreadsheet
from ..text import percent, table

STEPS = ("day", "week", "month")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}\Z", re.ASCII)
FIGURES = ("allocated", "utilized", "idle")
NAMES = {"project": ("project",), "department": ("department",), "user": ("user",),
         "job": ("job", "project", "user"), "slice": ("slice", "user"), "gpu": ("node", "gpu")}


def parse_date(text: str, option: str) -> date:
    """``YYYY-MM-DD`` as a date, or ``ValueError`` with one sentence."""
    if text is None or not DATE.match(text.strip()):
        raise ValueError(f"{option} must be a date like 2026-10-01 with a step, not "
                         f"{str(text)[:40]!r}")
    try:
        return date.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{option} {text.strip()} is not a day of the calendar") from None


def _next(d: date, step: str) -> date:
    if step == "day":
        return d + timedelta(days=1)
    if step == "week":
        return d + timedelta(days=7 - d.weekday())
    return date(d.year + (d.month == 12), d.month % 12 + 1, 1)


def periods(since: date, until: date, step: str) -> list[tuple[str, str]]:
    """``[(start, end), ...]`` as ``YYYY-MM-DD``, cut at the calendar's days, weeks (from
    Monday) or months and at the window's own edges; at most 1000."""
    if step not in STEPS:
        raise ValueError(f"step must be one of {', '.join(STEPS)}, not {step[:40]!r}")
    if since >= until:
        raise ValueError("--since must be before --until")
    out, start = [], since
    while start < until:
        end = min(_next(start, step), until)
        out.append((start.isoformat(), end.isoformat()))
        start = end
        if len(out) > 1000:
            raise ValueError(f"that is more than 1000 {step}s; choose a larger step or a "
                             f"shorter window")
    return out


def showback_rows(answer: dict, by: str, period: tuple[str, str] | None = None) -> list[dict]:
    """An ``api/usage`` answer's rows as showback rows: the group's names, GPU-seconds as the
    API gave them, GPU-hours, and the ratios."""
    out = []
    for r in answer.get("rows") or []:
        row = {"period_start": period[0], "period_end": period[1]} if period else {}
        row.update({n: r.get(n) for n in NAMES[by]})
        for f in FIGURES:
            row[f"{f}_gpu_hours"] = round(r.get(f"{f}_gpu_seconds", 0) / 3600, 4)
        for f in FIGURES:
            row[f"{f}_gpu_seconds"] = r.get(f"{f}_gpu_seconds", 0)
        row.update(allocation=r.get("allocation"), utilization=r.get("utilization"),
                   idle_ratio=r.get("idle_ratio"))
        out.append(row)
    return out


def to_csv(rows: list[dict]) -> str:
    """The rows as CSV, each text cell that a spreadsheet would evaluate made plain text."""
    return spreadsheet.to_csv(list(rows[0]), rows) if rows else ""


def to_table(rows: list[dict], by: str) -> str:
    if not rows:
        return "no GPU use in this window"
    period = "period_start" in rows[0]
    names = list(NAMES[by])
    headers = (["PERIOD"] if period else []) + [n.upper() for n in names] + \
        ["GPU-H ALLOCATED", "GPU-H UTILIZED", "GPU-H IDLE", "ALLOCATION", "UTILIZATION"]
    cells = [([r["period_start"]] if period else []) + [str(r.get(n) or "-") for n in names]
             + [f"{r[f'{f}_gpu_hours']:.2f}" for f in FIGURES]
             + [percent(r["allocation"]), percent(r["utilization"])] for r in rows]
    return table(headers, cells, numeric=set(headers[len(headers) - 5:]))
