"""Moves: jobs within quota leave the nodes a gang within quota needs (``consolidate``).

A job that keeps its project within quota may find GPUs free, and no borrower to take back,
yet not on few enough nodes: jobs of projects within their own quotas are spread over the
nodes it would use. Reclaim cannot serve it, and it would wait as long as those jobs run.
With ``PolicyConfig.consolidate`` the pool moves some of them instead, as KAI-Scheduler's
consolidation does: each is stopped and requeued, and the GPUs it will start on elsewhere are
free now, or borrowers' that are taken back for it. Its project keeps what it holds; the job
loses the work since its last checkpoint, as any preempted job does.

``plan_moves`` finds, for one claimant, the set of the fewest nodes that costs the fewest
moved GPUs (then the fewest moves, then the fewest GPUs taken back): borrowers on those
nodes go first, in contract order; then jobs that lie on one node of the set, the smallest
first; then every one not needed is put back. Each moved job needs a place outside the set,
on free GPUs or on a borrower's. The preemption module decides when to ask (only once no
borrower, of any age, could make room); the ledger (ledger.py) books the plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations, islice

from .model import TrainJob
from .placement import FreeMap, nodes_needed
from .victims import Candidates, VictimPicker, _gain, _greedy

MAX_NODE_SETS = 64
"""Node sets a claimant's search looks at, the most promising first."""


@dataclass
class Plan:
    nodes: tuple[str, ...]
    placement: dict[str, int]  # the claimant's, on ``nodes``
    victims: list[TrainJob]  # borrowers taken back: on ``nodes``, or where a moved job goes
    moves: list[tuple[TrainJob, dict[str, int]]] = field(default_factory=list)  # job, target

    @property
    def cost(self) -> tuple[int, int, int]:
        return (sum(j.gpus for j, _ in self.moves), len(self.moves),
                sum(v.gpus for v in self.victims))


def plan_moves(gpus: int, room: FreeMap, free: FreeMap, pool: Candidates,
               exclude: frozenset[str] = frozenset()) -> Plan | None:
    """The cheapest plan that makes room for a gang of ``gpus`` by moving jobs, or None.

    ``room``: free and releasing GPUs per node, where the gang may go; ``free``: free GPUs
    alone, where a moved job may go (releasing ones are promised to other claimants);
    ``pool``: the running jobs old enough to leave (those a guarantee reclaim may take are
    its borrowers, the rest may move). Nothing is changed.
    """
    best = None
    spare = FreeMap(free.free, free.node_size)  # where moved jobs may go; each set undoes its takes
    for nodes in _node_sets(gpus, room, pool, exclude):
        plan = _plan_on(gpus, nodes, room, spare, pool, best.cost[:2] if best else None)
        if plan is not None and (best is None or plan.cost < best.cost):
            best = plan
    return best


def _movers(pool: Candidates, name: str) -> list[TrainJob]:
    """The pool's jobs that lie on node ``name`` alone: the ones that may move."""
    return [j for j in pool.on_node.get(name, ()) if len(j.placement) == 1]


def _node_sets(gpus: int, room: FreeMap, pool: Candidates, exclude) -> list[tuple[str, ...]]:
    """Sets of the fewest nodes a gang needs that could hold it once the pool's jobs on them
    left, those with the most room and borrowers first."""
    k = nodes_needed(gpus, room.node_size)
    gains = {}
    for name, amount in room.free.items():
        if name in exclude:
            continue
        easy = amount + sum(j.gpus for j in pool.on_node.get(name, ())
                            if j.placement.keys() == {name} and pool.movable(j.project))
        gains[name] = (easy, easy + sum(j.gpus for j in _movers(pool, name)
                                        if not pool.movable(j.project)))
    ranked = sorted((n for n, g in gains.items() if g[1] > 0),
                    key=lambda n: (-gains[n][0], -gains[n][1], n))
    ranked = ranked[:k - 1 + MAX_NODE_SETS]
    return [nodes for nodes in islice(combinations(ranked, k), MAX_NODE_SETS)
            if sum(gains[n][1] for n in nodes) >= gpus]


