"""One scheduling cycle: an immutable snapshot in, decisions out. No I/O, no clock.

The pipeline:
  1. cache    what runs: free and releasing GPUs, usage per project       (cache.py)
  2. shares   each project's deserved share                                (shares.py)
  3. order    requests that keep their project within quota first, by project priority
              and submit time (a job's priority orders its own project's queue only); then
              borrowers: those that stay within their project's deserved share first, then
              by priority, the project furthest below its deserved share first
  4. admit    place on free GPUs (placement.py); else reclaim (preemption.py); else wait.
              Once no GPU is left to give, the rest of the queue is not visited.
  5. reserve  keep nodes for the job that has waited longest, so no stream of small jobs
              starves a large gang
  6. explain  queue positions and reasons in words (reasons.py), made when first read
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Mapping

from . import reasons as R
from .cache import Cluster
from .model import GPU, PolicyConfig, Project, Snapshot, TrainJob, gpus_text
from .placement import nodes_needed
from .preemption import Floor, VictimPool, choose_victims
from .queues import QueueView, Queues
from .shares import deserved_shares

_NEVER = 1 << 62


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
    kind: str = "guarantee"  # guarantee | fair | priority: which rule took the GPUs back


@dataclass(frozen=True, slots=True)
class Wait:
    job: str
    position: int | None  # None: the job can never run as asked
    reason: R.Reason
    reserved: tuple[str, ...] = ()


@dataclass(frozen=True)
class CycleResult:
    """The decisions of one cycle.

    ``starts``, ``preemptions``, ``reservation`` and ``unschedulable`` are what a caller acts
    on; ``waits`` (every pending job with its queue position and reason) is worked out the
    first time it is read, so a caller that does not show reasons does not pay for them.
    """

    starts: tuple[Start, ...]
    preemptions: tuple[Preempt, ...]
    deserved: Mapping[str, int]
    usage: Mapping[str, int]
    held: Mapping[str, int]
    """Free GPUs kept idle this cycle for a job whose reclaimed GPUs are on their way."""
    reservation: Wait | None
    unschedulable: tuple[Wait, ...]
    _explain: Callable[[], tuple[Wait, ...]] = field(repr=False, compare=False)
    within_quota_waiting: tuple[str, ...] = field(default=(), repr=False, compare=False)

    @cached_property
    def waits(self) -> tuple[Wait, ...]:
        return self._explain()


def cycle(snapshot: Snapshot, config: PolicyConfig = PolicyConfig()) -> CycleResult:
    view = (snapshot.queues or Queues(snapshot.jobs)).view()
    cluster = Cluster.from_snapshot(snapshot, view)                          # 1
    demand = dict(cluster.usage)
    for project, gpus in view.demand.items():
        demand[project] += gpus
    deserved = deserved_shares(cluster.projects.values(), demand, cluster.capacity)  # 2
    return _Admission(snapshot, config, cluster, deserved, view).run()       # 3–6


def never_fits(job: TrainJob, project: Project, capacity: int,
               node_sizes: tuple[int, ...] = ()) -> R.Reason | None:
    """Why ``job`` can never run as asked: larger than the pool, than the fewest nodes it
    must use (``node_sizes``, largest first), or than its project's limit."""
    if job.gpus > capacity:
        return R.TooLarge(job.gpus, capacity)
    if node_sizes:
        k = nodes_needed(job.gpus, node_sizes[0])
        if job.gpus > sum(node_sizes[:k]):
            return R.TooLarge(job.gpus, sum(node_sizes[:k]), nodes=k)
    if project.limit is not None and job.gpus > project.limit:
        return R.TooLarge(job.gpus, project.limit, project=project.name)
    return None


