"""A trace-driven, event-driven simulation of the train pool around ``policy.cycle``.

Time only moves through the event queue (``clock.py``: submit, finish, release after a grace
period, cycle); the policy sees one immutable snapshot per cycle of the pool kept between
cycles (``cluster.py``), exactly as the service will. What the run measures is kept apart
(``observer.py``), and so is what each project borrowed (``borrowing.py``). ``Simulator``
ties them together: it turns each event into changes of the pool and each cycle's decisions
into events.

Preemption is modelled honestly: a job told to stop keeps its GPUs for the termination
grace period and then loses the work done since its last checkpoint (one every
``checkpoint_interval_s`` of run time). That loss, grace included, is ``lost_gpu_s``. A job
whose work ends within its grace period exits 0 by itself and has finished; only one that
our stop ends is requeued (``policy/outcome.py``, the rule the service applies too).

A cycle that cannot decide anything new is not decided again: when the last cycle changed
nothing, nothing changed since but jobs that could neither start, claim GPUs nor move the
projects' shares (``Simulator._inert``), and no age the policy reads (the minimum runtime,
the wait before a reservation) was passed meanwhile, its decisions stand
(``Simulator._unchanged``). The figures are those of deciding every cycle; only
``decision_s`` is shorter (tests/test_sim_parts.py).

GPU activity (``activity.py``): each job runs at one utilization level, its trace's ``util``
or one drawn from ``SimConfig.activity``; what its GPUs did is ``utilized_gpu_s`` and the time
they sat below the pool's idle threshold ``idle_gpu_s``. A job idle for the pool's
``idle_job_after`` is flagged ``idle``, as the pool's meter flags it, so that the policy
takes it first among equal victims (``SimConfig.idle_first``, the pool's
``reclaim_idle_first``).
"""

from __future__ import annotations

import gc
import math
import random
import time
from dataclasses import replace
from typing import IO, Callable, Iterable, Mapping

from ..policy import CycleResult, Node, Snapshot, TrainJob, cycle
from ..policy.cycle import never_fits
from ..policy.lending import TAKE_BACK
from ..policy.model import GPU, Department, Project
from ..policy.outcome import KILLED, REQUEUED, after_attempt
from ..policy.preemption import Reclaim
from ..policy.queues import Queues
from ..trainjob import FAILED, SUCCEEDED
from . import activity
from .baselines import config_for, projects_for, queue_of
from .borrowing import Borrowing
from .clock import CALL, CYCLE, FINISH, RELEASE, SUBMIT, EventClock
from .cluster import ClusterState, on_lent
from .config import SimConfig
from .observer import MetricsObserver
from .quiet import Quiet, RoomLeft
from .records import JobRecord, SimRun
from .trace import TraceJob

__all__ = ["JobRecord", "SimConfig", "SimRun", "Simulator", "make_nodes", "on_lent"]


def make_nodes(capacity_gpus: int, gpus_per_node: int) -> tuple[Node, ...]:
    full, rest = divmod(capacity_gpus, gpus_per_node)
    sizes = [gpus_per_node] * full + ([rest] if rest else [])
    width = len(str(len(sizes) - 1))
    return tuple(Node(f"node-{i:0{width}d}", g) for i, g in enumerate(sizes))


