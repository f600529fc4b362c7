"""One scheduling cycle: an immutable snapshot in, decisions out. No I/O, no clock.

The pipeline:
  1. cache    what runs: free and releasing GPUs, usage per project       (cache.py)
  2. shares   each project's deserved share, by weights the decayed past use scales
              when fair share over time is on, top-down over departments
                                               (shares.py, past_use.py, departments.py)
  3. order    requests that keep their project within quota first, by project priority
              and the time a job queues from, its submit or its requeue (a job's priority
              orders its own project's queue only); then
              borrowers: those that stay within their project's deserved share first, then
              by priority, the project furthest below its deserved share first   (order.py)
  4. admit    place on free GPUs (placement.py), a borrower on lent build GPUs last
              (lending.py, which also takes back what the build pool needs); else
              reclaim (preemption.py, the victims from victims.py); else wait
              (admission.py). Once no GPU is left to give, the rest of the queue is not
              visited. Every start, hold, eviction and claim is booked by the one owner
              of the cycle's changes, which also keeps what each project holds and the
              rules that read it: ledger.py; gangs that already failed to fit: fits.py
  5. reserve  keep nodes for the job that has waited longest, so no stream of small jobs
              starves a large gang                                         (reservation.py)
  6. explain  queue positions and reasons in words (explain.py, reasons.py), made when
              first read
"""

from __future__ import annotations

import gc
from contextlib import contextmanager

from .admission import Admission, never_fits
from .cache import Cluster
from .decisions import CycleResult, Left, Preempt, Start, Wait
from .explain import Explainer
from .fits import FitMemo
from .ledger import Ledger
from .model import PolicyConfig, Snapshot
from .order import Order
from .preemption import Reclaimer
from .queues import Queues
from .reservation import Reservation
from .shares import deserved_shares

__all__ = ["CycleResult", "Preempt", "Start", "Wait", "cycle", "never_fits"]


def cycle(snapshot: Snapshot, config: PolicyConfig = PolicyConfig()) -> CycleResult:
    with _collector_held_off():
        view = (snapshot.queues or Queues(snapshot.jobs)).view()
        cluster = Cluster.from_snapshot(snapshot, view)                                  # 1
        demand = dict(cluster.usage)
        for project, gpus in view.demand.items():
            demand[project] += gpus
        projects = cluster.projects
        deserved = deserved_shares(projects.values(), demand, cluster.capacity,         # 2
                                   snapshot.past_use, snapshot.departments)

        ledger = Ledger.of(cluster, deserved)
        order = Order(view.pending, view.smallest, projects, ledger)                     # 3
        reservation = Reservation(snapshot, config, cluster, view.pending, ledger, view.holder)
        memo = FitMemo()
        reclaimer = Reclaimer(snapshot.now, config, cluster, projects, deserved, ledger, memo)
        explainer = Explainer(config, cluster, projects, ledger, memo, reclaimer, reservation)
        node_sizes = tuple(sorted((n.milli for n in snapshot.train_nodes() if not n.lent),
                                  reverse=True))
        taken_back = cluster.lending.take_back(view.running) if cluster.lending else []
        admission = Admission(config, cluster, node_sizes, projects, ledger, order, memo,
                              reclaimer, reservation, explainer, view.sizes,
                              view.positions)
        admission.within_quota(order.within_quota())                                     # 4
        borrowers = order.borrowers()
        admission.borrowers(borrowers)

        reserved = reservation.reserve(admission.done, ledger.held, order.global_key,    # 5
                                       admission.waits_for_nodes)
        return CycleResult(
            tuple(ledger.starts), (*taken_back, *ledger.preemptions), deserved, ledger.usage,
            ledger.held, reserved, tuple(admission.never),
            lambda: explainer.waits(admission.waits, admission.never, borrowers.unvisited(),  # 6
                                    reserved, admission.never_fits),
            tuple(admission.within_quota_waiting),
            Left(ledger.free.free, ledger.releasing, ledger.claimed))


@contextmanager
def _collector_held_off():
    """Hold Python's cyclic garbage collector off while a cycle decides.

    A cycle allocates many short-lived objects, which reference counting frees. A full
    collection they trigger midway walks the whole heap: 50–120 ms with 20,000 jobs
    (benchmarks/reclaim_burst.py), longer than most cycles. Held off, the collector runs
    after the decisions are out, and has less to do, since the cycle's garbage is gone.
    """
    if not gc.isenabled():  # held off by the caller (or by a cycle in another thread)
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
