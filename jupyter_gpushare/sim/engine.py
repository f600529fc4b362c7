"""A trace-driven, event-driven simulation of the train pool around ``policy.cycle``.

Time only moves through the event queue (submit, finish, release after a grace period,
cycle); the policy sees one immutable snapshot per cycle, exactly as the service will.

Preemption is modelled honestly: a job told to stop keeps its GPUs for the termination
grace period and then loses the work done since its last checkpoint (one every
``checkpoint_interval_s`` of run time). That loss, grace included, is ``lost_gpu_s``. A job
whose work ends within its grace period exits 0 by itself and has finished; only one that
our stop ends is requeued (``policy/outcome.py``, the rule the service applies too).

GPU activity (``activity.py``): each job runs at one utilization level, its trace's ``util``
or one drawn from ``SimConfig.activity``; what its GPUs did is ``utilized_gpu_s`` and the time
they sat below the pool's idle threshold ``idle_gpu_s``. A job idle for the pool's
``idle_job_after`` is flagged ``idle``, as the pool's meter flags it, so that the policy
takes it first among equal victims (``SimConfig.idle_first``, the pool's
``reclaim_idle_first``).
"""

from __future__ import annotations

import gc
import heapq
import json
import math
import random
import time
from dataclasses import dataclass, field, replace
from typing import IO, Callable, Iterable, Mapping

from ..policy import CycleResult, Node, PolicyConfig, Snapshot, TrainJob, cycle
from ..policy.cycle import never_fits
from ..policy.lending import TAKE_BACK, build_node_of
from ..policy.model import GPU, Department, JobState, Project
from ..policy.past_use import FairShareTime, PastUse
from ..policy.preemption import Reclaim
from ..policy.queues import Queues
from ..policy.settings import DEFAULT_GRACE_S
from . import activity
from .baselines import config_for, projects_for, queue_of
from .trace import TraceJob

# Event kinds, in the order they are handled at one instant: GPUs come free before new
# work arrives, a caller's scheduled change (``Simulator.at``) comes next, and the cycle
# sees them all.
FINISH, RELEASE, SUBMIT, CALL, CYCLE = range(5)


@dataclass(frozen=True)
class SimConfig:
    capacity_gpus: int
    gpus_per_node: int = 8
    policy: str = "guaranteed"
    grace_s: float = DEFAULT_GRACE_S
    checkpoint_interval_s: float = 1800.0
    cycle_interval_s: float = 0.0
    """Least time between two cycles; 0 runs one after every instant at which something changed."""
    cycle_delay_s: float = 0.0
    """Seconds from a change (a submit, an end) to the cycle it brings: 0 for a trace; a
    replay of the pool's history gives the pool's measured decision latency, so that its
    starts do not drift ahead of the recorded ones job after job."""
    policy_config: PolicyConfig = field(default_factory=PolicyConfig)
    fair_share: FairShareTime | None = None
    """Fair share over time (policy/past_use.py): off when None, as in the service."""
    activity: str | None = None
    """The profile (``activity.PROFILES``) each job's utilization is drawn from where the
    trace gives none; None: only the trace's ``util`` is used, and a job without one has no
    activity modelled (``JobRecord.util`` None)."""
    activity_seed: int = 0
    idle_first: bool = True
    """Flag jobs idle for ``activity.IDLE_JOB_AFTER_S`` as idle, as the pool's
    ``reclaim_idle_first`` does, so that reclaim takes them first."""


WEEK_S = 7 * 86400.0


@dataclass
class JobRecord:
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


def on_lent(placement) -> bool:
    """Whether a job runs on build GPUs lent to train jobs (``policy.lending``'s naming)."""
    return any(build_node_of(name) is not None for name in placement)


def make_nodes(capacity_gpus: int, gpus_per_node: int) -> tuple[Node, ...]:
    full, rest = divmod(capacity_gpus, gpus_per_node)
    sizes = [gpus_per_node] * full + ([rest] if rest else [])
    width = len(str(len(sizes) - 1))
    return tuple(Node(f"node-{i:0{width}d}", g) for i, g in enumerate(sizes))


