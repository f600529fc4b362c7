"""The pool's meter: readings in, rollup rows, live figures and idle flags out.

What flows in: readings of machines' GPUs, attributed (``attribution.py``): taken here every
``sample_interval`` on the local backend (``run_local``), or posted by node agents
(``api/samples``).
The steps, per reading:
  1. what it adds per row (``rollup.reading_totals``), for the seconds since that machine's
     previous reading;
  2. into the open minute's tally; a closed minute is written to the store, a closed hour
     rolled up into hour rows, and old rows dropped;
  3. the live view: each GPU now, each holder's utilization and memory now, its last hour,
     since when it has been idle; counters for Prometheus.
What flows out: ``query()`` for ``api/usage``, ``holder_now()`` for jobs and slices,
``gpus_now()`` and ``notes()`` for ``api/pool``, ``idle_jobs()`` for the scheduler.

NVML and the database are only touched in worker threads; the event loop only adds numbers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

from ..policy.model import GPU
from . import report
from .attribution import GPUUse, Holding, Owner, attribute
from .procs import LocalOwners
from .rollup import DAY, HOUR, MINUTE, RowKey, Tally, Totals, bucket, reading_totals, spans
from .sampler import MachineReading



@dataclass(frozen=True)
class UsageSettings:
    sample_interval: float = 5.0
    idle_threshold: float = 5.0  # percent of the holder's own share
    idle_job_after: float = 1800.0
    rollup_after: float = 7 * DAY
    retention: float = 90 * DAY


@dataclass(frozen=True)
class LocalContext:
    """What the pool knows when it samples its own machine: who holds which GPU (by UUID),
    the running attempts' process groups, the notebook servers' pids, each GPU's pool."""

    holdings: dict[str, list[Holding]]
    job_groups: dict[int, Owner]
    servers: dict[int, Owner]
    pools: dict[str, str]


@dataclass
class _Live:
    """One holder as last seen."""

    owner: Owner
    at: float = 0.0
    milli: int = 0
    sm: float | None = None  # percent of its own share
    memory: int = 0
    idle_since: float | None = None
    minutes: dict[int, Totals] = field(default_factory=dict)


