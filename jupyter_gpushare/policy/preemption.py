"""Step 4's reclaim: which running jobs give GPUs back so that a claimant fits.

``Reclaimer`` serves one cycle's claimants: it gathers the jobs a rule may take
(``VictimPool``), chooses the fewest (``choose_victims``), holds the free GPUs the claimant
will use and books the victims' GPUs as releasing. Which jobs may go:

Contract point 6 (docs/explanation/scheduling.md#contract-6): only over-quota projects lose jobs;
prefer victims that leave their project at or above its quota; then idle jobs (``idle``:
their GPUs stayed unused) before busy ones; then the project most over its deserved share,
then the lowest priority, then the most recently started job. Remove
greedily until the claimant fits, then put back every victim that was not needed.
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass
from itertools import combinations, islice
from typing import Callable, Mapping

from . import reasons as R
from .cache import Cluster
from .decisions import Preempt
from .fits import FitMemo
from .ledger import Ledger
from .model import PolicyConfig, Project, TrainJob, gpus_text
from .placement import FreeMap, nodes_needed


@dataclass(frozen=True, slots=True)
class Floor:
    """Which jobs of a project may go, by milli-GPUs the project runs.

    A project loses a job only while it runs more than ``above``; the job may not take it
    below ``keep``; a job that takes it below ``prefer`` is chosen last.
    """

    above: Callable[[str], int]
    keep: Callable[[str], int]
    prefer: Callable[[str], int]


class Reclaim(str, enum.Enum):
    """Which rule takes GPUs back, for whom and from whom (its value is ``Preempt.kind``)."""

    GUARANTEE = "guarantee"  # for a job within its project's quota: from over-quota projects
    FAIR = "fair"  # for a borrower within its deserved share: from projects above theirs
    PRIORITY = "priority"  # for a job of higher priority: from its own project

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
        self._pools: dict[Reclaim, VictimPool] = {}  # GUARANTEE and FAIR, gathered at first need

    def claim(self, job: TrainJob, rule: Reclaim, exclude: frozenset) -> R.Reason | None:
        """Preempt the fewest victims that let ``job`` fit (or claim GPUs already being
        released) and say why it waits for them; None if this rule cannot serve it."""
        k = nodes_needed(job.gpus, self.c.node_size)
        # A priority pool is the claimant's own (its lower-priority jobs): a failure says
        # nothing of the next claimant's.
        remember = rule is not Reclaim.PRIORITY
        if remember and self.memo.fails(rule, bool(exclude), k, job.gpus):
            return None
        pool = self._pool(rule, job)
        found = choose_victims(job.gpus, self.c.room, self.c.releasing, pool, exclude)
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
        by_project: dict[str, int] = {}
        for v in victims:
            by_project[v.project] = by_project.get(v.project, 0) + v.gpus
        return R.Reclaiming(job.gpus, k, tuple(sorted(by_project.items())))

    def moved(self, names) -> None:
        """Free or releasing GPUs changed on ``names``: keep the indexes in step."""
        self.c.moved(names)
        for pool in self._pools.values():
            pool.moved(names)

    def _pool(self, rule: Reclaim, job: TrainJob) -> VictimPool:
        """The jobs ``rule`` may take: old enough, and (guarantee, fair) from other projects,
        which the floors ensure, or (priority) of lower priority in the job's own project.
        Victims are judged on ``ledger.kept``, what ran before this cycle."""
        old_enough = self.now - self.config.min_runtime_s
        if rule is Reclaim.PRIORITY:
            return VictimPool([j for j in self.c.running if j.project == job.project
                               and j.priority < job.priority and j.id not in self.victims
                               and (j.start_time or 0.0) <= old_enough],
                              self.ledger.kept, self.projects, self.deserved,
                              rule.floor(self.projects, self.deserved), self.c.room)
        pool = self._pools.get(rule)
        if pool is None:
            pool = self._pools[rule] = self._gather(rule, old_enough)
        return pool

    def _gather(self, rule: Reclaim, old_enough: float) -> VictimPool:
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
        return VictimPool(jobs, self.ledger.kept, self.projects, self.deserved,
                          rule.floor(self.projects, self.deserved), self.c.room)

    def _commit(self, pool: VictimPool, victims: list[TrainJob]) -> None:
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


class VictimPool:
    """The jobs one kind of reclaim may take in one cycle, grouped by project, newest first,
    and indexed by node.

    Built once per cycle; each claimant's search starts from the cached best victim of
    every project, and ``commit`` applies a search's victims so the next one sees them gone.
    The node index (which of the pool's jobs sit on each node, and what each node would
    give were its movable jobs gone) lets a search look only at the nodes it may use.
    """

    def __init__(self, jobs: list[TrainJob], usage: Mapping[str, int],
                 projects: Mapping[str, Project], deserved: Mapping[str, int], floor: Floor,
                 room: FreeMap | None = None):
        self.by_project: dict[str, list[TrainJob]] = {}
        self.on_node: dict[str, list[TrainJob]] = {}
        for job in sorted(jobs, key=lambda j: (not j.idle, -(j.start_time or 0.0), j.id)):
            self.by_project.setdefault(job.project, []).append(job)
            for name in job.placement:
                self.on_node.setdefault(name, []).append(job)
        self.used = dict(usage)
        self.projects, self.deserved, self.floor = projects, deserved, floor
        self.best = {name: self.entry(name, self.used[name], ()) for name in self.by_project}
        self.room = room  # free and releasing GPUs per node, kept up to date by the cycle
        self._movable: dict[str, int] = {}  # node → GPUs of movable jobs on it
        self._gains: FreeMap | None = None  # node → room + movable; made at the first need

    def entry(self, name: str, used: int, taken) -> tuple | None:
        """The heap entry of the project's next victim in contract order, or None."""
        floor = self.floor
        if used <= floor.above(name):
            return None
        keep, prefer = floor.keep(name), floor.prefer(name)
        choice = None
        for job in self.by_project[name]:  # idle first, then most recently started
            if job.id in taken:
                continue
            left = used - job.gpus
            if left < keep:
                continue
            if left >= prefer:
                choice = (False, job)
                break
            if choice is None:
                choice = (True, job)
        if choice is None:
            return None
        below, job = choice
        return (below, not job.idle, -(used - self.deserved.get(name, 0)),
                self.projects[name].priority, -(job.start_time or 0.0), job.id, name, job)

    def movable(self, project: str) -> bool:
        """Whether the project may lose a job at all (it runs more than its floor)."""
        return self.used[project] > self.floor.above(project)

    def commit(self, victims: list[TrainJob]) -> None:
        """Victims chosen (by this pool's search or another's) are gone from now on."""
        names = {v.project for v in victims if v.project in self.used}
        was_movable = {name for name in names if self.movable(name)}
        changed: set[str] = set()
        for victim in victims:
            jobs = self.by_project.get(victim.project)
            if jobs is not None and victim in jobs:
                jobs.remove(victim)
                for name in victim.placement:
                    self.on_node[name].remove(victim)
                if victim.project in was_movable:
                    changed |= self._count(victim, -1)
            if victim.project in self.used:
                self.used[victim.project] -= victim.gpus
        for name in names:
            if name in was_movable and not self.movable(name):  # its jobs stay put from now on
                for job in self.by_project.get(name, ()):
                    changed |= self._count(job, -1)
            if name in self.by_project:
                self.best[name] = self.entry(name, self.used[name], ())
        self.moved(changed)

    def _count(self, job: TrainJob, sign: int) -> set[str]:
        if self._gains is None:
            return set()
        for name, amount in job.placement.items():
            self._movable[name] = self._movable.get(name, 0) + sign * amount
        return set(job.placement)

    def moved(self, names) -> None:
        """The room (or the movable jobs) on ``names`` changed: update what they would give."""
        gains = self._gains
        if gains is None:
            return
        for name in names:
            if name in gains.free:
                gains.set(name, self.room.free[name] + self._movable.get(name, 0))

    def ranked(self, count: int, exclude) -> list[str]:
        """The first ``count`` nodes not in ``exclude`` by what they would give (room and
        movable jobs), the most first, ties by name; only nodes that would give something."""
        if self._gains is None:
            for name, jobs in self.by_project.items():
                if self.movable(name):
                    for job in jobs:
                        for node, amount in job.placement.items():
                            self._movable[node] = self._movable.get(node, 0) + amount
            self._gains = FreeMap({n: a + self._movable.get(n, 0) for n, a in self.room.free.items()},
                                  self.room.node_size)
        ranked = []
        for _, name in self._gains.descending():
            if name not in exclude:
                ranked.append(name)
                if len(ranked) == count:
                    break
        return ranked

    def inside(self, nodes: set[str]) -> list[TrainJob]:
        """The pool's jobs that lie wholly on ``nodes``."""
        found = {}
        for name in nodes:
            for job in self.on_node.get(name, ()):
                if job.placement.keys() <= nodes:
                    found[job.id] = job
        return list(found.values())


