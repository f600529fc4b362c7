"""The last cycle, when it changed nothing, and what the simulator needs to find that the
next one would decide the same (``Simulator._inert``, ``Simulator._unchanged``).

A job submitted after such a cycle changes nothing the next cycle decides when it can
neither start nor take anything from anyone, and leaves every other job's turn as it was:

- a **borrower** (beyond its project's quota, counting what the project's claimants were
  promised) that no free or lent GPU holds waits: only a job within quota reclaims, unless
  fair-share reclaim or preemption within a project is on;
- a job **within quota** that no free GPU holds comes last of the jobs within quota (the
  latest to queue, every project and job of one priority), so every job before it is
  decided as before; it then claims GPUs that are being released, where they hold it
  (``victims.fit_without_victims``, the claim's first question: it preempts no one), or,
  where no running job is old enough to be preempted, claims nothing and moves no one.

Where a running job is old enough to be taken back or moved, no project's deserved share may
move either (its project already wants more than its share): the policy orders victims by
their projects' shares. Where none is, no one is taken back or moved, nothing starts, and the
shares decide nothing until the next cycle that is decided works them out again. For a job
within quota no reservation may be held: a claim changes which jobs wait for nodes.
``RoomLeft`` keeps what the quiet cycle left of the free and releasing GPUs as
such claims take them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, NamedTuple

from ..policy import CycleResult
from ..policy.placement import FreeMap
from ..policy.victims import fit_without_victims


class RoomLeft:
    """The free and releasing GPUs per train node, and what each project's claimants were
    promised, as the quiet cycle left them and the claims of jobs found inert since took
    them (as ``policy.ledger.Ledger.hold`` and ``claim`` do)."""

    __slots__ = ("free", "releasing", "claimed", "room")

    def __init__(self, result: CycleResult, node_size: int):
        left = result.left
        self.free = dict(left.free)
        self.releasing = dict(left.releasing)
        self.claimed = dict(left.claimed)
        self.room = FreeMap({n: a + self.releasing.get(n, 0) for n, a in self.free.items()},
                            node_size)

    def claim(self, project: str, gpus: int) -> bool:
        """Promise a claimant of ``project`` GPUs being released, where they hold it with no
        victim; False, and nothing changed, where they do not."""
        placement = fit_without_victims(gpus, self.room, self.releasing)
        if placement is None:
            return False
        free, releasing = self.free, self.releasing
        for name, need in placement.items():
            hold = min(free[name], need)
            free[name] -= hold
            rel = min(releasing.get(name, 0), need - hold)
            if rel:
                releasing[name] -= rel
            self.room.set(name, free[name] + releasing.get(name, 0))
        self.claimed[project] = self.claimed.get(project, 0) + gpus
        return True


class Quiet(NamedTuple):
    """The last cycle, when it changed nothing."""

    t: float
    version: int  # ``ClusterState.version`` it left, or that jobs found inert moved on to
    past_use: Mapping[str, float]
    result: CycleResult
    spare: int  # milli-GPUs a start could still use: free, not held for a claimant, or lent
    left: RoomLeft | None = None  # made when a job within quota first asks
    shares_moved: bool = False  # a job found inert since changed what a project wants

    def waiting(self, job_id: str) -> Quiet:
        """The same, with one more job within quota that does not start."""
        result = replace(self.result,
                         within_quota_waiting=(*self.result.within_quota_waiting, job_id))
        return self._replace(result=result)
