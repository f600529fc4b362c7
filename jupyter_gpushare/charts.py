"""SVG charts for the front ends that draw GPU use: the admin dashboard (allocation and
utilization per project over time) and the ``%gpushare`` panel (a sparkline per job or slice).

Pure functions of numbers that return SVG text: no I/O, no clock, no time zone of their own
(times are epoch seconds; ``offset`` is the seconds the labels are shifted by, the service's
UTC offset). Every text that goes into the SVG is escaped here. The JupyterLab extension draws
its sparklines with the same rules in TypeScript (``labextension/src/model.ts``).
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from typing import Sequence

# Okabe & Ito's colour-blind safe palette, then darker variants.
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442",
           "#000000", "#004a75", "#996a00", "#006b4f", "#8c4f72")
TICK_STEPS = (60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 2 * 86400,
              7 * 86400)


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _n(x: float) -> str:
    """A coordinate, short: ``12``, ``12.5``."""
    return f"{x:.1f}".rstrip("0").rstrip(".")


def sparkline(values: Sequence[float | None], *, width: int = 80, height: int = 18,
              top: float = 1.0, title: str = "", stroke: str = "#0072b2") -> str:
    """A small line of ``values`` (oldest first, 0 to ``top``) across ``width``; None is a gap.
    The last value gets a dot. Nothing to draw: an empty frame, so rows keep their height."""
    esc = html.escape(title)
    head = (f'<svg class="gpushare-spark" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc}">'
            + (f"<title>{esc}</title>" if title else "")
            + f'<line x1="0" y1="{height - 0.5}" x2="{width}" y2="{height - 0.5}" '
              f'stroke="#c8c8c8" stroke-width="1"/>')
    n = len(values)
    if not any(v is not None for v in values):
        return head + "</svg>"
    step = (width - 3) / max(1, n - 1)

    def point(i: int, v: float) -> tuple[float, float]:
        v = min(max(v, 0.0), top)
        return 1.5 + i * step, height - 1.5 - v / top * (height - 3)

    runs, run = [], []
    for i, v in enumerate(values):
        if v is None:
            if run:
                runs.append(run)
            run = []
        else:
            run.append(point(i, v))
    if run:
        runs.append(run)
    body = ""
    for run in runs:
        if len(run) == 1:  # a minute between gaps
            body += f'<circle cx="{_n(run[0][0])}" cy="{_n(run[0][1])}" r="1" fill="{stroke}"/>'
            continue
        body += (f'<polyline fill="none" stroke="{stroke}" stroke-width="1.5" '
                 f'points="{" ".join(f"{_n(x)},{_n(y)}" for x, y in run)}"/>')
    last = next((point(i, v) for i, v in reversed(list(enumerate(values))) if v is not None))
    body += f'<circle cx="{_n(last[0])}" cy="{_n(last[1])}" r="2" fill="{stroke}"/>'
    return head + body + "</svg>"


def minute_values(minutes, now: float, count: int = 60) -> list[float | None]:
    """A job's or slice's ``usage.minutes`` (``[[minute start, SM 0–1 or None, memory]]``) as
    one value per minute of the last ``count`` minutes up to ``now``, oldest first; None
    where no reading was taken."""
    by_start = {int(m[0]): m[1] for m in minutes or () if isinstance(m, (list, tuple)) and m}
    last = int(now) // 60 * 60
    return [by_start.get(last - 60 * i) for i in range(count - 1, -1, -1)]


# -- charts over time ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Series:
    """One named series of buckets: ``points`` are (bucket start, value); None: not known."""

    name: str
    points: tuple[tuple[float, float | None], ...]
    colour: str


@dataclass(frozen=True)
class Frame:
    """What every chart of a window shares: the window [t0, t1), its buckets' length, the UTC
    offset for labels, and the drawing's size."""

    t0: float
    t1: float
    step: float
    offset: float = 0.0
    width: int = 720
    height: int = 200
    left: int = 44
    right: int = 10
    top: int = 18
    bottom: int = 22

    def x(self, t: float) -> float:
        span = max(1.0, self.t1 - self.t0)
        t = min(max(t, self.t0), self.t1)
        return self.left + (t - self.t0) / span * (self.width - self.left - self.right)

    def y(self, value: float, top: float) -> float:
        value = min(max(value, 0.0), top) if top > 0 else 0.0
        inner = self.height - self.top - self.bottom
        return self.top + inner - (value / top * inner if top > 0 else 0.0)


def clock_label(t: float, offset: float, span: float) -> str:
    """``14:05`` within two days, else ``Nov 20``."""
    tm = time.gmtime(t + offset)
    return time.strftime("%H:%M", tm) if span <= 2 * 86400 else time.strftime("%b %d", tm)


def time_ticks(frame: Frame, most: int = 8) -> list[tuple[float, str]]:
    """Round times across the window (in the labels' zone), at most ``most`` of them."""
    span = frame.t1 - frame.t0
    step = next((s for s in TICK_STEPS if span / s <= most), TICK_STEPS[-1])
    first = (frame.t0 + frame.offset) // step * step - frame.offset
    if first < frame.t0:
        first += step
    ticks, t = [], first
    while t <= frame.t1:
        ticks.append((t, clock_label(t, frame.offset, span)))
        t += step
    return ticks


