"""Departments over projects (issue 22, part 1), in the pure policy: sibling projects borrow
a project's idle quota first and give it back first; a department's limit caps its projects
together; its quota holds theirs. The two-level properties of the whole contract are in
test_policy_properties.py (``quota_trees``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from builders import (cluster, finish, milli, pending, project, reason_of, running, started,
                      step)
from jupyter_gpushare.policy import Department, PolicyConfig, deserved_shares
from jupyter_gpushare.policy import reasons as R
from jupyter_gpushare.policy.departments import guaranteed, two_levels
from jupyter_gpushare.policy.quotas import overbooking


def research(quota=8, limit=None, weight=1):
    return Department("research", milli(quota), weight, None if limit is None else milli(limit))


def two_departments(*jobs, limit=None):
    """16 GPUs on two nodes; alice and bob (4 each) in research (8), carol (4) alone in ops (4)."""
    return (cluster(nodes=2, gpus_per_node=8)
            .departments(research(limit=limit), Department("ops", milli(4)))
            .projects(project("alice").quota(4).department("research"),
                      project("bob").quota(4).department("research"),
                      project("carol").quota(4).department("ops"))
            .jobs(*jobs))


def test_a_projects_idle_quota_goes_to_its_sibling_before_another_department():
    shares = deserved_shares(
        [project("alice").quota(4).department("research").build(),
         project("bob").quota(4).department("research").build(),
         project("carol").quota(4).department("ops").build()],
        {"alice": 0, "bob": milli(12), "carol": milli(12)}, milli(16),
        departments=[research(), Department("ops", milli(4))])
    # research keeps its 8 (alice's idle 4 go to bob), and the 4 no quota holds are split.
    assert shares == {"alice": 0, "bob": milli(10), "carol": milli(6)}
    flat = deserved_shares([project(n).quota(4).build() for n in ("alice", "bob", "carol")],
                           {"alice": 0, "bob": milli(12), "carol": milli(12)}, milli(16))
    assert flat == {"alice": 0, "bob": milli(8), "carol": milli(8)}  # one level: split evenly


def test_a_departments_weight_splits_what_no_quota_holds_before_its_projects_do():
    shares = deserved_shares(
        [project("alice").quota(2).department("research").build(),
         project("bob").quota(2).department("research").build(),
         project("carol").quota(4).build()],
        {"alice": milli(20), "bob": milli(20), "carol": milli(20)}, milli(16),
        departments=[research(quota=4, weight=3)])
    # 8 left after quotas: research gets 6 (weight 3 against carol's 1), halved between its two.
    assert shares == {"alice": milli(5), "bob": milli(5), "carol": milli(6)}


def test_the_sibling_borrows_first_when_idle_gpus_are_scarce():
    snap = two_departments(running("c0", "carol", 8, since=0, node="n0"),
                           running("b0", "bob", 4, since=0, node="n1"),
                           pending("c1", "carol", 4, submitted=10),
                           pending("b1", "bob", 4, submitted=20)).at(30)
    result, _ = step(snap)
    # carol asked first, but bob's department has alice's idle quota to lend.
    assert set(started(result)) == {"b1"}
    assert isinstance(reason_of(result, "c1"), R.NoIdleGpus)


def test_a_claimant_takes_its_siblings_borrowers_first():
    # bob borrows alice's idle quota on n0; carol borrows beyond hers on n1. Each is over its
    # quota by 4 on a full node; alice's claim takes bob's job though carol's is newer.
    snap = two_departments(running("b0", "bob", 4, since=0, node="n0"),
                           running("b1", "bob", 4, since=10, node="n0"),
                           running("c0", "carol", 4, since=0, node="n1"),
                           running("c1", "carol", 4, since=50, node="n1"),
                           pending("a1", "alice", 4, submitted=100)).at(100)
    result, _ = step(snap)
    assert [(p.job, p.kind) for p in result.preemptions] == [("b1", "guarantee")]
    flat = (cluster(nodes=2, gpus_per_node=8)
            .projects(*(project(n).quota(4) for n in ("alice", "bob", "carol")))
            .jobs(*snap.jobs).at(100))
    assert [p.job for p in step(flat)[0].preemptions] == ["c1"]  # one level: the newest


def test_a_department_limit_caps_its_projects_together():
    snap = two_departments(running("a0", "alice", 4, since=0, node="n0"),
                           running("b0", "bob", 4, since=0, node="n0"),
                           pending("b1", "bob", 2, submitted=10), limit=9).at(20)
    result, _ = step(snap)
    assert set(started(result)) == set()
    reason = reason_of(result, "b1")
    assert reason == R.AtLimit("bob", milli(9), milli(8), "research")
    assert str(reason) == ("department research (of project bob) is at its limit of 9 GPUs "
                           "(8 GPUs in use by its projects)")


def test_a_job_larger_than_its_departments_limit_is_told_it_never_runs():
    snap = two_departments(pending("b1", "bob", 12, submitted=10), limit=10).at(20)
    result, _ = step(snap)
    wait = next(w for w in result.waits if w.job == "b1")
    assert wait.position is None
    assert str(wait.reason) == ("the job asks for 12 GPUs but department research (of project "
                                "bob) may never use more than 10 GPUs; ask for fewer GPUs")


def test_within_quota_a_job_takes_its_siblings_borrowers_back_under_the_limit():
    # research may hold 8 together: bob borrows alice's idle 4 on n0; n1 is free. alice's
    # job would start on free GPUs, but the limit makes bob give back first.
    snap = two_departments(running("b0", "bob", 4, since=0, node="n0"),
                           running("b1", "bob", 2, since=0, node="n0"),
                           running("b2", "bob", 2, since=5, node="n0"),
                           pending("a1", "alice", 3, submitted=100), limit=8).at(100)
    result, after = step(snap)
    assert started(result) == {"a1": {"n1": 3}}
    assert [p.job for p in result.preemptions] == ["b2", "b1"]  # newest first, no more than needed
    # bob's requeued jobs wait at the limit; alice's quota is kept.
    result, _ = step(after)
    assert not result.preemptions and not result.starts
    assert all(isinstance(w.reason, R.AtLimit) for w in result.waits)


def test_within_quota_at_the_limit_waits_for_young_siblings():
    snap = two_departments(running("b0", "bob", 8, since=95, node="n0"),
                           pending("a1", "alice", 4, submitted=100), limit=8).at(100)
    config = PolicyConfig(min_runtime_s=30)
    result, _ = step(snap, config)
    assert not result.starts and not result.preemptions
    assert isinstance(reason_of(result, "a1"), R.AtLimit)
    result, _ = step(replace(snap, now=130.0), config)  # bob's job is old enough now
    assert [p.job for p in result.preemptions] == ["b0"] and "a1" in started(result)


@pytest.mark.parametrize("departments, projects, problem", [
    ([research()], [project("bob").quota(2).department("physics")],
     "project bob names department physics, which does not exist; create the department "
     "first or name another"),
    ([research(quota=4)], [project("alice").quota(3).department("research"),
                           project("bob").quota(2).department("research")],
     "the quotas of department research's projects add up to 5 GPUs, more than its quota of "
     "4 GPUs; raise the department's quota or lower its projects'"),
    ([research(), research()], [], "department research is given twice; give each "
     "department once"),
])
def test_two_levels_that_do_not_hold_are_refused_in_one_sentence(departments, projects, problem):
    projects = [p.build() for p in projects]
    assert two_levels(projects, departments) == problem
    with pytest.raises(ValueError, match="^" + problem.replace("(", r"\(").replace(")", r"\)")):
        cluster().departments(*departments).projects(*projects).at(0)


def test_a_departments_quota_counts_once_against_the_pool():
    projects = [project("alice").quota(4).department("research").build(),
                project("carol").quota(6).build()]
    assert guaranteed(projects, [research(quota=8)]) == [milli(8), milli(6)]
    assert overbooking(guaranteed(projects, [research(quota=8)]), milli(16)) is None
    assert "add up to 18 GPUs" in overbooking(guaranteed(projects, [research(quota=12)]), milli(16))
    with pytest.raises(ValueError, match="limit .* is below its quota"):
        Department("research", milli(8), 1, milli(4))


def test_what_a_department_holds_beyond_its_projects_quotas_is_a_first_claim_not_reclaimed():
    # research holds 8 but its projects' quotas only 2 each: 4 GPUs no project's quota holds,
    # which carol (ops) borrowed while research was idle. bob, beyond his own quota, waits
    # for idle GPUs as a borrower: nothing is preempted for him (docs: known limits)...
    snap = (cluster(nodes=2, gpus_per_node=8)
            .departments(research(), Department("ops", milli(4)))
            .projects(project("alice").quota(2).department("research"),
                      project("bob").quota(2).department("research"),
                      project("carol").quota(4).department("ops"))
            .jobs(running("a0", "alice", 2, since=0, node="n0"),
                  running("b0", "bob", 2, since=0, node="n0"),
                  running("c0", "carol", 4, since=0, node="n1"),
                  running("c1", "carol", 4, since=10, node="n1"),
                  running("c2", "carol", 4, since=20, node="n0"),
                  pending("b2", "bob", 4, submitted=100))).at(100)
    result, after = step(snap)
    assert result.preemptions == () and isinstance(reason_of(result, "b2"), R.NoIdleGpus)
    # ... but it is research's first: once carol's c2 ends, bob gets the GPUs before carol's
    # next job, though carol asked first.
    after = finish(after, "c2")
    after = replace(after, jobs=after.jobs + (pending("c3", "carol", 4, submitted=50).build(),))
    result, _ = step(after)
    assert set(started(result)) == {"b2"}


def test_at_its_limit_a_job_within_quota_claims_room_and_its_siblings_give_back():
    # research may hold 8 together; bob borrows alice's idle quota on n0 and n1 is carol's:
    # no free GPU. alice's job needs both its room (a victim on a node it fits on) and the
    # limit (bob's GPUs): carol's job on n1 is no help for the limit, bob's on n0 is both.
    snap = two_departments(running("b0", "bob", 4, since=0, node="n0"),
                           running("b1", "bob", 4, since=5, node="n0"),
                           running("c0", "carol", 8, since=0, node="n1"),
                           pending("a1", "alice", 4, submitted=100), limit=8).at(100)
    result, _ = step(snap)
    assert [(p.job, p.kind) for p in result.preemptions] == [("b1", "guarantee")]
    assert isinstance(reason_of(result, "a1"), R.Reclaiming)
