"""Scenarios of the scheduling contract (docs/explanation/scheduling.md, points 1–8), one table
per rule."""

from __future__ import annotations

import gc
import sys
from dataclasses import replace

import pytest

from builders import (GPU, cluster, finish, job, job_of, milli, pending, preempted, project,
                      reason_of, running, started, step, submit, wait_of)
from jupyter_gpushare.policy import (BUILD, Node, PolicyConfig, Slice, SliceRefused, cycle,
                                     deserved_shares, place_slice)
from jupyter_gpushare.policy import reasons as R
from jupyter_gpushare.policy.slices import SlicePlacement

EVEN_THIRDS = (project("susan").quota(2), project("joe").quota(2), project("jemma").quota(2))


# -- the design-notes story ---------------------------------------------------------------

@pytest.mark.parametrize("susan, victims", [
    pytest.param([("s1", 4, 0)], [], id="susan-runs-4-joe-takes-idle-gpus"),
    pytest.param([("s1", 4, 0), ("s2", 2, 10), ("s3", 2, 20)], ["s3"],
                 id="susan-runs-8-as-4+2+2-newest-goes"),
    pytest.param([("s1", 2, 0), ("s2", 2, 10), ("s3", 2, 20), ("s4", 2, 30)], ["s4"],
                 id="susan-runs-8-as-4x2-newest-goes"),
    pytest.param([(f"s{i}", 1, 10 * i) for i in range(1, 9)], ["s8", "s7"],
                 id="susan-runs-8-as-8x1-two-newest-go"),
])
def test_joe_gets_his_quota_back_from_susans_newest_jobs(susan, victims):
    snap = (cluster(nodes=1, gpus_per_node=8).projects(*EVEN_THIRDS)
            .jobs(*(running(i, "susan", g, t) for i, g, t in susan),
                  pending("j1", "joe", gpus=2, submitted=100))
            .at(100))

    result, snap = step(snap)

    assert preempted(result) == victims
    if not victims:
        assert started(result) == {"j1": {"n0": 2}}
        return
    assert started(result) == {}
    assert all(p.for_job == "j1" and p.project == "susan" for p in result.preemptions)
    assert str(reason_of(result, "j1")) == (
        "waiting for 2 GPUs on one node; reclaiming 2 GPUs from project susan")
    assert result.preemptions[0].why == (
        "preempted to give project joe back GPUs within its quota of 2 GPUs (job j1); "
        "it is requeued")

    result, snap = step(snap)  # the victims' grace period
    assert isinstance(reason_of(result, "j1"), R.Releasing)

    result, snap = step(snap)
    assert started(result) == {"j1": {"n0": 2}}
    for v in victims:
        requeued = job_of(snap, v)
        assert requeued.pending and requeued.attempt == 2
        assert requeued.submit_time == dict((i, t) for i, _, t in susan)[v]


def test_story_requeued_jobs_resume_when_capacity_frees():
    snap = (cluster(nodes=1, gpus_per_node=8).projects(*EVEN_THIRDS)
            .jobs(running("s1", "susan", 4, 0), running("s2", "susan", 2, 10),
                  running("s3", "susan", 2, 20), pending("j1", "joe", gpus=2, submitted=100))
            .at(100))
    timeline = []
    for t in range(100, 400, 10):
        if t == 150:
            snap = submit(snap, pending("m1", "jemma", gpus=2, submitted=150))
        if t == 250:
            snap = finish(snap, "j1")
        if t == 300:
            snap = finish(snap, "m1")
        result, snap = step(snap)
        timeline += [(t, "start", s.job) for s in result.starts]
        timeline += [(t, "preempt", p.job) for p in result.preemptions]

    assert timeline == [
        (100, "preempt", "s3"),  # joe's claim: susan's newest job
        (120, "start", "j1"),  # one cycle plus the grace step
        (150, "preempt", "s2"),  # jemma's claim: susan's newest running job now
        (170, "start", "m1"),
        (250, "start", "s3"),  # joe is done: the job requeued first (at 110) resumes,
        (300, "start", "s2"),  # then the one requeued at 160, though submitted before it
    ]
    assert {j.id: (j.state.value, j.attempt) for j in snap.jobs} == {
        "s1": ("running", 1), "s2": ("running", 2), "s3": ("running", 2)}


# -- the guarantee: within-quota projects are never preempted ----------------------------

@pytest.mark.parametrize("jobs, claimant, victims, reason", [
    pytest.param([running("s1", "susan", 6, 0), running("j0", "joe", 2, 50)],
                 pending("m1", "jemma", gpus=2, submitted=100), ["s1"], R.Reclaiming,
                 id="newest-job-is-joes-but-joe-is-within-quota"),
    pytest.param([running("s1", "susan", 2, 0), running("j0", "joe", 2, 10),
                  running("x0", "extra", 2, 20), running("s2", "susan", 2, 30)],
                 pending("m1", "jemma", gpus=2, submitted=100), ["s2"], R.Reclaiming,
                 id="only-the-over-quota-project-gives"),
    pytest.param([running("s1", "susan", 2, 0), running("j0", "joe", 2, 10),
                  running("m0", "jemma", 2, 20), running("x1", "extra", 2, 30)],
                 pending("m1", "jemma", gpus=1, submitted=100), [], R.NoIdleGpus,
                 id="everyone-within-quota-borrower-waits"),
])
def test_within_quota_projects_are_never_preempted(jobs, claimant, victims, reason):
    snap = (cluster(nodes=1, gpus_per_node=8)
            .projects(*EVEN_THIRDS, project("extra").quota(2))
            .jobs(*jobs, claimant).at(100))
    result = cycle(snap)
    assert preempted(result) == victims
    assert isinstance(reason_of(result, claimant.build().id), reason)


# -- limits, minimum runtime --------------------------------------------------------------

