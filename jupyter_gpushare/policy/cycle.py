"""One scheduling cycle: an immutable snapshot in, decisions out. No I/O, no clock.

The pipeline:
  1. cache    what runs: free and releasing GPUs, usage per project       (cache.py)
  2. shares   each project's deserved share                                (shares.py)
  3. order    requests that keep their project within quota first, by project priority,
              job priority and submit time; then borrowers, the project furthest below its
              deserved share first
  4. admit    place on free GPUs (placement.py); else reclaim (preemption.py); else wait
  5. reserve  keep nodes for the job that has waited longest, so no stream of small jobs
              starves a large gang
  6. explain  queue positions and reasons in words (reasons.py)
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Mapping

from . import reasons as R
from .cache import Cluster
from .model import PolicyConfig, Snapshot, TrainJob, gpus_text
from .placement import nodes_needed
from .preemption import Floor, choose_victims
from .shares import deserved_shares


@dataclass(frozen=True, slots=True)
class Start:
    job: str
    placement: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Preempt:
    job: str
    project: str
    for_job: str
    why: str


@dataclass(frozen=True, slots=True)
class Wait:
    job: str
    position: int | None  # None: the job can never run as asked
    reason: R.Reason
    reserved: tuple[str, ...] = ()


@dataclass(frozen=True)
class CycleResult:
    starts: tuple[Start, ...]
    preemptions: tuple[Preempt, ...]
    waits: tuple[Wait, ...]
    deserved: Mapping[str, int]
    usage: Mapping[str, int]
    held: Mapping[str, int] = field(default_factory=dict)
    """Free GPUs kept idle this cycle for a job whose reclaimed GPUs are on their way."""

    @property
    def reservation(self) -> Wait | None:
        return next((w for w in self.waits if w.reserved), None)


def cycle(snapshot: Snapshot, config: PolicyConfig = PolicyConfig()) -> CycleResult:
    cluster = Cluster.from_snapshot(snapshot)                                # 1
    pending = [j for j in snapshot.jobs if j.pending]
    demand = dict(cluster.usage)
    for job in pending:
        demand[job.project] += job.gpus
    deserved = deserved_shares(cluster.projects.values(), demand, cluster.capacity)  # 2
    return _Admission(snapshot, config, cluster, deserved).run(pending)      # 3–6


class _Admission:
    """Working state of steps 3–6; lives for one call."""

    def __init__(self, snap: Snapshot, config: PolicyConfig, cluster: Cluster,
                 deserved: dict[str, int]):
        self.snap, self.config, self.c, self.deserved = snap, config, cluster, deserved
        self.projects = cluster.projects
        self.usage = dict(cluster.usage)  # running, plus what starts this cycle
        self.claimed = dict.fromkeys(self.projects, 0)  # promised to claimants awaiting reclaim
        self.starts: list[Start] = []
        self.preempts: list[Preempt] = []
        self.waits: list[tuple[TrainJob, R.Reason]] = []
        self.held: dict[str, int] = {}
        self.victims: set[str] = set()
        self._no_fit: dict[tuple, int] = {}  # (mode, exclusion, nodes) → smallest gang that failed
        self._candidates: dict[str, list[TrainJob]] = {}
        self._young = 0  # over-quota jobs spared by the minimum runtime
        self.holder, self.reserved = self._current_reservation()

    # -- 3. order ---------------------------------------------------------------------
    def run(self, pending: list[TrainJob]) -> CycleResult:
        prio = {name: p.priority for name, p in self.projects.items()}
        order = sorted(pending, key=lambda j: (-prio[j.project], -j.priority, j.submit_time, j.id))
        borrowers: dict[str, list[TrainJob]] = {}
        never = []
        for job in order:
            p = self.projects[job.project]
            if job.gpus > self.c.capacity:
                never.append((job, R.TooLarge(job.gpus, self.c.capacity)))
            elif p.limit is not None and job.gpus > p.limit:
                never.append((job, R.TooLarge(job.gpus, p.limit, project=p.name)))
            elif self._committed(p.name) + job.gpus <= p.quota:
                self._admit_guaranteed(job)
            else:
                borrowers.setdefault(job.project, []).append(job)
        self._admit_borrowers(borrowers)
        return self._explain(never)

    def _committed(self, project: str) -> int:
        return self.usage[project] + self.claimed[project]

    def _borrow_key(self, project: str, job: TrainJob) -> tuple:
        share = self.deserved.get(project, 0)
        after = self._committed(project) + job.gpus
        ratio = after / share if share else float("inf")
        return (-self.projects[project].priority, ratio, after, project)

    # -- 4. admit ---------------------------------------------------------------------
    def _admit_guaranteed(self, job: TrainJob) -> None:
        if self._try_start(job, frozenset(), "guaranteed"):
            return
        if self.config.preemption and self._reclaim(job, "guarantee", frozenset()):
            return
        self._wait(job, self._why_no_room(job, frozenset()))

    def _admit_borrowers(self, borrowers: dict[str, list[TrainJob]]) -> None:
        heap = [(self._borrow_key(p, jobs[0]), p, 0) for p, jobs in borrowers.items()]
        heapq.heapify(heap)
        while heap:
            _, project, i = heapq.heappop(heap)
            job = borrowers[project][i]
            self._admit_borrower(job)
            if i + 1 < len(borrowers[project]):
                nxt = borrowers[project][i + 1]
                heapq.heappush(heap, (self._borrow_key(project, nxt), project, i + 1))

    def _admit_borrower(self, job: TrainJob) -> None:
        p = self.projects[job.project]
        if p.limit is not None and self._committed(p.name) + job.gpus > p.limit:
            self._wait(job, R.AtLimit(p.name, p.limit, self._committed(p.name)))
            return
        exclude = self.reserved if job.id != self.holder else frozenset()
        if self._try_start(job, exclude, "borrow"):
            return
        cfg = self.config
        if cfg.preemption and cfg.reclaim_fair_share and \
                self._committed(p.name) + job.gpus <= self.deserved.get(p.name, 0):
            if self._reclaim(job, "fair", exclude):
                return
        if cfg.preemption and cfg.preempt_within_project and self._reclaim(job, "priority", exclude):
            return
        self._wait(job, self._why_no_room(job, exclude))

    def _try_start(self, job: TrainJob, exclude: frozenset, mode: str) -> bool:
        key = (mode, bool(exclude), nodes_needed(job.gpus, self.c.node_size))
        if job.gpus >= self._no_fit.get(key, 1 << 62):
            return False  # a gang this large already failed; free GPUs only shrink in a cycle
        placement = self.c.free.fit(job.gpus, exclude)
        if placement is None:
            self._no_fit[key] = job.gpus
            return False
        self.c.free.take(placement)
        self.usage[job.project] += job.gpus
        self.starts.append(Start(job.id, placement))
        return True

    def _reclaim(self, job: TrainJob, mode: str, exclude: frozenset) -> bool:
        """Preempt a minimal set of victims (or wait for GPUs already being released)."""
        key = ("reclaim-" + mode, bool(exclude), nodes_needed(job.gpus, self.c.node_size))
        if mode != "priority" and job.gpus >= self._no_fit.get(key, 1 << 62):
            return False
        free = self.c.free.free
        hypo = {n: free[n] + self.c.releasing[n] for n in free}
        found = choose_victims(job.gpus, hypo, self.c.node_size, self._victim_pool(mode, job),
                               self.usage, self.projects, self.deserved,
                               self._floor(mode), exclude)
        if found is None:
            if mode != "priority":
                self._no_fit[key] = job.gpus
            return False
        victims, placement = found
        taken: dict[str, int] = {}
        for name, need in placement.items():
            hold = min(free[name], need)
            if hold:
                self.c.free.take({name: hold})
                self.held[name] = self.held.get(name, 0) + hold
            rel = min(self.c.releasing[name], need - hold)
            self.c.releasing[name] -= rel
            taken[name] = need - hold - rel
        for victim in victims:
            self.victims.add(victim.id)
            self.usage[victim.project] -= victim.gpus
            for name, amount in victim.placement.items():
                if name in self.c.releasing:  # what the claimant does not need frees for others
                    use = min(amount, taken.get(name, 0))
                    taken[name] = taken.get(name, 0) - use
                    self.c.releasing[name] += amount - use
            self.preempts.append(Preempt(victim.id, victim.project, job.id,
                                         self._preempt_why(mode, job)))
        self.claimed[job.project] += job.gpus
        k = nodes_needed(job.gpus, self.c.node_size)
        if victims:
            by_project: dict[str, int] = {}
            for v in victims:
                by_project[v.project] = by_project.get(v.project, 0) + v.gpus
            self._wait(job, R.Reclaiming(job.gpus, k, tuple(sorted(by_project.items()))))
        else:
            self._wait(job, R.Releasing(job.gpus, k))
        return True

    def _victim_pool(self, mode: str, job: TrainJob) -> list[TrainJob]:
        old_enough = self.snap.now - self.config.min_runtime_s
        if mode == "priority":
            return [j for j in self.c.running if j.project == job.project
                    and j.priority < job.priority and j.id not in self.victims
                    and (j.start_time or 0.0) <= old_enough]
        if mode not in self._candidates:
            pool = []
            for j in self.c.running:
                if (j.start_time or 0.0) <= old_enough:
                    pool.append(j)
                elif self.usage[j.project] > self.projects[j.project].quota:
                    self._young += 1
            self._candidates[mode] = pool
        pool = self._candidates[mode] = [j for j in self._candidates[mode]
                                         if j.id not in self.victims]
        return [j for j in pool if j.project != job.project]

    def _floor(self, mode: str) -> Floor:
        quota = lambda name: self.projects[name].quota  # noqa: E731
        share = lambda name: self.deserved.get(name, 0)  # noqa: E731
        if mode == "guarantee":  # only over-quota projects give back; prefer keeping them at quota
            return Floor(above=quota, keep=lambda name: 0, prefer=quota)
        if mode == "fair":  # only above-share projects give back, and never fall below it
            return Floor(above=share, keep=share, prefer=share)
        return Floor(above=lambda name: -1, keep=lambda name: 0, prefer=lambda name: 0)

    def _preempt_why(self, mode: str, job: TrainJob) -> str:
        p = self.projects[job.project]
        if mode == "guarantee":
            return (f"preempted to give project {p.name} back GPUs within its quota of "
                    f"{gpus_text(p.quota)} (job {job.id}); it is requeued")
        if mode == "fair":
            return (f"preempted so that project {p.name} gets its fair share of idle GPUs "
                    f"(job {job.id}); it is requeued")
        return f"preempted for higher-priority job {job.id} of the same project; it is requeued"

    def _why_no_room(self, job: TrainJob, exclude: frozenset) -> R.Reason:
        k = nodes_needed(job.gpus, self.c.node_size)
        p = self.projects[job.project]
        if exclude and job.gpus < self._no_fit.get(("borrow-any", False, k), 1 << 62):
            if self.c.free.fit(job.gpus) is not None:
                return R.BehindReservation(job.gpus, k, self.holder)
            self._no_fit[("borrow-any", False, k)] = job.gpus
        if self._committed(p.name) + job.gpus > p.quota:
            return R.NoIdleGpus(p.name, p.quota, self._committed(p.name), job.gpus, k)
        if self._young:
            return R.MinRuntime(job.gpus, k, self.config.min_runtime_s)
        return R.Fragmented(job.gpus, k, self.c.free.total())

    def _wait(self, job: TrainJob, reason: R.Reason) -> None:
        self.waits.append((job, reason))

    # -- 5. reserve -------------------------------------------------------------------
    def _current_reservation(self) -> tuple[str | None, frozenset[str]]:
        if not self.config.reservations:
            return None, frozenset()
        for job in self.snap.jobs:
            if job.pending and job.reserved and all(n in self.c.releasing for n in job.reserved):
                return job.id, frozenset(job.reserved)
        return None, frozenset()

    def _reserve(self) -> tuple[str | None, tuple[str, ...]]:
        if not self.config.reservations:
            return None, ()
        waiting = {job.id for job, _ in self.waits}
        if self.holder in waiting:
            return self.holder, tuple(sorted(self.reserved))
        starved = (R.NoIdleGpus, R.BehindReservation, R.Fragmented, R.MinRuntime)
        for job, reason in self.waits:
            if isinstance(reason, starved) and \
                    self.snap.now - job.submit_time >= self.config.reserve_after_s:
                return job.id, self._drain_nodes(job.gpus)
        return None, ()

    def _drain_nodes(self, gpus: int) -> tuple[str, ...]:
        """The freest nodes, enough for the gang; free GPUs there only grow from now on."""
        free = self.c.free.free
        sizes = {n.name: n.milli for n in self.snap.nodes if n.name in free}
        chosen, room = [], 0
        for name in sorted(free, key=lambda n: (-(free[n] + self.held.get(n, 0)), -sizes[n], n)):
            chosen.append(name)
            room += sizes[name]
            if room >= gpus and len(chosen) >= nodes_needed(gpus, self.c.node_size):
                break
        return tuple(sorted(chosen))

    # -- 6. explain -------------------------------------------------------------------
    def _explain(self, never: list) -> CycleResult:
        holder, nodes = self._reserve()
        waits = []
        for position, (job, reason) in enumerate(self.waits, start=1):
            if job.id == holder:
                if not isinstance(reason, (R.Reclaiming, R.Releasing)):
                    reason = R.Reserved(job.gpus, nodes)
                waits.append(Wait(job.id, position, reason, nodes))
            else:
                waits.append(Wait(job.id, position, reason))
        waits.extend(Wait(job.id, None, reason) for job, reason in never)
        return CycleResult(tuple(self.starts), tuple(self.preempts), tuple(waits),
                           self.deserved, self.usage, self.held)
