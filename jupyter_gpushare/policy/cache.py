"""What runs: the train pool's free and releasing GPUs and each project's usage.

Built once per cycle from the snapshot and never changed: its free and releasing GPUs and
usage are the cycle's start, which the ledger (ledger.py) takes over and changes as the cycle
decides. A job being preempted still holds its GPUs (``releasing``) until its grace period
ends, but no longer counts as its project's usage.
A drained node's GPUs stay in the pool's capacity (a drain is for a while: a gang that
needs them waits instead of being told it can never run), but none of them, free or
releasing, is given to a new job: the placement sees only the nodes that take jobs.
Lent build GPUs (``lending.py``) are kept apart in ``lending``: not in the capacity, the free
GPUs or the running jobs that claims look at, and their jobs in no project's usage.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .departments import Tree
from .lending import Lending
from .model import TRAIN, Project, Snapshot, TrainJob
from .queues import QueueView


@dataclass
class Cluster:
    capacity: int
    node_size: int
    free: dict[str, int]  # per node that takes jobs
    releasing: dict[str, int]  # only nodes where preempted jobs still hold GPUs
    usage: dict[str, int]
    projects: dict[str, Project]
    all_running: tuple[TrainJob, ...]
    tree: Tree | None = None  # the departments, when quotas have two levels
    lending: Lending | None = None  # lent build GPUs, when the snapshot has any

    @cached_property
    def running(self) -> list[TrainJob]:
        """Running jobs not being preempted and not on lent GPUs: the possible victims. Only
        reclaim needs them."""
        lent = self.lending
        return [j for j in self.all_running if not j.preempting and not (lent and lent.holds(j))]

    @classmethod
    def from_snapshot(cls, snap: Snapshot, view: QueueView) -> "Cluster":
        own = [n for n in snap.nodes if n.pool == TRAIN and not n.lent]
        nodes = {n.name: n.milli for n in own}
        taking = {n.name: n.milli for n in own if not n.drained}
        allocated, releasing = view.allocated, view.releasing
        lending = Lending(snap.nodes, allocated) if len(own) < len(snap.train_nodes()) else None
        free = {name: max(0, size - allocated.get(name, 0)) for name, size in taking.items()}
        projects = {p.name: p for p in snap.projects}
        for name in (*view.pending, *view.usage):
            if name not in projects:  # a job outlives its project: it only borrows
                projects[name] = Project(name)
        usage = dict.fromkeys(projects, 0)
        usage.update(view.usage)
        if lending:  # jobs on lent GPUs count toward no quota
            for job in view.running:
                if not job.preempting and lending.holds(job):
                    usage[job.project] -= job.gpus
        node_size = max(nodes.values(), default=0)
        return cls(
            capacity=sum(nodes.values()),
            node_size=node_size,
            free=free,
            releasing={name: a for name, a in releasing.items() if a and name in taking},
            usage=usage,
            projects=projects,
            all_running=view.running,
            tree=Tree(projects, snap.departments) if snap.departments else None,
            lending=lending,
        )