def test_limit_is_respected_and_said_in_words():
    snap = (cluster(nodes=1, gpus_per_node=8)
            .projects(project("joe").quota(2).limit(3))
            .jobs(running("j0", "joe", 2, 0), running("j1", "joe", 1, 10),
                  pending("j2", "joe", gpus=1, submitted=20),
                  pending("j3", "joe", gpus=4, submitted=30))
            .at(100))
    result = cycle(snap)
    assert started(result) == {}  # five GPUs idle, but joe may use only three
    assert str(reason_of(result, "j2")) == "project joe is at its limit of 3 GPUs (3 GPUs in use)"
    assert str(reason_of(result, "j3")) == (
        "the job asks for 4 GPUs but project joe may never use more than 3 GPUs; "
        "ask for fewer GPUs")
    assert wait_of(result, "j3").position is None


@pytest.mark.parametrize("now, victims", [
    pytest.param(100, [], id="both-jobs-young-claim-waits"),
    pytest.param(385, ["s1"], id="only-the-older-job-is-old-enough"),
    pytest.param(390, ["s2"], id="both-old-enough-newest-goes"),
])
def test_minimum_runtime_protects_young_jobs(now, victims):
    snap = (cluster(nodes=1, gpus_per_node=8).projects(*EVEN_THIRDS)
            .jobs(running("s1", "susan", 6, 80), running("s2", "susan", 2, 90),
                  pending("j1", "joe", gpus=2, submitted=95))
            .at(now))
    result = cycle(snap, PolicyConfig(min_runtime_s=300))
    assert preempted(result) == victims
    if not victims:
        assert str(reason_of(result, "j1")) == (
            "waiting for 2 GPUs on one node; the over-quota jobs that could give them back "
            "have run less than the minimum of 300 s")


# -- victims: order, preference, minimal set ------------------------------------------------

@pytest.mark.parametrize("nodes, projects, jobs, claim, victims", [
    pytest.param(
        1, (project("susan").quota(2), project("joe").quota(2)),
        [running("big", "susan", 4, 0), running("small", "susan", 1, 50),
         running("j0", "joe", 1, 0), running("s3", "susan", 2, 10)],
        pending("j1", "joe", gpus=1, submitted=100), ["small"],
        id="newest-is-a-1-gpu-job-and-it-alone-goes"),
    pytest.param(
        1, (project("susan").quota(2), project("joe").quota(2)),
        [running("small", "susan", 1, 0), running("big", "susan", 4, 50),
         running("j0", "joe", 1, 0), running("s3", "susan", 2, 10)],
        pending("j1", "joe", gpus=1, submitted=100), ["big"],
        id="recency-not-size-newest-4-gpu-job-goes"),
    pytest.param(
        2, (project("a").quota(7), project("b").quota(6), project("c").quota(2),
            project("x").quota(0)),
        [running("a0", "a", 7, 0, "n0"), running("x1", "x", 1, 50, "n0"),
         running("b0", "b", 6, 0, "n1"), running("x2", "x", 2, 40, "n1")],
        pending("c1", "c", gpus=2, submitted=100), ["x2"],
        id="put-back-what-did-not-help"),
    pytest.param(
        1, (project("susan").quota(4), project("joe").quota(2), project("jemma").quota(2)),
        [running("s_old", "susan", 2, 0), running("s_new", "susan", 4, 10),
         running("m0", "jemma", 2, 0)],
        pending("j1", "joe", gpus=2, submitted=100), ["s_old"],
        id="prefer-the-job-that-leaves-susan-at-quota"),
    pytest.param(
        1, EVEN_THIRDS,
        [running("s1", "susan", 4, 0), running("m1", "jemma", 2, 10),
         running("m2", "jemma", 1, 20), running("j0", "joe", 1, 30)],
        pending("j1", "joe", gpus=1, submitted=100), ["m2"],
        id="prefer-jemma-at-quota-over-susan-most-over-share"),
    pytest.param(
        1, (project("susan").quota(1), project("jemma").quota(1), project("joe").quota(3)),
        [running("s1", "susan", 1, 0), running("s2", "susan", 1, 10),
         running("s3", "susan", 1, 20), running("s4", "susan", 1, 30),
         running("m1", "jemma", 1, 40), running("m2", "jemma", 1, 50),
         running("j0", "joe", 2, 0)],
        pending("j1", "joe", gpus=1, submitted=100), ["s4"],
        id="most-over-share-project-first"),
    pytest.param(
        1, (project("susan").quota(1).weight(0), project("jemma").quota(1).weight(0).priority(1),
            project("joe").quota(4)),
        [running("s1", "susan", 3, 0), running("m1", "jemma", 3, 50), running("j0", "joe", 2, 0)],
        pending("j1", "joe", gpus=2, submitted=100), ["s1"],
        id="equal-over-share-lowest-priority-first"),
])
def test_victims(nodes, projects, jobs, claim, victims):
    snap = cluster(nodes=nodes, gpus_per_node=8).projects(*projects).jobs(*jobs, claim).at(100)
    result = cycle(snap)
    assert preempted(result) == victims
    assert isinstance(reason_of(result, claim.build().id), R.Reclaiming)


# -- deserved shares: quotas, priority tiers, water-filling ---------------------------------

@pytest.mark.parametrize("projects, demand, capacity, shares", [
    pytest.param([project("a").weight(1), project("b").weight(3)], {"a": 8, "b": 8}, 8,
                 {"a": 2, "b": 6}, id="weights-1-to-3-split-8-idle-gpus"),
    pytest.param([project("a").weight(1), project("b").weight(3)], {"a": 1, "b": 8}, 8,
                 {"a": 1, "b": 7}, id="a-sated-b-takes-the-rest"),
    pytest.param([project("a").priority(1), project("b")], {"a": 6, "b": 6}, 8,
                 {"a": 6, "b": 2}, id="higher-priority-tier-borrows-first"),
    pytest.param([project("a").priority(1), project("b").quota(3)], {"a": 8, "b": 8}, 8,
                 {"a": 5, "b": 3}, id="quotas-before-any-tier"),
    pytest.param([project("a").quota(4), project("b")], {"a": 1, "b": 8}, 8,
                 {"a": 1, "b": 7}, id="quota-only-up-to-demand"),
    pytest.param([project("a").limit(3), project("b")], {"a": 8, "b": 8}, 8,
                 {"a": 3, "b": 5}, id="limit-caps-the-share"),
    pytest.param([project("a").quota(2).weight(0), project("b")], {"a": 8, "b": 8}, 8,
                 {"a": 2, "b": 6}, id="weight-zero-borrows-nothing"),
])
def test_deserved_shares(projects, demand, capacity, shares):
    got = deserved_shares([p.build() for p in projects],
                          {k: milli(v) for k, v in demand.items()}, milli(capacity))
    assert got == {k: milli(v) for k, v in shares.items()}


