"""Step 4, admit: each job in the order of step 3 starts on free GPUs (placement.py), or
else reclaims them (preemption.py), or else waits. Once no GPU is left to give, the rest of
the borrowers' queue is not visited.
"""

from __future__ import annotations

from typing import Iterable, Mapping

from . import reasons as R
from .cache import Cluster
from .decisions import Wait
from .explain import Explainer
from .fits import FitMemo, Way
from .ledger import LEAST, Ledger
from .model import GPU, Department, PolicyConfig, Project, TrainJob
from .order import Borrowers, Order
from .placement import nodes_needed
from .preemption import Reclaim, Reclaimer
from .reservation import Reservation


def never_fits(job: TrainJob, project: Project, capacity: int,
               node_sizes: tuple[int, ...] = (), department: Department | None = None
               ) -> R.Reason | None:
    """Why ``job`` can never run as asked: larger than the pool, than the fewest nodes it
    must use (``node_sizes``, largest first), or than its project's or department's limit."""
    return never_fits_gpus(job.gpus, project, capacity, node_sizes, department)


def never_fits_gpus(gpus: int, project: Project, capacity: int,
                    node_sizes: tuple[int, ...] = (), department: Department | None = None
                    ) -> R.Reason | None:
    """``never_fits`` for a gang of ``gpus`` of ``project``."""
    if gpus > capacity:
        return R.TooLarge(gpus, capacity)
    if node_sizes:
        k = nodes_needed(gpus, node_sizes[0])
        if gpus > sum(node_sizes[:k]):
            return R.TooLarge(gpus, sum(node_sizes[:k]), nodes=k)
    if project.limit is not None and gpus > project.limit:
        return R.TooLarge(gpus, project.limit, project=project.name)
    if department is not None and department.limit is not None and gpus > department.limit:
        return R.TooLarge(gpus, department.limit, project=project.name,
                          department=department.name)
    return None


class BehindClaim:
    """The jobs of a claimant's project from ``i`` on, waiting behind its claim: listed with
    their reasons only when the waits are read (explain.py), so that a cycle does not walk
    the project's whole backlog."""

    __slots__ = ("queue", "i", "claimant", "seen")

    def __init__(self, queue, i: int, claimant: TrainJob, seen: set[str]):
        self.queue, self.i, self.claimant, self.seen = queue, i, claimant, seen

    def waits(self, node_size: int):
        c = self.claimant
        for job in self.queue[self.i:]:
            if job.id not in self.seen:
                yield job, R.BehindClaim(job.gpus, nodes_needed(job.gpus, node_size),
                                         job.project, c.id, c.gpus)