def _plan_on(gpus: int, nodes: tuple[str, ...], room: FreeMap, spare: FreeMap,
             pool: Candidates, beat: tuple[int, int] | None) -> Plan | None:
    """The plan on ``nodes``, or None if there is none, or none that moves less than
    ``beat`` (moved GPUs, moves) of the best plan so far."""
    here = FreeMap({n: room.free[n] for n in nodes}, room.node_size)
    inside = pool.inside(set(nodes))
    borrowers = Candidates([j for j in inside if pool.movable(j.project)],
                           {p: pool.used[p] for p in pool.used}, pool.projects, pool.deserved,
                           pool.floor)
    picker = VictimPicker(borrowers)
    victims: list[TrainJob] = []
    while here.fit(gpus) is None:
        victim = picker.pop()
        if victim is None:
            break
        victims.append(victim)
        here.give(victim.placement)
    gone = {v.id for v in victims}
    moves = []
    if here.fit(gpus) is None:
        quota = lambda name: pool.projects[name].quota  # noqa: E731
        movers = sorted((j for j in inside if len(j.placement) == 1 and j.id not in gone
                         and pool.used[j.project] <= quota(j.project)),  # within quota only
                        key=lambda j: (j.gpus, -(j.start_time or 0.0), j.id))
        for job in movers:
            moves.append(job)
            here.give(job.placement)
            if here.fit(gpus) is not None:
                break
        else:
            return None
    # Put back what is not needed: moved jobs first (a move costs a project within quota),
    # the last chosen first; then borrowers.
    for chosen in (moves, victims):
        for job in reversed(list(chosen)):
            here.take(job.placement)
            if here.fit(gpus) is not None:
                chosen.remove(job)
            else:
                here.give(job.placement)
    if not moves or (beat is not None and (sum(j.gpus for j in moves), len(moves)) > beat):
        return None  # borrowers alone do it (a reclaim will), or it moves more than the best
    placement = here.fit(gpus)
    targets = _targets(moves, nodes, spare, pool, victims)
    if targets is None:
        return None
    moved, taken = targets
    return Plan(nodes, placement, victims + taken, moved)


TARGET_NODES = 16
"""Nodes off the set where a moved job may go once borrowers there give back GPUs: those
that would give the most."""


def _targets(moves: list[TrainJob], nodes: tuple[str, ...], spare: FreeMap, pool: Candidates,
             victims: list[TrainJob]):
    """Where each moved job goes, off ``nodes``: on free GPUs (``spare``), else where
    borrowers on the nodes off the set that would give the most are taken back for it; with
    the borrowers taken. None if one of them has no place. ``spare`` is left as it was."""
    off = frozenset(nodes)
    others = None
    moved, taken, gained = [], [], []
    try:
        for job in sorted(moves, key=lambda j: (-j.gpus, j.id)):  # the largest first
            target = spare.fit(job.gpus, off)
            if target is None:
                if others is None:
                    others = _borrowers_near(nodes, pool, victims)
                found = _greedy(job.gpus, spare, {}, others, off)
                if found is None:
                    return None
                gone, target = found
                others.commit(gone)
                for v in gone:
                    gain = _gain(v, spare, off)
                    spare.give(gain)
                    gained.append(gain)
                taken.extend(gone)
            spare.take(target)
            moved.append((job, target))
        return moved, taken
    finally:  # undo: the next set starts from the same free GPUs
        for _, target in moved:
            spare.give(target)
        for gain in gained:
            spare.take(gain)


def _borrowers_near(nodes: tuple[str, ...], pool: Candidates, victims: list[TrainJob]
                    ) -> Candidates:
    """The borrowers on the ``TARGET_NODES`` nodes off the set that would give the most, as
    the pool would have them once ``victims`` are gone."""
    near = set(pool.ranked(TARGET_NODES, frozenset(nodes)))
    used = dict(pool.used)
    for v in victims:
        used[v.project] -= v.gpus
    gone = {v.id for v in victims}
    return Candidates([j for j in pool.inside(near) if pool.movable(j.project)
                       and j.id not in gone], used, pool.projects, pool.deserved, pool.floor)
