"""The scheduling model: immutable values in integer milli-GPUs.

Everything the policy sees is in this module. One GPU is ``GPU`` (1000) units; fractions
exist only for build slices. Floats never carry GPU amounts, so two quantities are equal
exactly when they are equal.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterable, Mapping

from .. import trainjob

GPU = 1000
"""Milli-GPU units in one whole GPU."""

TRAIN = "train"
BUILD = "build"


def gpus_text(milli: int) -> str:
    """Say a milli-GPU amount in words: ``2000`` → ``"2 GPUs"``, ``250`` → ``"0.25 GPU"``."""
    if milli % GPU == 0:
        n = milli // GPU
        return f"{n} GPU" if n == 1 else f"{n} GPUs"
    return f"{milli / GPU:g} GPU"


def _frozen(mapping: Mapping | None) -> Mapping:
    return MappingProxyType(dict(mapping or {}))


class JobState(str, enum.Enum):
    """A job's state as the policy sees it, in the words of ``trainjob.py``."""

    PENDING = trainjob.PENDING
    RUNNING = trainjob.RUNNING
    PREEMPTED = trainjob.PREEMPTED
    SUCCEEDED = trainjob.SUCCEEDED
    FAILED = trainjob.FAILED
    CANCELLED = trainjob.CANCELLED

    @property
    def finished(self) -> bool:
        return self.value in trainjob.FINAL


@dataclass(frozen=True, slots=True)
class Node:
    """A machine with ``gpus`` whole GPUs in one pool (``train`` or ``build``). A ``drained``
    node takes no new jobs; what runs there runs on (an admin drains a node before
    maintenance). A ``lent`` train node is build GPUs that hold no slice, lent to train jobs
    (``lending.py``): only jobs beyond their project's quota start there, they count toward
    no quota, and when the build pool needs a GPU back it gives the node fewer ``gpus`` than
    its jobs hold, and the cycle takes them back."""

    name: str
    gpus: int
    pool: str = TRAIN
    labels: Mapping[str, str] = field(default_factory=dict)
    drained: bool = False
    lent: bool = False

    def __post_init__(self):
        if self.gpus < 0:
            raise ValueError(f"node {self.name} has a negative number of GPUs")
        if self.lent and self.pool != TRAIN:
            raise ValueError(f"node {self.name} is lent to the train pool, so it is a train "
                             f"node, not a {self.pool} node")
        object.__setattr__(self, "labels", _frozen(self.labels))

    @property
    def milli(self) -> int:
        return self.gpus * GPU


@dataclass(frozen=True, slots=True)
class Project:
    """A queue of train jobs with a guaranteed ``quota``.

    ``quota`` and ``limit`` are milli-GPUs; ``limit=None`` means no cap beyond the pool.
    ``over_quota_weight`` sets the project's share of idle GPUs beyond quotas; ``priority``
    decides which projects borrow first. ``department`` names the ``Department`` the project
    belongs to, "" for none.
    """

    name: str
    quota: int = 0
    over_quota_weight: int = 1
    limit: int | None = None
    priority: int = 0
    department: str = ""

    def __post_init__(self):
        if self.quota < 0:
            raise ValueError(f"project {self.name}: quota must be 0 or more")
        if self.over_quota_weight < 0:
            raise ValueError(f"project {self.name}: over_quota_weight must be 0 or more")
        if self.limit is not None and self.limit < self.quota:
            raise ValueError(
                f"project {self.name}: limit ({gpus_text(self.limit)}) is below its quota "
                f"({gpus_text(self.quota)}); raise the limit or lower the quota"
            )


@dataclass(frozen=True, slots=True)
class Department:
    """Projects over projects (as Run:ai's departments, KAI's parent queues): ``quota``
    milli-GPUs guaranteed to its projects together, ``limit`` (None: no cap) on what they hold
    together, ``over_quota_weight`` for the department's share of idle GPUs beyond quotas.
    Its projects name it (``Project.department``); their quotas add up to at most its own."""

    name: str
    quota: int = 0
    over_quota_weight: int = 1
    limit: int | None = None

    def __post_init__(self):
        if self.quota < 0:
            raise ValueError(f"department {self.name}: quota must be 0 or more")
        if self.over_quota_weight < 0:
            raise ValueError(f"department {self.name}: over_quota_weight must be 0 or more")
        if self.limit is not None and self.limit < self.quota:
            raise ValueError(
                f"department {self.name}: limit ({gpus_text(self.limit)}) is below its quota "
                f"({gpus_text(self.quota)}); raise the limit or lower the quota"
            )


