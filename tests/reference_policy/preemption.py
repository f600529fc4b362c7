"""Victims: which running jobs give GPUs back so that a claimant fits.

Contract point 6 (docs/explanation/scheduling.md#contract-6): only over-quota projects lose jobs;
prefer victims that leave their project at or above its quota; then idle jobs (``idle``:
their GPUs stayed unused) before busy ones; then the project most over its deserved share,
then the lowest priority, then the most recently started job. Remove
greedily until the claimant fits, then put back every victim that was not needed.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from itertools import combinations, islice
from typing import Callable, Mapping

from .model import Project, TrainJob


@dataclass(frozen=True, slots=True)
class Floor:
    """Which jobs of a project may go, by milli-GPUs the project runs.

    A project loses a job only while it runs more than ``above``; the job may not take it
    below ``keep``; a job that takes it below ``prefer`` is chosen last.
    """

    above: Callable[[str], int]
    keep: Callable[[str], int]
    prefer: Callable[[str], int]


class VictimPool:
    """The jobs one kind of reclaim may take in one cycle, grouped by project, newest first.

    Built once per cycle; each claimant's search starts from the cached best victim of
    every project, and ``commit`` applies a search's victims so the next one sees them gone.
    """

    def __init__(self, jobs: list[TrainJob], usage: Mapping[str, int],
                 projects: Mapping[str, Project], deserved: Mapping[str, int], floor: Floor):
        self.by_project: dict[str, list[TrainJob]] = {}
        for job in sorted(jobs, key=lambda j: (not j.idle, -(j.start_time or 0.0), j.id)):
            self.by_project.setdefault(job.project, []).append(job)
        self.used = dict(usage)
        self.projects, self.deserved, self.floor = projects, deserved, floor
        self.best = {name: self.entry(name, self.used[name], ()) for name in self.by_project}

    def entry(self, name: str, used: int, taken) -> tuple | None:
        """The heap entry of the project's next victim in contract order, or None."""
        floor = self.floor
        if used <= floor.above(name):
            return None
        keep, prefer = floor.keep(name), floor.prefer(name)
        choice = None
        for job in self.by_project[name]:  # idle first, then most recently started
            if job.id in taken:
                continue
            left = used - job.gpus
            if left < keep:
                continue
            if left >= prefer:
                choice = (False, job)
                break
            if choice is None:
                choice = (True, job)
        if choice is None:
            return None
        below, job = choice
        return (below, not job.idle, -(used - self.deserved.get(name, 0)),
                self.projects[name].priority, -(job.start_time or 0.0), job.id, name, job)

    def jobs(self) -> list[TrainJob]:
        return [j for jobs in self.by_project.values() for j in jobs]

    def commit(self, victims: list[TrainJob]) -> None:
        """Victims chosen (by this pool's search or another's) are gone from now on."""
        for victim in victims:
            jobs = self.by_project.get(victim.project)
            if jobs is not None and victim in jobs:
                jobs.remove(victim)
            if victim.project in self.used:
                self.used[victim.project] -= victim.gpus
        for name in {v.project for v in victims}:
            if name in self.by_project:
                self.best[name] = self.entry(name, self.used[name], ())


def choose_victims(gpus: int, free: Mapping[str, int], releasing: Mapping[str, int],
                   node_size: int, pool: VictimPool, exclude: frozenset[str] = frozenset()
                   ) -> tuple[list[TrainJob], dict[str, int]] | None:
    """The minimal victim set that lets a gang of ``gpus`` fit, with its placement, or None.

    ``free`` are the GPUs free now, in which the gang does not fit; ``releasing`` those that
    preempted jobs are giving back; ``pool`` holds the jobs this kind of reclaim may take.
    The pool is not changed: ``pool.commit`` the victims.
    """
    found = _greedy(gpus, free, releasing, node_size, pool, exclude)
    if found is not None:
        return found
    free = {n: a + releasing.get(n, 0) for n, a in free.items()}
    # Newest first can spread its victims over nodes none of which then holds the gang (and
    # use up what projects may give). Aim at each set of the fewest nodes instead, with only
    # the jobs lying wholly on it, and take the one that preempts least.
    best = None
    candidates = pool.jobs()
    for nodes in _node_sets(gpus, free, node_size, candidates, pool.used, pool.floor, exclude):
        inside = set(nodes)
        sub = VictimPool([j for j in candidates if j.placement.keys() <= inside], pool.used,
                         pool.projects, pool.deserved, pool.floor)
        found = _greedy(gpus, {n: free[n] for n in nodes}, {}, node_size, sub, frozenset())
        if found is not None:
            cost = (sum(v.gpus for v in found[0]), len(found[0]))
            if best is None or cost < best[0]:
                best = (cost, found)
    return None if best is None else best[1]