def _axes(frame: Frame, top: float, y_ticks: Sequence[tuple[float, str]], label: str) -> str:
    out = []
    for value, text in y_ticks:
        y = _n(frame.y(value, top))
        out.append(f'<line x1="{frame.left}" y1="{y}" x2="{frame.width - frame.right}" '
                   f'y2="{y}" stroke="#e0e0e0"/>'
                   f'<text x="{frame.left - 4}" y="{y}" text-anchor="end" '
                   f'dominant-baseline="middle">{html.escape(text)}</text>')
    base = _n(frame.height - frame.bottom)
    for t, text in time_ticks(frame):
        x = _n(frame.x(t))
        out.append(f'<line x1="{x}" y1="{base}" x2="{x}" y2="{_n(frame.height - frame.bottom + 4)}"'
                   f' stroke="#9e9e9e"/><text x="{x}" y="{frame.height - 4}" '
                   f'text-anchor="middle">{html.escape(text)}</text>')
    out.append(f'<line x1="{frame.left}" y1="{base}" x2="{frame.width - frame.right}" '
               f'y2="{base}" stroke="#9e9e9e"/>')
    if label:
        out.append(f'<text x="4" y="8" dominant-baseline="middle" class="axis-label">'
                   f'{html.escape(label)}</text>')
    return "".join(out)


def _svg(frame: Frame, title: str, body: str) -> str:
    esc = html.escape(title)
    return (f'<svg class="gpushare-chart" viewBox="0 0 {frame.width} {frame.height}" '
            f'role="img" aria-label="{esc}" preserveAspectRatio="xMidYMid meet">'
            f'<title>{esc}</title>{body}</svg>')


def stacked_chart(frame: Frame, series: Sequence[Series], top: float, *, title: str,
                  y_ticks: Sequence[tuple[float, str]], label: str = "",
                  ceiling: tuple[float, str] | None = None) -> str:
    """``series`` stacked as step areas, one bucket wide each (missing buckets are 0), the
    first series at the bottom; ``ceiling`` (value, words) a dashed line, e.g. the pool's size."""
    starts = sorted({t for s in series for t, _ in s.points})
    below = {t: 0.0 for t in starts}
    body = [_axes(frame, top, y_ticks, label)]
    for s in series:
        values = {t: (v or 0.0) for t, v in s.points}
        upper, lower = [], []
        for t in starts:
            a, b = frame.x(t), frame.x(t + frame.step)
            y0, y1 = below[t], below[t] + values.get(t, 0.0)
            upper += [(a, frame.y(y1, top)), (b, frame.y(y1, top))]
            lower += [(a, frame.y(y0, top)), (b, frame.y(y0, top))]
            below[t] = y1
        if not starts or not any(values.values()):
            continue
        points = upper + lower[::-1]
        body.append(f'<polygon fill="{s.colour}" fill-opacity="0.8" stroke="{s.colour}" '
                    f'stroke-width="0.5" points="{" ".join(f"{_n(x)},{_n(y)}" for x, y in points)}">'
                    f'<title>{html.escape(s.name)}</title></polygon>')
    if ceiling is not None:
        y = _n(frame.y(ceiling[0], top))
        body.append(f'<line x1="{frame.left}" y1="{y}" x2="{frame.width - frame.right}" y2="{y}" '
                    f'stroke="#424242" stroke-dasharray="4 3"><title>{html.escape(ceiling[1])}'
                    f'</title></line>')
    return _svg(frame, title, "".join(body))


def line_chart(frame: Frame, series: Sequence[Series], top: float, *, title: str,
               y_ticks: Sequence[tuple[float, str]], label: str = "",
               threshold: tuple[float, str] | None = None) -> str:
    """One line per series through its buckets' middles (of the part in the window), broken
    where a bucket is missing or None; a lone bucket is a dot. ``threshold`` (value, words) a dashed line."""
    body = [_axes(frame, top, y_ticks, label)]
    if threshold is not None:
        y = _n(frame.y(threshold[0], top))
        body.append(f'<line x1="{frame.left}" y1="{y}" x2="{frame.width - frame.right}" y2="{y}" '
                    f'stroke="#d55e00" stroke-dasharray="2 3"><title>{html.escape(threshold[1])}'
                    f'</title></line>')
    for s in series:
        runs, run, previous = [], [], None
        for t, v in sorted(s.points):
            if v is None or (previous is not None and t - previous > frame.step):
                if run:
                    runs.append(run)
                run = []
            if v is not None:  # the middle of the part of the bucket in the window
                middle = (max(t, frame.t0) + min(t + frame.step, frame.t1)) / 2
                run.append((frame.x(middle), frame.y(v, top)))
            previous = t
        if run:
            runs.append(run)
        name = html.escape(s.name)
        for run in runs:
            if len(run) == 1:
                body.append(f'<circle cx="{_n(run[0][0])}" cy="{_n(run[0][1])}" r="2.5" '
                            f'fill="{s.colour}"><title>{name}</title></circle>')
            else:
                body.append(f'<polyline fill="none" stroke="{s.colour}" stroke-width="2" '
                            f'points="{" ".join(f"{_n(x)},{_n(y)}" for x, y in run)}">'
                            f'<title>{name}</title></polyline>')
    return _svg(frame, title, "".join(body))
