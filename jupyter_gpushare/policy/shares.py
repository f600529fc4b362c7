"""Deserved shares: each project's quota up to its demand, plus a fair part of what is left.

Water-filling in integer milli-GPUs: the capacity that quotas leave unused goes to
projects whose demand is not met, higher ``priority`` tiers first, in proportion to
``over_quota_weight`` within a tier, never beyond a project's demand or ``limit``. With fair
share over time (``past``: each project's decayed borrowed GPU-seconds, past_use.py) the
weights are scaled by what each hungry project borrowed lately.

With departments (departments.py) the water is poured top-down, as KAI-Scheduler divides
fair shares over its queue tree: first among the departments (each as one project with the
department's quota, limit and weight, its projects' demand and past use together, and the
highest priority among them) and the projects outside departments; then each department's
share among its own projects. A department's share holds its projects' quotas, so a
project's unused quota goes to its siblings before any other department.
"""

from __future__ import annotations

from itertools import groupby
from typing import Iterable, Mapping

from .model import Department, Project
from .past_use import weight_factors


def deserved_shares(projects: Iterable[Project], demand: Mapping[str, int],
                    capacity: int, past: Mapping[str, float] | None = None,
                    departments: Iterable[Department] = ()) -> dict[str, int]:
    departments = tuple(departments)
    if not departments:
        return _one_level(projects, demand, capacity, past)
    projects = list(projects)
    units, unit_demand, unit_past = [], dict(demand), dict(past or {})
    members: dict[str, list[Project]] = {d.name: [] for d in departments}
    for p in projects:
        if p.department:
            members[p.department].append(p)
    for d in departments:
        key = "\0" + d.name  # never a project's name
        group = members[d.name]
        units.append(Project(key, d.quota, d.over_quota_weight, d.limit,
                             max((p.priority for p in group), default=0)))
        unit_demand[key] = sum(_target(p, demand) for p in group)
        if past:
            unit_past[key] = sum(past.get(p.name, 0.0) for p in group)
    top = _one_level(units + [p for p in projects if not p.department], unit_demand, capacity,
                     unit_past if past else None)
    share = {name: amount for name, amount in top.items() if not name.startswith("\0")}
    for d in departments:  # (what a department holds is its projects' even at weight 0)
        share.update(_one_level(members[d.name], demand, top["\0" + d.name], past, True))
    return share


def _target(p: Project, demand: Mapping[str, int]) -> int:
    want = demand.get(p.name, 0)
    return want if p.limit is None else min(want, p.limit)


def _one_level(projects: Iterable[Project], demand: Mapping[str, int], capacity: int,
               past: Mapping[str, float] | None, all_share: bool = False) -> dict[str, int]:
    """Water-filling on one level; ``all_share``: when no hungry project of a tier has a
    weight, they share what is left evenly (a department's share is its projects')."""
    projects = sorted(projects, key=lambda p: (-p.priority, p.name))
    target = {}
    share = {}
    for p in projects:
        target[p.name] = _target(p, demand)
        share[p.name] = min(p.quota, target[p.name])
    left = capacity - sum(share.values())
    for _, tier in groupby(projects, key=lambda p: p.priority):
        if left <= 0:
            break
        tier = list(tier)
        hungry = [p for p in tier if p.over_quota_weight > 0 and target[p.name] > share[p.name]]
        weights = {p.name: p.over_quota_weight for p in hungry}
        if all_share and not hungry:
            hungry = [p for p in tier if target[p.name] > share[p.name]]
            weights = dict.fromkeys((p.name for p in hungry), 1)
        if past:  # integer weights still: a factor in thousandths
            factors = weight_factors(weights, past)
            weights = {n: max(1, round(w * factors[n] * 1000)) for n, w in weights.items()}
        left -= _water_fill(hungry, weights, target, share, left)
    return share


def _water_fill(hungry: list[Project], weights: Mapping[str, int], target: dict[str, int],
                share: dict[str, int], left: int) -> int:
    """Raise the shares of ``hungry`` by ``weights``, up to their targets; return what was
    given."""
    # Saturate projects in order of need per weight; cross-multiplying keeps it integer.
    need = {p.name: target[p.name] - share[p.name] for p in hungry}
    order = sorted(hungry, key=lambda p: (need[p.name] / weights[p.name], p.name))
    weight = sum(weights[p.name] for p in order)
    pool = left
    rest = []
    for i, p in enumerate(order):
        if need[p.name] * weight <= pool * weights[p.name]:
            share[p.name] += need[p.name]
            pool -= need[p.name]
            weight -= weights[p.name]
        else:
            rest = order[i:]
            break
    if rest:
        given = {p.name: pool * weights[p.name] // weight for p in rest}
        spare = pool - sum(given.values())
        for p in sorted(rest, key=lambda p: p.name)[:spare]:  # leftover milli-units, by name
            given[p.name] += 1
        for p in rest:
            share[p.name] += given[p.name]
        pool = 0
    return left - pool
