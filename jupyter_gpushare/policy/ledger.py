"""The one owner of a cycle's changes, as KAI-Scheduler's ``Statement`` is: what each project
holds, which GPUs are free, releasing or held, and what the cycle decided.

Admission and reclaim only ask it. Every change is one of its methods: ``start`` (on the
train pool's free GPUs) and ``start_lent`` (on lent build GPUs); for a claimant, ``hold``
(free GPUs kept for it, releasing ones promised to it), ``evict`` (its victims) and ``claim``
(what it was promised counts against its project); for a moved job, ``keep_for`` (the GPUs it
will start on elsewhere). The indexes that read the free and releasing GPUs (``room``, and
reclaim's victim pools, which ``watch`` it) are kept in step with each change here.

What it keeps:

- ``usage`` starts as what runs and changes with every decision: starts add, victims go.
- ``kept`` is what ran before the cycle, less its victims: reclaim judges victims on it, so a
  job started this cycle never makes its project look over its quota or share, and no cycle
  starts and preempts the same GPUs.
- ``claimed`` is what claimants were promised while their victims give GPUs back; it counts
  against their project like usage.
- ``free``: free GPUs per train node that takes jobs; ``lent``: per lent build node;
  ``releasing``: GPUs that jobs being preempted still hold and no claimant was promised;
  ``held``: free GPUs kept idle for claimants whose victims are still leaving.
- ``starts``, ``preemptions`` and ``evicted`` (the victims' ids): the cycle's decisions.

And the rules that read it, each written once: ``within_quota``, ``within_share`` and
``beyond_limit`` (a department's projects count together against its limit).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping

from . import reasons as R
from .decisions import Preempt, PreemptKind, Start
from .departments import Tree
from .model import TrainJob
from .placement import FreeMap

if TYPE_CHECKING:
    from .cache import Cluster

LEAST = 1
"""Milli-GPUs of the smallest gang: a project with room for it has room for some job."""


class Ledger:
    __slots__ = ("usage", "kept", "claimed", "projects", "deserved", "tree", "free", "lent",
                 "releasing", "held", "starts", "preemptions", "evicted", "_room", "_watchers")

    def __init__(self, usage: Mapping[str, int], projects: Iterable[str] | Mapping,
                 deserved: Mapping[str, int] | None = None, tree: Tree | None = None,
                 free: FreeMap | None = None, releasing: Mapping[str, int] | None = None,
                 lent: FreeMap | None = None):
        self.usage = dict(usage)
        self.kept = dict(usage)
        self.claimed = dict.fromkeys(projects, 0)
        self.projects = projects if isinstance(projects, Mapping) else {}
        self.deserved = deserved if deserved is not None else {}
        self.tree = tree
        self.free = free if free is not None else FreeMap({}, 0)
        self.lent = lent if lent is not None else FreeMap({}, 0)
        self.releasing = dict(releasing or {})  # only nodes where preempted jobs hold GPUs
        self.held: dict[str, int] = {}
        self.starts: list[Start] = []
        self.preemptions: list[Preempt] = []
        self.evicted: set[str] = set()
        self._room: FreeMap | None = None
        self._watchers: list = []

    @classmethod
    def of(cls, cluster: Cluster, deserved: Mapping[str, int]) -> Ledger:
        """The ledger of a cycle over ``cluster``, what runs as the snapshot has it."""
        lent = cluster.lending.free if cluster.lending else None
        return cls(cluster.usage, cluster.projects, deserved, cluster.tree,
                   FreeMap(cluster.free, cluster.node_size), cluster.releasing,
                   FreeMap(lent.free, lent.node_size) if lent is not None else None)

    # -- the rules ---------------------------------------------------------------------------
    def committed(self, project: str) -> int:
        """What the project runs or was promised this cycle."""
        return self.usage[project] + self.claimed[project]

    def within_quota(self, project: str, gpus: int) -> bool:
        """Whether ``gpus`` more keep the project within its quota."""
        return self.usage[project] + self.claimed[project] + gpus <= self.projects[project].quota

    def within_share(self, project: str, gpus: int) -> bool:
        """Whether ``gpus`` more keep the project within its deserved share: the one rule by
        which a borrower takes GPUs back from projects above theirs (fair-share reclaim),
        goes before borrowers beyond theirs, and may use nodes kept for a holder beyond its
        own. ``LEAST``: whether the project is below its share at all."""
        return self.usage[project] + self.claimed[project] + gpus <= self.deserved.get(project, 0)

    def department_committed(self, department: str) -> int:
        """What a department's projects run or were promised this cycle, together."""
        return sum(self.committed(name) for name in self.tree.members.get(department, ()))

    def beyond_limit(self, project: str, gpus: int) -> R.AtLimit | None:
        """Whether ``gpus`` more would take the project, or its department, beyond its limit."""
        p = self.projects.get(project)
        if p is not None and p.limit is not None:
            committed = self.committed(project)
            if committed + gpus > p.limit:
                return R.AtLimit(project, p.limit, committed)
        if self.tree:
            d = self.tree.department(project)
            if d is not None and d.limit is not None:
                committed = self.department_committed(d.name)
                if committed + gpus > d.limit:
                    return R.AtLimit(project, d.limit, committed, d.name)
        return None

    # -- the indexes ---------------------------------------------------------------------------
    @property
    def room(self) -> FreeMap:
        """Free GPUs plus those that jobs being preempted still hold, per node: what a
        claimant can be given without new victims. Only reclaim needs it: made at first need."""
        if self._room is None:
            releasing = self.releasing
            self._room = FreeMap({n: a + releasing.get(n, 0) for n, a in self.free.free.items()},
                                 self.free.node_size)
        return self._room

    def watch(self, index) -> None:
        """Tell ``index`` (its ``moved(names)``) whenever free or releasing GPUs change."""
        self._watchers.append(index)

    def _moved(self, names) -> None:
        room = self._room
        if room is not None:
            free, releasing = self.free.free, self.releasing
            for name in names:
                room.set(name, free[name] + releasing.get(name, 0))
        for index in self._watchers:
            index.moved(names)

    # -- the changes ---------------------------------------------------------------------------
    def start(self, job: TrainJob, placement: Mapping[str, int]) -> None:
        """Start ``job`` on the free GPUs of ``placement``."""
        self.free.take(placement)
        self._moved(placement)
        self.usage[job.project] += job.gpus
        self.starts.append(Start(job.id, placement))

    def start_lent(self, job: TrainJob, placement: Mapping[str, int]) -> None:
        """Start ``job`` on lent build GPUs, which count toward no quota: its project's
        usage does not grow."""
        self.lent.take(placement)
        self.starts.append(Start(job.id, placement))

    def claim(self, project: str, gpus: int) -> None:
        """A claimant of ``project`` was promised ``gpus``: they count against it."""
        self.claimed[project] += gpus

    def hold(self, placement: Mapping[str, int]) -> dict[str, int]:
        """Hold the free GPUs of a claimant's ``placement`` for it, then promise it releasing
        ones; return what each node still needs from its victims (``evict``)."""
        free, releasing, held = self.free, self.releasing, self.held
        taken: dict[str, int] = {}
        for name, need in placement.items():
            hold = min(free.free[name], need)
            if hold:
                free.take({name: hold})
                held[name] = held.get(name, 0) + hold
            rel = min(releasing.get(name, 0), need - hold)
            if rel:
                releasing[name] -= rel
            taken[name] = need - hold - rel
        self._moved(placement)
        return taken

    def evict(self, victims: Iterable[TrainJob], for_job: str, kind: PreemptKind, why: str,
              taken: dict[str, int]) -> None:
        """Preempt ``victims`` for ``for_job``: their GPUs leave their projects and, but for
        what the claimant still needs of them (``taken``, from ``hold``, used up here), are
        releasing for others."""
        free, releasing = self.free.free, self.releasing
        usage, kept = self.usage, self.kept
        changed = set()
        for victim in victims:
            self.evicted.add(victim.id)
            usage[victim.project] -= victim.gpus
            kept[victim.project] -= victim.gpus
            for name, amount in victim.placement.items():
                if name in free:
                    use = min(amount, taken.get(name, 0))
                    taken[name] = taken.get(name, 0) - use
                    releasing[name] = releasing.get(name, 0) + amount - use
                    changed.add(name)
            self.preemptions.append(Preempt(victim.id, victim.project, for_job, why, kind))
        self._moved(changed)

    def keep_for(self, job: TrainJob, target: Mapping[str, int]) -> None:
        """A job within quota is moved: its project keeps what it holds, and the GPUs it will
        start on (``target``: free, or its borrowers' that are releasing) are kept for it."""
        self.claim(job.project, job.gpus)
        self.hold(target)
