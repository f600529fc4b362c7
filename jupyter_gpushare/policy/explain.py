"""Step 6, explain: every waiting job's queue position and reason (words in reasons.py).

Worked out the first time a caller reads ``CycleResult.waits``, after the cycle's decisions:
it sees the state they left and changes nothing but reasons.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

from . import reasons as R
from .cache import Cluster
from .decisions import Wait
from .fits import FitMemo, Way
from .ledger import Ledger
from .model import PolicyConfig, Project, TrainJob
from .placement import nodes_needed
from .preemption import Reclaimer
from .reservation import Reservation


class Explainer:
    def __init__(self, config: PolicyConfig, cluster: Cluster, projects: Mapping[str, Project],
                 ledger: Ledger, memo: FitMemo, reclaimer: Reclaimer, reservation: Reservation):
        self.config, self.c, self.projects, self.ledger = config, cluster, projects, ledger
        self.memo, self.reclaimer, self.reservation = memo, reclaimer, reservation

    def why_no_room(self, job: TrainJob, exclude: frozenset) -> R.Reason:
        """Why a job that may have GPUs waits for them (also asked while admitting)."""
        k = nodes_needed(job.gpus, self.c.node_size)
        p = self.projects[job.project]
        if exclude and not self.memo.fails(Way.UNRESERVED, False, k, job.gpus):
            if self.ledger.free.fit(job.gpus) is not None:
                return R.BehindReservation(job.gpus, k, self.reservation.holder)
            self.memo.failed(Way.UNRESERVED, False, k, job.gpus)
        if not self.ledger.within_quota(p.name, job.gpus):
            return R.NoIdleGpus(p.name, p.quota, self.ledger.committed(p.name), job.gpus, k)
        if self.reclaimer.too_young:
            return R.MinRuntime(job.gpus, k, self.config.min_runtime_s)
        return R.Fragmented(job.gpus, k, self.ledger.free.total())

    def waits(self, decided: Iterable[tuple[TrainJob, R.Reason | None]], never: Iterable[Wait],
              unvisited: Iterable[TrainJob], reservation: Wait | None,
              never_fits: Callable[[TrainJob], R.Reason | None]) -> tuple[Wait, ...]:
        """Every waiting job in queue order, with its reason: first those the cycle visited
        (``decided``; a reason of None is worked out here), then the ``unvisited``."""
        entries = []
        for job, reason in decided:
            if job is None:  # admission.BehindClaim: a project's jobs behind its claim
                entries.extend(reason.waits(self.c.node_size))
            else:
                entries.append((job, reason))
        never = list(never)
        entries.extend((job, None) for job in unvisited)
        waits = []
        position = 0
        for job, reason in entries:
            if reason is None:
                reason = self._borrower_reason(job, never_fits)
                if isinstance(reason, R.TooLarge):
                    never.append(Wait(job.id, None, reason))
                    continue
            position += 1
            if reservation is not None and job.id == reservation.job:
                if not isinstance(reason, (R.Reclaiming, R.Releasing)):
                    reason = reservation.reason
                waits.append(Wait(job.id, position, reason, reservation.reserved))
            else:
                waits.append(Wait(job.id, position, reason))
        return tuple(waits) + tuple(never)

    def _borrower_reason(self, job: TrainJob, never_fits) -> R.Reason:
        p = self.projects[job.project]
        never = never_fits(job)
        if never is not None:
            return never
        at_limit = self.ledger.beyond_limit(p.name, job.gpus)
        if at_limit is not None:
            return at_limit
        return self.why_no_room(job, self.reservation.kept_out(job))
