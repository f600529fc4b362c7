"""Build GPUs lent to train jobs: one virtual pool (``Node.lent``).

A build GPU that holds no slice sits idle while train jobs queue. The caller (the service,
the simulator) offers such GPUs as lent train nodes. The cycle treats them apart:

- **Only borrowers start there**, and only once the train pool's own GPUs have no room for
  them: a job that keeps its project within quota, and every claim, uses the train pool's
  own nodes alone, so quotas and the guarantee are what they are without lending.
- **They count toward no quota**: a job on lent GPUs is not part of its project's usage, is
  never the victim of a claim, and the lent GPUs are not part of the capacity that quotas
  and shares divide.
- **The build pool takes them back**: when a slice needs a lent GPU, the caller gives the
  lent node fewer GPUs than its jobs hold; the cycle then preempts jobs there (idle ones
  first, then the most recently started) until what stays fits, whatever their age. They
  are requeued as any victim is, after the grace period.
- **Taking back is not a lever**: a GPU taken back rests, unlent, for a while (``lendable``'s
  ``resting``), so that a server that gave up or stopped again does not have it lent and
  taken back once more; and one user takes back only so many GPUs within a window
  (``take_back_wait``).
"""

from __future__ import annotations

from typing import Collection, Iterable, Mapping, NamedTuple, Sequence

from .decisions import Preempt, PreemptKind
from .model import GPU, TRAIN, Node, Slice, TrainJob
from .placement import FreeMap
from .slices import SlicePlacement, SliceRefused, place_slice

GPUKey = tuple[str, int]  # (build node, GPU index)

TAKE_BACK = PreemptKind.TAKE_BACK  # a job whose lent GPUs the build pool takes back
LENT_SUFFIX = "/lent"  # a lent node's name: its build node's and this (no real node has "/")


def lent_node(build_node: str) -> str:
    """The name of the lent train node of ``build_node``'s GPUs (the service's naming)."""
    return build_node + LENT_SUFFIX


def build_node_of(name: str) -> str | None:
    """The build node whose GPUs lent node ``name`` is; None for any other node."""
    return name[:-len(LENT_SUFFIX)] if name.endswith(LENT_SUFFIX) else None


class Want(NamedTuple):
    """A slice finds room only on a lent GPU a job holds (or one a cycle may be starting a
    job on): its server wants that GPU back."""

    node: str
    gpu: int


def lendable(build_nodes: Sequence[Node], sliced: Collection[GPUKey],
             taken_back: Collection[GPUKey], held: Collection[GPUKey], reserve: int,
             nameable: Collection[GPUKey] | None = None,
             resting: Collection[GPUKey] = ()) -> list[GPUKey]:
    """The build GPUs to lend now: those (``nameable`` ones, where a backend can give only
    those) without a slice that no server takes back and that do not rest after a take-back
    (``resting``), but for the last ``reserve`` of those that no job holds (``held``)
    either, so that most slices find room at once; resting GPUs no job holds count toward
    the reserve. A job on a GPU is never preempted to keep the reserve."""
    bare = [(n.name, i) for n in build_nodes for i in range(n.gpus)
            if (nameable is None or (n.name, i) in nameable)
            and (n.name, i) not in sliced and (n.name, i) not in taken_back]
    spare = [g for g in bare if g not in held and g not in resting]
    reserve -= sum(g not in held for g in bare if g in resting)
    kept = set(spare[len(spare) - min(max(0, reserve), len(spare)):])
    return [g for g in bare if g not in kept and g not in resting]


def take_back_wait(taken: Sequence[float], now: float, most: int, window_s: float) -> float:
    """Seconds until a user whose servers took back lent GPUs at times ``taken`` may take
    back another: 0 while fewer than ``most`` of them fall within the last ``window_s``
    seconds (a window of 0: no limit)."""
    recent = sorted(t for t in taken if t > now - window_s)
    if window_s <= 0 or len(recent) < most:
        return 0.0
    return max(0.0, recent[len(recent) - most] + window_s - now)


