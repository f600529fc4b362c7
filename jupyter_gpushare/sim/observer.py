"""What a simulation measures as it goes: the figures ``SimRun`` carries and ``metrics.py``
sums up, and the events log. It watches; it decides nothing and changes nothing the policy
sees (the per-job figures live on each ``JobRecord``, which it adds to).
"""

from __future__ import annotations

import json
from typing import IO

from ..policy.model import GPU
from ..policy.preemption import Reclaim
from ..policy.queues import QueueView
from . import activity
from .records import JobRecord

WEEK_S = 7 * 86400.0


class MetricsObserver:
    def __init__(self, records: dict[str, JobRecord], events: IO[str] | None = None,
                 timeline: bool = False, spans: bool = False):
        self.records = records
        self.out = events
        self.first = 0.0  # the first submit: week 0 starts here
        self.last_submit = max((r.trace.submit_time for r in records.values()), default=0.0)
        self.gpu_s_to_last_submit = 0.0  # allocated GPU-seconds before the last submit
        self.decision_s: list[float] = []
        self.reclaim_s: list[float] = []
        self.guarantee_wait_s: list[float] = []
        self.within_quota = 0
        self.moves = 0
        self.claimants: dict[str, set[str]] = {}  # project → jobs it reclaimed GPUs for
        self.wanting: dict[str, set[str]] = {}  # project → its jobs waiting within quota
        self.timeline: list | None = [] if timeline else None
        self.utilized_timeline: list[float] = []  # milli-GPUs utilized at each timeline point
        self.borrowed_s: dict[int, dict[str, float]] = {}
        self.wanted_s: dict[int, dict[str, float]] = {}
        self.spans: list | None = [] if spans else None

    def emit(self, t: float, event: str, rec: JobRecord, **extra) -> None:
        if self.out is not None:
            line = {"t": t, "event": event, "job": rec.trace.id, "project": rec.trace.project,
                    "gpus": rec.trace.gpus // GPU, **extra}
            self.out.write(json.dumps(line) + "\n")

    def attempt_ended(self, rec: JobRecord, placement, t: float) -> float:
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
                               tuple(placement)))
        return ran

    def preempted(self, rec: JobRecord, t: float, kind: str, lent: bool,
                  within_quota: bool) -> None:
        """``within_quota``: its project held no more than its quota before the stop, which
        the guarantee says never happens but by a move (``moves``)."""
        if not lent:  # a job on lent GPUs is within no quota
            if kind == Reclaim.MOVE:
                self.moves += 1
            elif within_quota:
                self.within_quota += 1
        rec.preemptions += 1
        rec.young_preemptions += t - rec.attempt_start < 60

    def claimed(self, t: float, job_id: str, project: str) -> None:
        """GPUs were reclaimed (or moved) for ``job_id``'s guarantee: its wait is timed from
        the first time."""
        rec = self.records[job_id]
        if rec.claim_since is None:
            rec.claim_since = t
            self.claimants.setdefault(project, set()).add(job_id)

    def waits_within_quota(self, t: float, job_id: str, project: str) -> None:
        rec = self.records[job_id]
        if rec.want_since is None:
            rec.want_since = t
            self.wanting.setdefault(project, set()).add(job_id)

    def guarantee_met(self, t: float, project: str, started: str, room: int) -> None:
        """A guarantee reclaim, or a wait within quota, is done when its job starts, or when
        the project's other jobs that started meanwhile leave too little of its quota
        (``room``) for it: the project got what it was owed, and the job, were it to start
        now, would borrow."""
        for jobs, since, times in ((self.wanting, "want_since", self.guarantee_wait_s),
                                   (self.claimants, "claim_since", self.reclaim_s)):
            for job_id in list(jobs.get(project) or ()):
                rec = self.records[job_id]
                if job_id == started or rec.trace.gpus > room:
                    times.append(t - getattr(rec, since))
                    setattr(rec, since, None)
                    jobs[project].discard(job_id)

    def borrowing(self, project: str, since: float, t: float, want: int, beyond: int) -> None:
        """``project`` wanted ``want`` milli-GPUs beyond its quota from ``since`` to ``t``
        (had all its pending jobs run) and held ``beyond`` of them: split at the weeks'
        ends."""
        week = int((since - self.first) // WEEK_S)
        while since < t:  # the index, not the float, moves on
            upto = min(t, self.first + (week + 1) * WEEK_S)
            if upto > since:
                wanted = self.wanted_s.setdefault(week, {})
                wanted[project] = wanted.get(project, 0.0) + want / GPU * (upto - since)
                if beyond:
                    borrowed = self.borrowed_s.setdefault(week, {})
                    borrowed[project] = borrowed.get(project, 0.0) + beyond / GPU * (upto - since)
                since = upto
            week += 1

    def point(self, t: float, view: QueueView) -> None:
        """A timeline point after the cycle at ``t``, when a timeline is kept."""
        alloc: dict[str, int] = {}
        for j in view.running:
            proj = self.records[j.id].trace.project
            alloc[proj] = alloc.get(proj, 0) + j.gpus
        self.timeline.append((t, alloc, sum(len(q) for q in view.pending.values())))
        self.utilized_timeline.append(
            sum(j.gpus * (self.records[j.id].util or 0.0) for j in view.running))