def test_deserved_shares_stay_integer_and_split_leftover_milli_gpus_by_name():
    got = deserved_shares([project(n).build() for n in "cab"], {n: GPU for n in "abc"}, GPU)
    assert got == {"a": 334, "b": 333, "c": 333}


def test_idle_gpus_go_by_over_quota_weight_in_a_cycle():
    snap = (cluster(nodes=1, gpus_per_node=8)
            .projects(project("a").weight(1), project("b").weight(3))
            .jobs(*(pending(f"a{i}", "a", submitted=i) for i in range(8)),
                  *(pending(f"b{i}", "b", submitted=i) for i in range(8)))
            .at(100))
    result = cycle(snap)
    by_project = {"a": 0, "b": 0}
    for s in result.starts:
        by_project[s.job[0]] += 1
    assert by_project == {"a": 2, "b": 6}
    assert result.deserved == {"a": 2000, "b": 6000}


# -- placement: best fit, fewest nodes, atomic gangs ----------------------------------------

PARTLY_FULL = [running("u0", "other", 6, 0, "n0"), running("u1", "other", 4, 0, "n1")]


@pytest.mark.parametrize("gpus, placement", [
    pytest.param(1, {"n0": 1}, id="1-gpu-on-the-fullest-node"),
    pytest.param(2, {"n0": 2}, id="2-gpus-fill-n0"),
    pytest.param(3, {"n1": 3}, id="3-gpus-skip-n0"),
    pytest.param(4, {"n1": 4}, id="4-gpus-fill-n1"),
    pytest.param(5, {"n2": 5}, id="5-gpus-need-the-empty-node"),
    pytest.param(12, {"n2": 8, "n1": 4}, id="12-gpus-whole-node-plus-best-fit"),
    pytest.param(14, {"n2": 8, "n1": 4, "n0": 2}, id="14-gpus-cannot-use-2-nodes-waits"),
])
def test_best_fit_placement(gpus, placement):
    snap = (cluster(nodes=3, gpus_per_node=8).projects(project("other"), project("p"))
            .jobs(*PARTLY_FULL, pending("j", "p", gpus=gpus)).at(100))
    result = cycle(snap)
    if gpus == 14:  # 14 free GPUs in all, but a 14-GPU gang is two nodes' worth at most
        assert started(result) == {}
        assert str(reason_of(result, "j")) == (
            "waiting for 14 GPUs on 2 nodes to borrow: this would take project p (0 GPUs in "
            "use) beyond its quota of 0 GPUs, and no idle GPUs fit")
    else:
        assert started(result) == {"j": placement}


@pytest.mark.parametrize("sizes, gpus, placement", [
    pytest.param((8, 8, 8), 12, {"n0": 8, "n1": 4}, id="12-on-8-gpu-nodes-uses-2"),
    pytest.param((8, 8, 8), 16, {"n0": 8, "n1": 8}, id="16-uses-2-whole-nodes"),
    pytest.param((8, 8, 8), 20, {"n0": 8, "n1": 8, "n2": 4}, id="20-uses-3"),
    pytest.param((4, 8, 8), 12, {"n1": 8, "n0": 4}, id="12-remainder-on-the-small-node"),
])
def test_gangs_use_the_fewest_nodes(sizes, gpus, placement):
    snap = (cluster(sizes=sizes).projects(project("p").quota(sum(sizes)))
            .jobs(pending("j", "p", gpus=gpus)).at(0))
    assert started(cycle(snap)) == {"j": placement}


@pytest.mark.parametrize("busy, gpus, text", [
    pytest.param({"n0": 6, "n1": 6}, 4,
                 "waiting for 4 GPUs on one node; 4 GPUs are free but not on few enough "
                 "nodes, and no over-quota jobs can be reclaimed", id="4-free-as-2+2"),
    pytest.param({"n0": 1}, 16,
                 "waiting for 16 GPUs on 2 nodes to borrow: this would take project p (0 GPUs "
                 "in use) beyond its quota of 15 GPUs, and no idle GPUs fit", id="16-with-15-free"),
])
def test_gangs_start_whole_or_not_at_all(busy, gpus, text):
    used = sum(busy.values())
    snap = (cluster(nodes=2, gpus_per_node=8)
            .projects(project("owner").quota(used), project("p").quota(16 - used))
            .jobs(*(running(f"u{n}", "owner", g, 0, n) for n, g in busy.items()),
                  pending("j", "p", gpus=gpus))
            .at(100))
    result = cycle(snap)
    assert started(result) == {} and preempted(result) == []
    assert str(reason_of(result, "j")) == text


# -- reservations: a large gang is not starved by a stream of small ones --------------------

def _stream_of_small_jobs(config: PolicyConfig, horizon: int = 600):
    """Two busy 8-GPU nodes, three 1-GPU jobs of 60 s arriving every 10 s, an 8-GPU job at 0."""
    busy = [job(f"r{i}").project("small").running_on(since=-10 * (i % 6), **{f"n{i % 2}": 1})
            for i in range(16)]
    snap = (cluster(nodes=2, gpus_per_node=8)
            .projects(project("small"), project("big"))
            .jobs(*busy, pending("big", "big", gpus=8, submitted=0)).at(0))
    seen = {"reserved": None, "big_started": None, "small_on_reserved": 0}
    for t in range(0, horizon, 10):
        done = [j.id for j in snap.jobs if j.running and snap.now - j.start_time >= 60]
        snap = submit(finish(snap, *done),
                      *(pending(f"s{t}-{i}", "small", submitted=t) for i in range(3)))
        before = snap
        result, snap = step(snap, config)
        holder = next((j for j in before.jobs if j.reserved), None)
        for s in result.starts:
            if s.job == "big":
                seen["big_started"] = t
            elif holder is not None and set(s.placement) & set(holder.reserved):
                seen["small_on_reserved"] += 1
        if result.reservation is not None and seen["reserved"] is None:
            seen["reserved"] = (t, result.reservation.job, result.reservation.reserved,
                                str(result.reservation.reason))
        if seen["big_started"] is not None:
            break
    return seen


