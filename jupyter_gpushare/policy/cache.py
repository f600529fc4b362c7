"""What runs: the train pool's free and releasing GPUs and each project's usage.

Built once per cycle from the snapshot. A job being preempted still holds its GPUs
(``releasing``) until its grace period ends, but no longer counts as its project's usage.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import TRAIN, Project, Snapshot, TrainJob
from .placement import FreeMap


@dataclass
class Cluster:
    capacity: int
    node_size: int
    free: FreeMap
    releasing: dict[str, int]
    usage: dict[str, int]
    running: list[TrainJob]
    projects: dict[str, Project]

    @classmethod
    def from_snapshot(cls, snap: Snapshot) -> "Cluster":
        nodes = {n.name: n.milli for n in snap.nodes if n.pool == TRAIN}
        free = dict(nodes)
        releasing = dict.fromkeys(nodes, 0)
        projects = {p.name: p for p in snap.projects}
        usage = dict.fromkeys(projects, 0)
        running = []
        for job in snap.jobs:
            if job.project not in projects:  # a job outlives its project: it only borrows
                projects[job.project] = Project(job.project)
                usage[job.project] = 0
            if not job.running:
                continue
            for name, amount in job.placement.items():
                if name in free:  # a vanished node holds nothing
                    free[name] = max(0, free[name] - amount)
                    if job.preempting:
                        releasing[name] += amount
            if not job.preempting:
                usage[job.project] += job.gpus
                running.append(job)
        return cls(
            capacity=sum(nodes.values()),
            node_size=max(nodes.values(), default=0),
            free=FreeMap(free, max(nodes.values(), default=0)),
            releasing=releasing,
            usage=usage,
            running=running,
            projects=projects,
        )
