"""Build GPUs lent to train jobs, in the policy (``policy/lending.py``): only borrowers start
there, last; the GPUs count toward no quota; claims never take them; the build pool takes
them back at once; the guarantee is what it is without them."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, note
from hypothesis import strategies as st

from builders import GPU
from jupyter_gpushare.policy import (JobState, Node, PolicyConfig, Project, Snapshot, TrainJob,
                                     cycle)
from jupyter_gpushare.policy.lending import TAKE_BACK
from test_policy_properties import SETTINGS, configs, snapshots

NOW = 1000.0


def running(job_id, project, placement, started=0.0, idle=False, preempting=False):
    return TrainJob(job_id, project, sum(placement.values()) * GPU, submit_time=started,
                    state=JobState.RUNNING, placement={n: g * GPU for n, g in placement.items()},
                    start_time=started, idle=idle, preempting=preempting)


def pending(job_id, project, gpus, submitted=NOW - 5):
    return TrainJob(job_id, project, gpus * GPU, submit_time=submitted)


def snap(jobs, lent=2, projects=(("a", 4), ("b", 4))):
    nodes = (Node("n0", 4), Node("n1", 4), Node("build-0/lent", lent, lent=True))
    return Snapshot(NOW, nodes, tuple(Project(p, q * GPU) for p, q in projects), tuple(jobs))


def test_a_borrower_goes_to_lent_gpus_only_once_the_train_pool_is_full():
    full = [running("a1", "a", {"n0": 4}), running("b1", "b", {"n1": 4})]
    result = cycle(snap([*full, pending("a2", "a", 2)]))
    assert [(s.job, dict(s.placement)) for s in result.starts] == \
        [("a2", {"build-0/lent": 2 * GPU})]
    # with room on the train pool's own GPUs, it goes there
    result = cycle(snap([running("a1", "a", {"n0": 4}), running("b1", "b", {"n1": 2}),
                         pending("a2", "a", 2)]))
    assert [dict(s.placement) for s in result.starts] == [{"n1": 2 * GPU}]


def test_a_job_within_quota_never_starts_on_lent_gpus():
    # b is within quota with its 2 GPUs, but only lent GPUs are free: it takes back its
    # quota from a's borrowed job instead
    jobs = [running("a1", "a", {"n0": 4}), running("a2", "a", {"n1": 4}, started=1.0),
            pending("b1", "b", 2)]
    result = cycle(snap(jobs), PolicyConfig(min_runtime_s=0))
    assert not result.starts
    assert [(p.job, p.kind) for p in result.preemptions] == [("a2", "guarantee")]


def test_lent_gpus_count_toward_no_quota_and_are_never_claimed():
    # a holds its quota on n0 and 2 lent GPUs; b's claim takes a borrowed job on n1, never
    # the lent one, and a's lent job does not make a look beyond its quota
    jobs = [running("a1", "a", {"n0": 4}), running("a2", "a", {"build-0/lent": 2}),
            running("x1", "x", {"n1": 4}), pending("b1", "b", 4)]
    result = cycle(snap(jobs, projects=(("a", 4), ("b", 4), ("x", 0))),
                   PolicyConfig(min_runtime_s=0))
    assert [(p.job, p.kind) for p in result.preemptions] == [("x1", "guarantee")]
    assert result.usage["a"] == 4 * GPU  # its lent 2 GPUs are not its usage
    # a's next job keeps it within quota only were the lent GPUs its quota: it borrows
    result = cycle(snap([running("a1", "a", {"n0": 2}), running("a2", "a", {"build-0/lent": 2}),
                         pending("a3", "a", 2)]))
    assert [dict(s.placement) for s in result.starts] == [{"n0": 2 * GPU}]


def test_the_build_pool_takes_back_lent_gpus_idle_jobs_first_whatever_their_age():
    jobs = [running("old", "a", {"build-0/lent": 1}, started=NOW - 3600),
            running("young", "a", {"build-0/lent": 1}, started=NOW - 1),
            running("idle", "b", {"build-0/lent": 1}, started=NOW - 7200, idle=True)]
    # the build pool needs two of its three lent GPUs back: one is left to lend
    result = cycle(snap(jobs, lent=1), PolicyConfig(min_runtime_s=600))
    assert [(p.job, p.kind, p.for_job) for p in result.preemptions] == \
        [("idle", TAKE_BACK, ""), ("young", TAKE_BACK, "")]
    assert "takes back GPUs of build-0/lent" in result.preemptions[0].why
    assert not result.starts
    # a job already leaving counts: only what is still over goes
    leaving = [replace(jobs[2], preempting=True), *jobs[:2]]
    result = cycle(snap(leaving, lent=1))
    assert [p.job for p in result.preemptions] == ["young"]
    # nothing over: nothing taken
    assert not cycle(snap(jobs, lent=3)).preemptions


def test_the_pool_capacity_and_shares_leave_lent_gpus_out():
    result = cycle(snap([pending("a1", "a", 9)], lent=4, projects=(("a", 0),)))
    [never] = result.unschedulable
    assert "8" in str(never.reason)  # larger than the train pool's own 8 GPUs


@st.composite
def with_lent(draw):
    """A random snapshot with lent build GPUs beside it: some running borrowed jobs, the
    lent node perhaps smaller now than what they hold (the build pool wants GPUs back)."""
    base = draw(snapshots())
    names = [p.name for p in base.projects]
    size = draw(st.integers(1, 4))
    held, jobs = 0, []
    for i in range(draw(st.integers(0, 3))):
        gpus = draw(st.integers(1, 2))
        if held + gpus > size:
            break
        held += gpus
        jobs.append(running(f"l{i}", draw(st.sampled_from(names)), {"lent-0": gpus},
                            started=NOW - draw(st.sampled_from([1.0, 100.0])),
                            idle=draw(st.booleans())))
    now_size = draw(st.integers(0, size))
    lent = Node("lent-0", now_size, lent=True)
    shifted = [replace(j, submit_time=j.submit_time + NOW - base.now,
                       start_time=None if j.start_time is None else j.start_time + NOW - base.now)
               for j in base.jobs]
    with_nodes = Snapshot(NOW, (*base.nodes, lent), base.projects, (*shifted, *jobs),
                          departments=base.departments)
    without = Snapshot(NOW, base.nodes, base.projects, tuple(shifted),
                       departments=base.departments)
    return with_nodes, without


@SETTINGS
@given(with_lent(), configs())
def test_lending_leaves_the_guarantee_as_it_is_and_takes_back_what_the_build_pool_needs(
        drawn, config):
    lent_snap, plain = drawn
    note(f"with lent GPUs: {lent_snap}")
    result, without = cycle(lent_snap, config), cycle(plain, config)
    on_lent = {j.id: j for j in lent_snap.jobs if "lent-0" in j.placement}
    # the guarantee: the same claims and the same jobs within quota waiting as without them
    assert [p for p in result.preemptions if p.kind == "guarantee"] == \
        [p for p in without.preemptions if p.kind == "guarantee"]
    assert result.within_quota_waiting == without.within_quota_waiting
    # no rule but the take-back preempts a job on lent GPUs
    assert all(p.kind == TAKE_BACK for p in result.preemptions if p.job in on_lent)
    assert all(p.job in on_lent for p in result.preemptions if p.kind == TAKE_BACK)
    # what stays on the lent node fits it, and the fewest jobs went: each was needed
    lent = next(n for n in lent_snap.nodes if n.lent)
    taken = {p.job for p in result.preemptions if p.kind == TAKE_BACK}
    stays = sum(j.gpus for j in on_lent.values() if j.id not in taken and not j.preempting)
    leaving = sum(j.gpus for j in on_lent.values() if j.preempting)
    assert stays + leaving <= lent.milli or stays == 0 and not taken
    assert all(stays + leaving + on_lent[j].gpus > lent.milli for j in taken)
    # starts on lent GPUs: only there, and within what is free
    free = max(0, lent.milli - sum(j.gpus for j in on_lent.values()))
    starts = [s for s in result.starts if "lent-0" in s.placement]
    assert all(set(s.placement) == {"lent-0"} for s in starts)
    assert sum(s.placement["lent-0"] for s in starts) <= free


def test_a_slice_takes_a_free_gpu_else_wants_a_lent_one_back():
    """``take_slice``, the rule the service (``BuildPool.reserve``) and the team scenario
    share; ``lendable`` keeps the last spare GPUs as the reserve."""
    from jupyter_gpushare.policy.lending import Want, lendable, take_slice
    from jupyter_gpushare.policy.model import BUILD, Slice
    from jupyter_gpushare.policy.slices import SlicePlacement, SliceRefused

    nodes = [Node("b", 3, pool=BUILD)]
    full = [Slice(f"s{i}", "carol", GPU // 4, "b", 2) for i in range(4)]  # GPU 2 is full
    quarter = GPU // 4
    # GPU 0 held by a job, GPU 1 free: the slice goes onto GPU 1 at once.
    assert take_slice(nodes, full, "alice", quarter, held={("b", 0)}) == SlicePlacement("b", 1)
    # GPU 1 is one a cycle may be starting a job on: want it (no job holds it) over GPU 0.
    assert take_slice(nodes, full, "alice", quarter, held={("b", 0)},
                      busy={("b", 1)}) == Want("b", 1)
    # Both held: want the one packing picks; another server's wanted slice fills GPU 0.
    assert take_slice(nodes, full, "alice", quarter, held={("b", 0), ("b", 1)}) == Want("b", 0)
    bob_waits = [Slice("", "bob", GPU, "b", 0)]
    assert take_slice(nodes, full, "alice", quarter, held={("b", 0), ("b", 1)},
                      others=bob_waits) == Want("b", 1)
    # Not while lending is off, nor beyond the allowance (counting her other waiting slice).
    off = take_slice(nodes, full, "alice", quarter, held={("b", 0), ("b", 1)}, may_want=False)
    assert isinstance(off, SliceRefused) and "full" in str(off)
    mine = [Slice("", "alice", GPU // 2, "", -1)]
    over = take_slice(nodes, full, "alice", quarter, GPU // 2, held={("b", 0), ("b", 1)},
                      own_waiting=mine)
    assert isinstance(over, SliceRefused) and "allowance" in str(over)
    # lendable: GPUs without a slice that no server takes back, less the last spare one.
    assert lendable(nodes, {("b", 2)}, set(), set(), reserve=1) == [("b", 0)]
    assert lendable(nodes, {("b", 2)}, set(), {("b", 1)}, reserve=1) == [("b", 1)]
    assert lendable(nodes, set(), {("b", 0)}, set(), reserve=0) == [("b", 1), ("b", 2)]
    assert lendable(nodes, set(), set(), set(), reserve=0, nameable={("b", 2)}) == [("b", 2)]


def test_a_gpu_taken_back_rests_unlent_and_counts_toward_the_reserve():
    """``lendable``'s ``resting``: a GPU taken back is not lent, whether a slice came or not;
    one that no job holds is free for slices, so it counts toward the reserve."""
    from jupyter_gpushare.policy.lending import lendable
    from jupyter_gpushare.policy.model import BUILD

    nodes = [Node("b", 3, pool=BUILD)]
    # GPU 0 rests, free: it is the reserve, GPUs 1 and 2 are lent
    assert lendable(nodes, set(), set(), set(), reserve=1, resting={("b", 0)}) == \
        [("b", 1), ("b", 2)]
    # without a reserve it is still not lent
    assert lendable(nodes, set(), set(), set(), reserve=0, resting={("b", 0)}) == \
        [("b", 1), ("b", 2)]
    # its preempted job still leaving it: not lent, and not the reserve (GPU 2 is)
    assert lendable(nodes, set(), set(), {("b", 0), ("b", 1)}, reserve=1,
                    resting={("b", 0)}) == [("b", 1)]


def test_one_user_takes_back_at_most_so_many_lent_gpus_within_the_window():
    from jupyter_gpushare.policy.lending import take_back_wait

    assert take_back_wait([], NOW, 2, 600) == 0
    assert take_back_wait([NOW - 30], NOW, 2, 600) == 0
    # two within the window: the next once the older of them leaves it
    assert take_back_wait([NOW - 30, NOW - 400], NOW, 2, 600) == 200
    assert take_back_wait([NOW - 700, NOW - 30, NOW - 400], NOW, 2, 600) == 200
    assert take_back_wait([NOW - 30, NOW - 400], NOW, 3, 600) == 0
    assert take_back_wait([NOW - 30, NOW - 40], NOW, 1, 600) == 570
    assert take_back_wait([NOW - 30, NOW - 40], NOW, 1, 0) == 0  # no limit
