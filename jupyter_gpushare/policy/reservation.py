"""Step 5, reserve: keep nodes for the job that has waited longest, so that no stream of
small jobs starves a large gang.

The job that held a reservation last cycle keeps its nodes while they can still hold it, and
borrowers stay off them meanwhile (``kept_out``). Once the cycle has decided, the holder
keeps them if it still waits for nodes; else the first job in order that waited longer
than ``reserve_after_s`` gets the freest nodes, which only gain free GPUs from then on.
"""

from __future__ import annotations

from typing import Callable, Mapping

from . import reasons as R
from .cache import Cluster
from .decisions import Wait
from .ledger import Ledger
from .model import PolicyConfig, Snapshot, TrainJob
from .placement import nodes_needed


class Reservation:
    def __init__(self, snap: Snapshot, config: PolicyConfig, cluster: Cluster,
                 queues: Mapping[str, tuple[TrainJob, ...]], ledger: Ledger, holder: str | None):
        self.snap, self.config, self.c, self.queues = snap, config, cluster, queues
        self.ledger = ledger
        self.holder, self.nodes = self._carried_over(holder)
        self.holder_job = self._pending_job(self.holder) if self.holder else None
        self.holder_project = self.holder_job.project if self.holder_job else None

    def _carried_over(self, holder: str | None) -> tuple[str | None, frozenset[str]]:
        if not self.config.reservations or holder is None:
            return None, frozenset()
        job = self._pending_job(holder)
        if job is None or not self._can_hold(job.gpus, job.reserved):
            return None, frozenset()  # a node is gone or was never big enough: reserve anew
        return holder, frozenset(job.reserved)

    def _can_hold(self, gpus: int, nodes) -> bool:
        sizes = {n.name: n.milli for n in self.snap.nodes if n.name in self.c.free}
        if not all(n in sizes for n in nodes):
            return False
        k = nodes_needed(gpus, self.c.node_size)  # the gang uses k of them
        return sum(sorted((sizes[n] for n in nodes), reverse=True)[:k]) >= gpus

    def _pending_job(self, job_id: str) -> TrainJob | None:
        for queue in self.queues.values():
            for job in queue:
                if job.id == job_id:
                    return job
        return None

    # -- while the cycle admits --------------------------------------------------------
    def kept_out(self, job: TrainJob) -> frozenset[str]:
        """The reserved nodes a borrower may not use: none for the holder itself, and none,
        with fair-share reclaim, for a job that keeps its project within its deserved share
        while the holder would take its own beyond it. Such a job would take the GPUs back
        from the holder once it ran; kept out, it would wait while the holder took the GPUs
        it reclaimed, then reclaim them again, and the two would preempt each other for ever."""
        if not self.nodes or job.id == self.holder:
            return frozenset()
        if self.holder_outranked() and self._within_either(job):
            return frozenset()
        return self.nodes

    def holder_outranked(self) -> bool:
        """Whether a job within its project's deserved share may use the reserved nodes."""
        cfg = self.config
        return cfg.preemption and cfg.reclaim_fair_share and self.holder_job is not None \
            and not self._within_either(self.holder_job)

    def _within_either(self, job: TrainJob) -> bool:
        """Whether ``job`` keeps its project within its deserved share or its quota."""
        ledger = self.ledger
        return ledger.within_share(job.project, job.gpus) or \
            ledger.within_quota(job.project, job.gpus)

    # -- once the cycle has decided -----------------------------------------------------
    def reserve(self, done: set[str], held: Mapping[str, int], global_key: Callable,
                waits_for_nodes: Callable[[TrainJob], bool]) -> Wait | None:
        """Keep the holder's nodes, or reserve for the first job in order that waited too
        long. ``done``: jobs started or claiming this cycle; ``waits_for_nodes``: whether
        nodes, not its size or its project's limit, are what a job waits for."""
        if not self.config.reservations:
            return None
        if self.holder is not None and self.holder not in done:
            job = self._pending_job(self.holder)
            if waits_for_nodes(job):  # else for its own project, or for ever
                nodes = tuple(sorted(self.nodes))
                return Wait(job.id, None, R.Reserved(job.gpus, nodes), nodes)
        oldest = self.snap.now - self.config.reserve_after_s
        best = None
        for name, queue in self.queues.items():
            for job in queue:  # the first starving job of each project, then the earliest
                if job.waiting_since > oldest or job.id in done:
                    continue
                if not waits_for_nodes(job):
                    continue  # never fits, or waits for its own project, not for nodes
                key = global_key(job)
                if best is None or key < best[0]:
                    best = (key, job)
                break
        if best is None:
            return None
        job = best[1]
        nodes = self._drain_nodes(job.gpus, held)
        return Wait(job.id, None, R.Reserved(job.gpus, nodes), nodes)

    def _drain_nodes(self, gpus: int, held: Mapping[str, int]) -> tuple[str, ...]:
        """The freest nodes that can hold the gang once drained (as many as its placement
        will use); free GPUs there only grow from now on."""
        free = self.ledger.free.free
        sizes = {n.name: n.milli for n in self.snap.nodes if n.name in free}
        k = nodes_needed(gpus, self.c.node_size)
        freest = sorted(free, key=lambda n: (-(free[n] + held.get(n, 0)), -sizes[n], n))
        if k == 1:
            return (next(n for n in freest if sizes[n] >= gpus),)
        chosen = freest[:k]
        if sum(sizes[n] for n in chosen) < gpus:  # mixed sizes: the largest nodes can
            chosen = sorted(free, key=lambda n: (-sizes[n], -free[n], n))[:k]
        return tuple(sorted(chosen))
