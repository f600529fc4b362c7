"""Victims: which running jobs give GPUs back so that a claimant fits.

Contract (DESIGN.md §Scheduling contract, point 6): only over-quota projects lose jobs;
prefer victims that leave their project at or above its quota; then the project most over
its deserved share, then the lowest priority, then the most recently started job. Remove
greedily until the claimant fits, then put back every victim that was not needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations, islice
from typing import Callable, Mapping

from .model import Project, TrainJob
from .placement import FreeMap


@dataclass(frozen=True, slots=True)
class Floor:
    """Which jobs of a project may go, by milli-GPUs the project runs.

    A project loses a job only while it runs more than ``above``; the job may not take it
    below ``keep``; a job that takes it below ``prefer`` is chosen last.
    """

    above: Callable[[str], int]
    keep: Callable[[str], int]
    prefer: Callable[[str], int]


def choose_victims(gpus: int, free: Mapping[str, int], node_size: int,
                   candidates: list[TrainJob], usage: Mapping[str, int],
                   projects: Mapping[str, Project], deserved: Mapping[str, int],
                   floor: Floor, exclude: frozenset[str] = frozenset()
                   ) -> tuple[list[TrainJob], dict[str, int]] | None:
    """The minimal victim set that lets a gang of ``gpus`` fit, with its placement, or None.

    ``free`` already counts GPUs that are free or being released; ``candidates`` are the
    running jobs that may be preempted at all (minimum runtime and over-quota checked by the
    caller), ``usage`` the projects' running milli-GPUs.
    """
    found = _greedy(gpus, free, node_size, candidates, usage, projects, deserved, floor, exclude)
    if found is not None:
        return found
    # Newest first can spread its victims over nodes none of which then holds the gang (and
    # use up what projects may give). Aim at each set of the fewest nodes instead, with only
    # the jobs lying wholly on it, and take the one that preempts least.
    best = None
    for nodes in _node_sets(gpus, free, node_size, candidates, usage, floor, exclude):
        inside = set(nodes)
        found = _greedy(gpus, {n: free[n] for n in nodes}, node_size,
                        [j for j in candidates if j.placement.keys() <= inside],
                        usage, projects, deserved, floor, frozenset())
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


def _greedy(gpus, free, node_size, candidates, usage, projects, deserved, floor, exclude):
    by_project: dict[str, list[TrainJob]] = {}
    for job in sorted(candidates, key=lambda j: (-(j.start_time or 0.0), j.id)):
        by_project.setdefault(job.project, []).append(job)
    hypo = dict(free)
    used = dict(usage)
    removed: list[TrainJob] = []
    placement = _fit(hypo, gpus, node_size, exclude)
    while placement is None:
        victim = _next_victim(by_project, used, projects, deserved, floor)
        if victim is None:
            return None
        by_project[victim.project].remove(victim)
        used[victim.project] -= victim.gpus
        for name, amount in victim.placement.items():
            if name in hypo:
                hypo[name] += amount
        removed.append(victim)
        if sum(hypo[n] for n in hypo if n not in exclude) >= gpus:
            placement = _fit(hypo, gpus, node_size, exclude)
    # Put back, newest choice first, every victim the claimant can do without.
    kept: list[TrainJob] = []
    for victim in reversed(removed):
        trial = dict(hypo)
        for name, amount in victim.placement.items():
            if name in trial:
                trial[name] -= amount
        fit = _fit(trial, gpus, node_size, exclude)
        if fit is not None:
            hypo, placement = trial, fit
        else:
            kept.append(victim)
    kept.reverse()
    return kept, placement


def _fit(free: Mapping[str, int], gpus: int, node_size: int, exclude) -> dict[str, int] | None:
    if gpus <= node_size:  # one node: no index needed for a single question
        best = None
        for name, amount in free.items():
            if amount >= gpus and name not in exclude and (
                    best is None or (amount, name) < (free[best], best)):
                best = name
        return None if best is None else {best: gpus}
    return FreeMap(free, node_size).fit(gpus, exclude)


def _next_victim(by_project, used, projects, deserved, floor: Floor) -> TrainJob | None:
    best_key, best = None, None
    for name, jobs in by_project.items():
        if not jobs:
            continue
        if used[name] <= floor.above(name):
            continue
        keep = floor.keep(name)
        prefer = floor.prefer(name)
        choice = None
        for job in jobs:  # most recently started first
            left = used[name] - job.gpus
            if left < keep:
                continue
            if left >= prefer:
                choice = (False, job)
                break
            if choice is None:
                choice = (True, job)
        if choice is None:
            continue
        below, job = choice
        key = (below, -(used[name] - deserved.get(name, 0)), projects[name].priority,
               -(job.start_time or 0.0), job.id)
        if best_key is None or key < best_key:
            best_key, best = key, job
    return best