def choose_victims(gpus: int, room: FreeMap, releasing: Mapping[str, int], pool: VictimPool,
                   exclude: frozenset[str] = frozenset()
                   ) -> tuple[list[TrainJob], dict[str, int]] | None:
    """The minimal victim set that lets a gang of ``gpus`` fit, with its placement, or None.

    ``room`` is each node's free GPUs plus ``releasing``, those that preempted jobs are
    giving back; the gang does not fit on the free GPUs alone. ``pool`` holds the jobs this
    kind of reclaim may take. Neither is changed: ``pool.commit`` the victims.
    """
    found = _greedy(gpus, room, releasing, pool, exclude)
    if found is not None:
        return found
    # Newest first can spread its victims over nodes none of which then holds the gang (and
    # use up what projects may give). Aim at each set of the fewest nodes instead, with only
    # the jobs lying wholly on it, and take the one that preempts least.
    best = None
    for nodes, jobs in _node_sets(gpus, room, pool, exclude):
        used = {j.project: pool.used[j.project] for j in jobs}
        sub = VictimPool(jobs, used, pool.projects, pool.deserved, pool.floor)
        here = FreeMap({n: room.free[n] for n in nodes}, room.node_size)
        found = _greedy(gpus, here, {}, sub, frozenset())
        if found is not None:
            cost = (sum(v.gpus for v in found[0]), len(found[0]))
            if best is None or cost < best[0]:
                best = (cost, found)
    return None if best is None else best[1]