def test_reservation_lets_a_large_gang_start_despite_a_stream_of_small_jobs():
    config = PolicyConfig(reserve_after_s=100, reclaim_fair_share=False)
    seen = _stream_of_small_jobs(config)
    t, holder, nodes, text = seen["reserved"]
    assert (t, holder) == (100, "big")
    assert len(nodes) == 1
    assert text == (f"waiting for 8 GPUs; node(s) {nodes[0]} are reserved for this job and "
                    f"start no new borrowing jobs until it runs")
    assert seen["small_on_reserved"] == 0
    assert seen["big_started"] is not None and seen["big_started"] <= t + 60 + 10


def test_without_reservations_the_stream_starves_the_large_gang():
    seen = _stream_of_small_jobs(PolicyConfig(reservations=False, reclaim_fair_share=False))
    assert seen["big_started"] is None and seen["reserved"] is None


def test_jobs_behind_a_reservation_are_told_why():
    snap = (cluster(nodes=2, gpus_per_node=8)
            .projects(project("small"), project("big"))
            .jobs(job("big").project("big").gpus(16).submitted(0).reserved("n0", "n1"),
                  running("s0", "small", 4, 0, "n0"), pending("s1", "small", submitted=50))
            .at(100))
    result = cycle(snap)
    assert started(result) == {}
    assert str(reason_of(result, "s1")) == (
        "waiting for 1 GPU on one node; the free GPUs are reserved for job big, which has "
        "waited longest")
    assert result.reservation.job == "big" and result.reservation.reserved == ("n0", "n1")


def test_a_guaranteed_job_is_not_held_back_by_a_reservation():
    snap = (cluster(nodes=2, gpus_per_node=8)
            .projects(project("small").quota(1), project("big"))
            .jobs(job("big").project("big").gpus(16).submitted(0).reserved("n0", "n1"),
                  running("s0", "other", 4, 0, "n0"), pending("s1", "small", submitted=50))
            .at(100))
    assert started(cycle(snap)) == {"s1": {"n0": 1}}



def test_a_fair_share_claim_is_not_kept_out_by_a_reservation_beyond_its_share():
    """Found by the no-flapping property: one GPU, project a (weight 1) deserves it, b
    (weight 0) runs on it. a's claim preempts b's job while b's other job, waiting as long,
    is given the node's reservation. Were a kept out of the reserved node, b would get the GPU
    a reclaimed, a would reclaim it again, and the two would preempt each other for ever."""
    snap = (cluster(nodes=1, gpus_per_node=1)
            .projects(project("a").weight(1), project("b").weight(0))
            .jobs(running("b0", "b", 1, 0), pending("a1", "a", submitted=0),
                  pending("b1", "b", submitted=0))
            .at(0))
    config = PolicyConfig(min_runtime_s=15, reserve_after_s=20, reclaim_fair_share=True)
    events, after = _history(snap, config, cycles=3)
    assert job_of(after, "b1").reserved == ("n0",)  # b1 waited longest: its node is held
    more, _ = _history(after, config, cycles=17)
    assert events + more == [(20, "preempt", "b0"), (40, "start", "a1")]



def test_a_priority_claim_does_not_drop_its_project_below_its_fair_share():
    """Found by the no-flapping property: p2's high-priority 2-GPU job j8 may not preempt
    p2's own j4 when that leaves p2 below its deserved share and j8 still beyond it. It
    used to: the GPUs freed went to p0, below its share too, p2 reclaimed them back for j4,
    p0 took them back by priority, and the three preempted each other for ever."""
    jobs = [running("r0", "p2", 1, 0)]
    for i, (who, gpus, prio) in enumerate([("p0", 1, 1), ("p0", 2, 0), ("p1", 1, 0),
                                           ("p1", 1, 0), ("p2", 1, 0), ("p0", 2, 0),
                                           ("p0", 2, 0), ("p0", 2, 0), ("p2", 2, 1),
                                           ("p0", 2, 0)]):
        jobs.append(pending(f"j{i}", who, gpus, submitted=0, priority=prio))
    snap = (cluster(sizes=(1, 5))
            .projects(project("p0").quota(2).weight(0), project("p1"), project("p2"))
            .jobs(*jobs).at(0))
    config = PolicyConfig(min_runtime_s=0, reclaim_fair_share=True,
                          preempt_within_project=True, reservations=False)
    events, snap = _history(snap, config, cycles=30)
    assert all(t < 60 for t, _, _ in events), events
    assert ("j4" in {j.id for j in snap.jobs if j.running}
            and "j8" not in {j.id for j in snap.jobs if j.running})



def test_a_priority_claim_beyond_quota_is_not_overtaken_by_its_own_project():
    """Found by the no-flapping property: p0 (quota 5) runs 6 one-GPU jobs and its
    high-priority j0 needs 3 on n3. Preempting two there would leave p0 below its quota,
    so the released GPUs would go to p0's low-priority j1 (within quota, it goes first),
    which j0 would preempt again, for ever. The claim is not made."""
    placed = {"r0": "n0", "r1": "n1", "r2": "n2", "r3": "n2", "r4": "n3", "r5": "n3"}
    snap = (cluster(sizes=(1, 1, 2, 3))
            .projects(project("p0").quota(5), project("p1").weight(0))
            .jobs(*(running(j, "p0", 1, 0, node) for j, node in placed.items()),
                  pending("j0", "p0", 3, submitted=0, priority=1),
                  pending("j1", "p0", submitted=0), pending("j2", "p0", submitted=0))
            .at(0))
    config = PolicyConfig(min_runtime_s=0, reclaim_fair_share=True,
                          preempt_within_project=True, reservations=False)
    events, _ = _history(snap, config, cycles=20)
    assert events == [(0, "start", "j1")]



