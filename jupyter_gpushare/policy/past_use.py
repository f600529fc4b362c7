"""Fair share over time: what each project borrowed lately, decayed by a half-life.

Off by default, as KAI-Scheduler's time-based fair share is. Switched on, a project's
borrowed GPU-time (GPUs held beyond its quota, times how long) is kept in buckets; a
bucket counts ``0.5 ** (age / half_life)`` of itself, and buckets older than the window
not at all. ``shares.deserved_shares`` then divides idle GPUs by weights that the decayed
use scales: a project that borrowed twice its weight's share of what the hungry projects
borrowed lately gets half its weight, one that borrowed nothing gets up to ``MAX_FACTOR``
times it. Quotas are not touched: only the idle GPUs beyond them are divided this way.

Pure and clock-free: the caller says when. The service keeps the buckets in its store
(they survive a restart); the simulator keeps them in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from .model import GPU

MIN_FACTOR, MAX_FACTOR = 0.1, 10.0
"""How far the past can scale a project's weight: never below a tenth, never above ten
times, so that no project's share of idle GPUs drops to nothing or swallows the rest."""

BUCKETS_PER_WINDOW = 168
"""A window of a week has hourly buckets; the oldest bucket leaves the window whole."""

LONGEST_S = 366 * 86400.0
"""The longest half-life and window taken: a year."""


@dataclass(frozen=True, slots=True)
class FairShareTime:
    """``half_life_s``: use this old counts half; ``window_s``: use older than this does not
    count at all. Both in seconds, both above zero."""

    half_life_s: float
    window_s: float = 7 * 86400.0

    def __post_init__(self):
        if not 0 < self.half_life_s <= LONGEST_S:  # NaN fails too
            raise ValueError("the fair share's half-life must be a positive number of seconds, "
                             "a year at most")
        if not 60 <= self.window_s <= LONGEST_S:
            raise ValueError("the fair share's window must be 60 seconds to a year")

    @property
    def bucket_s(self) -> int:
        """Whole seconds, so that the store keys its rows by exactly the buckets used."""
        return max(60, int(self.window_s // BUCKETS_PER_WINDOW))

    def bucket(self, t: float) -> int:
        return math.floor(t / self.bucket_s)


class PastUse:
    """Borrowed milli-GPU-seconds per project, in buckets of ``FairShareTime.bucket_s``."""

    def __init__(self, clock: FairShareTime, buckets: Iterable[tuple[str, int, float]] = ()):
        self.clock = clock
        self.buckets: dict[str, dict[int, float]] = {}
        self._closed: dict[str, float] = {}  # decayed sums of the closed buckets …
        self._closed_at: tuple[int, int] | None = None  # … as of (this bucket, the first)
        for project, bucket, amount in buckets:
            self.buckets.setdefault(project, {})[bucket] = amount

    def add(self, project: str, start: float, end: float, milli: int) -> dict[int, float]:
        """Count ``milli`` milli-GPUs borrowed from ``start`` to ``end``, each bucket its own
        part; returns the milli-GPU-seconds added per bucket."""
        added: dict[int, float] = {}
        if end <= start or milli <= 0:
            return added
        size = self.clock.bucket_s
        b = self.clock.bucket(start)
        if self._closed_at is not None and b < self._closed_at[0]:
            self._closed_at = None  # a closed bucket changes: sum them again
        per = self.buckets.setdefault(project, {})
        while True:
            upto = min(end, (b + 1) * size)
            if upto > start:
                per[b] = per.get(b, 0.0) + milli * (upto - start)
                added[b] = added.get(b, 0.0) + milli * (upto - start)
            if upto >= end:
                return added
            start, b = upto, b + 1

    def forget_before(self, t: float) -> int:
        """Drop the buckets wholly older than the window at ``t``; returns the first kept."""
        first = self.clock.bucket(t - self.clock.window_s)
        for project in list(self.buckets):
            per = self.buckets[project]
            for b in [b for b in per if b < first]:
                del per[b]
            if not per:
                del self.buckets[project]
        self._closed_at = None
        return first

    def decayed(self, now: float) -> dict[str, float]:
        """Each project's decayed borrowed GPU-seconds at ``now``: a bucket counts from its
        middle. The closed buckets are summed once per bucket (their ages all grow alike,
        so one factor carries them to ``now``); only the open bucket is read every time."""
        clock = self.clock
        size, half = clock.bucket_s, clock.half_life_s
        cur, first = clock.bucket(now), clock.bucket(now - clock.window_s)
        if self._closed_at != (cur, first):
            ref = cur * size
            self._closed = {}
            for project, per in self.buckets.items():
                total = sum(amount * 0.5 ** ((ref - (b + 0.5) * size) / half)
                            for b, amount in per.items() if first <= b < cur)
                if total > 0:
                    self._closed[project] = total
            self._closed_at = (cur, first)
        carry = 0.5 ** ((now - cur * size) / half)
        open_weight = 0.5 ** (max(0.0, now - (cur + 0.5) * size) / half)
        out = {p: v * carry for p, v in self._closed.items()}
        for project, per in self.buckets.items():
            amount = per.get(cur, 0.0)
            if amount > 0:
                out[project] = out.get(project, 0.0) + amount * open_weight
        return {p: v / GPU for p, v in out.items() if v > 0}


def borrowed(usage: Mapping[str, int], quotas: Mapping[str, int]) -> dict[str, int]:
    """Milli-GPUs each project holds beyond its quota (a project missing from ``quotas`` has
    none): what fair share over time counts as borrowed. Only the projects that borrow."""
    return {p: u - quotas.get(p, 0) for p, u in usage.items() if u > quotas.get(p, 0)}


def account(past: PastUse, usage: Mapping[str, int], quotas: Mapping[str, int],
            start: float, end: float) -> dict[tuple[str, int], float]:
    """Count in ``past`` what each project of ``usage`` borrowed from ``start`` to ``end``,
    having held ``usage`` (milli-GPUs) all that time: the one place where borrowing becomes
    past use. The service's loop counts the usage its last cycle left, from that cycle to
    this one; the simulator a project's usage since it last changed. Returns the
    milli-GPU-seconds added per (project, bucket): what the service keeps in its store."""
    added: dict[tuple[str, int], float] = {}
    for project, beyond in borrowed(usage, quotas).items():
        for b, amount in past.add(project, start, end, beyond).items():
            added[project, b] = added.get((project, b), 0.0) + amount
    return added


def weight_factors(hungry: Mapping[str, int], past: Mapping[str, float]) -> dict[str, float]:
    """How much the past scales each hungry project's over-quota weight: its weight's share
    of the hungry projects' weights over its share of their decayed borrowed use, within
    [``MIN_FACTOR``, ``MAX_FACTOR``]. 1 for all when none of them borrowed lately."""
    used = sum(past.get(p, 0.0) for p in hungry)
    weights = sum(hungry.values())
    if used <= 0 or weights <= 0:
        return dict.fromkeys(hungry, 1.0)
    out = {}
    for p, w in hungry.items():
        share = past.get(p, 0.0) / used
        due = w / weights
        out[p] = MAX_FACTOR if share <= 0 else min(MAX_FACTOR, max(MIN_FACTOR, due / share))
    return out
