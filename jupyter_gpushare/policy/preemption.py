"""Step 4's reclaim: which running jobs give GPUs back so that a claimant fits.

``Reclaimer`` serves one cycle's claimants: it gathers the jobs a rule may take
(``victims.Candidates``), chooses the fewest (``victims.choose_victims``), and asks the ledger
(ledger.py) to hold the free GPUs the claimant will use and to evict the victims. Which jobs
may go:

Contract point 6 (docs/explanation/scheduling.md#contract-6): only over-quota projects lose jobs;
prefer victims that leave their project at or above its quota; then the claimant's siblings
in its department (departments.py); then idle jobs (``idle``:
their GPUs stayed unused) before busy ones; then the project most over its deserved share,
then the lowest priority, then the most recently started job. Remove
greedily until the claimant fits, then put back every victim that was not needed.
"""

from __future__ import annotations

import enum
from typing import Mapping

from . import reasons as R
from .cache import Cluster
from .decisions import PreemptKind
from .fits import FitMemo
from .ledger import Ledger
from .model import PolicyConfig, Project, TrainJob, gpus_text
from .placement import nodes_needed
from .moves import plan_moves
from .victims import Candidates, Floor, VictimPicker, choose_victims, fit_without_victims


class Reclaim(str, enum.Enum):
    """Which rule takes GPUs back, for whom and from whom; what its victims' ``Preempt.kind``
    says is ``kind``."""

    GUARANTEE = PreemptKind.GUARANTEE.value  # for a job within quota: from over-quota projects
    FAIR = PreemptKind.FAIR.value  # for a borrower within its share: from projects above theirs
    PRIORITY = PreemptKind.PRIORITY.value  # for a job of higher priority: from its own project
    MOVE = PreemptKind.MOVE.value  # for a gang within quota: jobs within quota go elsewhere

    @property
    def kind(self) -> PreemptKind:
        return PreemptKind(self.value)

    def floor(self, projects: Mapping[str, Project], deserved: Mapping[str, int]) -> Floor:
        quota = lambda name: projects[name].quota  # noqa: E731
        share = lambda name: deserved.get(name, 0)  # noqa: E731
        if self is Reclaim.GUARANTEE:  # only over-quota projects give back; prefer keeping them at quota
            return Floor(above=quota, keep=lambda name: 0, prefer=quota)
        if self is Reclaim.FAIR:  # only above-share projects give back, and never fall below it
            return Floor(above=share, keep=share, prefer=share)
        return Floor(above=lambda name: -1, keep=lambda name: 0, prefer=quota)

    def why(self, project: Project, job: TrainJob) -> str:
        """What the victim's owner reads."""
        if self is Reclaim.GUARANTEE:
            return (f"preempted to give project {project.name} back GPUs within its quota of "
                    f"{gpus_text(project.quota)} (job {job.id}); it is requeued")
        if self is Reclaim.FAIR:
            return (f"preempted so that project {project.name} gets its fair share of idle GPUs "
                    f"(job {job.id}); it is requeued")
        if self is Reclaim.MOVE:
            return (f"moved so that job {job.id} of project {project.name}, within its quota, "
                    f"gets the nodes it needs; it is requeued to start again on other GPUs, "
                    f"which are kept for it")
        return f"preempted for higher-priority job {job.id} of the same project; it is requeued"