class UsageMeter:
    def __init__(self, usage_store, settings: UsageSettings = UsageSettings(),
                 log: logging.Logger | None = None, clock: Callable[[], float] = time.time):
        self.rows, self.settings, self.clock = usage_store, settings, clock
        self.log = log or logging.getLogger("gpushare.usage")
        self.tally: Tally | None = None
        self._closed: list[Tally] = []
        self._last_at: dict[str, float] = {}  # node -> its previous reading
        self._gpus: dict[str, tuple[float, GPUUse]] = {}  # uuid -> latest
        self._notes: dict[str, tuple[str, ...]] = {}  # node -> sentences
        self._live: dict[tuple[str, str], _Live] = {}
        # Since the service started, for Prometheus: ("pool"|"project"|"user", name) → sums.
        self.counters: dict[tuple[str, str], Totals] = defaultdict(Totals)
        self.version = 0  # bumped by every reading: rendered answers that show usage go stale
        self._rolled: dict[int, int] = {}  # step -> start of the next bucket to roll up
        self._writing = asyncio.Lock()

    # -- 1–3: a reading ------------------------------------------------------------------
    def ingest(self, node: str, at: float, uses: tuple[GPUUse, ...], problem: str = "") -> None:
        s = self.settings
        previous = self._last_at.get(node)
        dt = s.sample_interval if previous is None else at - previous
        if dt <= 0:
            return  # a reading older than the last one of this machine
        dt = min(dt, 3 * s.sample_interval)  # a gap (a pause, a restart) is not extrapolated
        self._last_at[node] = at
        totals = reading_totals(uses, dt, s.idle_threshold)
        start = bucket(at, MINUTE)
        if self.tally is None or self.tally.start != start:
            if self.tally is not None and self.tally.rows:
                self._closed.append(self.tally)
            self.tally = Tally(start, MINUTE)
        self.tally.add(totals)
        for key, t in totals.items():
            if key.kind in ("pool", "project"):
                self.counters[(key.kind, key.key)].merge(t)
            elif key.kind in ("job", "slice"):
                self.counters[("user", key.user)].merge(t)
        for use in uses:
            self._gpus[use.uuid] = (at, use)
        self._notes[node] = ((problem,) if problem else ()) + tuple(
            n for u in uses for n in u.notes)
        self._update_live(at, start, uses, totals)
        self.version += 1

    def _update_live(self, at: float, start: int, uses, totals) -> None:
        thr = self.settings.idle_threshold
        seen: dict[Owner, list] = defaultdict(list)
        for use in uses:
            for h in use.holders:
                seen[h.owner].append(h)
        for owner, held in seen.items():
            live = self._live.get((owner.kind, owner.key))
            if live is None:
                live = self._live[(owner.kind, owner.key)] = _Live(owner)
            milli = sum(h.milli for h in held)
            known = all(h.sm is not None for h in held)
            live.at, live.milli = at, milli
            live.sm = sum(h.sm for h in held) * GPU / milli if known and milli else None
            live.memory = sum(h.memory for h in held)
            idle = known and all(h.sm * GPU < thr * h.milli for h in held)
            if not idle:
                live.idle_since = None
            elif live.idle_since is None:
                live.idle_since = at - self.settings.sample_interval
            t = totals.get(RowKey(owner.kind, owner.key, "", owner.project, owner.user, owner.job))
            if t is not None:
                minute = live.minutes.setdefault(start, Totals())
                minute.merge(t)
                for old in [m for m in live.minutes if m <= start - HOUR]:
                    del live.minutes[old]
        stale = at - max(3 * self.settings.sample_interval, 2 * MINUTE)
        for key in [k for k, v in self._live.items() if v.at < stale]:
            del self._live[key]

    # -- the store ------------------------------------------------------------------------
    async def write(self, force: bool = False) -> None:
        """Write closed minutes (and, with ``force``, the open one: at shutdown), roll up
        closed hours and drop old rows. In a worker thread."""
        async with self._writing:
            closed, self._closed = self._closed, []
            if force and self.tally is not None and self.tally.rows:
                closed.append(self.tally)
                self.tally = None
            if closed or force:
                now = self.clock()
                await asyncio.to_thread(self._write, closed, now)

    def _write(self, closed: list[Tally], now: float) -> None:
        for tally in closed:
            self.rows.write(tally.start, tally.step, tally.rows)
        rolled_any = False
        for step, finer in ((HOUR, MINUTE), (DAY, HOUR)):  # minutes into hours, hours into days
            current = bucket(now, step)
            if step not in self._rolled:
                last, first = self.rows.newest(step), self.rows.oldest(finer)
                self._rolled[step] = last + step if last is not None else \
                    (bucket(first, step) if first is not None else current)
            while self._rolled[step] < current:
                self.rows.roll_up(self._rolled[step], step)
                self._rolled[step] += step
                rolled_any = True
        if rolled_any:
            s = self.settings
            self.rows.prune(int(now - s.rollup_after) // HOUR * HOUR, int(now - s.retention))

    async def run_writer(self) -> None:
        """Write what has closed, about once a minute."""
        while True:
            await asyncio.sleep(min(MINUTE / 4, max(self.settings.sample_interval, 1.0)))
            try:
                await self.write()
            except Exception:  # noqa: BLE001 - keep measuring; the next minute tries again
                self.log.exception("writing GPU usage rollups failed")

    # -- local sampling -----------------------------------------------------------------
    async def run_local(self, samplers, context: Callable[[], LocalContext],
                        owners: LocalOwners | None = None) -> None:
        """Read this machine's GPUs (``samplers``: one per machine read here) every
        ``sample_interval``: NVML and /proc in a worker thread, attribution and sums here. A
        driver that does not answer holds up no one: the reading is waited for in the
        background, said in a sentence, and no second one is started meanwhile."""
        owners = owners or LocalOwners()
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        pending, started = None, 0.0
        while True:
            try:
                if pending is None:
                    ctx = context()
                    pending = asyncio.ensure_future(asyncio.to_thread(_read_local, samplers,
                                                                      owners, ctx))
                    started = loop.time()
                done, _ = await asyncio.wait({pending}, timeout=self.settings.sample_interval)
                if done:
                    future, pending = pending, None
                    for reading, found in future.result():
                        self.ingest(reading.node, reading.at,
                                    attribute(reading, ctx.holdings, found, ctx.pools),
                                    reading.problem)
                elif loop.time() - started > max(1.0, 3 * self.settings.sample_interval):
                    for sampler in samplers:
                        self._notes[sampler.node] = (
                            f"NVML on {sampler.node} has not answered for "
                            f"{loop.time() - started:.0f} s (a hung driver?); GPU use is not "
                            f"being read.",)
                    continue
            except Exception:  # noqa: BLE001 - a failed reading must not stop the pool
                pending = None
                self.log.exception("reading the GPUs failed; trying again")
            next_at += self.settings.sample_interval
            delay = next_at - loop.time()
            if delay < 0:  # fell behind (a slow driver): start from now
                next_at, delay = loop.time(), 0
            await asyncio.sleep(delay)

    # -- the live view ----------------------------------------------------------------------
    def holder_now(self, kind: str, key: str, now: float | None = None) -> dict | None:
        """A job attempt's or slice's use now and over the last hour, for the API; None when
        no reading has seen it."""
        live = self._live.get((kind, key))
        if live is None:
            return None
        now = self.clock() if now is None else now
        hour = Totals()
        for start, t in live.minutes.items():
            if start > now - HOUR:
                hour.merge(t)
        idle_for = None if live.idle_since is None else max(0.0, live.at - live.idle_since)
        return {"sm_now": None if live.sm is None else round(live.sm / 100, 4),
                "memory_now_bytes": live.memory,
                "sm_last_hour": None if not hour.measured else round(hour.utilized / hour.measured, 4),
                "memory_peak_last_hour_bytes": hour.memory_peak,
                "idle_for_s": None if idle_for is None else round(idle_for),
                "idle": idle_for is not None and idle_for >= self.settings.idle_job_after,
                "at": live.at,
                # the last hour minute by minute, for sparklines: [start, SM, memory peak]
                "minutes": [[start, None if not t.measured else round(t.utilized / t.measured, 4),
                             t.memory_peak] for start, t in sorted(live.minutes.items())
                            if start > now - HOUR]}

    def idle_for(self, kind: str, key: str) -> float | None:
        live = self._live.get((kind, key))
        if live is None or live.idle_since is None:
            return None
        return live.at - live.idle_since

    def idle_jobs(self) -> set[str]:
        """Ids of jobs whose attempt has been idle for ``idle_job_after`` seconds."""
        after = self.settings.idle_job_after
        return {live.owner.job for (kind, _), live in self._live.items()
                if kind == "job" and live.idle_since is not None
                and live.at - live.idle_since >= after}

    def gpus_now(self) -> list[tuple[float, GPUUse]]:
        return [self._gpus[u] for u in sorted(self._gpus, key=lambda u: (
            self._gpus[u][1].node, self._gpus[u][1].index, u))]

    def notes(self) -> list[str]:
        return [n for node in sorted(self._notes) for n in self._notes[node]]

    async def query(self, since: float, until: float, by, scope, series_step: int | None = None,
                    sort: str = "allocated", limit: int | None = None,
                    fold: Callable[[tuple], tuple] | None = None) -> dict:
        """``api/usage``'s answer over [since, until) (``report.py``), rows the ``scope``
        (``pool/usage_store.Scope``) admits. The database is read in a worker thread; the
        rows not written yet are added from memory. ``fold`` maps each row's group to the one
        it is added into (a project's to its department's) before the figures are made."""
        now = self.clock()
        horizon = int(now - self.settings.rollup_after) // HOUR * HOUR
        # Nothing is measured after now; a window that reaches past it (until tomorrow, the
        # month's end) would otherwise be read from day or hour rows that do not exist yet.
        until = max(since + 1, min(until, int(now) // MINUTE * MINUTE + MINUTE))
        async with self._writing:  # so a minute being written is counted once
            covered, found = await asyncio.to_thread(self._query_db, since, until, horizon, by,
                                                     scope, series_step)
            lo, hi = min(c[1] for c in covered), max(c[2] for c in covered)
            pending = self.open_rows(lo, hi)
        sums, pools, s_sums, s_pools = found
        col = {"key": lambda k: k.key, "node": lambda k: k.node, "project": lambda k: k.project,
               "user": lambda k: k.user, "job": lambda k: k.job}
        for start, key, t in pending:
            if key.kind == "pool":
                _add(pools, (key.key,), t)
                if series_step:
                    _add(s_pools, (start // series_step * series_step, key.key), t)
            elif key.kind in by.kinds and scope.admits(key):
                group = tuple(col[g](key) for g in by.group)
                _add(sums, group, t)
                if series_step:
                    _add(s_sums, (start // series_step * series_step, *group), t)
        pools = {k[0]: t for k, t in pools.items()}
        if fold is not None:
            sums = _folded(sums, fold)
            s_sums = _folded(s_sums, lambda key: (key[0], *fold(key[1:])))
        answer = {"since": lo, "until": hi, "step": series_step,
                  "pools": report.pool_figures(pools),
                  "rows": report.rows(sums, pools, by, sort, limit)}
        if series_step:
            answer["series"] = report.series(s_sums, s_pools, by)
        return answer

    def _query_db(self, since, until, horizon, by, scope, series_step):
        """The rows that cover the window (hour and day rows only where summed already) and
        their sums."""
        covered = spans(int(since), int(until), horizon, series_step or DAY,
                        rolled=self.rows.rolled())
        return covered, self._sums(covered, by, scope, series_step)

    def _sums(self, covered, by, scope, series_step):
        where = scope.sql()
        if not series_step:
            return (self.rows.sums(by.kinds, covered, by.group, where),
                    self.rows.sums(("pool",), covered, ("key",)), {}, {})
        s_sums = self.rows.sums(by.kinds, covered, by.group, where, series_step)
        s_pools = self.rows.sums(("pool",), covered, ("key",), None, series_step)
        sums, pools = {}, {}  # the window's sums are the series' sums
        for key, t in s_sums.items():
            _add(sums, key[1:], t)
        for key, t in s_pools.items():
            _add(pools, key[1:], t)
        return sums, pools, s_sums, s_pools

    async def first_reading(self) -> float | None:
        """When the oldest reading kept began (a minute's, hour's or day's start); None before
        any."""
        kept = await asyncio.to_thread(lambda: [self.rows.oldest(s) for s in (MINUTE, HOUR, DAY)])
        held = [t.start for t in [*self._closed, *([self.tally] if self.tally else [])]]
        starts = [t for t in kept + held if t is not None]
        return min(starts) if starts else None

    def open_rows(self, since: int, until: int) -> list[tuple[int, RowKey, Totals]]:
        """Rows not written yet (the open minute, closed ones waiting) within [since, until)."""
        out = []
        for tally in [*self._closed, *([self.tally] if self.tally else [])]:
            if since <= tally.start < until:
                out += [(tally.start, k, t) for k, t in tally.rows.items()]
        return out


def _folded(sums: dict, fold: Callable[[tuple], tuple]) -> dict:
    out: dict = {}
    for key, t in sums.items():
        _add(out, fold(key), t)
    return out


def _add(into: dict, key: tuple, t: Totals) -> None:
    found = into.get(key)
    if found is None:
        into[key] = Totals(**t.as_dict())
    else:
        found.merge(t)


def _read_local(samplers, owners: LocalOwners, ctx: LocalContext):
    out = []
    for sampler in samplers:
        reading: MachineReading = sampler.read()
        pids = {p.pid for g in reading.gpus for p in g.all_processes()}
        out.append((reading, owners.owners(pids, ctx.job_groups, ctx.servers)))
    return out


