"""Departments: a second level of quotas over projects (docs/explanation/scheduling.md,
"Departments").

A department's ``quota`` is guaranteed to its projects together, and their own quotas add
up to at most it; its ``limit`` caps what they hold together. Idle GPUs are divided top-down
(shares.py): first among departments and the projects that belong to none, then within each
department among its projects, so a project's idle quota goes to its siblings before other
departments. A job that keeps its project within quota keeps its department's guaranteed
part within quota too, since the projects' quotas fit in the department's; only jobs beyond
their project's quota are ever victims, siblings' first when a sibling claims.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from .model import Department, Project, gpus_text


def two_levels(projects: Iterable[Project], departments: Iterable[Department]) -> str | None:
    """Why projects and departments do not make two levels of quotas, in one sentence that
    says what to do; None when they do."""
    known: dict[str, Department] = {}
    for d in departments:
        if d.name in known:
            return f"department {d.name} is given twice; give each department once"
        known[d.name] = d
    held = dict.fromkeys(known, 0)
    for p in projects:
        if not p.department:
            continue
        if p.department not in known:
            return (f"project {p.name} names department {p.department}, which does not exist; "
                    f"create the department first or name another")
        held[p.department] += p.quota
    for name, total in held.items():
        d = known[name]
        if total > d.quota:
            return (f"the quotas of department {name}'s projects add up to {gpus_text(total)}, "
                    f"more than its quota of {gpus_text(d.quota)}; raise the department's "
                    f"quota or lower its projects'")
    return None


def guaranteed(projects: Iterable[Project], departments: Iterable[Department]) -> list[int]:
    """The guarantees the pool must honour at once: each department's quota and each quota
    of a project outside departments (what ``quotas.overbooking`` adds up)."""
    departments = list(departments)
    return [d.quota for d in departments] + [p.quota for p in projects if not p.department]


class Tree:
    """Which projects share a department, for one cycle."""

    __slots__ = ("departments", "members", "of")

    def __init__(self, projects: Mapping[str, Project], departments: Iterable[Department]):
        self.departments: dict[str, Department] = {d.name: d for d in departments}
        self.of: dict[str, str] = {n: p.department for n, p in projects.items() if p.department}
        self.members: dict[str, tuple[str, ...]] = {}
        for name, dept in sorted(self.of.items()):
            self.members[dept] = self.members.get(dept, ()) + (name,)

    def __bool__(self) -> bool:
        return bool(self.departments)

    def department(self, project: str) -> Department | None:
        name = self.of.get(project)
        return None if name is None else self.departments[name]

    def siblings(self, project: str) -> frozenset[str]:
        """The other projects of ``project``'s department (none outside departments)."""
        name = self.of.get(project)
        if name is None:
            return frozenset()
        return frozenset(self.members[name]) - {project}
