"""What each project holds while one cycle decides.

``usage`` starts as what runs and changes with every decision: starts add, victims go.
``kept`` is what ran before the cycle, less its victims: reclaim judges victims on it, so a
job started this cycle never makes its project look over its quota or share, and no cycle
starts and preempts the same GPUs. ``claimed`` is what claimants were promised while their
victims give GPUs back; it counts against their project like usage.
"""

from __future__ import annotations

from typing import Iterable, Mapping


class Ledger:
    __slots__ = ("usage", "kept", "claimed")

    def __init__(self, usage: Mapping[str, int], projects: Iterable[str]):
        self.usage = dict(usage)
        self.kept = dict(usage)
        self.claimed = dict.fromkeys(projects, 0)

    def committed(self, project: str) -> int:
        """What the project runs or was promised this cycle."""
        return self.usage[project] + self.claimed[project]