def test_a_requeued_victim_does_not_retake_the_gpus_of_its_claimant():
    """Found by the no-flapping property: p0's j2 (within quota) needs 4 GPUs on one node,
    and only p1's j0 (2) and j3 (3) on n0 can give them; j0 leaves p1 below its quota. Both
    go; once n0 is free j2 goes first. Before jobs carried when they were requeued, the
    requeued j0, submitted before j2, went first, started there and was reclaimed again, for
    ever; now it queues from its requeue, after j2 (``TrainJob.waiting_since``). Requeued,
    j0 keeps p1 within its quota but finds 1 GPU free on no node with 2: without
    ``consolidate`` it waits for a job to end; with it, p0's j5 moves off n2 (and p2's j1 goes
    back), and j0 starts there. The GPUs kept for j5 are kept for one cycle: p2's j12 takes one
    and goes back when j5 returns (no minimum runtime here); then nothing changes."""
    snap = (cluster(sizes=(5, 6, 7))
            .projects(project("p0").quota(16).weight(0), project("p1").quota(2).weight(0),
                      project("p2").weight(0))
            .jobs(*(pending(f"j{i}", who, gpus, submitted=0) for i, (who, gpus) in enumerate(
                [("p1", 2), ("p2", 1), ("p0", 4), ("p1", 3), ("p0", 1), ("p0", 1), ("p2", 1),
                 ("p2", 1), ("p2", 1), ("p2", 1), ("p0", 4), ("p0", 1), ("p2", 1), ("p0", 5)])))
            .at(0))
    config = PolicyConfig(min_runtime_s=0, reclaim_fair_share=False, reservations=False,
                          consolidate=False)
    events, _ = _history(snap, config, cycles=20)
    assert sorted(e for e in events if e[0] == 10) == [(10, "preempt", "j0"), (10, "preempt", "j3")]
    assert (30, "start", "j2") in events
    assert all(t <= 30 for t, _, _ in events), events
    moved, snap = _history(snap, replace(config, consolidate=True), cycles=20)
    assert [e for e in moved if e[0] > 10] == [
        (30, "start", "j2"), (30, "preempt", "j1"), (30, "preempt", "j5"),
        (40, "start", "j12"), (50, "start", "j0"), (50, "preempt", "j12"), (70, "start", "j5")]
    assert job_of(snap, "j0").running and job_of(snap, "j5").running


def test_a_claimant_keeps_its_turn_over_its_own_projects_later_jobs():
    """While b gives back n0 for a's 4-GPU job C, a's later one-GPU jobs could borrow n1's
    idle GPUs; a would then hold 2 GPUs, C no longer keep it within quota, and the requeued
    b1 retake n0 as a borrower: the reclaim wasted, C waiting on a's own small jobs. Instead
    a borrows nothing while C claims, and the small jobs start with it."""
    snap = (cluster(sizes=(4, 4))
            .projects(project("a").quota(4), project("b").quota(2), project("c").quota(2))
            .jobs(running("b1", "b", 4, -100, node="n0"), running("c1", "c", 1, -100, node="n1"),
                  pending("C", "a", gpus=4, submitted=0), pending("S1", "a", submitted=1),
                  pending("S2", "a", submitted=2))
            .at(2))
    first = cycle(snap)
    assert [p.job for p in first.preemptions] == ["b1"] and not first.starts
    for small in ("S1", "S2"):
        assert str(reason_of(first, small)) == (
            "waiting for 1 GPU on one node; project a's job C is taking back 4 GPUs for its "
            "quota, and the project borrows no more until it starts")
    events, snap = _history(snap, PolicyConfig())
    assert sorted(events) == [(2, "preempt", "b1"), (22, "start", "C"), (22, "start", "S1"),
                              (22, "start", "S2")]
    assert job_of(snap, "b1").pending


# -- reasons are sentences ---------------------------------------------------------------------

@pytest.mark.parametrize("reason, text", [
    (R.TooLarge(milli(20), milli(16)),
     "the job asks for 20 GPUs but the train pool has only 16 GPUs; ask for fewer GPUs"),
    (R.AtLimit("joe", milli(3), milli(3)), "project joe is at its limit of 3 GPUs (3 GPUs in use)"),
    (R.NoIdleGpus("susan", milli(2), milli(6), milli(2), 1),
     "waiting for 2 GPUs on one node to borrow: this would take project susan (6 GPUs in use) "
     "beyond its quota of 2 GPUs, and no idle GPUs fit"),
    (R.Reclaiming(milli(12), 2, (("jemma", GPU), ("susan", milli(4)))),
     "waiting for 12 GPUs on 2 nodes; reclaiming 1 GPU from project jemma, 4 GPUs from "
     "project susan"),
    (R.Releasing(GPU, 1),
     "waiting for 1 GPU on one node; preempted jobs are releasing them within their grace period"),
    (R.MinRuntime(milli(2), 1, 600.0),
     "waiting for 2 GPUs on one node; the over-quota jobs that could give them back have run "
     "less than the minimum of 600 s"),
    (R.Reserved(milli(8), ("n1",)),
     "waiting for 8 GPUs; node(s) n1 are reserved for this job and start no new borrowing jobs "
     "until it runs"),
    (R.BehindReservation(GPU, 1, "big"),
     "waiting for 1 GPU on one node; the free GPUs are reserved for job big, which has waited "
     "longest"),
    (R.Fragmented(milli(4), 1, milli(4)),
     "waiting for 4 GPUs on one node; 4 GPUs are free but not on few enough nodes, and no "
     "over-quota jobs can be reclaimed"),
    (R.Fragmented(milli(2), 1, milli(1)),
     "waiting for 2 GPUs on one node; 1 GPU is free but not on few enough nodes, and no "
     "over-quota jobs can be reclaimed"),
], ids=lambda v: type(v).__name__ if isinstance(v, R.Reason) else "")
def test_reasons_are_plain_sentences(reason, text):
    assert str(reason) == text


