"""Sums of GPU time per row and time bucket, and the figures made from them.

What flows in: the attributed GPUs of one reading (``attribution.GPUUse``) and the seconds it
stands for.
The steps:
  1. per GPU: a ``gpu`` row and its ``pool`` row get the GPU's capacity, what was held of it,
     and its SM utilization;
  2. per holder on it: a ``job`` or ``slice`` row, and for jobs a ``project`` row, get what it
     held, what it used (its processes' share of the GPU) and what it held while idle;
  3. memory peaks are per reading: the most a row held at once.
What flows out: ``Totals`` per ``RowKey`` of one bucket (``Tally``), stored as rollup rows; and
``figures()``, the one place that turns sums into allocation, utilization and idle ratios.

Every amount is milli-GPU-seconds (1000 = one GPU for one second):
  - ``capacity``: GPUs present × seconds read (gpu and pool rows);
  - ``allocated``: held by a job attempt or slice × seconds;
  - ``measured``: the part of ``allocated`` (of ``capacity`` for gpu/pool rows) during which
    SM utilization could be measured (not on MIG, not on a lost GPU);
  - ``utilized``: SM utilization × GPUs × seconds (a process using 20 % of a GPU for 10 s:
    2 GPU-seconds);
  - ``idle``: allocated while the holder's own utilization stayed below the idle threshold.
A pool's row sums its holders' (use outside gpushare is not counted); a GPU's row has all of
that GPU's use, and ``measured`` is then its capacity while measurable.
The definitions of docs/explanation/utilization.md: allocation = allocated ÷ capacity of the
pool it draws on; utilization = utilized ÷ measured (for a slice: its share of the GPU ÷ its
fraction; for a GPU: its SM utilization); idle-allocated = idle; a pool's average utilization
= utilized ÷ capacity.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Iterable, NamedTuple

from ..policy.model import GPU
from .attribution import GPUUse

MINUTE, HOUR, DAY = 60, 3600, 86400  # the buckets rows are summed in, in seconds
KINDS = ("pool", "gpu", "project", "job", "slice")
SUMS = ("capacity", "allocated", "measured", "utilized", "idle", "seconds")


class RowKey(NamedTuple):
    kind: str  # one of KINDS
    key: str  # pool name, GPU UUID, project, "job/attempt", slice id
    node: str = ""
    project: str = ""
    user: str = ""
    job: str = ""


@dataclass(slots=True)
class Totals:
    capacity: float = 0.0
    allocated: float = 0.0
    measured: float = 0.0
    utilized: float = 0.0
    idle: float = 0.0
    seconds: float = 0.0
    memory_peak: int = 0
    memory_total: int = 0

    def merge(self, other: "Totals") -> None:
        for name in SUMS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.memory_peak = max(self.memory_peak, other.memory_peak)
        self.memory_total = max(self.memory_total, other.memory_total)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def reading_totals(uses: Iterable[GPUUse], dt: float, idle_threshold: float) -> dict[RowKey, Totals]:
    """What one reading of some GPUs adds, per row (steps 1–3). ``idle_threshold`` is in
    percent of the holder's own share (5: a ¼ slice below 1.25 % of its GPU is idle)."""
    out: dict[RowKey, Totals] = {}

    def row(key: RowKey) -> Totals:
        found = out.get(key)
        if found is None:
            found = out[key] = Totals()
        return found

    for use in uses:
        held = use.held
        measurable = use.utilization is not None and not use.lost
        gpu = row(RowKey("gpu", use.uuid, use.node))
        pool = row(RowKey("pool", use.pool or "other"))
        for t in (gpu, pool):
            t.capacity += GPU * dt
            t.memory_peak += use.memory_used or 0  # pool: the sum at this reading
            t.memory_total += use.memory_total
        # A GPU's own row: all its use, whoever's; what was held of it; idle while held.
        gpu.allocated += held * dt
        if measurable:
            gpu.measured += GPU * dt
            gpu.utilized += use.utilization * 10 * dt
            if held and use.utilization < idle_threshold:
                gpu.idle += held * dt
        gpu.seconds += dt
        for h in use.holders:
            o = h.owner
            # A pool's row sums its holders: its utilization is of what was allocated.
            rows = [row(RowKey(o.kind, o.key, "", o.project, o.user, o.job)), pool]
            if o.kind == "job":
                rows.append(row(RowKey("project", o.project, project=o.project)))
            for t in rows:
                t.allocated += h.milli * dt
                if t is not pool:  # a pool's memory is its GPUs', whoever's
                    t.memory_peak += h.memory
                if h.sm is not None:
                    t.measured += h.milli * dt
                    t.utilized += h.sm * 10 * dt
                    if h.sm * GPU < idle_threshold * h.milli:
                        t.idle += h.milli * dt
    for key, t in out.items():
        if key.kind in ("job", "slice", "project"):
            t.seconds = dt
    return out


