"""The team of the team scenario (``gpushare simulate --scenario team``) and its demand.

The team (``TeamParameters``): researchers in projects on a few servers, over weeks of
working days. Each working day a researcher is at work in stretches with gaps; at work they
write code in a notebook and test it in short GPU bursts (``activity.SessionActivity``); at
the end of a stretch they stop their notebook server or leave it open, nights included.
They train in a closed loop: each of their lines of work thinks (working time only), submits
an experiment drawn from the Philly trace (``examples/philly_jobs.csv``), waits for its result
and thinks again; they queue another only while fewer than ``queue_short`` of their own wait
(``team_run.py`` runs that loop on the pool). Researchers differ (a lognormal weight: a few
train far more than the rest) and their weeks differ (a deadline week, a quiet week).
"""

from __future__ import annotations

import csv
import math
import random
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

from ..policy.settings import DEFAULT_GRACE_S
from . import activity

JOBS_TABLE = Path(__file__).parent / "examples" / "philly_jobs.csv"
DAY, HOUR = 86400.0, 3600.0


@dataclass(frozen=True)
class TeamParameters:
    """Every parameter of the model; docs/explanation/before-and-after.md says what each
    rests on."""

    researchers: int = 20
    projects: int = 4
    servers: tuple[int, ...] = (8, 8, 4, 4, 4, 4)
    build_servers: int = 2  # the last servers: the build pool where it is pooled
    weeks: int = 4
    slice_gpu: float = 0.25
    arrive_h: float = 9.0  # mean arrival, hours after midnight
    arrive_spread_h: float = 1.0  # arrivals uniform within ± this
    workday_h: float = 8.5
    stretches: tuple[int, ...] = (1, 2, 2, 3)  # stretches at work a day, drawn evenly
    gap_h: tuple[float, float] = (0.5, 1.5)  # a gap between stretches, uniform
    leave_open: float = 0.5  # chance a server stays open at the end of a stretch
    session: activity.SessionActivity = field(default_factory=activity.SessionActivity)
    weight_sigma: float = 1.0  # lognormal sigma of how much each researcher trains
    max_lines: int = 8  # lines of work of the heaviest researcher; the lightest has 1
    week_kinds: tuple[tuple[float, float], ...] = ((0.25, 2.0), (0.25, 0.25), (0.5, 1.0))
    """(chance, factor on the rate of thinking): a deadline week, a quiet week, a usual one."""
    think_h: float = 4.0  # mean working hours of thinking per experiment at demand 1
    queue_short: int = 1  # a researcher queues another only while fewer of theirs wait
    max_gpus: int = 8
    grace_s: float = DEFAULT_GRACE_S
    cycle_interval_s: float = 10.0
    checkpoint_interval_s: float = 1800.0
    cull_after_s: float = 3600.0
    cull_warning_s: float = 600.0
    build_reserve: int = 1
    seed: int = 21

    @property
    def window_s(self) -> float:
        return self.weeks * 7 * DAY

    @property
    def gpus(self) -> int:
        return sum(self.servers)


@dataclass
class Researcher:
    name: str
    project: str
    weight: float
    lines: int
    owned: int  # whole GPUs in the static configuration
    stretches: list[tuple[float, float]]
    bursts: list[tuple[float, float]]
    week_factor: list[float]

    def at_work(self, t: float) -> int | None:
        """The index of the stretch that holds ``t``, or None."""
        i = bisect_right(self.starts, t) - 1
        return i if i >= 0 and t < self.stretches[i][1] else None

    def after_work(self, t: float, work_s: float) -> float | None:
        """When ``work_s`` seconds at work have passed from ``t``; None beyond the last day."""
        i = max(0, bisect_right(self.starts, t) - 1)
        while i < len(self.stretches):
            start, end = self.stretches[i]
            t = max(t, start)
            if t + work_s <= end:
                return t + work_s
            work_s -= max(0.0, end - t)
            i += 1
        return None

    def __post_init__(self):
        self.starts = [s for s, _ in self.stretches]
        self.burst_ends = [e for _, e in self.bursts]


def load_jobs(path: Path = JOBS_TABLE) -> list[tuple[int, float]]:
    with path.open() as f:
        return [(int(r["gpus"]), float(r["duration"])) for r in csv.DictReader(f)]


def make_team(p: TeamParameters) -> list[Researcher]:
    rng = random.Random(p.seed)
    weights = [rng.lognormvariate(0.0, p.weight_sigma) for _ in range(p.researchers)]
    total = sum(weights)
    weights = [w / total for w in weights]
    owned = _owned(weights, p.gpus)
    team = []
    for i, w in enumerate(weights):
        stretches, bursts = [], []
        for day in range(p.weeks * 7):
            if day % 7 >= 5:  # Saturday and Sunday
                continue
            t = day * DAY + (p.arrive_h + rng.uniform(-p.arrive_spread_h, p.arrive_spread_h)) * HOUR
            n = rng.choice(p.stretches)
            gaps = [rng.uniform(*p.gap_h) * HOUR for _ in range(n - 1)]
            length = (p.workday_h * HOUR - sum(gaps)) / n
            for k in range(n):
                stretches.append((t, t + length))
                bursts += p.session.bursts(t, t + length, rng)
                t += length + (gaps[k] if k < n - 1 else 0.0)
        factors = []
        for _ in range(p.weeks):
            x, acc = rng.random(), 0.0
            for chance, factor in p.week_kinds:
                acc += chance
                if x < acc:
                    break
            factors.append(factor)
        lines = 1 + round((p.max_lines - 1) * w / max(weights))
        team.append(Researcher(f"r{i:02d}", f"p{i % p.projects}", w, lines, owned[i],
                               stretches, bursts, factors))
    return team


def _owned(weights: list[float], gpus: int) -> list[int]:
    """Whole GPUs per researcher: one each, the rest by weight (largest remainder)."""
    spare = gpus - len(weights)
    exact = [w * spare for w in weights]
    whole = [math.floor(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: whole[i] - exact[i])[:spare - sum(whole)]:
        whole[i] += 1
    return [1 + n for n in whole]


def next_experiment(rng: random.Random, jobs: int, profile: str) -> tuple[float, int, float]:
    """A line of work's next experiment: its thinking (in units of the mean), which job of
    the table, and its utilization; drawn alike in every configuration."""
    return rng.expovariate(1.0), rng.randrange(jobs), activity.draw_util(profile, rng)


def unlimited_demand(p: TeamParameters, team: list[Researcher], jobs, demand: float) -> float:
    """The GPUs the team would keep busy on average over the window at ``demand`` if every
    experiment started the moment it was submitted: the demand level in GPUs."""
    total = 0.0
    for r in team:
        for k in range(r.lines):
            rng = random.Random(f"{p.seed}-{r.name}-{k}")
            t = r.stretches[0][0] if r.stretches else math.inf
            while True:
                draw, pick, _ = next_experiment(rng, len(jobs), "philly")
                week = min(int(t // (7 * DAY)), p.weeks - 1)
                rate = demand * r.weight * len(team) * r.week_factor[week]
                ready = r.after_work(t, draw * p.think_h * HOUR / rate) if rate > 0 else None
                if ready is None or ready >= p.window_s:
                    break
                gpus, duration = jobs[pick]
                cap = min(gpus, p.max_gpus)
                t = ready + duration * gpus / cap
                total += cap * (min(t, p.window_s) - ready)
    return total / p.window_s