def _cluster(jobs: list[TraceJob], quotas: dict[str, int], config: SimConfig,
             nodes: tuple[Node, ...] | None, projects: tuple[Project, ...] | None,
             departments: dict[Department, tuple[str, ...]]) -> ClusterState:
    """The pool a run starts with (``Simulator``'s arguments say how)."""
    if departments and config.policy != "guaranteed":
        raise ValueError(f"departments are for the guaranteed policy, not {config.policy}")
    member_of = {name: d.name for d, names in departments.items() for name in names}
    if projects is not None:
        quotas = {p.name: p.quota for p in projects}
    quotas = {p: quotas.get(p, 0)
              for p in sorted({j.project for j in jobs} | set(quotas) | set(member_of))}
    decided = projects_for(config.policy, quotas)
    if projects is not None and config.policy == "guaranteed":
        given = {p.name: p for p in projects}
        decided = tuple(given.get(p.name, p) for p in decided)
    if member_of:
        decided = tuple(replace(p, department=member_of.get(p.name, p.department))
                        for p in decided)
    if nodes is None:
        nodes = make_nodes(config.capacity_gpus, config.gpus_per_node)
    return ClusterState(nodes, decided, quotas, departments)


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
        (``trace.departments_problem``); a snapshot refuses what two_levels refuses.
        ``events`` gets the events log, ``timeline`` and ``spans`` ask ``SimRun`` for them."""
        self.cfg = config
        self.policy_config = config_for(config.policy, config.policy_config)
        self.on_progress = on_progress  # hears the share of submits done, now and then
        self.cluster = _cluster(jobs, quotas, config, nodes, projects,
                                {d: tuple(names) for d, names in (departments or {}).items()})
        self.clock = EventClock(config.cycle_interval_s, config.cycle_delay_s)
        self.rng = random.Random(config.activity_seed)
        self.records: dict[str, JobRecord] = {}
        for j in jobs:
            if j.kind == "train":
                self.records[j.id] = JobRecord(j, j.duration, util=self._util(j))
        self.metrics = MetricsObserver(self.records, events, timeline, spans)
        self.borrowing = Borrowing(self.cluster, self.metrics, config.fair_share)
        self.quiet: Quiet | None = None
        # The priorities of the jobs and whether the projects have one: with one of each, the
        # latest job to queue comes last (quiet.py)
        self._ranks = {r.trace.priority for r in self.records.values()}
        self._one_project_rank = len({p.priority for p in self.cluster.projects}) <= 1
        self.on_end: Callable[[JobRecord, float], None] | None = None
        """Hears each attempt that ends (finished, or released after a preemption)."""
        self.on_start: Callable[[JobRecord, float], None] | None = None
        """Hears each attempt that starts."""
        for rec in self.records.values():
            self.clock.push(rec.trace.submit_time, SUBMIT, rec.trace.id, 1)

    # -- what callers read and change ----------------------------------------------------
    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.cluster.nodes

    @nodes.setter
    def nodes(self, nodes: tuple[Node, ...]) -> None:
        """New nodes from now on (lent build GPUs come and go); ``changed`` asks for a cycle."""
        self.cluster.nodes = nodes

    @property
    def projects(self) -> tuple[Project, ...]:
        return self.cluster.projects

    @property
    def active(self) -> Queues:
        """The jobs pending and running, to read: change them through the simulator."""
        return self.cluster.active

    @property
    def spans(self) -> list | None:
        return self.metrics.spans

    @property
    def stop_at(self) -> float:
        return self.clock.stop_at

    @stop_at.setter
    def stop_at(self, t: float) -> None:
        """End the run at ``t``: a caller's window (``Simulator.at`` users)."""
        self.clock.stop_at = t

    def _util(self, job: TraceJob) -> float | None:
        if self.cfg.activity is None:
            return job.util
        drawn = activity.draw_util(self.cfg.activity, self.rng)  # drawn for every job alike
        return drawn if job.util is None else job.util

    def at(self, t: float, call: Callable[[float], None]) -> None:
        """Call ``call(t)`` at ``t``, before that instant's cycle: a caller's own events (a
        notebook session opening, a culler's round) on the simulation's clock."""
        self.clock.call_at(t, call)

    def add(self, job: TraceJob) -> None:
        """Submit ``job`` at its ``submit_time``, which is now or later: demand that depends
        on what the pool did (the next experiment after the last one's result)."""
        self.records[job.id] = JobRecord(job, job.duration, util=self._util(job))
        self._ranks.add(job.priority)
        self.clock.push(job.submit_time, SUBMIT, job.id, 1)

    def changed(self, t: float) -> None:
        """Ask for a cycle: the caller changed what the policy sees (``nodes``)."""
        self.clock.cycle_after(t)

    def stop(self, t: float, job_id: str) -> None:
        """Preempt a running job now, apart from the policy: what the pool's loop does to a
        job on a lent build GPU that a notebook server takes back (``pool/loop.py``)."""
        job = self.cluster.active.get(job_id)
        if job is not None and job.running and not job.preempting:
            self._preempt(t, job_id, TAKE_BACK)
            self.clock.cycle_after(t)

    # -- the run -------------------------------------------------------------------------
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
        self.metrics.first = self.borrowing.first = end = first
        total, submitted = max(1, len(self.records)), 0
        while (event := self.clock.next()) is not None:
            t, kind, seq, job, attempt = event
            if kind == SUBMIT:
                self._submit(t, job)
                submitted += 1
                if self.on_progress is not None and submitted % 500 == 0:
                    self.on_progress(submitted / total)
            elif kind == FINISH:  # its work is done: it exits 0
                self._attempt_ends(t, job, attempt, SUCCEEDED, 0)
            elif kind == RELEASE:  # still running when its grace ran out: killed
                self._attempt_ends(t, job, attempt, FAILED, KILLED)
            elif kind == CALL:
                self.clock.take_call(seq)(t)
            else:
                assert kind == CYCLE
                self._cycle(t)
            end = max(end, t)
        for project in self.cluster.quota_of:
            self.borrowing.count(project, end)
        ends = [r.finish for r in self.records.values() if r.finish is not None]
        m, c = self.metrics, self.cluster
        return SimRun(self.cfg, c.quotas, self.records, m.decision_s, m.reclaim_s,
                      m.within_quota, first, max(ends, default=end),
                      time.perf_counter() - wall, m.timeline or [], m.guarantee_wait_s,
                      m.borrowed_s, m.wanted_s,
                      {p.name: p.over_quota_weight for p in c.projects}, c.departments,
                      m.spans or [], m.utilized_timeline, m.last_submit,
                      m.gpu_s_to_last_submit, m.moves)

    # -- events ----------------------------------------------------------------------------
    def _submit(self, t: float, job_id: str) -> None:
        rec = self.records[job_id]
        tj = rec.trace
        rec.pending_since = t
        job = TrainJob(job_id, queue_of(self.cfg.policy, tj.project), tj.gpus,
                       user=tj.user, priority=tj.priority, submit_time=tj.submit_time)
        self.metrics.emit(t, "submit", rec)
        project = self.cluster.project.get(job.project)
        never = never_fits(job, project, self.cfg.capacity_gpus * GPU) if project else None
        if never is not None:  # what the policy would say at once; no cycle needed
            rec.unschedulable = str(never)
            return
        self.borrowing.count(job.project, t)
        quiet = self.quiet
        after = self._inert(job, quiet) if quiet is not None and \
            quiet.version == self.cluster.version else None
        self.cluster.submit(job)
        if after is not None:
            self.quiet = after._replace(version=self.cluster.version)
        self.clock.cycle_after(t)

    def _inert(self, job: TrainJob, quiet: Quiet) -> Quiet | None:
        """``quiet`` as the next cycle would leave it with ``job`` pending too, where that
        cycle decides as the quiet last one did without it (``quiet.py`` says when); None
        where it might not. The job cannot start (fewer GPUs free than it asks for) or be
        found never to fit. Where a running job is old enough to be taken back or moved, no
        project's deserved share may move either (its project already wants more than its
        share, or its limit caps what it wants): the policy orders victims by their
        projects' shares. A new job's wait is one of the ages ``_unchanged`` checks."""
        cfg, c = self.policy_config, self.cluster
        if cfg.preemption and (cfg.reclaim_fair_share or cfg.preempt_within_project):
            return None
        p = c.project.get(job.project)
        if p is None or job.gpus <= quiet.spare or c.never_fits(job, p) is not None:
            return None
        no_old = not c.started or c.started[0][0] > job.waiting_since - cfg.min_runtime_s
        if not no_old:
            wants = c.usage[p.name] + c.active.pending_gpus(p.name)
            cap = math.inf if p.limit is None else p.limit
            if quiet.shares_moved or (min(wants + job.gpus, cap) != min(wants, cap) and
                                      quiet.result.deserved.get(p.name, 0) >= min(wants, cap)):
                return None
        else:  # shares no one reads now; the next cycle decided works them out again
            quiet = quiet._replace(shares_moved=True)
        left = quiet.left
        claimed = left.claimed if left is not None else \
            (quiet.result.left.claimed if quiet.result.left is not None else {})
        if job.gpus > p.quota - quiet.result.usage.get(p.name, 0) - claimed.get(p.name, 0):
            return quiet  # a borrower: only a job within quota reclaims
        if not cfg.preemption or c.departments or len(self._ranks) > 1 or \
                not self._one_project_rank or quiet.result.reservation is not None or \
                quiet.result.left is None or \
                (c.queued and c.queued[-1][0] >= job.waiting_since):
            return None
        if left is None:
            left = RoomLeft(quiet.result, c.node_sizes[0] if c.node_sizes else GPU)
            quiet = quiet._replace(left=left)
        if left.claim(p.name, job.gpus):  # GPUs being released hold it: preempts no one
            return quiet._replace(spare=max(sum(left.free.values()), c.free[True])) \
                .waiting(job.id)
        if no_old:  # no job to take back or move, whatever its size
            return quiet.waiting(job.id)
        return None

    def _attempt_ends(self, t: float, job_id: str, attempt: int, ended: str,
                      exit_code: int) -> None:
        """The attempt ended as ``ended`` with ``exit_code``: the job ends or is requeued,
        as ``policy.outcome.after_attempt`` says, the service's own rule."""
        rec = self.records[job_id]
        job = self.cluster.active.get(job_id)
        if job is None or rec.attempt != attempt or not job.running:
            return  # a stale event of an attempt that was preempted
        self.borrowing.count(job.project, t)
        outcome = after_attempt(ended, exit_code, stopping=job.preempting)
        ran = self.metrics.attempt_ended(rec, job.placement, t)
        if outcome in REQUEUED:
            self._requeue(t, rec, job, ran)
        else:
            rec.finished_while_preempted = job.preempting  # its work ended within the grace
            rec.finish = t
            rec.remaining = 0.0
            self.cluster.end(job_id)
            self.metrics.emit(t, "finish", rec)
        self.clock.cycle_after(t)
        if self.on_end is not None:
            self.on_end(rec, t)

    def _requeue(self, t: float, rec: JobRecord, job: TrainJob, ran: float) -> None:
        """Our stop ended the attempt: the job waits again, with the work its last checkpoint
        saved."""
        interval = self.cfg.checkpoint_interval_s
        saved = math.floor((ran - self.cfg.grace_s) / interval) * interval if interval > 0 else 0.0
        saved = max(0.0, min(saved, rec.remaining))
        rec.lost_gpu_s += rec.trace.gpus / GPU * (ran - saved)
        rec.remaining -= saved
        rec.attempt += 1
        rec.attempt_start = None
        rec.pending_since = t
        self.cluster.requeue(job, t, rec.attempt)

    def snapshot(self, t: float) -> Snapshot:
        """What the policy sees at ``t``: the queues kept up to date between cycles, and with
        fair share over time, each project's decayed borrowing."""
        return self.cluster.snapshot(t, self.borrowing.past_use(t))

    def decide(self, snap: Snapshot) -> CycleResult:
        """The policy's decisions on one snapshot: the one place the simulator asks the
        policy, so that a subclass can run another implementation of it on the same events
        (tests/test_policy_equality.py, benchmarks/reclaim_burst.py)."""
        return cycle(snap, self.policy_config)

    def _unchanged(self, t: float, snap: Snapshot) -> CycleResult | None:
        """The last cycle's decisions, where this cycle would decide the same: the last one
        changed nothing, nothing changed since but jobs submitted that ``_inert`` found
        could change nothing, and the policy's clock passed no age it reads. A job's run
        time counts only for reclaim, which only a job within its project's quota asks for
        (``within_quota_waiting``) but with fair-share reclaim or preemption within a
        project; a pending job's wait counts for reservations. The cycle still runs, as late
        as before (the next one's ``cycle_interval_s`` counts from it), on these decisions."""
        quiet, cfg = self.quiet, self.policy_config
        if quiet is None or quiet.version != self.cluster.version or \
                quiet.past_use != snap.past_use:
            return None
        may_reclaim = cfg.preemption and (bool(quiet.result.within_quota_waiting) or
                                          cfg.reclaim_fair_share or cfg.preempt_within_project)
        if self.cluster.ages_cross(quiet.t, t, cfg.min_runtime_s if may_reclaim else None,
                                   cfg.reserve_after_s if cfg.reservations else None):
            return None
        return quiet.result

    def _cycle(self, t: float) -> None:
        self.clock.cycle_runs(t)
        snap = self.snapshot(t)
        result = self._unchanged(t, snap)
        kept = self.quiet if result is not None else None  # and what inert jobs claimed since
        if result is None:
            tick = time.perf_counter()
            result = self.decide(snap)
            self.metrics.decision_s.append(time.perf_counter() - tick)
        version = self.cluster.version
        self._apply(t, result)
        self.quiet = None
        if self.cluster.version == version:
            c = self.cluster
            spare = max(c.free[False] - sum(result.held.values()), c.free[True])
            self.quiet = kept._replace(t=t) if kept is not None else \
                Quiet(t, version, snap.past_use, result, spare)
        if self.metrics.timeline is not None:
            self.metrics.point(t, self.cluster.active.view())

    def _apply(self, t: float, result: CycleResult) -> None:
        """Act on one cycle's decisions."""
        c = self.cluster
        for p in result.preemptions:
            self._preempt(t, p.job, p.kind)
            if not p.for_job:  # lent GPUs taken back for the build pool: no claimant
                continue
            if p.kind in (Reclaim.GUARANTEE, Reclaim.MOVE) and \
                    self.records[p.for_job].claim_since is None:
                self.metrics.claimed(t, p.for_job, c.active.get(p.for_job).project)
        for s in result.starts:
            self._start(t, s.job, s.placement)
        for job_id in result.within_quota_waiting:
            rec = self.records[job_id]
            project = c.active.get(job_id).project
            # Still within quota after the cycle's starts (a later job of its project may
            # have taken the room: then the project got what it was owed, guarantee_met).
            if rec.want_since is None and \
                    c.usage[project] + rec.trace.gpus <= c.quota_of[project]:
                self.metrics.waits_within_quota(t, job_id, project)
        for w in result.unschedulable:  # can never run as asked
            self.records[w.job].unschedulable = str(w.reason)
            self.borrowing.count(c.active.get(w.job).project, t)
            c.remove(w.job)
        reservation = result.reservation
        c.reserve(reservation.job if reservation else None,
                  reservation.reserved if reservation else ())
        wait = self.policy_config.min_runtime_s
        if wait > 0:  # a young job becomes preemptible with no event to say so
            young = c.first_young(t, wait)
            if young is not None and c.pending:
                self.clock.cycle_after(young + wait)

    def _start(self, t: float, job_id: str, placement) -> None:
        rec = self.records[job_id]
        job = self.cluster.active.get(job_id)
        self.borrowing.count(job.project, t)
        rec.queued_s += t - rec.pending_since
        rec.attempt_start = t
        self.cluster.start(job_id, t, placement)
        self.metrics.guarantee_met(t, job.project, job_id, self.cluster.quota_of[job.project]
                                   - self.cluster.usage[job.project])
        self.clock.push(t + rec.remaining, FINISH, job_id, rec.attempt)
        if self.on_start is not None:
            self.on_start(rec, t)
        if self.cfg.idle_first and rec.util is not None and rec.util < activity.IDLE_THRESHOLD:
            self.at(t + activity.IDLE_JOB_AFTER_S, lambda now, a=rec.attempt:
                    self.cluster.flag_idle(job_id, a))
        self.metrics.emit(t, "start", rec, attempt=rec.attempt,
                          placement={n: m // GPU for n, m in sorted(placement.items())})

    def _preempt(self, t: float, job_id: str, kind: str) -> None:
        """``kind``: the rule that stopped it (``Preempt.kind``: a ``Reclaim`` rule, or a
        take-back of lent build GPUs), written with its event."""
        rec = self.records[job_id]
        job = self.cluster.active.get(job_id)
        self.borrowing.count(job.project, t)
        lent = on_lent(job.placement)
        # Counted here, apart from the policy: the guarantee says a job within quota is only
        # ever stopped by a move.
        self.metrics.preempted(rec, t, kind, lent,
                               not lent and self.cluster.within_quota(job.project))
        self.cluster.stop(job_id)
        # A job whose work ends within the grace period finishes (its FINISH event comes
        # first); only one still running when the grace ends is released and requeued.
        if rec.attempt_start + rec.remaining > t + self.cfg.grace_s:
            self.clock.push(t + self.cfg.grace_s, RELEASE, job_id, rec.attempt)
        self.metrics.emit(t, "preempt", rec, attempt=rec.attempt,
                          kind=getattr(kind, "value", kind))