_MAX_NODE_SETS = 256


def _node_sets(gpus: int, room: FreeMap, pool: VictimPool, exclude
               ) -> list[tuple[tuple[str, ...], list[TrainJob]]]:
    """Sets of the fewest nodes a gang needs that could hold it were their jobs gone, each
    with the pool's jobs lying wholly on it."""
    k = nodes_needed(gpus, room.node_size)
    # The first combinations of k ranked nodes keep the first k-1 and vary the last: they
    # never reach past this many nodes.
    ranked = pool.ranked(k - 1 + _MAX_NODE_SETS, exclude)
    sets = []
    for nodes in islice(combinations(ranked, k), _MAX_NODE_SETS):
        jobs = pool.inside(set(nodes))
        space = sum(room.free[n] for n in nodes)
        space += sum(j.gpus for j in jobs if pool.movable(j.project))
        if space >= gpus:
            sets.append((nodes, jobs))
    return sets


def _greedy(gpus: int, room: FreeMap, releasing: Mapping[str, int], pool: VictimPool, exclude):
    """Take victims in contract order until the gang fits, then put back, newest choice
    first, every victim it can do without.

    Each victim's GPUs are added to ``room`` while the search runs (so a fit is a question
    to its index, not a walk over every node) and taken out again before it returns.
    """
    gaining = set()  # nodes a victim gave GPUs: with releasing ones, where a small gang may go
    if gpus <= room.node_size:
        def fit():  # the free GPUs alone did not hold it: only nodes that gain can
            for _, name in room.ascending(gpus):
                if name not in exclude and (name in gaining or releasing.get(name)):
                    return {name: gpus}
            return None

        def promising(changed):
            return any(room.free[n] >= gpus for n in changed)
    else:
        def fit():
            return room.fit(gpus, exclude)

        def promising(changed):
            return True

    placement = fit()
    removed: list[TrainJob] = []
    picker = None
    while placement is None:
        picker = picker or _VictimPicker(pool)
        victim = picker.pop()
        if victim is None:
            for gone in removed:
                room.take(_gain(gone, room, exclude))
            return None
        changed = _gain(victim, room, exclude)
        room.give(changed)
        gaining.update(changed)
        removed.append(victim)
        if promising(changed):
            placement = fit()
    kept: list[TrainJob] = []
    for victim in reversed(removed):
        back = _gain(victim, room, exclude)
        room.take(back)
        trial = fit()
        if trial is not None:
            placement = trial
        else:
            room.give(back)
            kept.append(victim)
    for victim in kept:
        room.take(_gain(victim, room, exclude))
    kept.reverse()
    return kept, placement


def _gain(victim: TrainJob, room: FreeMap, exclude) -> dict[str, int]:
    """What a victim gives the nodes a claimant may use."""
    return {n: a for n, a in victim.placement.items() if n in room.free and n not in exclude}


class _VictimPicker:
    """One search's walk through a pool in contract order: a heap of each project's best
    victim; taking one changes only its own project's entry, so a step costs a log."""

    def __init__(self, pool: VictimPool):
        self.pool = pool
        self.used: dict[str, int] = {}
        self.taken: set[str] = set()
        self.heap = [e for e in pool.best.values() if e is not None]
        heapq.heapify(self.heap)

    def pop(self) -> TrainJob | None:
        if not self.heap:
            return None
        entry = heapq.heappop(self.heap)
        name, job = entry[-2], entry[-1]
        self.taken.add(job.id)
        used = self.used[name] = self.used.get(name, self.pool.used[name]) - job.gpus
        nxt = self.pool.entry(name, used, self.taken)
        if nxt is not None:
            heapq.heappush(self.heap, nxt)
        return job