def take_slice(build_nodes: Sequence[Node], slices: Sequence[Slice], user: str, milli: int,
               allowance: int | None = None, *, others: Sequence[Slice] = (),
               held: Collection[GPUKey] = (), busy: Collection[GPUKey] = (),
               own_waiting: Sequence[Slice] = (), may_want: bool = True,
               not_now: SliceRefused | None = None) -> SlicePlacement | Want | SliceRefused:
    """Where a slice goes on a build pool that lends GPUs: packed best fit on GPUs no job
    holds (``held``) and no cycle may be starting a job on (``busy``); ``others`` are the
    slices other servers wait for on GPUs they want back, which count against their users'
    allowances and take their room. Where only lent GPUs have room, the server wants one
    (``may_want``): one no job holds if packing finds one, else the one packing picks. A
    slice that has no room lent GPUs or not, or is beyond the allowance (counting the
    user's ``own_waiting`` slices), is refused; one that would want a GPU gets ``not_now``
    instead where the caller gives it (another server of the user is taking one back)."""
    def fence(keys):
        return [Slice("", "", GPU, n, g) for n, g in keys]

    where = place_slice(build_nodes, [*slices, *others, *fence(held), *fence(busy)], user,
                        milli, allowance)
    if not isinstance(where, SliceRefused) or not may_want or (not held and not busy):
        return where
    anyway = place_slice(build_nodes, [*slices, *own_waiting], user, milli, allowance)
    if isinstance(anyway, SliceRefused):
        return anyway  # full, or beyond the allowance, lent GPUs or not
    if not_now is not None:
        return not_now
    want = place_slice(build_nodes, [*slices, *others, *fence(held)], user, milli, allowance)
    if isinstance(want, SliceRefused):
        want = place_slice(build_nodes, [*slices, *others], user, milli, allowance)
    return want if isinstance(want, SliceRefused) else Want(want.node, want.gpu)


class Lending:
    """The lent nodes of one cycle: their free GPUs (``free``) and the jobs they run."""

    def __init__(self, nodes: Iterable[Node], allocated: Mapping[str, int]):
        lent = [n for n in nodes if n.pool == TRAIN and n.lent]
        self.size = {n.name: n.milli for n in lent}
        self.names = frozenset(self.size)
        taking = {n.name: max(0, n.milli - allocated.get(n.name, 0)) for n in lent
                  if not n.drained}
        self.free = FreeMap(taking, max(self.size.values(), default=0))
        self.allocated = {name: allocated.get(name, 0) for name in self.names}

    def __bool__(self) -> bool:
        return bool(self.names)

    def holds(self, job: TrainJob) -> bool:
        """Whether ``job`` runs on lent GPUs (a start places a job on lent nodes only)."""
        return bool(self.names) and not self.names.isdisjoint(job.placement)

    def fit(self, gpus: int) -> dict[str, int] | None:
        return self.free.fit(gpus) if self.free.free else None

    def take_back(self, running: Iterable[TrainJob]) -> list[Preempt]:
        """Preempt jobs on lent nodes that now hold fewer GPUs than their jobs: idle jobs
        first, then the most recently started, until the rest fit."""
        over = {name: self.allocated[name] - size for name, size in self.size.items()
                if self.allocated[name] > size}
        if not over:
            return []
        on = {name: [] for name in over}
        for job in running:
            for name in job.placement:
                if name in on:
                    on[name].append(job)
        for name, jobs in on.items():  # GPUs already leaving are taken back already
            over[name] -= sum(j.placement[name] for j in jobs if j.preempting)
        taken: dict[str, tuple[TrainJob, str]] = {}
        for name in sorted(over):
            for job in sorted((j for j in on[name] if not j.preempting),
                              key=lambda j: (not j.idle, -(j.start_time or 0.0), j.id)):
                if over[name] <= 0:
                    break
                if job.id not in taken:
                    taken[job.id] = (job, name)
                    self._count(over, job, -1)
        for job_id in reversed(list(taken)):  # put back any that was not needed after all
            job = taken[job_id][0]
            if all(over[n] + a <= 0 for n, a in job.placement.items() if n in over):
                self._count(over, job, +1)
                del taken[job_id]
        return [Preempt(job.id, job.project, "", f"the build pool takes back GPUs of {name} "
                        f"that it lent to train jobs", TAKE_BACK)
                for job, name in taken.values()]

    @staticmethod
    def _count(over: dict[str, int], job: TrainJob, sign: int) -> None:
        for name, amount in job.placement.items():
            if name in over:
                over[name] += sign * amount
