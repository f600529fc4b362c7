"""What a simulation keeps of each job (``JobRecord``) and hands back at its end (``SimRun``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..policy.model import Department
from .config import SimConfig
from .trace import TraceJob


@dataclass
class JobRecord:
    """One trace job through the run: where its current attempt stands (``remaining``,
    ``attempt``, ``attempt_start``, ``pending_since``) and the figures it adds up to."""

    trace: TraceJob
    remaining: float  # run time still needed, seconds
    attempt: int = 1
    pending_since: float = 0.0
    queued_s: float = 0.0
    attempt_start: float | None = None
    finish: float | None = None
    preemptions: int = 0
    young_preemptions: int = 0  # of attempts that had run less than a minute: thrash
    lost_gpu_s: float = 0.0
    allocated_gpu_s: float = 0.0
    claim_since: float | None = None  # when GPUs were first reclaimed for its guarantee
    want_since: float | None = None  # when a cycle first found it within quota and waiting
    unschedulable: str | None = None
    finished_while_preempted: bool = False  # its work ended within a grace period
    util: float | None = None  # the GPU utilization it runs at (0..1); None: not modelled
    utilized_gpu_s: float = 0.0  # allocated GPU-seconds × util
    idle_gpu_s: float = 0.0  # allocated GPU-seconds while util was below the idle threshold


@dataclass
class SimRun:
    config: SimConfig
    quotas: dict[str, int]
    records: dict[str, JobRecord]
    decision_s: list[float]
    reclaim_s: list[float]
    within_quota_preemptions: int
    start: float
    end: float
    wall_s: float
    timeline: list[tuple[float, dict[str, int], int]]  # (t, allocated milli per project, queued)
    guarantee_wait_s: list[float] = field(default_factory=list)
    """From the first cycle that found a job within its project's quota and waiting to its
    start (or until its project's other jobs left too little of the quota for it): what the
    guarantee's bound bounds."""
    borrowed_s: dict[int, dict[str, float]] = field(default_factory=dict)
    """Week (from the first submit) → project → GPU-seconds held beyond its quota."""
    wanted_s: dict[int, dict[str, float]] = field(default_factory=dict)
    """Week → project → GPU-seconds it would have held beyond its quota had all its pending
    jobs run: what it wanted to borrow (``borrowed_s`` included)."""
    weights: dict[str, int] = field(default_factory=dict)  # over-quota weight per project
    departments: dict[Department, tuple[str, ...]] = field(default_factory=dict)
    """Each department the run decided with and its projects; empty on one level."""
    spans: list[tuple[float, float, str, int, float, tuple[str, ...]]] = field(default_factory=list)
    """With ``spans=True``: each ended attempt as (start, end, job, milli-GPUs, util, the
    nodes it ran on)."""
    utilized_timeline: list[float] = field(default_factory=list)
    """Beside each ``timeline`` point: the milli-GPUs its running jobs utilized."""
    last_submit: float = 0.0
    gpu_s_to_last_submit: float = 0.0
    """GPU-seconds allocated from the first submit to the last: the allocation while the
    trace still offers work, which the time its last jobs take to end does not move."""
    moves: int = 0
    """Jobs within their project's quota stopped and requeued so that a gang within quota
    got the nodes it needed (``PolicyConfig.consolidate``): not in
    ``within_quota_preemptions``, for their projects kept their GPUs."""
