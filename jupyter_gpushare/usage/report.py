"""What ``api/usage`` answers, built from rollup sums: one row per project, user, job, slice or
GPU, optionally a time series, and the pools they are measured against.

What flows in: sums of rollup rows per group (``pool/store/usage_rollups.py`` and the meter's open
minute), grouped as ``BY`` says, and the pools' sums.
The steps: 1. each row's denominator: the capacity of the pool it draws on (train for projects
and jobs, build for slices, both for users, the GPU itself for GPUs); 2. the figures
(``rollup.figures``); 3. sorted and cut to ``limit``.
What flows out: the JSON-able answer. Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..policy.model import GPU
from .rollup import Totals, figures


@dataclass(frozen=True)
class By:
    kinds: tuple[str, ...]  # rollup row kinds summed
    group: tuple[str, ...]  # their columns grouped by
    names: tuple[str, ...]  # what the answer calls those columns
    pools: tuple[str, ...]  # denominators: the pools drawn on ("" : the row's own capacity)


BY = {
    "project": By(("project",), ("key",), ("project",), ("train",)),
    # the projects' rows, folded into their departments as they are now (meter.query's fold)
    "department": By(("project",), ("key",), ("department",), ("train",)),
    "user": By(("job", "slice"), ("user",), ("user",), ("train", "build")),
    "job": By(("job",), ("job", "project", "user"), ("job", "project", "user"), ("train",)),
    "slice": By(("slice",), ("key", "user"), ("slice", "user"), ("build",)),
    "gpu": By(("gpu",), ("key", "node"), ("gpu", "node"), ("",)),
}
SORTS = ("allocated", "idle", "utilization", "name")


def pool_figures(pools: Mapping[str, Totals]) -> dict:
    out = {}
    for name, t in sorted(pools.items()):
        out[name] = {"capacity_gpu_seconds": round(t.capacity / GPU, 3),
                     "average_utilization": round(t.utilized / t.capacity, 6) if t.capacity
                     else None, **figures(t, t.capacity)}
    return out


def rows(sums: Mapping[tuple, Totals], pools: Mapping[str, Totals], by: By,
         sort: str = "allocated", limit: int | None = None) -> list[dict]:
    capacity = sum(pools[p].capacity for p in by.pools if p in pools)
    order = {
        "name": lambda kv: str(kv[0][0]),
        "idle": lambda kv: (-kv[1].idle, str(kv[0][0])),
        "utilization": lambda kv: (not kv[1].measured, -(kv[1].utilized / kv[1].measured
                                                        if kv[1].measured else 0),
                                   str(kv[0][0])),
    }.get(sort, lambda kv: (-kv[1].allocated, str(kv[0][0])))
    chosen = sorted(sums.items(), key=order)[:limit] if limit else sorted(sums.items(), key=order)
    out = []
    for key, t in chosen:  # figures only for the rows answered
        row = dict(zip(by.names, key))
        row.update(figures(t, t.capacity if by.pools == ("",) else capacity))
        out.append(row)
    return out


def series(sums: Mapping[tuple, Totals], pools: Mapping[tuple, Totals], by: By) -> list[dict]:
    """``sums`` and ``pools`` keyed by (bucket start, *group): one point per bucket and key."""
    capacity: dict[int, float] = {}
    for (t0, name), t in pools.items():
        if name in by.pools:
            capacity[t0] = capacity.get(t0, 0.0) + t.capacity
    out = []
    for key, t in sorted(sums.items(), key=lambda kv: (kv[0][0], tuple(map(str, kv[0][1:])))):
        point = {"t": key[0], **dict(zip(by.names, key[1:]))}
        point.update(figures(t, t.capacity if by.pools == ("",) else capacity.get(key[0], 0.0)))
        out.append(point)
    return out
