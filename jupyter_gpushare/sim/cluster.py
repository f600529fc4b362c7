"""What the policy sees of the simulated pool, kept up to date between cycles: its nodes and
projects, the jobs pending and running (``policy.queues.Queues``), each project's usage and
the job that holds a reservation.

Every change goes through a method here, which moves ``version`` on: a cycle that finds the
version where the last cycle left it sees the very jobs that cycle saw (``Simulator``
uses that to spare cycles that cannot decide anything new). Sorted start and queue times
say when a job's age next passes a threshold of the policy (the minimum runtime, the wait
before a reservation); the free GPUs, kept per node as jobs come and go, say whether a new
job could start at all.
"""

from __future__ import annotations

import bisect
from dataclasses import replace
from typing import Mapping

from ..policy import Node, Snapshot, TrainJob
from ..policy.cycle import never_fits
from ..policy.lending import build_node_of
from ..policy.model import TRAIN, Department, JobState, Project
from ..policy.queues import Queues


def on_lent(placement) -> bool:
    """Whether a job runs on build GPUs lent to train jobs (``policy.lending``'s naming)."""
    return any(build_node_of(name) is not None for name in placement)


class ClusterState:
    """The pool between cycles. ``usage``: milli-GPUs each project holds, less its jobs being
    preempted and its jobs on lent build GPUs (which count toward no quota, as in the pool)."""

    def __init__(self, nodes: tuple[Node, ...], projects: tuple[Project, ...],
                 quotas: dict[str, int], departments: dict[Department, tuple[str, ...]]):
        self.projects = projects
        self.project = {p.name: p for p in projects}
        self.quota_of = {p.name: p.quota for p in projects}
        self.quotas = quotas  # as the run was given them, for its report
        self.departments = departments
        self.department_list = tuple(departments)  # as each snapshot takes them
        self.department_of = {name: d for d, names in departments.items() for name in names}
        self.active = Queues()  # pending and running jobs, as the policy sees them
        self.usage = dict.fromkeys(self.quota_of, 0)
        self.holder: str | None = None  # the pending job that holds a reservation
        self.version = 0
        self.started: list[tuple[float, str]] = []  # (start, job) of those running, not stopping
        self.queued: list[tuple[float, str]] = []  # (waiting_since, job) of those pending
        self.allocated: dict[str, int] = {}  # node → milli-GPUs its running jobs hold
        self.nodes = nodes

    # -- the nodes -------------------------------------------------------------------------
    @property
    def nodes(self) -> tuple[Node, ...]:
        return self._nodes

    @nodes.setter
    def nodes(self, nodes: tuple[Node, ...]) -> None:
        self._nodes = nodes
        self.version += 1
        own = [n for n in nodes if n.pool == TRAIN and not n.lent]
        self.capacity = sum(n.milli for n in own)  # as the policy's ``Cluster`` counts it
        self.node_sizes = tuple(sorted((n.milli for n in own), reverse=True))
        # Where a start may go: the train pool's own nodes that take jobs, and lent ones.
        self.takes = {n.name: (n.milli, n.lent) for n in nodes
                      if n.pool == TRAIN and not n.drained}
        self.free = {False: 0, True: 0}  # milli-GPUs free on own nodes, on lent nodes
        for name, (size, lent) in self.takes.items():
            self.free[lent] += max(0, size - self.allocated.get(name, 0))

    def _allocate(self, placement, sign: int) -> None:
        for name, amount in placement.items():
            before = self.allocated.get(name, 0)
            self.allocated[name] = before + sign * amount
            if name in self.takes:
                size, lent = self.takes[name]
                self.free[lent] += max(0, size - before - sign * amount) - max(0, size - before)

    def never_fits(self, job: TrainJob, project: Project):
        """The policy's reason why ``job`` can never run as asked on these nodes, or None."""
        return never_fits(job, project, self.capacity, self.node_sizes,
                          self.department_of.get(project.name))

    def snapshot(self, t: float, past_use: Mapping[str, float]) -> Snapshot:
        return Snapshot(t, self._nodes, self.projects, queues=self.active, past_use=past_use,
                        departments=self.department_list)

    # -- changes ---------------------------------------------------------------------------
    def _put(self, job: TrainJob) -> None:
        old = self.active.get(job.id)
        if old is not None:
            self._unlist(old)
            if old.running:
                self._allocate(old.placement, -1)
        self.active.put(job)
        if job.running:
            self._allocate(job.placement, +1)
        if job.pending:
            bisect.insort(self.queued, (job.waiting_since, job.id))
        elif job.running and not job.preempting:
            bisect.insort(self.started, (job.start_time, job.id))
        self.version += 1

    def _unlist(self, job: TrainJob) -> None:
        if job.pending:
            listed, key = self.queued, (job.waiting_since, job.id)
        elif job.running and not job.preempting:
            listed, key = self.started, (job.start_time, job.id)
        else:
            return
        del listed[bisect.bisect_left(listed, key)]

    def remove(self, job_id: str) -> TrainJob:
        job = self.active.remove(job_id)
        self._unlist(job)
        if job.running:
            self._allocate(job.placement, -1)
        self.version += 1
        return job

    def submit(self, job: TrainJob) -> None:
        self._put(job)

    def start(self, job_id: str, t: float, placement) -> TrainJob:
        job = self.active.get(job_id)
        if not on_lent(placement):  # lent build GPUs count toward no quota, as in the pool
            self.usage[job.project] += job.gpus
        job = replace(job, state=JobState.RUNNING, placement=placement, start_time=t,
                      reserved=())
        self._put(job)
        if self.holder == job_id:
            self.holder = None
        return job

    def within_quota(self, project: str) -> bool:
        return self.usage[project] <= self.quota_of[project]

    def stop(self, job_id: str) -> TrainJob:
        """The job is told to stop: it holds its GPUs through its grace period, but no
        longer counts as its project's usage."""
        job = self.active.get(job_id)
        if not on_lent(job.placement):
            self.usage[job.project] -= job.gpus
        self._put(replace(job, preempting=True))
        return job

    def end(self, job_id: str) -> TrainJob:
        """The job's work is done: it leaves the pool."""
        job = self.active.get(job_id)
        if not job.preempting and not on_lent(job.placement):
            self.usage[job.project] -= job.gpus
        return self.remove(job_id)

    def requeue(self, job: TrainJob, t: float, attempt: int) -> None:
        """The stopped job is pending again from ``t``, as attempt ``attempt``."""
        self._put(replace(job, state=JobState.PENDING, attempt=attempt, placement={},
                          start_time=None, preempting=False, requeued=t, idle=False))

    def flag_idle(self, job_id: str, attempt: int) -> None:
        """The pool's meter has seen the attempt idle for ``idle_job_after``: flag it."""
        job = self.active.get(job_id)
        if job is not None and job.running and job.attempt == attempt:
            self._put(replace(job, idle=True))

    def reserve(self, holder: str | None, reserved: tuple[str, ...]) -> None:
        """The cycle's reservation: ``holder`` keeps ``reserved``; a former holder still
        pending keeps nothing."""
        if holder is not None:
            job = self.active.get(holder)
            if job.reserved != reserved:
                self._put(replace(job, reserved=reserved))
        if self.holder not in (None, holder):
            old = self.active.get(self.holder)
            if old is not None and old.pending:
                self._put(replace(old, reserved=()))
        if holder != self.holder:
            self.holder = holder
            self.version += 1

    # -- the policy's thresholds ---------------------------------------------------------------
    def first_young(self, t: float, min_runtime_s: float) -> float | None:
        """The start of the first job running at ``t`` (not being stopped) that has run less
        than ``min_runtime_s``, or None."""
        i = bisect.bisect_right(self.started, t, key=lambda s: s[0] + min_runtime_s)
        return self.started[i][0] if i < len(self.started) else None

    def ages_cross(self, t1: float, t2: float, min_runtime_s: float | None,
                   reserve_after_s: float | None) -> bool:
        """Whether, from ``t1`` to ``t2``, a running job's run time reaches
        ``min_runtime_s`` (when it may be preempted from) or a pending job's wait reaches
        ``reserve_after_s`` (when nodes may be reserved for it); None: that age does not
        count. As the policy reads them: old enough at ``now`` when ``start <= now - min``."""
        for listed, age in ((self.started, min_runtime_s), (self.queued, reserve_after_s)):
            if age is None:
                continue
            i = bisect.bisect_right(listed, t1 - age, key=lambda s: s[0])
            if i < len(listed) and listed[i][0] <= t2 - age:
                return True
        return False

    @property
    def pending(self) -> bool:
        return bool(self.queued)
