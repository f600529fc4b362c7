"""The cycle's steps one at a time: the fit memo, the two orders of step 3, the reclaim
rules (the collector held off in every step's module: test_policy_scenarios)."""

from __future__ import annotations

import pytest
from builders import GPU, cluster, pending, project

from jupyter_gpushare.policy import Preempt, Project
from jupyter_gpushare.policy.fits import NEVER, FitMemo, Way
from jupyter_gpushare.policy.ledger import Ledger
from jupyter_gpushare.policy.order import Order
from jupyter_gpushare.policy.preemption import Reclaim
from jupyter_gpushare.policy.queues import Queues


# -- fits.py --------------------------------------------------------------------------------

def test_the_memo_says_a_gang_as_large_as_one_that_failed_fails():
    memo = FitMemo()
    assert memo.smallest(Way.BORROWING, False, 1) == NEVER
    memo.failed(Way.BORROWING, False, 1, 4 * GPU)
    assert memo.fails(Way.BORROWING, False, 1, 4 * GPU)
    assert memo.fails(Way.BORROWING, False, 1, 6 * GPU)
    assert not memo.fails(Way.BORROWING, False, 1, 2 * GPU)


@pytest.mark.parametrize("way, excluded, nodes", [
    (Way.WITHIN_QUOTA, False, 1),  # another way
    (Way.UNRESERVED, False, 1),
    (Reclaim.FAIR, False, 1),  # a reclaim rule
    (Way.BORROWING, True, 1),  # kept out of reserved nodes
    (Way.BORROWING, False, 2),  # on more nodes
])
def test_the_memo_keeps_failures_apart(way, excluded, nodes):
    memo = FitMemo()
    memo.failed(Way.BORROWING, False, 1, 1 * GPU)
    assert not memo.fails(way, excluded, nodes, 8 * GPU)


def test_ways_and_reclaim_rules_never_share_a_memo_key():
    assert not {w.value for w in Way} & {r.value for r in Reclaim}


# -- order.py -------------------------------------------------------------------------------

def _order(snap):
    view = Queues(snap.jobs).view()
    projects = {p.name: p for p in snap.projects}
    ledger = Ledger(dict.fromkeys(projects, 0), projects)
    deserved = {name: p.quota for name, p in projects.items()}
    return Order(view.pending, view.smallest, projects, deserved, ledger), ledger


def test_within_quota_goes_by_project_priority_then_submit_time_and_reads_the_room_as_it_goes():
    snap = (cluster(nodes=2)
            .projects(project("a").quota(4), project("b").quota(4).priority(1))
            .jobs(pending("a1", "a", 2, submitted=1), pending("a2", "a", 2, submitted=2),
                  pending("a3", "a", 2, submitted=3), pending("b1", "b", 4, submitted=5),
                  pending("b2", "b", 1, submitted=6))
            .at(10))
    order, ledger = _order(snap)
    seen = []
    for job in order.within_quota():
        seen.append(job.id)
        if job.id == "a1":  # admitted: a's room shrinks before a2 is asked for
            ledger.usage["a"] += 3 * GPU
    # b first (its priority; b1 was not admitted here, so b2 still fits); then a1 takes 3 of
    # a's 4 GPUs, and a2 and a3 no longer keep a within its quota.
    assert seen == ["b1", "b2", "a1"]
    assert order.seen == {"b1", "b2", "a1"}


def test_borrowers_go_by_fair_share_and_parked_projects_are_explained_in_order():
    snap = (cluster(nodes=2)
            .projects(project("a").quota(1), project("b").quota(1), project("c").quota(1))
            .jobs(*(pending(f"{p}{i}", p, 1, submitted=i) for p in "abc" for i in range(2)))
            .at(10))
    order, ledger = _order(snap)
    ledger.usage["a"] = 2 * GPU  # a is furthest beyond its share: last
    turn = order.borrowers()
    visited = []
    for name, i in turn:
        visited.append(order.queues[name][i].id)
        if name == "c":
            turn.park()
        else:
            turn.go_on(name, i + 1)
    assert visited == ["b0", "b1", "c0", "a0", "a1"]
    assert [job.id for job in turn.unvisited()] == ["c0", "c1"]


# -- preemption.py --------------------------------------------------------------------------

def test_a_reclaim_rule_is_the_kind_a_preemption_reports():
    assert [r.value for r in Reclaim] == ["guarantee", "fair", "priority", "move"]
    assert Preempt("j", "p", "c", "why").kind == Reclaim.GUARANTEE.value


def test_reclaim_rules_set_their_floors():
    projects = {"p": Project("p", quota=4 * GPU)}
    deserved = {"p": 6 * GPU}
    guarantee = Reclaim.GUARANTEE.floor(projects, deserved)
    fair = Reclaim.FAIR.floor(projects, deserved)
    priority = Reclaim.PRIORITY.floor(projects, deserved)
    assert (guarantee.above("p"), guarantee.keep("p"), guarantee.prefer("p")) == (4000, 0, 4000)
    assert (fair.above("p"), fair.keep("p"), fair.prefer("p")) == (6000, 6000, 6000)
    assert (priority.above("p"), priority.keep("p"), priority.prefer("p")) == (-1, 0, 4000)


# -- every step ------------------------------------------------------------------------------
