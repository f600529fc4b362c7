"""Build GPUs lent to train jobs: one virtual pool (``Node.lent``).

A build GPU that holds no slice sits idle while train jobs queue. The caller (the service,
the simulator) offers such GPUs as lent train nodes. The cycle treats them apart:

- **Only borrowers start there**, and only once the train pool's own GPUs have no room for
  them: a job that keeps its project within quota, and every claim, uses the train pool's
  own nodes alone, so quotas and the guarantee are what they are without lending.
- **They count toward no quota**: a job on lent GPUs is not part of its project's usage, is
  never the victim of a claim, and the lent GPUs are not part of the capacity that quotas
  and shares divide.
- **The build pool takes them back**: when a slice needs a lent GPU, the caller gives the
  lent node fewer GPUs than its jobs hold; the cycle then preempts jobs there (idle ones
  first, then the most recently started) until what stays fits, whatever their age. They
  are requeued as any victim is, after the grace period.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from .decisions import Preempt
from .model import TRAIN, Node, TrainJob
from .placement import FreeMap

TAKE_BACK = "take back"  # Preempt.kind of a job whose lent GPUs the build pool takes back
LENT_SUFFIX = "/lent"  # a lent node's name: its build node's and this (no real node has "/")


def lent_node(build_node: str) -> str:
    """The name of the lent train node of ``build_node``'s GPUs (the service's naming)."""
    return build_node + LENT_SUFFIX


def build_node_of(name: str) -> str | None:
    """The build node whose GPUs lent node ``name`` is; None for any other node."""
    return name[:-len(LENT_SUFFIX)] if name.endswith(LENT_SUFFIX) else None


class Lending:
    """The lent nodes of one cycle: their free GPUs (``free``) and the jobs they run."""

    def __init__(self, nodes: Iterable[Node], allocated: Mapping[str, int]):
        lent = [n for n in nodes if n.pool == TRAIN and n.lent]
        self.size = {n.name: n.milli for n in lent}
        self.names = frozenset(self.size)
        taking = {n.name: max(0, n.milli - allocated.get(n.name, 0)) for n in lent
                  if not n.drained}
        self.free = FreeMap(taking, max(self.size.values(), default=0))
        self.allocated = {name: allocated.get(name, 0) for name in self.names}

    def __bool__(self) -> bool:
        return bool(self.names)

    def holds(self, job: TrainJob) -> bool:
        """Whether ``job`` runs on lent GPUs (a start places a job on lent nodes only)."""
        return bool(self.names) and not self.names.isdisjoint(job.placement)

    def fit(self, gpus: int) -> dict[str, int] | None:
        return self.free.fit(gpus) if self.free.free else None

    def take_back(self, running: Iterable[TrainJob]) -> list[Preempt]:
        """Preempt jobs on lent nodes that now hold fewer GPUs than their jobs: idle jobs
        first, then the most recently started, until the rest fit."""
        over = {name: self.allocated[name] - size for name, size in self.size.items()
                if self.allocated[name] > size}
        if not over:
            return []
        on = {name: [] for name in over}
        for job in running:
            for name in job.placement:
                if name in on:
                    on[name].append(job)
        for name, jobs in on.items():  # GPUs already leaving are taken back already
            over[name] -= sum(j.placement[name] for j in jobs if j.preempting)
        taken: dict[str, tuple[TrainJob, str]] = {}
        for name in sorted(over):
            for job in sorted((j for j in on[name] if not j.preempting),
                              key=lambda j: (not j.idle, -(j.start_time or 0.0), j.id)):
                if over[name] <= 0:
                    break
                if job.id not in taken:
                    taken[job.id] = (job, name)
                    self._count(over, job, -1)
        for job_id in reversed(list(taken)):  # put back any that was not needed after all
            job = taken[job_id][0]
            if all(over[n] + a <= 0 for n, a in job.placement.items() if n in over):
                self._count(over, job, +1)
                del taken[job_id]
        return [Preempt(job.id, job.project, "", f"the build pool takes back GPUs of {name} "
                        f"that it lent to train jobs", TAKE_BACK)
                for job, name in taken.values()]

    @staticmethod
    def _count(over: dict[str, int], job: TrainJob, sign: int) -> None:
        for name, amount in job.placement.items():
            if name in over:
                over[name] += sign * amount