class Admission:
    """Admits one cycle's jobs, which the ledger starts, and keeps the rest of what it
    decided: ``waits`` (each with its reason, or None where the reason is worked out only
    when read), ``never`` (jobs that can never run as asked) and ``done`` (started or
    claiming this cycle)."""

    def __init__(self, config: PolicyConfig, cluster: Cluster, node_sizes: tuple[int, ...],
                 projects: Mapping[str, Project], ledger: Ledger, order: Order, memo: FitMemo,
                 reclaimer: Reclaimer, reservation: Reservation, explainer: Explainer,
                 sizes: Mapping[str, tuple[int, ...]] | None = None):
        self.config, self.c, self.node_sizes = config, cluster, node_sizes
        self.projects, self.ledger = projects, ledger
        self.order, self.memo, self.reclaimer = order, memo, reclaimer
        self.reservation, self.explainer = reservation, explainer
        self.sizes = sizes  # the gang sizes each project's pending jobs ask for, if known
        self.waits: list[tuple[TrainJob, R.Reason | None]] = []
        self.never: list[Wait] = []
        self.done: set[str] = set()
        self.within_quota_waiting: list[str] = []  # kept within quota but did not start
        self.claiming: dict[str, TrainJob] = {}  # project → its job taking GPUs back for its quota

    def never_fits(self, job: TrainJob) -> R.Reason | None:
        tree = self.c.tree
        return never_fits(job, self.projects[job.project], self.c.capacity, self.node_sizes,
                          tree.department(job.project) if tree else None)

    def waits_for_nodes(self, job: TrainJob) -> bool:
        """Whether nodes, not its size, its (department's) limit or its project's claim (it
        waits behind it: ``_behind_claim``), are what ``job`` waits for."""
        if job.project in self.claiming:
            return False
        ledger, p = self.ledger, self.projects[job.project]
        limit = p.limit if p.limit is not None else self.c.capacity
        return self.never_fits(job) is None and ledger.committed(p.name) + job.gpus <= limit \
            and ledger.beyond_limit(p.name, job.gpus) is None

    # -- within quota ----------------------------------------------------------------------
    def within_quota(self, jobs: Iterable[TrainJob]) -> None:
        for job in jobs:
            reason = self.never_fits(job)
            if reason is not None:
                self.never.append(Wait(job.id, None, reason))
                continue
            if self.c.tree:  # within its quota, but beyond its department's limit?
                at_limit = self.ledger.beyond_limit(job.project, job.gpus)
                if at_limit is not None and at_limit.department:
                    went = self._within_limit(job, at_limit)
                    if went is None:
                        self.within_quota_waiting.append(job.id)
                        self.waits.append((job, at_limit))
                    if went != "free":
                        continue  # it waits, or claimed
            if self._start(job, frozenset(), Way.WITHIN_QUOTA):
                continue
            self.within_quota_waiting.append(job.id)
            if self.config.preemption and (self._reclaim(job, Reclaim.GUARANTEE, frozenset())
                                           or self._move(job)):
                self.claiming.setdefault(job.project, job)
                continue
            self.waits.append((job, self.explainer.why_no_room(job, frozenset())))

    def _within_limit(self, job: TrainJob, at_limit: R.AtLimit) -> str | None:
        """A job within quota whose department would pass its limit: its siblings' borrowed
        jobs give back what the limit needs. Where the job fits on free GPUs, any of them
        do ("free": it starts there); elsewhere only a claim that also makes it room
        ("claimed", here). None, and nothing preempted, when they cannot: no job is
        preempted for a claimant that could not run once they are gone."""
        if not self.config.preemption:
            return None
        if self.ledger.free.fit(job.gpus, frozenset()) is not None:
            return "free" if self.reclaimer.within_limit(job, at_limit) else None
        reason = self.reclaimer.claim(job, Reclaim.GUARANTEE, frozenset(), at_limit)
        if reason is None:
            return None
        self.done.add(job.id)
        self.within_quota_waiting.append(job.id)
        self.claiming.setdefault(job.project, job)
        self.waits.append((job, reason))
        return "claimed"

    # -- borrowers -------------------------------------------------------------------------
    def borrowers(self, turn: Borrowers) -> None:
        """Admit borrowers in fair-share order until no GPU is left to give; the projects
        not visited are parked in ``turn``."""
        order = self.order
        queues, smallest = order.queues, order.smallest
        beyond_limit = self.ledger.beyond_limit
        for name, i in turn:
            queue = queues[name]
            if beyond_limit(name, smallest[name]) is not None:
                turn.park()  # at its (department's) limit: no job of the project can start
                continue
            if name in self.claiming:
                self._behind_claim(queue, i)  # and its queue is done for this cycle
                continue
            if self._exhausted() and not self._may_reclaim(name):
                turn.park()
                continue
            i = self._next_hopeful(queue, i)
            if i is None:
                continue
            job = queue[i]
            reason = self.never_fits(job)
            if reason is not None:
                self.never.append(Wait(job.id, None, reason))
                order.pass_over(job)
            else:
                self._admit_borrower(job)
            turn.go_on(name, i + 1)

    def _behind_claim(self, queue, i: int) -> None:
        """A project whose job within quota claims GPUs borrows nothing this cycle: were its
        later jobs to borrow idle GPUs, the claimant would no longer keep the project within
        quota by the time its GPUs are free, and the reclaim would be wasted. Its jobs wait
        (their reasons are listed when read); only a size that can never run is looked for
        now, and only when the project has one."""
        order, project = self.order, queue[i].project
        sizes = self.sizes.get(project) if self.sizes is not None else None
        p = self.projects[project]
        tree = self.c.tree
        department = tree.department(project) if tree else None
        if sizes is None or any(never_fits_gpus(g, p, self.c.capacity, self.node_sizes,
                                                department) for g in sizes):
            for job in queue[i:]:
                if job.id not in order.seen:
                    reason = self.never_fits(job)
                    if reason is not None:
                        self.never.append(Wait(job.id, None, reason))
                        order.pass_over(job)  # listed as never, not behind the claim
        self.waits.append((None, BehindClaim(queue, i, self.claiming[project], order.seen)))

    def _next_hopeful(self, queue, i: int) -> int | None:
        """The first job from ``i`` on that might still get GPUs; the ones passed over wait.
        Their project's key does not change meanwhile, so the order is the heap's."""
        seen, memo, node_size = self.order.seen, self.memo, self.c.node_size
        kept_out, beyond_limit = self.reservation.kept_out, self.ledger.beyond_limit
        for j in range(i, len(queue)):
            job = queue[j]
            if job.id in seen:
                continue
            excluded = bool(kept_out(job))
            k = nodes_needed(job.gpus, node_size)
            if beyond_limit(job.project, job.gpus) is not None:
                pass  # waits for its own project (or department), whatever is free
            elif not memo.fails(Way.BORROWING, excluded, k, job.gpus) or \
                    self._may_lend(job) or self._may_take(job, k):
                return j
            self.waits.append((job, None))
        return None

    def _may_lend(self, job: TrainJob) -> bool:
        """Whether lent build GPUs might still hold ``job``."""
        return self.ledger.lent.total() >= job.gpus and \
            not self.memo.fails(Way.LENT, False, 1, job.gpus)

    def _may_take(self, job: TrainJob, k: int) -> bool:
        """Whether reclaim could still serve ``job`` when no free GPUs fit it."""
        cfg = self.config
        if not cfg.preemption:
            return False
        if cfg.preempt_within_project:
            return True
        if not cfg.reclaim_fair_share or not self.ledger.within_share(job.project, job.gpus):
            return False
        excluded = bool(self.reservation.kept_out(job))
        return not self.memo.fails(Reclaim.FAIR, excluded, k, job.gpus)

    def _exhausted(self) -> bool:
        """No borrower but the reservation holder can start on a free GPU any more."""
        free, reservation = self.ledger.free, self.reservation
        if free.total(reservation.nodes) > 0 or self.ledger.lent.total() > 0:
            return False
        return not reservation.holder_outranked() or free.total() == 0

    def _may_reclaim(self, project: str) -> bool:
        """Whether a job of ``project`` may still get GPUs once no free GPU is left: by the
        holder's reservation, or by reclaiming."""
        cfg, reservation = self.config, self.reservation
        if project == reservation.holder_project and reservation.holder not in self.done:
            return True  # the holder may start on its reserved nodes
        if not cfg.preemption:
            return False
        if cfg.preempt_within_project:
            return True
        if not cfg.reclaim_fair_share or not self.ledger.within_share(project, LEAST):
            return False
        smallest_failed = min(self.memo.smallest(Reclaim.FAIR, x, 1) for x in (False, True))
        return smallest_failed > GPU  # once one GPU cannot be reclaimed, nothing can

    def _admit_borrower(self, job: TrainJob) -> None:
        p = self.projects[job.project]
        if self.ledger.beyond_limit(p.name, job.gpus) is not None:
            self.waits.append((job, None))
            return
        exclude = self.reservation.kept_out(job)
        if self._start(job, exclude, Way.BORROWING) or self._start_lent(job):
            return
        cfg = self.config
        if cfg.preemption and cfg.reclaim_fair_share and \
                self.ledger.within_share(p.name, job.gpus):
            if self._reclaim(job, Reclaim.FAIR, exclude):
                return
        if cfg.preemption and cfg.preempt_within_project and \
                self._reclaim(job, Reclaim.PRIORITY, exclude):
            return
        self.waits.append((job, None))  # the reason is worked out when someone reads it

    # -- either ----------------------------------------------------------------------------
    def _start(self, job: TrainJob, exclude: frozenset, way: Way) -> bool:
        k, excluded = nodes_needed(job.gpus, self.c.node_size), bool(exclude)
        if self.memo.fails(way, excluded, k, job.gpus):
            return False  # a gang this large already failed; free GPUs only shrink in a cycle
        placement = self.ledger.free.fit(job.gpus, exclude)
        if placement is None:
            self.memo.failed(way, excluded, k, job.gpus)
            return False
        self.ledger.start(job, placement)
        self.done.add(job.id)
        return True

    def _start_lent(self, job: TrainJob) -> bool:
        """Start a borrower on lent build GPUs alone (``lending.py``), which count toward no
        quota: its project's usage does not grow."""
        if not self._may_lend(job):
            return False
        placement = self.ledger.lent.fit(job.gpus)
        if placement is None:
            self.memo.failed(Way.LENT, False, 1, job.gpus)
            return False
        self.ledger.start_lent(job, placement)
        self.done.add(job.id)
        return True

    def _move(self, job: TrainJob) -> bool:
        """With ``consolidate``: move jobs within quota off the nodes ``job`` needs."""
        if not self.config.consolidate:
            return False
        reason = self.reclaimer.move(job, frozenset())
        if reason is None:
            return False
        self.done.add(job.id)
        self.waits.append((job, reason))
        return True

    def _reclaim(self, job: TrainJob, rule: Reclaim, exclude: frozenset) -> bool:
        reason = self.reclaimer.claim(job, rule, exclude)
        if reason is None:
            return False
        self.done.add(job.id)
        self.waits.append((job, reason))
        return True