_MAX_NODE_SETS = 256


def _node_sets(gpus: int, free: Mapping[str, int], node_size: int, candidates: list[TrainJob],
               usage: Mapping[str, int], floor: Floor, exclude) -> list[tuple[str, ...]]:
    """Sets of the fewest nodes a gang needs that could hold it were their jobs gone."""
    k = -(-gpus // node_size)
    movable = [j for j in candidates if usage[j.project] > floor.above(j.project)]
    gain = {n: a for n, a in free.items() if n not in exclude}
    for job in movable:
        for name, amount in job.placement.items():
            if name in gain:
                gain[name] += amount
    ranked = sorted((n for n in gain if gain[n] > 0), key=lambda n: (-gain[n], n))
    sets = []
    for nodes in islice(combinations(ranked, k), _MAX_NODE_SETS):
        inside = set(nodes)
        room = sum(free[n] for n in nodes)
        room += sum(j.gpus for j in movable if j.placement.keys() <= inside)
        if room >= gpus:
            sets.append(nodes)
    return sets


def _greedy(gpus, free, releasing, node_size, pool: VictimPool, exclude):
    """Take victims in contract order until the gang fits, then put back, newest choice
    first, every victim it can do without. ``gain`` is what each node gets back."""
    gain = {n: a for n, a in releasing.items() if a and n in free and n not in exclude}
    if gpus <= node_size:
        def fit():  # the free GPUs alone did not hold it: only nodes that gain can
            best = None
            for name, extra in gain.items():
                amount = free[name] + extra
                if amount >= gpus and (best is None or (amount, name) < best):
                    best = (amount, name)
            return None if best is None else {best[1]: gpus}

        def promising(changed):
            return any(free[n] + gain[n] >= gpus for n in changed)
    else:
        base = sum(a for n, a in free.items() if n not in exclude)

        def fit():
            return _fit_gang({n: a + gain.get(n, 0) for n, a in free.items()}, gpus,
                             node_size, exclude)

        def promising(changed):
            return base + sum(gain.values()) >= gpus

    placement = fit()
    removed: list[TrainJob] = []
    picker = _VictimPicker(pool)
    while placement is None:
        victim = picker.pop()
        if victim is None:
            return None
        changed = [n for n in victim.placement if n in free and n not in exclude]
        for name in changed:
            gain[name] = gain.get(name, 0) + victim.placement[name]
        removed.append(victim)
        if promising(changed):
            placement = fit()
    kept: list[TrainJob] = []
    for victim in reversed(removed):
        back = {n: a for n, a in victim.placement.items() if n in gain}
        for name, amount in back.items():
            gain[name] -= amount
        trial = fit()
        if trial is not None:
            placement = trial
        else:
            for name, amount in back.items():
                gain[name] += amount
            kept.append(victim)
    kept.reverse()
    return kept, placement


def _fit_gang(free: Mapping[str, int], gpus: int, node_size: int, exclude) -> dict[str, int] | None:
    """The k-1 freest nodes whole and the rest best fit, as FreeMap.fit does, without
    building its index for a single question."""
    k = -(-gpus // node_size)
    top = heapq.nsmallest(k, ((-a, n) for n, a in free.items() if a > 0 and n not in exclude))
    if len(top) < k or -sum(a for a, _ in top) < gpus:
        return None
    placement = {n: -a for a, n in top[: k - 1]}
    rest = gpus - sum(placement.values())
    best = min((a, n) for n, a in free.items()
               if a >= rest and n not in exclude and n not in placement)
    placement[best[1]] = rest
    return placement


class _VictimPicker:
    """One search's walk through a pool in contract order: a heap of each project's best
    victim; taking one changes only its own project's entry, so a step costs a log."""

    def __init__(self, pool: VictimPool):
        self.pool = pool
        self.used: dict[str, int] = {}
        self.taken: set[str] = set()
        self.heap = [e for e in pool.best.values() if e is not None]
        heapq.heapify(self.heap)

    def pop(self) -> TrainJob | None:
        if not self.heap:
            return None
        entry = heapq.heappop(self.heap)
        name, job = entry[-2], entry[-1]
        self.taken.add(job.id)
        used = self.used[name] = self.used.get(name, self.pool.used[name]) - job.gpus
        nxt = self.pool.entry(name, used, self.taken)
        if nxt is not None:
            heapq.heappush(self.heap, nxt)
        return job
