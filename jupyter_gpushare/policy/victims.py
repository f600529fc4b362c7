"""Which running jobs to preempt so that a claimant fits: the fewest, by the contract's order.

``Candidates`` are the jobs one kind of reclaim may take in a cycle (``preemption.Reclaim``
says which), grouped by project and indexed by node; ``choose_victims`` removes them greedily
until the claimant fits on the fewest nodes, then puts back every victim that was not needed
(contract point 6, docs/explanation/scheduling.md#contract-6).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from itertools import combinations, islice
from typing import Callable, Mapping

from .model import Project, TrainJob
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


class Candidates:
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


def choose_victims(gpus: int, room: FreeMap, releasing: Mapping[str, int], pool: Candidates,
                   exclude: frozenset[str] = frozenset(), first: frozenset[str] = frozenset(),
                   need: int = 0) -> tuple[list[TrainJob], dict[str, int]] | None:
    """The minimal victim set that lets a gang of ``gpus`` fit, with its placement, or None.

    ``room`` is each node's free GPUs plus ``releasing``, those that preempted jobs are
    giving back; the gang does not fit on the free GPUs alone. ``pool`` holds the jobs this
    kind of reclaim may take; those of the projects in ``first`` (the claimant's siblings in
    its department) go before others that leave their project as high; ``need``: milli-GPUs
    the victims of ``first`` must give whether or not the gang needs them (its department's
    limit). Neither is changed: ``pool.commit`` the victims.
    """
    found = _greedy(gpus, room, releasing, pool, exclude, first, need)
    if found is not None:
        return found
    # Newest first can spread its victims over nodes none of which then holds the gang (and
    # use up what projects may give). Aim at each set of the fewest nodes instead, with only
    # the jobs lying wholly on it, and take the one that preempts least.
    best = None
    for nodes, jobs in _node_sets(gpus, room, pool, exclude):
        used = {j.project: pool.used[j.project] for j in jobs}
        sub = Candidates(jobs, used, pool.projects, pool.deserved, pool.floor)
        here = FreeMap({n: room.free[n] for n in nodes}, room.node_size)
        found = _greedy(gpus, here, {}, sub, frozenset(), first, need)
        if found is not None:
            cost = (sum(v.gpus for v in found[0]), len(found[0]))
            if best is None or cost < best[0]:
                best = (cost, found)
    return None if best is None else best[1]


_MAX_NODE_SETS = 256


def _node_sets(gpus: int, room: FreeMap, pool: Candidates, exclude
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


def fit_without_victims(gpus: int, room: FreeMap, releasing: Mapping[str, int],
                        exclude=frozenset()) -> dict[str, int] | None:
    """Where a gang of ``gpus`` that the free GPUs alone do not hold goes on ``room`` (free
    plus releasing GPUs) with no victim, or None: a gang of one node only where GPUs are
    being released, a larger one on the freest nodes. The first question of every claim."""
    if gpus <= room.node_size:
        for _, name in room.ascending(gpus):
            if name not in exclude and releasing.get(name):
                return {name: gpus}
        return None
    return room.fit(gpus, exclude)


def _greedy(gpus: int, room: FreeMap, releasing: Mapping[str, int], pool: Candidates, exclude,
            first: frozenset[str] = frozenset(), need: int = 0):
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

    placement = fit_without_victims(gpus, room, releasing, exclude)  # fit(), none gaining yet
    removed: list[TrainJob] = []
    picker = None
    given = 0  # by the projects of ``first``
    while placement is None or given < need:
        picker = picker or VictimPicker(pool, first)
        victim = picker.pop()
        if victim is None:
            for gone in removed:
                room.take(_gain(gone, room, exclude))
            return None
        changed = _gain(victim, room, exclude)
        room.give(changed)
        gaining.update(changed)
        removed.append(victim)
        if victim.project in first:
            given += victim.gpus
        if placement is None and promising(changed):
            placement = fit()
    kept: list[TrainJob] = []
    for victim in reversed(removed):
        mine = victim.gpus if victim.project in first else 0
        if given - mine < need:
            kept.append(victim)  # the limit needs it gone
            continue
        back = _gain(victim, room, exclude)
        room.take(back)
        trial = fit()
        if trial is not None:
            placement = trial
            given -= mine
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


class VictimPicker:
    """One search's walk through a pool in contract order: a heap of each project's best
    victim; taking one changes only its own project's entry, so a step costs a log. The
    projects in ``first`` go first among victims that leave their project as high: they
    have a heap of their own (a department's few projects), so that the pool's entries are
    not ranked again for every claimant. ``only``, when given, are the only projects it
    takes from."""

    def __init__(self, pool: Candidates, first: frozenset[str] = frozenset(),
                 only: frozenset[str] | None = None):
        self.pool, self.first = pool, first
        self.used: dict[str, int] = {}
        self.taken: set[str] = set()
        best = pool.best
        self.heap = [e for name, e in best.items()
                     if e is not None and name not in first and (only is None or name in only)]
        heapq.heapify(self.heap)
        self.heap_first = [e for name in first
                           if (e := best.get(name)) is not None and (only is None or name in only)]
        heapq.heapify(self.heap_first)

    def pop(self) -> TrainJob | None:
        heap, mine = self.heap, self.heap_first
        if mine and (not heap or mine[0][0] <= heap[0][0]):  # a sibling's unless it is below
            heap = mine  # its project's quota and another's is not
        if not heap:
            return None
        entry = heapq.heappop(heap)
        name, job = entry[-2], entry[-1]
        self.taken.add(job.id)
        used = self.used[name] = self.used.get(name, self.pool.used[name]) - job.gpus
        nxt = self.pool.entry(name, used, self.taken)
        if nxt is not None:
            heapq.heappush(heap, nxt)
        return job
