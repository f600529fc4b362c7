"""What each project borrowed (GPUs held beyond its quota) and wanted to borrow, counted
each time what it holds or queues is about to change.

Borrowing feeds fair share over time, when it is on, through ``policy.past_use.account``,
the function the service's loop counts it with too; both, borrowed and wanted, go to the
run's weekly figures (``MetricsObserver.borrowing``).
"""

from __future__ import annotations

from ..policy.past_use import FairShareTime, PastUse, account
from .cluster import ClusterState
from .observer import MetricsObserver


class Borrowing:
    def __init__(self, cluster: ClusterState, metrics: MetricsObserver,
                 fair_share: FairShareTime | None):
        self.cluster, self.metrics = cluster, metrics
        self.past = PastUse(fair_share) if fair_share else None
        self.counted: dict[str, float] = {}  # project → the time it is counted to
        self.first = 0.0  # counted from here: the run's first submit
        self.last_forgot = 0.0

    def count(self, project: str, t: float) -> None:
        """Count what ``project`` borrowed and wanted since it last changed: called before
        each change to what it holds or queues, and at each cycle with fair share over
        time."""
        since = self.counted.get(project, self.first)
        self.counted[project] = t
        if t <= since:
            return
        c = self.cluster
        quota = c.quota_of.get(project, 0)
        held = c.usage.get(project, 0)
        want = held + c.active.pending_gpus(project) - quota
        if want <= 0:
            return
        if self.past is not None:
            account(self.past, {project: held}, c.quota_of, since, t)
        self.metrics.borrowing(project, since, t, want, max(0, held - quota))

    def past_use(self, t: float) -> dict[str, float]:
        """Each project's decayed borrowed GPU-seconds at ``t``, all counted to ``t`` first;
        empty with fair share over time off."""
        if self.past is None:
            return {}
        for project in self.cluster.quota_of:
            self.count(project, t)
        if self.past.clock.bucket(self.last_forgot) != self.past.clock.bucket(t):
            self.past.forget_before(t)
            self.last_forgot = t
        return self.past.decayed(t)