@dataclass(frozen=True, slots=True)
class TrainJob:
    """A gang of whole GPUs: ``gpus`` milli-GPUs, a multiple of ``GPU``.

    A running job has a ``placement`` (node name → milli-GPUs) and a ``start_time``;
    ``preempting`` marks a running job that was told to stop and still holds its GPUs
    until its grace period ends. ``reserved`` names the nodes kept for a pending job that
    waited too long (see ``PolicyConfig.reserve_after_s``); the caller hands back what the
    previous cycle decided so that a reservation stays put. ``idle`` marks a running job
    whose GPUs have stayed idle (measured by the caller): among otherwise equal victims,
    idle jobs are taken first. ``requeued`` is when a preempted (or lost) attempt put the
    job back in its queue, None before that: a requeued job queues from then, as Kueue
    orders an evicted workload by its eviction time, so a victim never goes before the job
    it made room for (``waiting_since``).
    """

    id: str
    project: str
    gpus: int
    user: str = ""
    priority: int = 0
    submit_time: float = 0.0
    state: JobState = JobState.PENDING
    attempt: int = 1
    placement: Mapping[str, int] = field(default_factory=dict)
    start_time: float | None = None
    preempting: bool = False
    reserved: tuple[str, ...] = ()
    idle: bool = False
    requeued: float | None = None

    def __post_init__(self):
        if self.gpus <= 0 or self.gpus % GPU:
            raise ValueError(f"job {self.id}: a train job asks for a whole number of GPUs (1 or more)")
        object.__setattr__(self, "placement", _frozen(self.placement))

    @property
    def running(self) -> bool:
        return self.state is JobState.RUNNING

    @property
    def pending(self) -> bool:
        return self.state is JobState.PENDING

    @property
    def waiting_since(self) -> float:
        """The time the job's place in the queues counts from: its submit, or its requeue."""
        return self.submit_time if self.requeued is None else self.requeued


@dataclass(frozen=True, slots=True)
class Slice:
    """A build slice: ``milli`` of GPU number ``gpu`` on build-pool node ``node``."""

    id: str
    user: str
    milli: int
    node: str
    gpu: int


DEFAULT_MIN_RUNTIME_S = 30.0
"""The service's and ``gpushare simulate``'s default minimum runtime: without one, a job that
borrowed an idle GPU could be preempted milliseconds after it started by the next job within
quota, again and again (docs/explanation/scheduling.md, "Anti-thrash"; measured on the
Philly trace in docs/explanation/performance.md)."""


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Knobs of the guaranteed-quota policy. Times are seconds."""

    min_runtime_s: float = 0.0
    """A running job is not preempted before it has run this long. The pure policy's default
    is 0; the service and the simulator's command line use ``DEFAULT_MIN_RUNTIME_S``."""
    reserve_after_s: float = 1800.0
    """A job pending this long gets nodes reserved: no borrowing job starts there until it does."""
    reclaim_fair_share: bool = False
    """Borrowers below their deserved share may preempt borrowers above theirs. Off by
    default: on the Philly trace it multiplied preemptions and lost work
    (docs/explanation/scheduling.md, "Fair borrowing"); fair borrowing then comes from the
    order in which idle GPUs are handed out. With fair share over time it is what makes
    borrowing fair week by week (same page, "Fair share over time")."""
    preempt_within_project: bool = False
    """A higher-priority job may preempt lower-priority jobs of its own project."""
    consolidate: bool = True
    """A gang within its project's quota that finds GPUs, but not on few enough nodes, and
    no borrower to take them back from, may move jobs within their projects' quotas off the
    nodes it needs, onto other GPUs (moves.py), one gang a cycle. A moved job loses the work
    since its last checkpoint; its project keeps its GPUs (docs/explanation/scheduling.md,
    "Gangs and moves")."""
    preemption: bool = True
    """Reclaim at all; off for baselines that never preempt."""
    reservations: bool = True
    """Keep nodes for starving large gangs; off for plain first-fit baselines."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one scheduling cycle sees. ``now`` is the caller's clock, never read here.

    The jobs (pending and running) come either as ``jobs`` or, from a caller that runs many
    cycles, as a ``queues.Queues`` it keeps up to date, so that no cycle sorts the backlog.
    """

    now: float
    nodes: tuple[Node, ...]
    projects: tuple[Project, ...]
    jobs: tuple[TrainJob, ...] = ()
    slices: tuple[Slice, ...] = ()
    queues: object = None  # queues.Queues; not imported here to keep the model at the bottom
    past_use: Mapping[str, float] = field(default_factory=dict)
    """Fair share over time (past_use.py): each project's decayed borrowed GPU-seconds; empty
    when it is off, and idle GPUs are divided by the projects' weights alone."""
    departments: tuple[Department, ...] = ()
    """The departments the projects name; empty when quotas have one level."""

    def __post_init__(self):
        if self.queues is not None and self.jobs:
            raise ValueError("a snapshot takes its jobs as jobs or as queues, not both")
        if self.departments or any(p.department for p in self.projects):
            problem = two_levels(self.projects, self.departments)
            if problem:
                raise ValueError(problem)

    def train_nodes(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.pool == TRAIN)

    def build_nodes(self) -> tuple[Node, ...]:
        return tuple(n for n in self.nodes if n.pool == BUILD)

    def train_capacity(self) -> int:
        """The train pool's own GPUs, which quotas share out; lent build GPUs are not."""
        return sum(n.milli for n in self.nodes if n.pool == TRAIN and not n.lent)


def two_levels(projects: Iterable[Project], departments: Iterable[Department]) -> str | None:
    """Why projects and departments do not make two levels of quotas, in one sentence that
    says what to do; None when they do."""
    known: dict[str, Department] = {}
    for d in departments:
        if d.name in known:
            return f"department {d.name} is given twice; give each department once"
        known[d.name] = d
    held = dict.fromkeys(known, 0)
    for p in projects:
        if not p.department:
            continue
        if p.department not in known:
            return (f"project {p.name} names department {p.department}, which does not exist; "
                    f"create the department first or name another")
        held[p.department] += p.quota
    for name, total in held.items():
        d = known[name]
        if total > d.quota:
            return (f"the quotas of department {name}'s projects add up to {gpus_text(total)}, "
                    f"more than its quota of {gpus_text(d.quota)}; raise the department's "
                    f"quota or lower its projects'")
    return None