class Reclaimer:
    """Reclaim for the claimants of one cycle.

    Chooses; the ledger books what is chosen (its victim pools watch the ledger). Keeps
    ``too_young`` (over-quota jobs its pools left out for their minimum runtime, counted as
    each pool is gathered) and ``moved_for``.
    """

    def __init__(self, now: float, config: PolicyConfig, cluster: Cluster,
                 projects: Mapping[str, Project], deserved: Mapping[str, int], ledger: Ledger,
                 memo: FitMemo):
        self.now, self.config, self.c = now, config, cluster
        self.projects, self.deserved, self.ledger, self.memo = projects, deserved, ledger, memo
        self.too_young = 0
        self.moved_for: str | None = None  # the gang given room by moves this cycle, if any
        self._pools: dict = {}  # GUARANTEE, FAIR and "any age" (moves), made at first need
        self._gathered: dict = {}  # GUARANTEE and FAIR: the jobs they may look at

    def claim(self, job: TrainJob, rule: Reclaim, exclude: frozenset,
              at_limit: R.AtLimit | None = None) -> R.Reason | None:
        """Preempt the fewest victims that let ``job`` fit (or claim GPUs already being
        released) and say why it waits for them; None if this rule cannot serve it.
        ``at_limit``: the job's department would pass its limit, so its siblings' victims
        must also bring the department back within it."""
        ledger = self.ledger
        k = nodes_needed(job.gpus, self.c.node_size)
        # A priority pool is the claimant's own (its lower-priority jobs): a failure says
        # nothing of the next claimant's; nor does one that had to meet a limit too.
        remember = rule is not Reclaim.PRIORITY and at_limit is None
        if rule is not Reclaim.PRIORITY and self.memo.fails(rule, bool(exclude), k, job.gpus):
            return None
        need = 0 if at_limit is None else at_limit.usage + job.gpus - at_limit.limit
        if need == 0 and rule is not Reclaim.PRIORITY:
            # GPUs being released that hold it need no victim, nor the pool of victims (only
            # counted, as every claim's first look at it counts the young borrowers)
            self._old_enough(rule)
            placement = fit_without_victims(job.gpus, ledger.room, ledger.releasing, exclude)
            if placement is not None:
                ledger.hold(placement)
                ledger.claim(job.project, job.gpus)
                return R.Releasing(job.gpus, k)
        pool = self._pool(rule, job)
        tree = self.c.tree
        first = tree.siblings(job.project) if tree else frozenset()
        found = choose_victims(job.gpus, ledger.room, ledger.releasing, pool, exclude, first,
                               need)
        if found is None:
            if remember:
                self.memo.failed(rule, bool(exclude), k, job.gpus)
            return None
        victims, placement = found
        if victims:  # a claim on GPUs already being released changes no pool
            self._commit(pool, victims)
        if rule is Reclaim.PRIORITY and not self._keeps_its_turn(job, victims):
            return None  # (its victims stay out of every pool for the rest of the cycle)
        taken = ledger.hold(placement)
        if victims:
            self._evict(job, rule, victims, taken)
        ledger.claim(job.project, job.gpus)
        if not victims:
            return R.Releasing(job.gpus, k)
        return R.Reclaiming(job.gpus, k, _by_project(victims))

    def move(self, job: TrainJob, exclude: frozenset) -> R.Reason | None:
        """Make room for ``job``, within its project's quota, by moving jobs within quota off
        the nodes it needs (moves.py); say why it waits, or None if no move can serve it or
        borrowers will: once their minimum runtime is over, taking them back costs no
        project within quota anything."""
        ledger = self.ledger
        k = nodes_needed(job.gpus, self.c.node_size)
        if self.moved_for is not None or self.memo.fails(Reclaim.MOVE, bool(exclude), k, job.gpus):
            return None  # one gang a cycle is given room by moves
        pool = self._pool(Reclaim.GUARANTEE, job)  # counts the young borrowers
        if self.too_young and choose_victims(job.gpus, ledger.room, ledger.releasing,
                                             self._any_age(), exclude) is not None:
            plan = None  # young borrowers will make room once old enough
        else:
            plan = plan_moves(job.gpus, ledger.room, ledger.free, pool, exclude)
        if plan is None:
            # A larger gang on as many nodes moves nothing this cycle either: at worst it
            # waits a cycle more, while the smaller one ahead of it waits for borrowers.
            self.memo.failed(Reclaim.MOVE, bool(exclude), k, job.gpus)
            return None
        self.moved_for = job.id
        moved = [m for m, _ in plan.moves]
        self._commit(pool, [*plan.victims, *moved])
        taken = ledger.hold(plan.placement)
        self._evict(job, Reclaim.GUARANTEE, plan.victims, taken)
        self._evict(job, Reclaim.MOVE, moved, taken)
        for m, target in plan.moves:  # its project keeps them, and no one else gets them
            ledger.keep_for(m, target)
        ledger.claim(job.project, job.gpus)
        return R.Moving(job.gpus, k, _by_project(moved), _by_project(plan.victims))

    def _any_age(self) -> Candidates:
        """What a guarantee reclaim could take were every job old enough: if it makes room,
        the claimant waits for the young borrowers instead of moving anyone."""
        pool = self._pools.get("any age")
        if pool is None:
            evicted = self.ledger.evicted
            jobs = [j for j in self.c.running if j.id not in evicted]
            pool = self._pools["any age"] = self._watched(Candidates(
                jobs, self.ledger.kept, self.projects, self.deserved,
                Reclaim.GUARANTEE.floor(self.projects, self.deserved), self.ledger.room))
        return pool

    def within_limit(self, job: TrainJob, at: R.AtLimit) -> bool:
        """A job within its project's quota would take its department beyond its limit
        (``at``): its siblings borrow what the limit leaves. Preempt the fewest of their jobs
        beyond their quotas, in contract order, that bring the department back within its
        limit with ``job``; False (and nothing preempted) if they cannot."""
        excess = at.usage + job.gpus - at.limit
        pool = self._pool(Reclaim.GUARANTEE, job)
        picker = VictimPicker(pool, only=self.c.tree.siblings(job.project))
        victims, got = [], 0
        while got < excess:
            victim = picker.pop()
            if victim is None:
                return False
            victims.append(victim)
            got += victim.gpus
        for victim in reversed(list(victims)):  # put back, newest choice first, what is not needed
            if got - victim.gpus >= excess:
                victims.remove(victim)
                got -= victim.gpus
        self._commit(pool, victims)
        self._evict(job, Reclaim.GUARANTEE, victims, {})
        return True

    def _evict(self, job: TrainJob, rule: Reclaim, victims: list[TrainJob],
               taken: dict[str, int]) -> None:
        """The ledger preempts ``victims`` for ``job`` by ``rule``, in its owner's words."""
        self.ledger.evict(victims, job.id, rule.kind, rule.why(self.projects[job.project], job),
                          taken)

    def _pool(self, rule: Reclaim, job: TrainJob) -> Candidates:
        """The jobs ``rule`` may take: old enough, and (guarantee, fair) from other projects,
        which the floors ensure, or (priority) of lower priority in the job's own project.
        Victims are judged on ``ledger.kept``, what ran before this cycle."""
        old_enough = self.now - self.config.min_runtime_s
        if rule is Reclaim.PRIORITY:
            evicted = self.ledger.evicted
            return Candidates([j for j in self.c.running if j.project == job.project
                               and j.priority < job.priority and j.id not in evicted
                               and (j.start_time or 0.0) <= old_enough],
                              self.ledger.kept, self.projects, self.deserved,
                              rule.floor(self.projects, self.deserved), self.ledger.room)
        pool = self._pools.get(rule)
        if pool is None:
            evicted = self.ledger.evicted  # by another rule's claims since they were gathered
            jobs = [j for j in self._old_enough(rule) if j.id not in evicted]
            pool = self._pools[rule] = self._watched(Candidates(
                jobs, self.ledger.kept, self.projects, self.deserved,
                rule.floor(self.projects, self.deserved), self.ledger.room))
        return pool

    def _watched(self, pool: Candidates) -> Candidates:
        """A pool kept for the rest of the cycle follows the free and releasing GPUs."""
        self.ledger.watch(pool)
        return pool

    def _old_enough(self, rule: Reclaim) -> list[TrainJob]:
        """The running jobs a rule that takes from other projects may look at, gathered at
        its first need in a cycle: old enough, not evicted. It counts the over-quota jobs it
        leaves out for their minimum runtime in ``too_young``, which makes a waiting job's
        reason the minimum runtime. A pool (``_pool``) is made of them when a claim needs
        victims: the jobs it may take are what ran when they were gathered, as the victims
        chosen since are committed to every pool."""
        jobs = self._gathered.get(rule)
        if jobs is None:
            jobs = self._gathered[rule] = []
            old_enough = self.now - self.config.min_runtime_s
            usage, evicted = self.ledger.usage, self.ledger.evicted
            for j in self.c.running:
                if j.id in evicted:
                    continue
                if (j.start_time or 0.0) <= old_enough:
                    jobs.append(j)
                elif usage[j.project] > self.projects[j.project].quota:
                    self.too_young += 1
        return jobs

    def _commit(self, pool: Candidates, victims: list[TrainJob]) -> None:
        """The victims are gone from the searching pool and from every pool gathered."""
        for other in {id(pool): pool, **{id(p): p for p in self._pools.values()}}.values():
            other.commit(victims)

    def _keeps_its_turn(self, job: TrainJob, victims: list[TrainJob]) -> bool:
        """Whether the claimant, not a requeued victim, is served first once GPUs free up.

        Below quota a requeued victim keeps its project within quota and goes before this
        borrower, which would preempt it again: allowed only if the claimant then fits the quota.
        With fair-share reclaim the same holds for the project's deserved share: below it, the
        victim would reclaim, or another project below its share would take the GPUs first.
        """
        ledger, p = self.ledger, self.projects[job.project]
        gone = sum(v.gpus for v in victims)
        left = ledger.usage[p.name] - gone  # what the project runs once they are gone
        if left < p.quota and not ledger.within_quota(p.name, job.gpus - gone):
            return False
        return not self.config.reclaim_fair_share or left >= self.deserved.get(p.name, 0) \
            or ledger.within_share(p.name, job.gpus - gone)


def _by_project(jobs: list[TrainJob]) -> tuple[tuple[str, int], ...]:
    """(project, milli-GPUs) of ``jobs``, by project name."""
    by_project: dict[str, int] = {}
    for j in jobs:
        by_project[j.project] = by_project.get(j.project, 0) + j.gpus
    return tuple(sorted(by_project.items()))