def test_a_job_larger_than_the_pool_can_never_run():
    snap = (cluster(nodes=2, gpus_per_node=8).projects(project("p"))
            .jobs(pending("huge", "p", gpus=20)).at(0))
    w = wait_of(cycle(snap), "huge")
    assert w.position is None
    assert str(w.reason) == ("the job asks for 20 GPUs but the train pool has only 16 GPUs; "
                             "ask for fewer GPUs")


# -- determinism ---------------------------------------------------------------------------------

def _busy_snapshot():
    return (cluster(sizes=(8, 8, 4, 2))
            .projects(project("susan").quota(4), project("joe").quota(6).weight(2),
                      project("jemma").quota(2).priority(1), project("zed").limit(4))
            .jobs(running("s1", "susan", 8, 0, "n0"), running("s2", "susan", 4, 5, "n1"),
                  running("z1", "zed", 2, 10, "n2"), running("z2", "zed", 2, 20, "n3"),
                  pending("j1", "joe", gpus=4, submitted=30), pending("j2", "joe", 2, submitted=31),
                  pending("m1", "jemma", gpus=1, submitted=40), pending("z3", "zed", submitted=41),
                  pending("s3", "susan", gpus=12, submitted=0))
            .at(5000))


def test_the_same_snapshot_gives_the_same_decisions():
    snap = _busy_snapshot()
    first, second = cycle(snap), cycle(snap)
    assert first == second and first.waits == second.waits
    assert first.preemptions  # the snapshot is busy enough to exercise reclaim


def test_the_order_of_jobs_in_the_snapshot_does_not_matter():
    snap = _busy_snapshot()
    reordered, result = cycle(replace(snap, jobs=snap.jobs[::-1])), cycle(snap)
    assert reordered == result and reordered.waits == result.waits


# -- build slices --------------------------------------------------------------------------------

BUILD_NODES = (Node("b0", 2, BUILD), Node("b1", 1, BUILD), Node("n0", 8))
HELD = (Slice("s1", "ann", 750, "b0", 0), Slice("s2", "bob", 250, "b0", 1))


@pytest.mark.parametrize("milli_gpus, where", [
    pytest.param(250, SlicePlacement("b0", 0), id="quarter-fills-the-fullest-gpu"),
    pytest.param(500, SlicePlacement("b0", 1), id="half-skips-the-gpu-with-a-quarter-left"),
    pytest.param(750, SlicePlacement("b0", 1), id="three-quarters-fit-exactly"),
    pytest.param(1000, SlicePlacement("b1", 0), id="a-whole-gpu-needs-an-empty-one"),
])
def test_slices_are_packed_best_fit(milli_gpus, where):
    assert place_slice(BUILD_NODES, HELD, "cat", milli_gpus) == where


def test_slice_beyond_the_users_allowance_is_refused():
    refused = place_slice(BUILD_NODES, HELD, "ann", 500, allowance=1000)
    assert isinstance(refused, SliceRefused)
    assert str(refused) == ("ann already holds 0.75 GPU of a build allowance of 1 GPU; stop "
                            "another notebook server or pick a smaller slice")
    assert place_slice(BUILD_NODES, HELD, "ann", 250, allowance=1000) == SlicePlacement("b0", 0)


def test_slice_on_a_full_build_pool_is_refused():
    full = HELD + (Slice("s3", "cat", 250, "b0", 0), Slice("s4", "cat", 750, "b0", 1),
                   Slice("s5", "dan", 1000, "b1", 0))
    refused = place_slice(BUILD_NODES, full, "eve", 250)
    assert str(refused) == ("the build pool is full: no GPU has 0.25 GPU free; try a smaller "
                            "slice or a CPU-only server, or try again later")


@pytest.mark.parametrize("milli_gpus, text", [
    pytest.param(0, "0 GPUs", id="zero"),
    pytest.param(-250, "-0.25 GPU", id="negative"),
    pytest.param(1500, "1.5 GPU", id="more-than-one-gpu"),
])
def test_slice_of_a_bad_fraction_is_refused(milli_gpus, text):
    refused = place_slice(BUILD_NODES, HELD, "eve", milli_gpus)
    assert str(refused) == ("a build slice is a fraction of one GPU (more than 0, at most 1), "
                            f"not {text}")


# -- found by the property tests ----------------------------------------------------------------

def test_a_guaranteed_gang_gets_a_whole_node_back_when_newest_first_would_spread():
    # Newest first takes x3 (n1) and x2 (n0): 4 + 4 GPUs back, but on no single node.
    snap = (cluster(nodes=2, gpus_per_node=8)
            .projects(project("x").quota(4), project("y").quota(4), project("z").quota(8))
            .jobs(running("x1", "x", 4, 0, "n0"), running("x2", "x", 4, 10, "n0"),
                  running("y1", "y", 4, 0, "n1"), running("x3", "x", 4, 20, "n1"),
                  pending("z1", "z", gpus=8, submitted=30))
            .at(100))
    result, snap = step(snap)
    assert sorted(preempted(result)) == ["x1", "x2"]
    assert str(reason_of(result, "z1")) == (
        "waiting for 8 GPUs on one node; reclaiming 8 GPUs from project x")
    _, snap = step(snap)
    result, snap = step(snap)
    assert started(result) == {"z1": {"n0": 8}}


def _shape_blocks_z():
    """x is over its quota, but no node frees 4 GPUs for z unless y, within its quota, gives
    too."""
    return (cluster(nodes=2, gpus_per_node=4)
            .projects(project("x"), project("y").quota(4), project("z").quota(4))
            .jobs(running("x1", "x", 2, 0, "n0"), running("y1", "y", 2, 0, "n0"),
                  running("x2", "x", 2, 0, "n1"), running("y2", "y", 2, 0, "n1"),
                  pending("z1", "z", gpus=4, submitted=30))
            .at(100))


