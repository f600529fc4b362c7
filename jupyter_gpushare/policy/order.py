"""Step 3, order: which pending job the cycle considers next.

First the jobs that keep their project within quota, merged across projects by project
priority and the time each queues from (``TrainJob.waiting_since``: its submit, or its
requeue); each project's queue is already in job priority order, so a
job's own priority orders its project's queue only. Then the borrowers, project by project
in fair-share order (``borrow_key``). Both orders read the ledger as the cycle decides: a
project's room and its key change when it gets GPUs.
"""

from __future__ import annotations

import heapq
from typing import Iterator, Mapping

from .ledger import LEAST, Ledger
from .model import Project, TrainJob


class Order:
    def __init__(self, queues: Mapping[str, tuple[TrainJob, ...]], smallest: Mapping[str, int],
                 projects: Mapping[str, Project], ledger: Ledger):
        self.queues, self.smallest = queues, smallest
        self.projects, self.ledger = projects, ledger
        self.seen: set[str] = set()  # handled already: a borrower's turn passes them over

    def global_key(self, job: TrainJob) -> tuple:
        """Across projects, the project's priority and then the time the job queues from (its
        submit, or its requeue) decide."""
        return (-self.projects[job.project].priority, job.waiting_since, job.id)

    def borrow_key(self, project: str) -> tuple:
        """Projects below their deserved share first, then higher priority, then the one
        furthest below its share. The key changes only when the project gets GPUs, so a
        project's jobs that cannot start are passed over together."""
        ledger = self.ledger
        share = ledger.deserved.get(project, 0)
        committed = ledger.committed(project)
        ratio = committed / share if share else float("inf")
        # Shares already rank priority tiers: a borrower beyond its share must not take the
        # GPUs a project below its share reclaims, or the two would preempt each other forever.
        below = ledger.within_share(project, LEAST)
        return (not below, -self.projects[project].priority, ratio, committed, project)

    # -- within quota --------------------------------------------------------------------
    def within_quota(self) -> Iterator[TrainJob]:
        """Jobs that keep their project within quota, in order; each is asked for after the
        one before was admitted, so it sees the room that admission left."""
        heap = []
        for name, queue in self.queues.items():
            i = self._next_within(name, queue, 0)
            if i is not None:
                heap.append((self.global_key(queue[i]), name, i))
        heapq.heapify(heap)
        while heap:
            _, name, i = heapq.heappop(heap)
            queue = self.queues[name]
            job = queue[i]
            if job.gpus <= self._room(name):  # the room may have shrunk since it was pushed
                self.seen.add(job.id)
                yield job
            nxt = self._next_within(name, queue, i + 1)
            if nxt is not None:
                heapq.heappush(heap, (self.global_key(queue[nxt]), name, nxt))

    def _room(self, project: str) -> int:
        return self.projects[project].quota - self.ledger.committed(project)

    def _next_within(self, name: str, queue, i: int) -> int | None:
        room = self._room(name)
        if room < self.smallest.get(name, 0):
            return None  # not even the project's smallest job keeps it within quota
        for j in range(i, len(queue)):
            if queue[j].gpus <= room:
                return j
        return None

    # -- borrowers -----------------------------------------------------------------------
    def borrowers(self) -> "Borrowers":
        return Borrowers(self)

    def pass_over(self, job: TrainJob) -> None:
        """``job`` was handled (it can never run as asked): the borrowers' turn passes it over."""
        self.seen.add(job.id)

    def next_unseen(self, queue, i: int) -> int | None:
        seen = self.seen
        for j in range(i, len(queue)):
            if queue[j].id not in seen:
                return j
        return None


class Borrowers:
    """The borrowers' turn: ``(project, position)`` in fair-share order, one project's next
    job at a time. After each, the caller says how it went on: ``go_on`` from a position,
    ``park`` (the project waits out this cycle unvisited), or nothing (its queue is done).
    """

    def __init__(self, order: Order):
        self.order = order
        self._heap = []
        for name, queue in order.queues.items():
            i = order.next_unseen(queue, 0)
            if i is not None:
                self._heap.append((order.borrow_key(name), name, i))
        heapq.heapify(self._heap)
        self._tail: list[tuple] = []
        self._entry: tuple | None = None

    def __iter__(self) -> Iterator[tuple[str, int]]:
        heap = self._heap
        while heap:
            self._entry = entry = heapq.heappop(heap)
            yield entry[1], entry[2]

    def go_on(self, name: str, i: int) -> None:
        """The project's next borrower from position ``i`` on takes its place in the order."""
        order = self.order
        nxt = order.next_unseen(order.queues[name], i)
        if nxt is not None:
            heapq.heappush(self._heap, (order.borrow_key(name), name, nxt))

    def park(self) -> None:
        """The project just handed out is not visited: its order is fixed from now on."""
        self._tail.append(self._entry)

    def rest(self) -> list[tuple[str, int]]:
        """The projects still to come, ``(project, position, entry)`` in their order, handed
        out all at once: the caller parks each entry (``park_entry``) or not, as it would
        have one by one."""
        rest = sorted(self._heap)
        self._heap.clear()
        return [(entry[1], entry[2], entry) for entry in rest]

    def park_entry(self, entry: tuple) -> None:
        """``park`` for an entry of ``rest``."""
        self._tail.append(entry)

    def unvisited(self) -> Iterator[TrainJob]:
        """The parked projects' jobs in the order they would have been visited. Read once,
        after the cycle's decisions (to explain the waits)."""
        order, tail = self.order, self._tail
        heapq.heapify(tail)
        while tail:
            _, name, i = heapq.heappop(tail)
            queue = order.queues[name]
            yield queue[i]
            nxt = order.next_unseen(queue, i + 1)
            if nxt is not None:
                heapq.heappush(tail, (order.borrow_key(name), name, nxt))
