"""What each project holds while one cycle decides.

``usage`` starts as what runs and changes with every decision: starts add, victims go.
``kept`` is what ran before the cycle, less its victims: reclaim judges victims on it, so a
job started this cycle never makes its project look over its quota or share, and no cycle
starts and preempts the same GPUs. ``claimed`` is what claimants were promised while their
victims give GPUs back; it counts against their project like usage. A department's
projects count together against its limit (``beyond_limit``).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from . import reasons as R
from .departments import Tree


class Ledger:
    __slots__ = ("usage", "kept", "claimed", "projects", "tree")

    def __init__(self, usage: Mapping[str, int], projects: Iterable[str] | Mapping,
                 tree: Tree | None = None):
        self.usage = dict(usage)
        self.kept = dict(usage)
        self.claimed = dict.fromkeys(projects, 0)
        self.projects = projects if isinstance(projects, Mapping) else {}
        self.tree = tree

    def committed(self, project: str) -> int:
        """What the project runs or was promised this cycle."""
        return self.usage[project] + self.claimed[project]

    def department_committed(self, department: str) -> int:
        """What a department's projects run or were promised this cycle, together."""
        return sum(self.committed(name) for name in self.tree.members.get(department, ()))

    def beyond_limit(self, project: str, gpus: int) -> R.AtLimit | None:
        """Whether ``gpus`` more would take the project, or its department, beyond its limit."""
        p = self.projects.get(project)
        if p is not None and p.limit is not None:
            committed = self.committed(project)
            if committed + gpus > p.limit:
                return R.AtLimit(project, p.limit, committed)
        if self.tree:
            d = self.tree.department(project)
            if d is not None and d.limit is not None:
                committed = self.department_committed(d.name)
                if committed + gpus > d.limit:
                    return R.AtLimit(project, d.limit, committed, d.name)
        return None