def test_without_consolidate_within_quota_jobs_are_not_moved_to_make_room_for_a_gang():
    result = cycle(_shape_blocks_z(), PolicyConfig(consolidate=False))
    assert preempted(result) == [] and started(result) == {}
    assert isinstance(reason_of(result, "z1"), R.Fragmented)


MOVES = PolicyConfig()  # consolidate is on by default


def test_with_consolidate_a_within_quota_job_moves_to_make_room_for_a_gang():
    # The same pool: x's job on n0 goes back, y's moves from n0 to n1, where x's other job
    # goes back for it; z gets n0. y keeps its 4 GPUs throughout.
    result, snap = step(_shape_blocks_z(), MOVES)
    kinds = {p.job: p.kind for p in result.preemptions}
    assert kinds == {"x1": "guarantee", "x2": "guarantee", "y1": "move"}
    assert str(reason_of(result, "z1")) == (
        "waiting for 4 GPUs on one node; moving 2 GPUs of project y to other GPUs and "
        "reclaiming 4 GPUs from project x")
    assert result.usage["y"] == milli(2)  # what runs; its moved job is promised its GPUs
    why = next(p.why for p in result.preemptions if p.job == "y1")
    assert why.startswith("moved so that job z1 of project z, within its quota, gets the nodes")
    result, snap = step(snap, MOVES)  # the victims leave at the end of their grace
    result, snap = step(snap, MOVES)
    assert started(result) == {"z1": {"n0": 4}, "y1": {"n1": 2}}
    assert result.preemptions == ()


@pytest.mark.parametrize("young", [True, False], ids=["borrowers-young", "borrowers-old"])
def test_consolidate_moves_nothing_while_borrowers_could_make_room(young):
    # x borrows a whole node: once old enough it goes back, and nobody within quota moves.
    snap = (cluster(nodes=2, gpus_per_node=4)
            .projects(project("x"), project("y").quota(4), project("z").quota(4))
            .jobs(running("x1", "x", 4, 90 if young else 0, "n0"),
                  running("y1", "y", 2, 0, "n1"), pending("z1", "z", gpus=4, submitted=30))
            .at(100))
    result = cycle(snap, PolicyConfig(consolidate=True, min_runtime_s=60))
    assert [(p.job, p.kind) for p in result.preemptions] == ([] if young else [("x1", "guarantee")])
    if young:
        assert isinstance(reason_of(result, "z1"), R.MinRuntime)


def test_consolidate_moves_only_jobs_that_ran_their_minimum_runtime():
    snap = (cluster(nodes=2, gpus_per_node=8)
            .projects(project("v").quota(8), project("n").quota(8))
            .jobs(running("v1", "v", 4, 95, "n0"), running("v2", "v", 4, 95, "n1"),
                  pending("n1", "n", gpus=8, submitted=30))
            .at(100))
    config = PolicyConfig(consolidate=True, min_runtime_s=60)
    result = cycle(snap, config)
    assert result.preemptions == ()  # a move would stop a young job
    assert isinstance(reason_of(result, "n1"), R.Fragmented)
    result = cycle(replace(snap, now=200), config)
    assert [(p.job, p.kind) for p in result.preemptions] == [("v1", "move")]
    assert result.held == {"n0": milli(4), "n1": milli(4)}  # for n1, and for v1 while it stops


@pytest.mark.parametrize("now, victims", [
    pytest.param(100, [], id="young-low-priority-job-is-spared"),
    pytest.param(400, ["low"], id="old-enough-low-priority-job-goes"),
])
def test_preempting_within_a_project_respects_the_minimum_runtime(now, victims):
    snap = (cluster(nodes=1, gpus_per_node=4).projects(project("p"))
            .jobs(running("low", "p", 4, 90), pending("high", "p", gpus=4, priority=1))
            .at(now))
    config = PolicyConfig(preempt_within_project=True, min_runtime_s=300)
    assert preempted(cycle(snap, config)) == victims


def _history(snap, config, cycles=12):
    events = []
    for _ in range(cycles):
        result, snap = step(snap, config)
        events += [(snap.now - 10, "start", s.job) for s in result.starts]
        events += [(snap.now - 10, "preempt", p.job) for p in result.preemptions]
    return events, snap


@pytest.mark.parametrize("quota, running_gpus, high_gpus, expected", [
    pytest.param(4, 4, 2, [(0, "preempt", "low"), (20, "start", "high")],
                 id="claimant-then-fits-the-quota-preempts"),
    pytest.param(3, 3, 4, [], id="claimant-beyond-quota-would-lose-to-the-requeued-victim"),
])
def test_preempting_within_a_project_does_not_flap(quota, running_gpus, high_gpus, expected):
    snap = (cluster(nodes=1, gpus_per_node=4).projects(project("p").quota(quota))
            .jobs(running("low", "p", running_gpus, -100),
                  pending("high", "p", gpus=high_gpus, priority=1))
            .at(0))
    events, _ = _history(snap, PolicyConfig(preempt_within_project=True))
    assert events == expected


def test_a_borrower_beyond_its_share_goes_after_one_within_its_share():
    # p2's priority tier borrows first, but its share is its quota (weight 0): one GPU. Were
    # b to start first, c would reclaim from p2 and b take the GPU back, forever.
    snap = (cluster(nodes=2, gpus_per_node=1)
            .projects(project("p2").quota(1).weight(0).priority(1), project("p3"))
            .jobs(pending("a", "p2"), pending("b", "p2", submitted=1), pending("c", "p3"))
            .at(0))
    events, snap = _history(snap, PolicyConfig(reclaim_fair_share=True))
    assert events == [(0, "start", "a"), (0, "start", "c")]
    assert job_of(snap, "b").pending


@pytest.mark.parametrize("quota", [pytest.param(0, id="borrower"),
                                   pytest.param(12, id="guaranteed")])
