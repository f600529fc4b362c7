"""Step 4, admit: each job in the order of step 3 starts on free GPUs (placement.py), or
else reclaims them (preemption.py), or else waits. Once no GPU is left to give, the rest of
the borrowers' queue is not visited.
"""

from __future__ import annotations

import bisect
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


def _first_at(index: Mapping[int, list[int]], sizes, j: int, n: int) -> int:
    """The first position from ``j`` on of a job of one of ``sizes`` (``index``: each gang
    size's positions in its queue, ascending), or ``n``."""
    first = n
    for gpus in sizes:
        at = index.get(gpus)
        if at:
            k = bisect.bisect_left(at, j)
            if k < len(at) and at[k] < first:
                first = at[k]
    return first


class PassedOver:
    """A run of a borrowers' queue, from ``i`` to ``end``, none of whose jobs might still get
    GPUs this cycle (``Admission._hopeful_sizes``): its jobs wait, their reasons worked out when the waits are
    read (explain.py), so that a cycle does not walk the whole backlog."""

    __slots__ = ("queue", "i", "end", "seen")

    def __init__(self, queue, i: int, end: int, seen: set[str]):
        self.queue, self.i, self.end, self.seen = queue, i, end, seen

    def waits(self, node_size: int):
        for job in self.queue[self.i:self.end]:
            if job.id not in self.seen:
                yield job, None


