"""Departments: a second level of quotas over projects (docs/explanation/scheduling.md,
"Departments").

A department's ``quota`` holds its projects' quotas, each guaranteed as on one level, and is
their first claim on idle GPUs; its ``limit`` caps what they hold together. Idle GPUs are
divided top-down (shares.py): first among departments and the projects that belong to none,
then within each department among its projects, so a project's idle quota goes to its
siblings before other departments. Only jobs beyond their project's quota are ever victims,
siblings' first when a sibling claims. The rule that projects and departments make two
levels (``two_levels``) lives with the model, which checks every snapshot by it.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from .model import Department, Project, two_levels

__all__ = ["Tree", "guaranteed", "two_levels"]


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