class Tally:
    """The rows of one bucket (``start``, ``step`` seconds) as readings come in."""

    def __init__(self, start: int, step: int):
        self.start, self.step = start, step
        self.rows: dict[RowKey, Totals] = {}

    def add(self, totals: dict[RowKey, Totals]) -> None:
        for key, t in totals.items():
            found = self.rows.get(key)
            if found is None:
                self.rows[key] = Totals(**t.as_dict())
            else:
                found.merge(t)


def bucket(t: float, step: int) -> int:
    return int(t // step) * step


# -- figures --------------------------------------------------------------------------------

def figures(t: Totals, capacity: float) -> dict:
    """The API's figures of one row: GPU-seconds and the ratios (None where undefined).
    ``capacity`` is the milli-GPU-seconds of the pool(s) it draws on in the window."""
    return {
        "allocated_gpu_seconds": round(t.allocated / GPU, 3),
        "utilized_gpu_seconds": round(t.utilized / GPU, 3),
        "idle_gpu_seconds": round(t.idle / GPU, 3),
        "measured_gpu_seconds": round(t.measured / GPU, 3),
        "allocation": round(t.allocated / capacity, 6) if capacity else None,
        "utilization": round(t.utilized / t.measured, 6) if t.measured else None,
        "idle_ratio": round(t.idle / t.allocated, 6) if t.allocated else None,
        "memory_peak_bytes": int(t.memory_peak),
    }


# -- which rows cover a window ---------------------------------------------------------------

def spans(since: int, until: int, minutes_from: int, finest: int = DAY, *,
          rolled: tuple[int, int] | None = None) -> list[tuple[int, int, int]]:
    """The rows that cover [since, until), widened to whole minutes: day rows for whole days,
    hour rows for the rest of whole hours, minute rows for the rest where minute rows are still
    kept (from ``minutes_from``, an hour's start, on; an edge before that widens to whole
    hours). No rows coarser than ``finest`` seconds (a series' step) are used.
    ``rolled``: (hours, days) — hour rows exist only for hours that end by ``hours``, day rows
    for days that end by ``days`` (``UsageStore.rolled``); later ones, the hour or day still
    open and one closed but not yet summed, are read from finer rows, which are all kept there
    (minutes are dropped only after their hour is summed). None: every closed bucket is
    summed (a store nothing writes to any more)."""
    hours, days = rolled if rolled is not None else (None, None)
    if hours is not None:
        minutes_from = min(minutes_from, hours)
    lo, hi = _down(since, MINUTE), _up(until, MINUTE)
    if lo < minutes_from:
        lo = _down(lo, HOUR)
    if hi < minutes_from:
        hi = _up(hi, HOUR)
    limits = {DAY: days, HOUR: hours, MINUTE: None}
    allowed = [(s, limits[s]) for s in (DAY, HOUR, MINUTE) if s <= max(finest, MINUTE)]
    if len(allowed) == 1 and lo < minutes_from:  # a series by the minute: hours before
        return _cover(lo, min(hi, minutes_from), [(HOUR, None)]) + \
            _cover(max(lo, minutes_from), hi, allowed)
    return _cover(lo, hi, allowed) or [(MINUTE, lo, lo)]


def _cover(lo: int, hi: int, steps: list[tuple[int, int | None]]
           ) -> list[tuple[int, int, int]]:
    """[lo, hi) in rows of the first step for its whole buckets (those that end by its limit,
    when it has one), the rest in the following steps'."""
    (step, limit), rest = steps[0], steps[1:]
    if not rest:
        return [(step, lo, hi)] if hi > lo else []
    a, b = _up(lo, step), _down(hi if limit is None else min(hi, limit), step)
    if a >= b:
        return _cover(lo, hi, rest)
    return [(step, a, b)] + _cover(lo, a, rest) + _cover(b, hi, rest)


def _down(t: int, step: int) -> int:
    return t // step * step


def _up(t: int, step: int) -> int:
    return -(-t // step) * step