def test_a_gang_too_large_for_its_fewest_nodes_never_runs_and_reserves_nothing(quota):
    # 12 GPUs is two nodes' worth at most, and no two of these nodes hold 12.
    snap = (cluster(sizes=(8, 2, 2)).projects(project("big").quota(quota), project("small"))
            .jobs(pending("g", "big", gpus=12, submitted=0), pending("s1", "small", submitted=50))
            .at(3000))
    result = cycle(snap)
    assert started(result) == {"s1": {"n1": 1}}
    assert result.reservation is None
    w = wait_of(result, "g")
    assert w.position is None
    assert str(w.reason) == ("the job asks for 12 GPUs but it must run on 2 nodes and the largest "
                             "2 nodes of the train pool have only 10 GPUs; ask for fewer GPUs")


def test_a_reservation_holder_at_its_projects_limit_gives_the_nodes_back():
    snap = (cluster(nodes=2, gpus_per_node=4)
            .projects(project("p").quota(1).limit(4), project("q"))
            .jobs(running("g", "p", 1, 0, "n0"), running("q0", "q", 3, 0, "n0"),
                  job("h").project("p").gpus(4).submitted(0).reserved("n1"),
                  pending("b", "q", submitted=50))
            .at(100))
    result, snap = step(snap)
    assert result.reservation is None
    assert str(reason_of(result, "h")) == "project p is at its limit of 4 GPUs (1 GPU in use)"
    assert isinstance(reason_of(result, "b"), R.BehindReservation)  # it held this cycle
    result, snap = step(snap)
    assert started(result) == {"b": {"n1": 1}}


def test_a_cycle_is_not_paused_by_the_garbage_collector():
    """A cycle holds Python's cyclic collector off (a full collection midway walks the whole
    heap) and gives it back as it found it."""
    snap = (cluster(nodes=4)
            .projects(project("a").quota(16), project("b"))
            .jobs(*(running(f"r{i}", "b", 1, 0, f"n{i % 4}") for i in range(32)),
                  *(pending(f"j{i}", "a", submitted=i) for i in range(200)))
            .at(100))
    collections = []  # collections that started while the cycle decided

    def callback(phase, info):
        frame = sys._getframe(1)
        while frame is not None:  # (the collector is back while ``cycle`` returns)
            # anywhere in the policy: the cycle's steps live in modules of their own
            if phase == "start" and "/jupyter_gpushare/policy/" in frame.f_code.co_filename \
                    and frame.f_code.co_name not in ("cycle", "_collector_held_off"):
                collections.append(frame.f_code.co_name)
                return
            frame = frame.f_back

    threshold = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(1)  # any allocation would collect
    try:
        result = cycle(snap)
        assert gc.isenabled()
        gc.disable()
        cycle(snap)
        assert not gc.isenabled()  # a caller's choice stands
    finally:
        gc.enable()
        gc.set_threshold(*threshold)
        gc.callbacks.remove(callback)
    assert len(result.preemptions) == 16 and collections == []


# -- drained nodes: no new job starts there, what runs there runs on ------------------------

def drained(snap, *names):
    return replace(snap, nodes=tuple(replace(n, drained=n.name in names) for n in snap.nodes))


@pytest.mark.parametrize("jobs, starts, waiting", [
    pytest.param([pending("j1", "joe", 2), pending("j2", "joe", 2)], {"j1": {"n1": milli(2)},
                 "j2": {"n1": milli(2)}}, [], id="new-jobs-go-to-the-node-that-takes-them"),
    pytest.param([pending("j1", "joe", 4), pending("j2", "joe", 1)], {"j1": {"n1": milli(4)}},
                 ["j2"], id="the-drained-nodes-idle-gpus-are-not-given"),
    pytest.param([pending("big", "joe", 8)], {}, ["big"], id="a-gang-that-needs-it-waits"),
])
def test_a_drained_node_takes_no_new_jobs(jobs, starts, waiting):
    snap = drained(cluster(nodes=2, gpus_per_node=4).projects(project("joe").quota(8))
                   .jobs(*jobs).at(0), "n0")
    result = cycle(snap)
    assert {s.job: dict(s.placement) for s in result.starts} == starts
    assert sorted(w.job for w in result.waits) == waiting
    assert not result.unschedulable  # a drain is for a while: nothing is told it never fits


def test_jobs_on_a_drained_node_run_on_and_its_freed_gpus_are_not_reclaimed_for():
    """Joe's job within quota reclaims from Susan's borrowers on the node that takes jobs,
    never on the drained one, whose jobs keep running (though the newest started there)."""
    snap = (cluster(nodes=2, gpus_per_node=4)
            .projects(project("joe").quota(4), project("susan").quota(0))
            .jobs(running("newest", "susan", 4, 50, node="n0"),
                  running("older", "susan", 4, 0, node="n1"),
                  pending("j1", "joe", gpus=4, submitted=100)).at(100))
    assert [p.job for p in cycle(snap).preemptions] == ["newest"]
    result = cycle(drained(snap, "n0"))
    assert [p.job for p in result.preemptions] == ["older"]
    assert not result.starts


def test_consolidate_moves_no_job_of_a_project_beyond_its_quota():
    # p runs 5 GPUs on a quota of 4: its jobs are borrowers, never moved (found in review).
    snap = (cluster(nodes=2, gpus_per_node=8)
            .projects(project("p").quota(4), project("q").quota(4), project("z").quota(7))
            .jobs(running("a", "p", 4, 0, "n0"), running("b", "p", 1, 50, "n0"),
                  running("c", "q", 4, 0, "n1"), pending("z1", "z", gpus=7, submitted=60))
            .at(100))
    result = cycle(snap, PolicyConfig(min_runtime_s=0))
    # b goes back (p back at its quota), q's c moves to n0, where b's GPU and 3 free hold it
    assert [(p.job, p.kind) for p in result.preemptions] == [("b", "guarantee"), ("c", "move")]
    assert str(reason_of(result, "z1")) == (
        "waiting for 7 GPUs on one node; moving 4 GPUs of project q to other GPUs and "
        "reclaiming 1 GPU from project p")