class Admission:
    """Admits one cycle's jobs, which the ledger starts, and keeps the rest of what it
    decided: ``waits`` (each with its reason, or None where the reason is worked out only
    when read), ``never`` (jobs that can never run as asked) and ``done`` (started or
    claiming this cycle)."""

    def __init__(self, config: PolicyConfig, cluster: Cluster, node_sizes: tuple[int, ...],
                 projects: Mapping[str, Project], ledger: Ledger, order: Order, memo: FitMemo,
                 reclaimer: Reclaimer, reservation: Reservation, explainer: Explainer,
                 sizes: Mapping[str, tuple[int, ...]] | None = None, positions=None):
        self.config, self.c, self.node_sizes = config, cluster, node_sizes
        self.projects, self.ledger = projects, ledger
        self.order, self.memo, self.reclaimer = order, memo, reclaimer
        self.reservation, self.explainer = reservation, explainer
        self.sizes = sizes  # the gang sizes each project's pending jobs ask for, if known
        self.positions = positions  # (project, queue) → {gang size: its positions}, if known
        self._all_sizes: list[int] | None = None  # every pending gang size, made at first need
        self._none_left = False  # ``_exhausted`` for the rest of the cycle
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
        not visited are parked in ``turn``. Once nothing can change any more (no free GPU
        is left for a project that may not reclaim, or no gang size pending anywhere might
        still get GPUs), the rest are handled at once, each as its turn would have."""
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
                if self._none_may_reclaim():  # nor may any after it
                    self._rest_wait(turn)
                continue
            if self._none_hopeful_anywhere():
                self.waits.append((None, PassedOver(queue, i, len(queue), order.seen)))
                self._rest_wait(turn)
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

    def _rest_wait(self, turn: Borrowers) -> None:
        """The projects still to come in ``turn``, once nothing can start, claim or change
        any more: each handled as its turn would have handled it (parked at its limit or
        with no GPU left for it, behind its claim, or its jobs passed over), in order."""
        queues, smallest, seen = self.order.queues, self.order.smallest, self.order.seen
        beyond_limit = self.ledger.beyond_limit
        for name, i, entry in turn.rest():
            queue = queues[name]
            if beyond_limit(name, smallest[name]) is not None:
                turn.park_entry(entry)
            elif name in self.claiming:
                self._behind_claim(queue, i)
            elif self._exhausted() and not self._may_reclaim(name):
                turn.park_entry(entry)
            else:
                self.waits.append((None, PassedOver(queue, i, len(queue), seen)))

    def _none_hopeful_anywhere(self) -> bool:
        """Whether no gang size any project's pending jobs ask for might still get GPUs
        (``_hopeful_sizes`` for every project, their limits aside), with neither fair-share
        reclaim nor preemption within a project, which ask per project. Sizes known only."""
        cfg = self.config
        if self.sizes is None or (cfg.preemption and (cfg.reclaim_fair_share or
                                                      cfg.preempt_within_project)):
            return False
        if self._all_sizes is None:
            self._all_sizes = sorted({g for sizes in self.sizes.values() for g in sizes})
        reservation = self.reservation
        holder = reservation.holder_job
        if holder is not None and holder.id not in self.done and \
                self._hopeful(holder.gpus, (False,)):
            return False  # the holder may use the reserved nodes
        kept = (True,) if reservation.nodes else (False,)  # every other job's
        return not any(self._hopeful(gpus, kept) for gpus in self._all_sizes)

    def _hopeful(self, gpus: int, kept: tuple[bool, ...]) -> bool:
        """Whether a gang of ``gpus`` might still fit the free GPUs (kept off the reserved
        nodes or not, as ``kept`` has it) or lent ones."""
        k, memo = nodes_needed(gpus, self.c.node_size), self.memo
        return any(not memo.fails(Way.BORROWING, x, k, gpus) for x in kept) or \
            self._may_lend(gpus)

    def _kept(self, project: str) -> tuple[bool, ...]:
        """Whether a job of ``project`` may be kept off the reserved nodes (``kept_out``):
        the holder is not, nor is any job where there are none; with fair-share reclaim a
        job within its share may not be either."""
        reservation = self.reservation
        if not reservation.nodes:
            return (False,)
        if reservation.holder_outranked() or project == reservation.holder_project:
            return (False, True)
        return (True,)

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
        Their project's key does not change meanwhile, so the order is the heap's. Jobs of a
        size none of which might (``_hopeful_sizes``) are passed over without a walk: the
        queue's positions by size (``queues.Queues.positions``) say where the next one of a
        hopeful size is."""
        seen, memo, node_size = self.order.seen, self.memo, self.c.node_size
        kept_out, beyond_limit = self.reservation.kept_out, self.ledger.beyond_limit
        hopeful = self._hopeful_sizes(queue[i].project)
        index = self.positions(queue[i].project, queue) \
            if hopeful is not None and self.positions is not None else None
        n = len(queue)
        j = i
        while j < n:
            if hopeful is not None:
                if index is not None:
                    nxt = _first_at(index, hopeful, j, n)
                else:  # no positions to skip by: all of them, or none
                    nxt = j if hopeful else n
                if nxt > j:
                    self.waits.append((None, PassedOver(queue, j, nxt, seen)))
                    j = nxt
                    continue
            job = queue[j]
            j += 1
            if job.id in seen:
                continue
            excluded = bool(kept_out(job))
            k = nodes_needed(job.gpus, node_size)
            if beyond_limit(job.project, job.gpus) is not None:
                pass  # waits for its own project (or department), whatever is free
            elif not memo.fails(Way.BORROWING, excluded, k, job.gpus) or \
                    self._may_lend(job.gpus) or \
                    self._may_take(job.project, job.gpus, k, excluded):
                return j - 1
            self.waits.append((job, None))
        return None

    def _hopeful_sizes(self, project: str) -> list[int] | None:
        """The gang sizes ``project``'s pending jobs ask for that might still get GPUs,
        whatever the job: within its (department's) limit, and fitting the free GPUs (on or
        off the reserved nodes), lent ones, or reclaim; None where the sizes are not known.
        A job of any other size waits."""
        sizes = self.sizes.get(project) if self.sizes is not None else None
        if sizes is None:
            return None
        node_size, kept = self.c.node_size, self._kept(project)
        out = []
        for gpus in sizes:
            if self.ledger.beyond_limit(project, gpus) is not None:
                continue
            k = nodes_needed(gpus, node_size)
            if self._hopeful(gpus, kept) or \
                    any(self._may_take(project, gpus, k, x) for x in kept):
                out.append(gpus)
        return out

    def _may_lend(self, gpus: int) -> bool:
        """Whether lent build GPUs might still hold a gang of ``gpus``."""
        return self.ledger.lent.total() >= gpus and not self.memo.fails(Way.LENT, False, 1, gpus)

    def _may_take(self, project: str, gpus: int, k: int, excluded: bool) -> bool:
        """Whether reclaim could still serve a gang of ``gpus`` of ``project`` when no free
        GPUs fit it (``excluded``: kept off the reserved nodes)."""
        cfg = self.config
        if not cfg.preemption:
            return False
        if cfg.preempt_within_project:
            return True
        if not cfg.reclaim_fair_share or not self.ledger.within_share(project, gpus):
            return False
        return not self.memo.fails(Reclaim.FAIR, excluded, k, gpus)

    def _exhausted(self) -> bool:
        """No borrower but the reservation holder can start on a free GPU any more. Once so
        it stays so (free and lent GPUs only shrink in a cycle) but with fair-share reclaim,
        whose holder may be outranked or not as its project gets GPUs."""
        if self._none_left:
            return True
        free, reservation = self.ledger.free, self.reservation
        if free.total(reservation.nodes) > 0 or self.ledger.lent.total() > 0:
            return False
        if not reservation.holder_outranked():
            self._none_left = not self.config.reclaim_fair_share
            return True
        return free.total() == 0

    def _none_may_reclaim(self) -> bool:
        """Whether no project may get GPUs by reclaiming or by a reservation any more, once
        no free GPU is left (``_may_reclaim`` for every project)."""
        cfg, reservation = self.config, self.reservation
        if reservation.holder_project is not None and reservation.holder not in self.done:
            return False
        return not cfg.preemption or not (cfg.preempt_within_project or cfg.reclaim_fair_share)

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
        if not self._may_lend(job.gpus):
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