class _Admission:
    """Working state of steps 3–6; lives for one call."""

    def __init__(self, snap: Snapshot, config: PolicyConfig, cluster: Cluster,
                 deserved: dict[str, int], view: QueueView):
        self.snap, self.config, self.c, self.deserved = snap, config, cluster, deserved
        self.queues = view.pending
        self.smallest = view.smallest
        self.projects = cluster.projects
        self.node_sizes = tuple(sorted((n.milli for n in snap.train_nodes()), reverse=True))
        self.usage = dict(cluster.usage)  # running, plus what starts this cycle
        self.kept = dict(cluster.usage)  # running before this cycle, less its victims
        self.claimed = dict.fromkeys(self.projects, 0)  # promised to claimants awaiting reclaim
        self.starts: list[Start] = []
        self.preempts: list[Preempt] = []
        self.waits: list[tuple[TrainJob, R.Reason]] = []
        self.done: set[str] = set()  # started or claiming this cycle
        self.seen: set[str] = set()  # handled before the borrowers' turn
        self.never: list[Wait] = []
        self.claiming: dict[str, TrainJob] = {}  # project → its job reclaiming for its quota
        self.within_quota_waiting: list[str] = []  # kept within quota but did not start
        self.held: dict[str, int] = {}
        self.victims: set[str] = set()
        self._no_fit: dict[tuple, int] = {}  # (mode, exclusion, nodes) → smallest gang that failed
        self._candidates: dict[str, VictimPool] = {}
        self._young = 0  # over-quota jobs spared by the minimum runtime
        self.holder, self.reserved = self._current_reservation(view.holder)
        self.holder_job = self._pending_job(self.holder) if self.holder else None
        self.holder_project = self.holder_job.project if self.holder_job else None

    # -- 3. order ---------------------------------------------------------------------
    def run(self) -> CycleResult:
        self._admit_guaranteed_all()
        tail = self._admit_borrowers()
        reservation = self._reserve()
        return CycleResult(tuple(self.starts), tuple(self.preempts), self.deserved, self.usage,
                           self.held, reservation, tuple(self.never),
                           lambda: self._explain(tail, reservation),
                           tuple(self.within_quota_waiting))

    def _room(self, project: str) -> int:
        return self.projects[project].quota - self._committed(project)

    def _admit_guaranteed_all(self) -> None:
        """Jobs that keep their project within quota, merged across projects in order of
        project priority and submit time (each project's queue is in job priority order)."""
        heap = []
        for name, queue in self.queues.items():
            i = self._next_guaranteed(name, queue, 0)
            if i is not None:
                heap.append((self._global_key(queue[i]), name, i))
        heapq.heapify(heap)
        while heap:
            _, name, i = heapq.heappop(heap)
            queue = self.queues[name]
            job = queue[i]
            if job.gpus <= self._room(name):  # the room may have shrunk since it was pushed
                self.seen.add(job.id)
                self._admit_guaranteed(job)
            nxt = self._next_guaranteed(name, queue, i + 1)
            if nxt is not None:
                heapq.heappush(heap, (self._global_key(queue[nxt]), name, nxt))

    def _next_guaranteed(self, name: str, queue, i: int) -> int | None:
        room = self._room(name)
        if room < self.smallest.get(name, 0):
            return None  # not even the project's smallest job keeps it within quota
        for j in range(i, len(queue)):
            if queue[j].gpus <= room:
                return j
        return None

    def _global_key(self, job: TrainJob) -> tuple:
        # A job's own priority orders it within its project (the queue) only: across
        # projects, the project's priority and then the time it queues from decide.
        return (-self.projects[job.project].priority, job.waiting_since, job.id)

    def _committed(self, project: str) -> int:
        return self.usage[project] + self.claimed[project]

    def _borrow_key(self, project: str) -> tuple:
        """Projects below their deserved share first, then higher priority, then the one
        furthest below its share. The key changes only when the project gets GPUs, so a
        project's jobs that cannot start are passed over together (``_next_hopeful``)."""
        share = self.deserved.get(project, 0)
        committed = self._committed(project)
        ratio = committed / share if share else float("inf")
        # Shares already rank priority tiers: a borrower beyond its share must not take the
        # GPUs a project below its share reclaims, or the two would preempt each other forever.
        return (committed >= share, -self.projects[project].priority, ratio, committed, project)

    # -- 4. admit ---------------------------------------------------------------------
    def _admit_guaranteed(self, job: TrainJob) -> None:
        reason = self._never_fits(job)
        if reason is not None:
            self.never.append(Wait(job.id, None, reason))
            return
        if self._try_start(job, frozenset(), "guaranteed"):
            return
        self.within_quota_waiting.append(job.id)
        if self.config.preemption and self._reclaim(job, "guarantee", frozenset()):
            self.claiming.setdefault(job.project, job)
            return
        self._wait(job, self._why_no_room(job, frozenset()))

    def _admit_borrowers(self) -> list[tuple]:
        """Admit borrowers in fair-share order until no GPU is left to give; return the
        queue entries not visited (their order is fixed from then on)."""
        heap = []
        for name, queue in self.queues.items():
            i = self._next_borrower(queue, 0)
            if i is not None:
                heap.append((self._borrow_key(name), name, i))
        heapq.heapify(heap)
        tail = []
        while heap:
            entry = heapq.heappop(heap)
            _, name, i = entry
            queue = self.queues[name]
            limit = self.projects[name].limit
            if limit is not None and self._committed(name) + self.smallest[name] > limit:
                tail.append(entry)  # at its limit: no job of the project can start
                continue
            if name in self.claiming:  # borrows nothing while its claimant takes GPUs back
                claimant = self.claiming[name]
                for job in queue[i:]:
                    if job.id in self.seen:
                        continue
                    self.seen.add(job.id)
                    reason = self._never_fits(job)
                    if reason is not None:
                        self.never.append(Wait(job.id, None, reason))
                    else:
                        k = nodes_needed(job.gpus, self.c.node_size)
                        self._wait(job, R.BehindClaim(job.gpus, k, name, claimant.id,
                                                      claimant.gpus))
                continue
            if self._exhausted() and not self._may_reclaim(name, queue, i):
                tail.append(entry)
                continue
            i = self._next_hopeful(queue, i)
            if i is None:
                continue
            job = queue[i]
            reason = self._never_fits(job)
            if reason is not None:
                self.never.append(Wait(job.id, None, reason))
                self.seen.add(job.id)
            else:
                self._admit_borrower(job)
            nxt = self._next_borrower(queue, i + 1)
            if nxt is not None:
                heapq.heappush(heap, (self._borrow_key(name), name, nxt))
        return tail

    def _next_hopeful(self, queue, i: int) -> int | None:
        """The first job from ``i`` on that might still get GPUs; the ones passed over wait.
        Their project's key does not change meanwhile, so the order is the heap's."""
        seen, no_fit, node_size = self.seen, self._no_fit, self.c.node_size
        for j in range(i, len(queue)):
            job = queue[j]
            if job.id in seen:
                continue
            excluded = bool(self._kept_out(job))
            k = nodes_needed(job.gpus, node_size)
            limit = self.projects[job.project].limit
            if limit is not None and self._committed(job.project) + job.gpus > limit:
                pass  # waits for its own project, whatever is free
            elif job.gpus < no_fit.get(("borrow", excluded, k), _NEVER) or self._may_take(job, k):
                return j
            self._wait(job, None)
        return None

    def _may_take(self, job: TrainJob, k: int) -> bool:
        """Whether reclaim could still serve ``job`` when no free GPUs fit it."""
        cfg = self.config
        if not cfg.preemption:
            return False
        if cfg.preempt_within_project:
            return True
        if not cfg.reclaim_fair_share or \
                self._committed(job.project) + job.gpus > self.deserved.get(job.project, 0):
            return False
        excluded = bool(self._kept_out(job))
        return job.gpus < self._no_fit.get(("reclaim-fair", excluded, k), _NEVER)

    def _next_borrower(self, queue, i: int) -> int | None:
        seen = self.seen
        for j in range(i, len(queue)):
            if queue[j].id not in seen:
                return j
        return None

    def _kept_out(self, job: TrainJob) -> frozenset[str]:
        """The reserved nodes a borrower may not use: none for the holder itself, and none,
        with fair-share reclaim, for a job that keeps its project within its deserved share
        while the holder would take its own beyond it. Such a job would take the GPUs back
        from the holder once it ran; kept out, it would wait while the holder took the GPUs
        it reclaimed, then reclaim them again, and the two would preempt each other for ever."""
        if not self.reserved or job.id == self.holder:
            return frozenset()
        if self._holder_outranked() and self._within_share(job):
            return frozenset()
        return self.reserved

    def _holder_outranked(self) -> bool:
        """Whether a job within its project's deserved share may use the reserved nodes."""
        cfg = self.config
        return cfg.preemption and cfg.reclaim_fair_share and self.holder_job is not None \
            and not self._within_share(self.holder_job)

    def _within_share(self, job: TrainJob) -> bool:
        p = self.projects[job.project]
        return self._committed(p.name) + job.gpus <= max(self.deserved.get(p.name, 0), p.quota)

    def _exhausted(self) -> bool:
        """No borrower but the reservation holder can start on a free GPU any more."""
        if self.c.free.total(self.reserved) > 0:
            return False
        return not self._holder_outranked() or self.c.free.total() == 0

    def _may_reclaim(self, project: str, queue, i: int) -> bool:
        """Whether a job of ``project`` from position ``i`` on may still get GPUs once no
        free GPU is left: by the holder's reservation, or by reclaiming."""
        cfg = self.config
        if project == self.holder_project and self.holder not in self.done:
            return True  # the holder may start on its reserved nodes
        if not cfg.preemption:
            return False
        if cfg.preempt_within_project:
            return True
        if not cfg.reclaim_fair_share or self._committed(project) >= self.deserved.get(project, 0):
            return False
        smallest_failed = min(self._no_fit.get(("reclaim-fair", x, 1), _NEVER) for x in (False, True))
        return smallest_failed > GPU  # once one GPU cannot be reclaimed, nothing can

    def _admit_borrower(self, job: TrainJob) -> None:
        p = self.projects[job.project]
        if p.limit is not None and self._committed(p.name) + job.gpus > p.limit:
            self._wait(job, None)
            return
        exclude = self._kept_out(job)
        if self._try_start(job, exclude, "borrow"):
            return
        cfg = self.config
        if cfg.preemption and cfg.reclaim_fair_share and \
                self._committed(p.name) + job.gpus <= self.deserved.get(p.name, 0):
            if self._reclaim(job, "fair", exclude):
                return
        if cfg.preemption and cfg.preempt_within_project and self._reclaim(job, "priority", exclude):
            return
        self._wait(job, None)  # the reason is worked out when someone reads it

    def _try_start(self, job: TrainJob, exclude: frozenset, mode: str) -> bool:
        key = (mode, bool(exclude), nodes_needed(job.gpus, self.c.node_size))
        if job.gpus >= self._no_fit.get(key, _NEVER):
            return False  # a gang this large already failed; free GPUs only shrink in a cycle
        placement = self.c.free.fit(job.gpus, exclude)
        if placement is None:
            self._no_fit[key] = job.gpus
            return False
        self.c.free.take(placement)
        self.usage[job.project] += job.gpus
        self.starts.append(Start(job.id, placement))
        self.done.add(job.id)
        return True

    def _reclaim(self, job: TrainJob, mode: str, exclude: frozenset) -> bool:
        """Preempt a minimal set of victims (or wait for GPUs already being released)."""
        key = ("reclaim-" + mode, bool(exclude), nodes_needed(job.gpus, self.c.node_size))
        if mode != "priority" and job.gpus >= self._no_fit.get(key, _NEVER):
            return False
        free = self.c.free.free
        pool = self._victim_pool(mode, job)
        found = choose_victims(job.gpus, free, self.c.releasing, self.c.node_size, pool, exclude)
        if found is None:
            if mode != "priority":
                self._no_fit[key] = job.gpus
            return False
        victims, placement = found
        for other in {id(pool): pool, **{id(p): p for p in self._candidates.values()}}.values():
            other.commit(victims)
        if mode == "priority" and not self._keeps_its_turn(job, victims):
            return False
        taken: dict[str, int] = {}
        for name, need in placement.items():
            hold = min(free[name], need)
            if hold:
                self.c.free.take({name: hold})
                self.held[name] = self.held.get(name, 0) + hold
            rel = min(self.c.releasing.get(name, 0), need - hold)
            if rel:
                self.c.releasing[name] -= rel
            taken[name] = need - hold - rel
        for victim in victims:
            self.victims.add(victim.id)
            self.usage[victim.project] -= victim.gpus
            self.kept[victim.project] -= victim.gpus
            for name, amount in victim.placement.items():
                if name in free:  # what the claimant does not need frees for others
                    use = min(amount, taken.get(name, 0))
                    taken[name] = taken.get(name, 0) - use
                    self.c.releasing[name] = self.c.releasing.get(name, 0) + amount - use
            self.preempts.append(Preempt(victim.id, victim.project, job.id,
                                         self._preempt_why(mode, job), mode))
        self.claimed[job.project] += job.gpus
        self.done.add(job.id)
        k = nodes_needed(job.gpus, self.c.node_size)
        if victims:
            by_project: dict[str, int] = {}
            for v in victims:
                by_project[v.project] = by_project.get(v.project, 0) + v.gpus
            self._wait(job, R.Reclaiming(job.gpus, k, tuple(sorted(by_project.items()))))
        else:
            self._wait(job, R.Releasing(job.gpus, k))
        return True

    def _keeps_its_turn(self, job: TrainJob, victims: list[TrainJob]) -> bool:
        """Whether the claimant, not a requeued victim, is served first once GPUs free up.

        Below quota a requeued victim keeps its project within quota and goes before this
        borrower, which would preempt it again: allowed only if the claimant then fits the quota.
        With fair-share reclaim the same holds for the project's deserved share: below it, the
        victim would reclaim, or another project below its share would take the GPUs first.
        """
        p = self.projects[job.project]
        left = self.usage[p.name] - sum(v.gpus for v in victims)
        after = left + self.claimed[p.name] + job.gpus
        floors = [p.quota]
        if self.config.reclaim_fair_share:
            floors.append(self.deserved.get(p.name, 0))
        return all(left >= floor or after <= floor for floor in floors)

    def _victim_pool(self, mode: str, job: TrainJob) -> VictimPool:
        """The jobs reclaim may take: old enough, and (guarantee, fair) from other projects,
        which the floors ensure, or (priority) of lower priority in the job's own project.
        Victims are judged on what ran before this cycle (``kept``): a job started now never
        makes its project look over its quota or share, so no cycle starts and preempts at once."""
        old_enough = self.snap.now - self.config.min_runtime_s
        if mode == "priority":
            return VictimPool([j for j in self.c.running if j.project == job.project
                               and j.priority < job.priority and j.id not in self.victims
                               and (j.start_time or 0.0) <= old_enough],
                              self.kept, self.projects, self.deserved, self._floor(mode))
        if mode not in self._candidates:
            pool = []
            for j in self.c.running:
                if j.id in self.victims:
                    continue
                if (j.start_time or 0.0) <= old_enough:
                    pool.append(j)
                elif self.usage[j.project] > self.projects[j.project].quota:
                    self._young += 1
            self._candidates[mode] = VictimPool(pool, self.kept, self.projects, self.deserved,
                                                self._floor(mode))
        return self._candidates[mode]

    def _floor(self, mode: str) -> Floor:
        quota = lambda name: self.projects[name].quota  # noqa: E731
        share = lambda name: self.deserved.get(name, 0)  # noqa: E731
        if mode == "guarantee":  # only over-quota projects give back; prefer keeping them at quota
            return Floor(above=quota, keep=lambda name: 0, prefer=quota)
        if mode == "fair":  # only above-share projects give back, and never fall below it
            return Floor(above=share, keep=share, prefer=share)
        return Floor(above=lambda name: -1, keep=lambda name: 0, prefer=quota)

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
        if exclude and job.gpus < self._no_fit.get(("borrow-any", False, k), _NEVER):
            if self.c.free.fit(job.gpus) is not None:
                return R.BehindReservation(job.gpus, k, self.holder)
            self._no_fit[("borrow-any", False, k)] = job.gpus
        if self._committed(p.name) + job.gpus > p.quota:
            return R.NoIdleGpus(p.name, p.quota, self._committed(p.name), job.gpus, k)
        if self._young:
            return R.MinRuntime(job.gpus, k, self.config.min_runtime_s)
        return R.Fragmented(job.gpus, k, self.c.free.total())

    def _borrower_reason(self, job: TrainJob) -> R.Reason:
        p = self.projects[job.project]
        never = self._never_fits(job)
        if never is not None:
            return never
        if p.limit is not None and self._committed(p.name) + job.gpus > p.limit:
            return R.AtLimit(p.name, p.limit, self._committed(p.name))
        return self._why_no_room(job, self._kept_out(job))

    def _wait(self, job: TrainJob, reason: R.Reason | None) -> None:
        self.waits.append((job, reason))

    # -- 5. reserve -------------------------------------------------------------------
    def _current_reservation(self, holder: str | None) -> tuple[str | None, frozenset[str]]:
        if not self.config.reservations or holder is None:
            return None, frozenset()
        job = self._pending_job(holder)
        if job is None or not self._can_hold(job.gpus, job.reserved):
            return None, frozenset()  # a node is gone or was never big enough: reserve anew
        return holder, frozenset(job.reserved)

    def _can_hold(self, gpus: int, nodes) -> bool:
        sizes = {n.name: n.milli for n in self.snap.nodes if n.name in self.c.free.free}
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

    def _reserve(self) -> Wait | None:
        """Keep the holder's nodes, or reserve for the first job in order that waited too long."""
        if not self.config.reservations:
            return None
        if self.holder is not None and self.holder not in self.done:
            job = self._pending_job(self.holder)
            if self._waits_for_nodes(job):  # else for its own project, or for ever
                nodes = tuple(sorted(self.reserved))
                return Wait(job.id, None, R.Reserved(job.gpus, nodes), nodes)
        oldest = self.snap.now - self.config.reserve_after_s
        best = None
        for name, queue in self.queues.items():
            for job in queue:  # the first starving job of each project, then the earliest
                if job.waiting_since > oldest or job.id in self.done:
                    continue
                if not self._waits_for_nodes(job):
                    continue  # never fits, or waits for its own project, not for nodes
                key = self._global_key(job)
                if best is None or key < best[0]:
                    best = (key, job)
                break
        if best is None:
            return None
        job = best[1]
        nodes = self._drain_nodes(job.gpus)
        return Wait(job.id, None, R.Reserved(job.gpus, nodes), nodes)

    def _never_fits(self, job: TrainJob) -> R.Reason | None:
        return never_fits(job, self.projects[job.project], self.c.capacity, self.node_sizes)

    def _waits_for_nodes(self, job: TrainJob) -> bool:
        """Whether nodes, not its size, its project's limit or its project's claim, are what
        ``job`` waits for."""
        p = self.projects[job.project]
        limit = p.limit if p.limit is not None else self.c.capacity
        return self._never_fits(job) is None and self._committed(p.name) + job.gpus <= limit \
            and p.name not in self.claiming

    def _drain_nodes(self, gpus: int) -> tuple[str, ...]:
        """The freest nodes that can hold the gang once drained (as many as its placement
        will use); free GPUs there only grow from now on."""
        free = self.c.free.free
        sizes = {n.name: n.milli for n in self.snap.nodes if n.name in free}
        k = nodes_needed(gpus, self.c.node_size)
        freest = sorted(free, key=lambda n: (-(free[n] + self.held.get(n, 0)), -sizes[n], n))
        if k == 1:
            return (next(n for n in freest if sizes[n] >= gpus),)
        chosen = freest[:k]
        if sum(sizes[n] for n in chosen) < gpus:  # mixed sizes: the largest nodes can
            chosen = sorted(free, key=lambda n: (-sizes[n], -free[n], n))[:k]
        return tuple(sorted(chosen))

    # -- 6. explain -------------------------------------------------------------------
    def _explain(self, tail, reservation: Wait | None) -> tuple[Wait, ...]:
        """Every waiting job in queue order, with its reason. Runs after the cycle's
        decisions, so it sees the state they left and changes nothing but reasons."""
        entries = list(self.waits)
        never = list(self.never)
        heapq.heapify(tail)
        while tail:
            _, name, i = heapq.heappop(tail)
            queue = self.queues[name]
            entries.append((queue[i], None))
            nxt = self._next_borrower(queue, i + 1)
            if nxt is not None:
                heapq.heappush(tail, (self._borrow_key(name), name, nxt))
        waits = []
        position = 0
        for job, reason in entries:
            if reason is None:
                reason = self._borrower_reason(job)
                if isinstance(reason, R.TooLarge):
                    never.append(Wait(job.id, None, reason))
                    continue
            position += 1
            if reservation is not None and job.id == reservation.job:
                if not isinstance(reason, (R.Reclaiming, R.Releasing)):
                    reason = reservation.reason
                waits.append(Wait(job.id, position, reason, reservation.reserved))
            else:
                waits.append(Wait(job.id, position, reason))
        return tuple(waits) + tuple(never)