class Simulator:
    def __init__(self, jobs: list[TraceJob], quotas: dict[str, int], config: SimConfig,
                 events: IO[str] | None = None, timeline: bool = False,
                 nodes: tuple[Node, ...] | None = None,
                 projects: tuple[Project, ...] | None = None,
                 on_progress: Callable[[float], None] | None = None,
                 departments: Mapping[Department, Iterable[str]] | None = None,
                 spans: bool = False):
        """``nodes`` and ``projects`` (guaranteed policy only) replace the uniform nodes of
        ``config`` and the quota-only projects of ``quotas``: a replay of the pool's own
        settings (``history.py``); trace projects not among them get quota 0.
        ``departments`` (guaranteed policy only) maps each department to its projects'
        names: a second level of quotas (``trace.read_departments``); a project named there
        and nowhere else gets quota 0. Whether they fit is the caller's to check
        (``trace.departments_problem``); a snapshot refuses what two_levels refuses."""
        self.cfg = config
        self.on_progress = on_progress  # hears the share of submits done, now and then
        departments = {d: tuple(names) for d, names in (departments or {}).items()}
        if departments and config.policy != "guaranteed":
            raise ValueError(f"departments are for the guaranteed policy, not {config.policy}")
        member_of = {name: d.name for d, names in departments.items() for name in names}
        if projects is not None:
            quotas = {p.name: p.quota for p in projects}
        self.quotas = {p: quotas.get(p, 0)
                       for p in sorted({j.project for j in jobs} | set(quotas) | set(member_of))}
        self.nodes = nodes if nodes is not None else \
            make_nodes(config.capacity_gpus, config.gpus_per_node)
        self.projects = projects_for(config.policy, self.quotas)
        if projects is not None and config.policy == "guaranteed":
            given = {p.name: p for p in projects}
            self.projects = tuple(given.get(p.name, p) for p in self.projects)
        if member_of:
            self.projects = tuple(replace(p, department=member_of.get(p.name, p.department))
                                  for p in self.projects)
        self.departments = departments
        self.department_list = tuple(departments)  # as each snapshot takes them
        self.policy_config = config_for(config.policy, config.policy_config)
        self.quota_of = {p.name: p.quota for p in self.projects}
        self.project = {p.name: p for p in self.projects}
        self.rng = random.Random(config.activity_seed)
        self.records: dict[str, JobRecord] = {}
        for j in jobs:
            if j.kind == "train":
                self.records[j.id] = JobRecord(j, j.duration, util=self._util(j))
        self.last_submit = max((r.trace.submit_time for r in self.records.values()), default=0.0)
        self.gpu_s_to_last_submit = 0.0  # allocated GPU-seconds before the last submit
        self.active = Queues()  # pending and running jobs, as the policy sees them
        self.usage = dict.fromkeys(self.quota_of, 0)  # running, not being preempted
        self.holder: str | None = None
        self.cycles_at: set[float] = set()  # times of the cycles in the heap
        self.heap: list[tuple] = []
        self.seq = 0
        self.cycle_due: float | None = None
        self.last_cycle = -math.inf
        self.decision_s: list[float] = []
        self.reclaim_s: list[float] = []
        self.within_quota = 0
        self.moves = 0
        self.claimants: dict[str, set[str]] = {}  # project → jobs it reclaimed GPUs for
        self.wanting: dict[str, set[str]] = {}  # project → its jobs waiting within quota
        self.guarantee_wait_s: list[float] = []
        self.out = events
        self.timeline = [] if timeline else None
        self.utilized_timeline: list[float] = []  # milli-GPUs utilized at each timeline point
        self.past = PastUse(config.fair_share) if config.fair_share else None
        self.accounted: dict[str, float] = {}  # project → the time its borrowing is counted to
        self.borrowed_s: dict[int, dict[str, float]] = {}
        self.wanted_s: dict[int, dict[str, float]] = {}
        self.last_forgot = 0.0
        self.spans = [] if spans else None
        self.calls: dict[int, Callable[[float], None]] = {}
        self.stop_at = math.inf  # a caller's end of the run (``Simulator.at`` users)
        self.on_end: Callable[[JobRecord, float], None] | None = None
        """Hears each attempt that ends (finished, or released after a preemption)."""
        self.on_start: Callable[[JobRecord, float], None] | None = None
        """Hears each attempt that starts."""
        for rec in self.records.values():
            self._push(rec.trace.submit_time, SUBMIT, rec.trace.id, 1)

    def _util(self, job: TraceJob) -> float | None:
        if self.cfg.activity is None:
            return job.util
        drawn = activity.draw_util(self.cfg.activity, self.rng)  # drawn for every job alike
        return drawn if job.util is None else job.util

    def _push(self, t: float, kind: int, job: str = "", attempt: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, job, attempt))

    def at(self, t: float, call: Callable[[float], None]) -> None:
        """Call ``call(t)`` at ``t``, before that instant's cycle: a caller's own events (a
        notebook session opening, a culler's round) on the simulation's clock."""
        self._push(t, CALL)
        self.calls[self.seq] = call

    def add(self, job: TraceJob) -> None:
        """Submit ``job`` at its ``submit_time``, which is now or later: demand that depends
        on what the pool did (the next experiment after the last one's result)."""
        self.records[job.id] = JobRecord(job, job.duration, util=self._util(job))
        self._push(job.submit_time, SUBMIT, job.id, 1)

    def changed(self, t: float) -> None:
        """Ask for a cycle: the caller changed what the policy sees (``nodes``)."""
        self._changed(t)

    def stop(self, t: float, job_id: str) -> None:
        """Preempt a running job now, apart from the policy: what the pool's loop does to a
        job on a lent build GPU that a notebook server takes back (``pool/train/scheduler.py``)."""
        job = self.active.get(job_id)
        if job is not None and job.running and not job.preempting:
            self._preempt(t, job_id, TAKE_BACK)
            self._changed(t)

    def _emit(self, t: float, event: str, rec: JobRecord, **extra) -> None:
        if self.out is not None:
            line = {"t": t, "event": event, "job": rec.trace.id, "project": rec.trace.project,
                    "gpus": rec.trace.gpus // GPU, **extra}
            self.out.write(json.dumps(line) + "\n")

    def _changed(self, t: float) -> None:
        # A cycle due later (the wake-up of a young job's minimum runtime) must not hold up
        # this one: the pool runs a cycle at once after a change, and so must the replay. The
        # later cycle stays in the queue and runs at its time.
        due = max(t + self.cfg.cycle_delay_s, self.last_cycle + self.cfg.cycle_interval_s)
        if self.cycle_due is None or due < self.cycle_due:
            self.cycle_due = due
            if due not in self.cycles_at:  # one cycle at a time is all a change needs
                self.cycles_at.add(due)
                self._push(due, CYCLE)

    def run(self) -> SimRun:
        # The trace, its records and the program live through the whole run: frozen, they
        # are not walked again by every full collection the run's cycles trigger.
        gc.collect()
        gc.freeze()
        try:
            return self._run()
        finally:
            gc.unfreeze()

    def _run(self) -> SimRun:
        wall = time.perf_counter()
        first = min((r.trace.submit_time for r in self.records.values()), default=0.0)
        end = self.first = first
        total, submitted = max(1, len(self.records)), 0
        while self.heap:
            t, kind, seq, job, attempt = heapq.heappop(self.heap)
            if t > self.stop_at:
                break
            if kind == SUBMIT:
                self._submit(t, job)
                submitted += 1
                if self.on_progress is not None and submitted % 500 == 0:
                    self.on_progress(submitted / total)
            elif kind == FINISH:
                self._finish(t, job, attempt)
            elif kind == RELEASE:
                self._release(t, job, attempt)
            elif kind == CALL:
                self.calls.pop(seq)(t)
            else:
                self.cycles_at.discard(t)
                self._cycle(t)
            end = max(end, t)
        for project in self.quota_of:
            self._account(project, end)
        ends = [r.finish for r in self.records.values() if r.finish is not None]
        return SimRun(self.cfg, self.quotas, self.records, self.decision_s, self.reclaim_s,
                      self.within_quota, first, max(ends, default=end),
                      time.perf_counter() - wall, self.timeline or [], self.guarantee_wait_s,
                      self.borrowed_s, self.wanted_s,
                      {p.name: p.over_quota_weight for p in self.projects}, self.departments,
                      self.spans or [], self.utilized_timeline, self.last_submit,
                      self.gpu_s_to_last_submit, self.moves)

    # -- events ------------------------------------------------------------------------
    def _submit(self, t: float, job_id: str) -> None:
        rec = self.records[job_id]
        tj = rec.trace
        rec.pending_since = t
        job = TrainJob(job_id, queue_of(self.cfg.policy, tj.project), tj.gpus,
                       user=tj.user, priority=tj.priority, submit_time=tj.submit_time)
        self._emit(t, "submit", rec)
        project = self.project.get(job.project)
        never = never_fits(job, project, self.cfg.capacity_gpus * GPU) if project else None
        if never is not None:  # what the policy would say at once; no cycle needed
            rec.unschedulable = str(never)
            return
        self._account(job.project, t)
        self.active.put(job)
        self._changed(t)

    def _finish(self, t: float, job_id: str, attempt: int) -> None:
        rec = self.records[job_id]
        job = self.active.get(job_id)
        if job is None or rec.attempt != attempt or not job.running:
            return  # a stale event of an attempt that was preempted
        self._account(job.project, t)
        if job.preempting:  # its work ended within the grace: exit 0, the job has finished
            rec.finished_while_preempted = True
        self._held(rec, job, t)
        rec.finish = t
        rec.remaining = 0.0
        if not job.preempting and not on_lent(job.placement):
            self.usage[job.project] -= job.gpus
        self.active.remove(job_id)
        self._emit(t, "finish", rec)
        self._changed(t)
        if self.on_end is not None:
            self.on_end(rec, t)

    def _held(self, rec: JobRecord, job: TrainJob, t: float) -> float:
        """Count the GPU-seconds of the attempt that ends at ``t``; its run time."""
        ran = t - rec.attempt_start
        held = rec.trace.gpus / GPU * ran
        rec.allocated_gpu_s += held
        if rec.attempt_start < self.last_submit:
            self.gpu_s_to_last_submit += rec.trace.gpus / GPU * \
                (min(t, self.last_submit) - rec.attempt_start)
        if rec.util is not None:
            rec.utilized_gpu_s += held * rec.util
            if rec.util < activity.IDLE_THRESHOLD:
                rec.idle_gpu_s += held
        if self.spans is not None:
            self.spans.append((rec.attempt_start, t, rec.trace.id, rec.trace.gpus, rec.util,
                               tuple(job.placement)))
        return ran

    def _release(self, t: float, job_id: str, attempt: int) -> None:
        rec = self.records[job_id]
        job = self.active.get(job_id)
        if job is None or rec.attempt != attempt:
            return
        # Still running at the end of its grace: our stop ends it (143 or 137), so it is
        # requeued with the work saved by its last checkpoint.
        self._account(job.project, t)
        ran = self._held(rec, job, t)
        interval = self.cfg.checkpoint_interval_s
        saved = math.floor((ran - self.cfg.grace_s) / interval) * interval if interval > 0 else 0.0
        saved = max(0.0, min(saved, rec.remaining))
        gpus = rec.trace.gpus / GPU
        rec.lost_gpu_s += gpus * (ran - saved)
        rec.remaining -= saved
        rec.attempt += 1
        rec.attempt_start = None
        rec.pending_since = t
        self.active.put(replace(job, state=JobState.PENDING, attempt=rec.attempt,
                                placement={}, start_time=None, preempting=False, requeued=t,
                                idle=False))
        self._changed(t)
        if self.on_end is not None:
            self.on_end(rec, t)

    def snapshot(self, t: float) -> Snapshot:
        """What the policy sees at ``t``: the queues kept up to date between cycles, and with
        fair share over time, each project's decayed borrowing."""
        past = {}
        if self.past is not None:
            for project in self.quota_of:
                self._account(project, t)
            if self.past.clock.bucket(self.last_forgot) != self.past.clock.bucket(t):
                self.past.forget_before(t)
                self.last_forgot = t
            past = self.past.decayed(t)
        return Snapshot(t, self.nodes, self.projects, queues=self.active, past_use=past,
                        departments=self.department_list)

    def _account(self, project: str, t: float) -> None:
        """Count what ``project`` borrowed (GPUs held beyond its quota) and wanted to borrow
        (had all its pending jobs run) since it last changed: called before each change to
        what it holds or queues, and at each cycle with fair share over time."""
        since = self.accounted.get(project, self.first)
        self.accounted[project] = t
        if t <= since:
            return
        quota = self.quota_of.get(project, 0)
        held = self.usage.get(project, 0)
        want = held + self.active.pending_gpus(project) - quota
        if want <= 0:
            return
        beyond = max(0, held - quota)
        if beyond and self.past is not None:
            self.past.add(project, since, t, beyond)
        week = int((since - self.first) // WEEK_S)
        while since < t:  # split at the weeks' ends; the index, not the float, moves on
            upto = min(t, self.first + (week + 1) * WEEK_S)
            if upto > since:
                wanted = self.wanted_s.setdefault(week, {})
                wanted[project] = wanted.get(project, 0.0) + want / GPU * (upto - since)
                if beyond:
                    borrowed = self.borrowed_s.setdefault(week, {})
                    borrowed[project] = borrowed.get(project, 0.0) + beyond / GPU * (upto - since)
                since = upto
            week += 1

    def decide(self, snap: Snapshot) -> CycleResult:
        """The policy's decisions on one snapshot: the one place the simulator asks the
        policy, so that a subclass can run another implementation of it on the same events
        (tests/test_policy_equality.py, benchmarks/reclaim_burst.py)."""
        return cycle(snap, self.policy_config)

    def _cycle(self, t: float) -> None:
        self.cycle_due = None
        self.last_cycle = t
        snap = self.snapshot(t)
        tick = time.perf_counter()
        result = self.decide(snap)
        self.decision_s.append(time.perf_counter() - tick)
        for p in result.preemptions:
            self._preempt(t, p.job, p.kind)
            if not p.for_job:  # lent GPUs taken back for the build pool: no claimant
                continue
            claimant = self.records[p.for_job]
            if p.kind in (Reclaim.GUARANTEE, Reclaim.MOVE) and claimant.claim_since is None:
                claimant.claim_since = t
                self.claimants.setdefault(self.active.get(p.for_job).project, set()).add(p.for_job)
        for s in result.starts:
            self._start(t, s.job, s.placement)
        for job_id in result.within_quota_waiting:
            rec = self.records[job_id]
            project = self.active.get(job_id).project
            # Still within quota after the cycle's starts (a later job of its project may
            # have taken the room: then the project got what it was owed, _guarantee_met).
            if rec.want_since is None and \
                    self.usage[project] + rec.trace.gpus <= self.quota_of[project]:
                rec.want_since = t
                self.wanting.setdefault(project, set()).add(job_id)
        self._apply_waits(t, result)
        if self.timeline is not None:
            view = self.active.view()
            alloc: dict[str, int] = {}
            for j in view.running:
                proj = self.records[j.id].trace.project
                alloc[proj] = alloc.get(proj, 0) + j.gpus
            self.timeline.append((t, alloc, sum(len(q) for q in view.pending.values())))
            self.utilized_timeline.append(
                sum(j.gpus * (self.records[j.id].util or 0.0) for j in view.running))

    def _start(self, t: float, job_id: str, placement) -> None:
        rec = self.records[job_id]
        job = self.active.get(job_id)
        self._account(job.project, t)
        rec.queued_s += t - rec.pending_since
        rec.attempt_start = t
        if not on_lent(placement):  # lent build GPUs count toward no quota, as in the pool
            self.usage[job.project] += job.gpus
        self._guarantee_met(t, job.project, job_id)
        self.active.put(replace(job, state=JobState.RUNNING, placement=placement,
                                start_time=t, reserved=()))
        if self.holder == job_id:
            self.holder = None
        self._push(t + rec.remaining, FINISH, job_id, rec.attempt)
        if self.on_start is not None:
            self.on_start(rec, t)
        if self.cfg.idle_first and rec.util is not None and rec.util < activity.IDLE_THRESHOLD:
            self.at(t + activity.IDLE_JOB_AFTER_S, lambda now, a=rec.attempt:
                    self._flag_idle(job_id, a))
        self._emit(t, "start", rec, attempt=rec.attempt,
                   placement={n: m // GPU for n, m in sorted(placement.items())})

    def _flag_idle(self, job_id: str, attempt: int) -> None:
        """The pool's meter has seen the attempt idle for ``idle_job_after``: flag it."""
        job = self.active.get(job_id)
        if job is not None and job.running and job.attempt == attempt:
            self.active.put(replace(job, idle=True))

    def _guarantee_met(self, t: float, project: str, started: str) -> None:
        """A guarantee reclaim, or a wait within quota, is done when its job starts, or when
        the project's other jobs that started meanwhile leave too little of its quota for it:
        the project got what it was owed, and the job, were it to start now, would borrow."""
        room = self.quota_of[project] - self.usage[project]
        for jobs, since, times in ((self.wanting, "want_since", self.guarantee_wait_s),
                                   (self.claimants, "claim_since", self.reclaim_s)):
            for job_id in list(jobs.get(project) or ()):
                rec = self.records[job_id]
                if job_id == started or rec.trace.gpus > room:
                    times.append(t - getattr(rec, since))
                    setattr(rec, since, None)
                    jobs[project].discard(job_id)

    def _preempt(self, t: float, job_id: str, kind: str) -> None:
        """``kind``: the rule that stopped it (``Preempt.kind``: a ``Reclaim`` rule, or a
        take-back of lent build GPUs), written with its event."""
        rec = self.records[job_id]
        job = self.active.get(job_id)
        # Checked here, apart from the policy: the guarantee says this never happens.
        self._account(job.project, t)
        if not on_lent(job.placement):  # a job on lent GPUs is within no quota
            if kind == Reclaim.MOVE:
                self.moves += 1
            elif self.usage[job.project] <= self.quota_of[job.project]:
                self.within_quota += 1
            self.usage[job.project] -= job.gpus
        rec.preemptions += 1
        rec.young_preemptions += t - rec.attempt_start < 60
        self.active.put(replace(job, preempting=True))
        # A job whose work ends within the grace period finishes (its FINISH event comes
        # first); only one still running when the grace ends is released and requeued.
        if rec.attempt_start + rec.remaining > t + self.cfg.grace_s:
            self._push(t + self.cfg.grace_s, RELEASE, job_id, rec.attempt)
        self._emit(t, "preempt", rec, attempt=rec.attempt, kind=getattr(kind, "value", kind))

    def _apply_waits(self, t: float, result) -> None:
        for w in result.unschedulable:  # can never run as asked
            self.records[w.job].unschedulable = str(w.reason)
            self._account(self.active.get(w.job).project, t)
            self.active.remove(w.job)
        holder = result.reservation.job if result.reservation else None
        if holder is not None:
            job = self.active.get(holder)
            if job.reserved != result.reservation.reserved:
                self.active.put(replace(job, reserved=result.reservation.reserved))
        if self.holder not in (None, holder):
            old = self.active.get(self.holder)
            if old is not None and old.pending:
                self.active.put(replace(old, reserved=()))
        self.holder = holder
        wait = self.policy_config.min_runtime_s
        if wait > 0:  # a young job becomes preemptible with no event to say so
            view = self.active.view()
            young = [j.start_time for j in view.running
                     if not j.preempting and j.start_time + wait > t]
            if young and view.pending:
                self._changed(min(young) + wait)
