"""Step 4's reclaim: which running jobs give GPUs back so that a claimant fits.

``Reclaimer`` serves one cycle's claimants: it gathers the jobs a rule may take
(``victims.Candidates``), chooses the fewest (``victims.choose_victims``), holds the free GPUs
the claimant will use and books the victims' GPUs as releasing. Which jobs may go:

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
from .decisions import Preempt
from .fits import FitMemo
from .ledger import Ledger
from .model import PolicyConfig, Project, TrainJob, gpus_text
from .placement import nodes_needed
from .moves import plan_moves
from .victims import Candidates, Floor, VictimPicker, choose_victims


class Reclaim(str, enum.Enum):
    """Which rule takes GPUs back, for whom and from whom (its value is ``Preempt.kind``)."""

    GUARANTEE = "guarantee"  # for a job within its project's quota: from over-quota projects
    FAIR = "fair"  # for a borrower within its deserved share: from projects above theirs
    PRIORITY = "priority"  # for a job of higher priority: from its own project
    MOVE = "move"  # for a gang within quota: jobs within quota go to other GPUs (moves.py)

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

    Keeps the cluster (free and releasing GPUs), the ledger and its victim pools in step
    with every claim, and holds what the cycle decides: ``preemptions``, ``held`` (free GPUs
    kept for a claimant whose victims are still leaving) and ``too_young`` (over-quota jobs
    its pools left out for their minimum runtime, counted as each pool is gathered).
    """

    def __init__(self, now: float, config: PolicyConfig, cluster: Cluster,
                 projects: Mapping[str, Project], deserved: Mapping[str, int], ledger: Ledger,
                 memo: FitMemo):
        self.now, self.config, self.c = now, config, cluster
        self.projects, self.deserved, self.ledger, self.memo = projects, deserved, ledger, memo
        self.preemptions: list[Preempt] = []
        self.held: dict[str, int] = {}
        self.victims: set[str] = set()
        self.too_young = 0
        self.moved_for: str | None = None  # the gang given room by moves this cycle, if any
        self._pools: dict = {}  # GUARANTEE, FAIR and "any age" (moves), gathered at first need

    def claim(self, job: TrainJob, rule: Reclaim, exclude: frozenset,
              at_limit: R.AtLimit | None = None) -> R.Reason | None:
        """Preempt the fewest victims that let ``job`` fit (or claim GPUs already being
        released) and say why it waits for them; None if this rule cannot serve it.
        ``at_limit``: the job's department would pass its limit, so its siblings' victims
        must also bring the department back within it."""
        k = nodes_needed(job.gpus, self.c.node_size)
        # A priority pool is the claimant's own (its lower-priority jobs): a failure says
        # nothing of the next claimant's; nor does one that had to meet a limit too.
        remember = rule is not Reclaim.PRIORITY and at_limit is None
        if rule is not Reclaim.PRIORITY and self.memo.fails(rule, bool(exclude), k, job.gpus):
            return None
        pool = self._pool(rule, job)
        tree = self.c.tree
        first = tree.siblings(job.project) if tree else frozenset()
        need = 0 if at_limit is None else at_limit.usage + job.gpus - at_limit.limit
        found = choose_victims(job.gpus, self.c.room, self.c.releasing, pool, exclude, first,
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
        taken = self._hold(placement)
        if victims:
            self._preempt(job, rule, victims, taken)
        free = self.c.free.free
        self.moved({*placement, *(n for v in victims for n in v.placement if n in free)})
        self.ledger.claimed[job.project] += job.gpus
        if not victims:
            return R.Releasing(job.gpus, k)
        return R.Reclaiming(job.gpus, k, _by_project(victims))

    def move(self, job: TrainJob, exclude: frozenset) -> R.Reason | None:
        """Make room for ``job``, within its project's quota, by moving jobs within quota off
        the nodes it needs (moves.py); say why it waits, or None if no move can serve it or
        borrowers will: once their minimum runtime is over, taking them back costs no
        project within quota anything."""
        k = nodes_needed(job.gpus, self.c.node_size)
        if self.moved_for is not None or self.memo.fails(Reclaim.MOVE, bool(exclude), k, job.gpus):
            return None  # one gang a cycle is given room by moves
        pool = self._pool(Reclaim.GUARANTEE, job)  # counts the young borrowers
        if self.too_young and choose_victims(job.gpus, self.c.room, self.c.releasing,
                                             self._any_age(), exclude) is not None:
            plan = None  # young borrowers will make room once old enough
        else:
            plan = plan_moves(job.gpus, self.c.room, self.c.free, pool, exclude)
        if plan is None:
            # A larger gang on as many nodes moves nothing this cycle either: at worst it
            # waits a cycle more, while the smaller one ahead of it waits for borrowers.
            self.memo.failed(Reclaim.MOVE, bool(exclude), k, job.gpus)
            return None
        self.moved_for = job.id
        moved = [m for m, _ in plan.moves]
        self._commit(pool, [*plan.victims, *moved])
        taken = self._hold(plan.placement)
        self._preempt(job, Reclaim.GUARANTEE, plan.victims, taken)
        self._preempt(job, Reclaim.MOVE, moved, taken)
        free, releasing = self.c.free, self.c.releasing
        for m, target in plan.moves:  # its project keeps them, and no one else gets them
            self.ledger.claimed[m.project] += m.gpus
            for name, need in target.items():
                hold = min(free.free[name], need)
                if hold:
                    free.take({name: hold})
                    self.held[name] = self.held.get(name, 0) + hold
                if need > hold:
                    releasing[name] -= need - hold
        everyone = [*plan.victims, *moved]
        self.moved({*plan.placement, *(n for v in everyone for n in v.placement),
                    *(n for _, t in plan.moves for n in t)} & free.free.keys())
        self.ledger.claimed[job.project] += job.gpus
        return R.Moving(job.gpus, k, _by_project(moved), _by_project(plan.victims))

    def _any_age(self) -> Candidates:
        """What a guarantee reclaim could take were every job old enough: if it makes room,
        the claimant waits for the young borrowers instead of moving anyone."""
        pool = self._pools.get("any age")
        if pool is None:
            jobs = [j for j in self.c.running if j.id not in self.victims]
            pool = self._pools["any age"] = Candidates(
                jobs, self.ledger.kept, self.projects, self.deserved,
                Reclaim.GUARANTEE.floor(self.projects, self.deserved), self.c.room)
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
        self._preempt(job, Reclaim.GUARANTEE, victims, {})
        free = self.c.free.free
        self.moved({n for v in victims for n in v.placement if n in free})
        return True

    def moved(self, names) -> None:
        """Free or releasing GPUs changed on ``names``: keep the indexes in step."""
        self.c.moved(names)
        for pool in self._pools.values():
            pool.moved(names)

    def _pool(self, rule: Reclaim, job: TrainJob) -> Candidates:
        """The jobs ``rule`` may take: old enough, and (guarantee, fair) from other projects,
        which the floors ensure, or (priority) of lower priority in the job's own project.
        Victims are judged on ``ledger.kept``, what ran before this cycle."""
        old_enough = self.now - self.config.min_runtime_s
        if rule is Reclaim.PRIORITY:
            return Candidates([j for j in self.c.running if j.project == job.project
                               and j.priority < job.priority and j.id not in self.victims
                               and (j.start_time or 0.0) <= old_enough],
                              self.ledger.kept, self.projects, self.deserved,
                              rule.floor(self.projects, self.deserved), self.c.room)
        pool = self._pools.get(rule)
        if pool is None:
            pool = self._pools[rule] = self._gather(rule, old_enough)
        return pool

    def _gather(self, rule: Reclaim, old_enough: float) -> Candidates:
        """The pool of a rule that takes from other projects, once a cycle; it counts the
        over-quota jobs it leaves out for their minimum runtime in ``too_young``, which
        makes a waiting job's reason the minimum runtime."""
        jobs = []
        usage = self.ledger.usage
        for j in self.c.running:
            if j.id in self.victims:
                continue
            if (j.start_time or 0.0) <= old_enough:
                jobs.append(j)
            elif usage[j.project] > self.projects[j.project].quota:
                self.too_young += 1
        return Candidates(jobs, self.ledger.kept, self.projects, self.deserved,
                          rule.floor(self.projects, self.deserved), self.c.room)

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
        p = self.projects[job.project]
        left = self.ledger.usage[p.name] - sum(v.gpus for v in victims)
        after = left + self.ledger.claimed[p.name] + job.gpus
        floors = [p.quota]
        if self.config.reclaim_fair_share:
            floors.append(self.deserved.get(p.name, 0))
        return all(left >= floor or after <= floor for floor in floors)

    def _hold(self, placement: Mapping[str, int]) -> dict[str, int]:
        """Hold the free GPUs of ``placement``, then claim releasing ones; return what each
        node still needs from the victims."""
        free, releasing = self.c.free, self.c.releasing
        taken: dict[str, int] = {}
        for name, need in placement.items():
            hold = min(free.free[name], need)
            if hold:
                free.take({name: hold})
                self.held[name] = self.held.get(name, 0) + hold
            rel = min(releasing.get(name, 0), need - hold)
            if rel:
                releasing[name] -= rel
            taken[name] = need - hold - rel
        return taken

    def _preempt(self, job: TrainJob, rule: Reclaim, victims: list[TrainJob],
                 taken: dict[str, int]) -> None:
        """Book the victims: their GPUs leave their projects and, but for what the claimant
        takes, are releasing for others."""
        free, releasing = self.c.free.free, self.c.releasing
        usage, kept = self.ledger.usage, self.ledger.kept
        why = rule.why(self.projects[job.project], job)
        for victim in victims:
            self.victims.add(victim.id)
            usage[victim.project] -= victim.gpus
            kept[victim.project] -= victim.gpus
            for name, amount in victim.placement.items():
                if name in free:
                    use = min(amount, taken.get(name, 0))
                    taken[name] = taken.get(name, 0) - use
                    releasing[name] = releasing.get(name, 0) + amount - use
            self.preemptions.append(Preempt(victim.id, victim.project, job.id, why, rule.value))


def _by_project(jobs: list[TrainJob]) -> tuple[tuple[str, int], ...]:
    """(project, milli-GPUs) of ``jobs``, by project name."""
    by_project: dict[str, int] = {}
    for j in jobs:
        by_project[j.project] = by_project.get(j.project, 0) + j.gpus
    return tuple(sorted(by_project.items()))
