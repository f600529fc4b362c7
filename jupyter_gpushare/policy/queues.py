"""What waits: pending jobs per project in queue order, and what runs (Kueue's queue manager).

A caller that schedules many cycles (the simulator, the service) keeps one ``Queues`` and
updates it as jobs change, so that a cycle never sorts the whole backlog again. Each
project's queue is a tuple replaced on every change (copy on write), so a ``view()`` taken
for one cycle stays exactly as it was while the caller goes on updating.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from .model import JobState, TrainJob


def queue_key(job: TrainJob) -> tuple:
    """Order inside a project's queue: higher job priority, then the earlier time it queues
    from (its submit, or its requeue: ``TrainJob.waiting_since``), then id."""
    return (-job.priority, job.waiting_since, job.id)


@dataclass(frozen=True, slots=True)
class QueueView:
    running: tuple[TrainJob, ...]
    pending: Mapping[str, tuple[TrainJob, ...]]
    demand: Mapping[str, int]  # pending milli-GPUs per project
    usage: Mapping[str, int]  # running milli-GPUs per project, less jobs being preempted
    allocated: Mapping[str, int]  # milli-GPUs held on each node, preempted jobs included
    releasing: Mapping[str, int]  # milli-GPUs on each node held by jobs being preempted
    smallest: Mapping[str, int]  # the smallest pending job of each project, milli-GPUs
    sizes: Mapping[str, tuple[int, ...]]  # the gang sizes a project's pending jobs ask for
    holder: str | None  # the pending job that holds a reservation, if any
    positions: Callable[[str, tuple[TrainJob, ...]], Mapping[int, list[int]]]
    """(project, its queue) → each gang size's positions in that queue, ascending."""


class Queues:
    def __init__(self, jobs: Iterable[TrainJob] = ()):
        self._pending: dict[str, tuple[TrainJob, ...]] = {}
        self._keys: dict[str, tuple[tuple, ...]] = {}
        self._demand: dict[str, int] = {}
        self._running: dict[str, TrainJob] = {}
        self._usage: dict[str, int] = {}
        self._allocated: dict[str, int] = {}
        self._releasing: dict[str, int] = {}
        self._where: dict[str, TrainJob] = {}
        self._holders: set[str] = set()
        self._sizes: dict[str, dict[int, int]] = {}  # project → pending gang size → count
        self._positions: dict[str, tuple] = {}  # project → (its queue, its positions by size)
        for job in jobs:
            self.put(job)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, job_id: str) -> bool:
        return job_id in self._where

    def get(self, job_id: str) -> TrainJob | None:
        return self._where.get(job_id)

    def put(self, job: TrainJob) -> None:
        """Add a pending or running job, or replace the job with the same id."""
        if job.id in self._where:
            self.remove(job.id)
        if job.state is JobState.RUNNING:
            self._running[job.id] = job
            self._count(job, +1)
        elif job.state is JobState.PENDING:
            key = queue_key(job)
            keys = self._keys.get(job.project, ())
            i = bisect.bisect_left(keys, key)
            self._keys[job.project] = keys[:i] + (key,) + keys[i:]
            queue = self._pending.get(job.project, ())
            self._pending[job.project] = queue[:i] + (job,) + queue[i:]
            self._demand[job.project] = self._demand.get(job.project, 0) + job.gpus
            sizes = self._sizes.setdefault(job.project, {})
            sizes[job.gpus] = sizes.get(job.gpus, 0) + 1
            if job.reserved:
                self._holders.add(job.id)
        else:
            return  # finished jobs are not kept
        self._where[job.id] = job

    def remove(self, job_id: str) -> TrainJob | None:
        job = self._where.pop(job_id, None)
        if job is None:
            return None
        if job.state is JobState.RUNNING:
            del self._running[job_id]
            self._count(job, -1)
        else:
            keys = self._keys[job.project]
            i = bisect.bisect_left(keys, queue_key(job))
            self._keys[job.project] = keys[:i] + keys[i + 1:]
            queue = self._pending[job.project]
            self._pending[job.project] = queue[:i] + queue[i + 1:]
            self._demand[job.project] -= job.gpus
            sizes = self._sizes[job.project]
            sizes[job.gpus] -= 1
            if not sizes[job.gpus]:
                del sizes[job.gpus]
            if not queue[:i] + queue[i + 1:]:
                del self._pending[job.project], self._keys[job.project], self._demand[job.project]
                del self._sizes[job.project]
                self._positions.pop(job.project, None)
            self._holders.discard(job_id)
        return job

    def _count(self, job: TrainJob, sign: int) -> None:
        if not job.preempting:
            self._usage[job.project] = self._usage.get(job.project, 0) + sign * job.gpus
        for node, amount in job.placement.items():
            self._allocated[node] = self._allocated.get(node, 0) + sign * amount
            if job.preempting:
                self._releasing[node] = self._releasing.get(node, 0) + sign * amount

    def pending_gpus(self, project: str) -> int:
        """Milli-GPUs the project's pending jobs ask for, read without a view."""
        return self._demand.get(project, 0)

    def jobs(self) -> tuple[TrainJob, ...]:
        return tuple(self._where.values())

    def view(self) -> QueueView:
        holder = min(self._holders) if self._holders else None
        return QueueView(tuple(self._running.values()), dict(self._pending), dict(self._demand),
                         dict(self._usage), dict(self._allocated), dict(self._releasing),
                         {p: min(sizes) for p, sizes in self._sizes.items()},
                         {p: tuple(sizes) for p, sizes in self._sizes.items()}, holder,
                         self.positions)

    def positions(self, project: str, queue: tuple[TrainJob, ...]) -> Mapping[int, list[int]]:
        """Each gang size's positions in ``queue`` (the project's queue of a view, which
        stays as it was), ascending. Made for a queue once and kept while it is the project's
        latest: most cycles find most queues as the last one left them."""
        kept = self._positions.get(project)
        if kept is not None and kept[0] is queue:
            return kept[1]
        index: dict[int, list[int]] = {}
        for at, job in enumerate(queue):
            index.setdefault(job.gpus, []).append(at)
        self._positions[project] = (queue, index)
        return index
