"""Fair share over time (issue 22, part 2; policy/past_use.py): borrowing decayed by a
half-life scales each hungry project's share of the idle GPUs; quotas stay guaranteed; the
borrowed GPU-time the service counts survives a restart."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

import pytest

from builders import cluster, pending, project, running, started
from hubtest import refused_at_start
from jupyter_gpushare.policy import PolicyConfig, cycle
from jupyter_gpushare.policy.model import GPU
from jupyter_gpushare.policy.past_use import (MAX_FACTOR, MIN_FACTOR, FairShareTime, PastUse,
                                              account, borrowed, weight_factors)
from jupyter_gpushare.sim.engine import SimConfig, Simulator
from jupyter_gpushare.sim.metrics import borrow_gaps, fair_targets, summarize
from jupyter_gpushare.sim.trace import TraceJob

DAY = 86400.0


# -- the decayed use ----------------------------------------------------------------------

def test_use_counts_half_after_a_half_life_and_nothing_beyond_the_window():
    clock = FairShareTime(half_life_s=DAY, window_s=7 * DAY)
    past = PastUse(clock)
    past.add("a", 0.0, 3600.0, GPU)  # one GPU for the first hour: its bucket's middle is 1800
    assert past.decayed(1800.0) == {"a": 3600.0}
    assert past.decayed(1800.0 + DAY)["a"] == pytest.approx(1800.0)
    assert past.decayed(1800.0 + 3 * DAY)["a"] == pytest.approx(450.0)
    assert past.decayed(8 * DAY) == {}  # the bucket left the window
    past.forget_before(8 * DAY)
    assert past.buckets == {}


def test_a_long_interval_is_split_into_its_buckets():
    past = PastUse(FairShareTime(half_life_s=DAY, window_s=7 * DAY))  # hourly buckets
    added = past.add("a", 1800.0, 3 * 3600.0 + 900.0, 2 * GPU)
    assert added == {0: 1800.0 * 2 * GPU, 1: 3600.0 * 2 * GPU, 2: 3600.0 * 2 * GPU,
                     3: 900.0 * 2 * GPU}
    assert past.add("a", 10.0, 10.0, GPU) == {}


def test_borrowing_is_counted_beyond_the_quota_alone():
    """``account``, what the service's loop and the simulator count past use with: only
    what a project holds beyond its quota, each bucket its own part."""
    past = PastUse(FairShareTime(half_life_s=DAY, window_s=7 * DAY))  # hourly buckets
    usage = {"a": 3 * GPU, "b": 2 * GPU, "c": GPU, "d": GPU}
    quotas = {"a": GPU, "b": 2 * GPU, "c": 2 * GPU}  # d has none
    assert borrowed(usage, quotas) == {"a": 2 * GPU, "d": GPU}
    added = account(past, usage, quotas, 1800.0, 5400.0)
    assert added == {("a", 0): 1800.0 * 2 * GPU, ("a", 1): 1800.0 * 2 * GPU,
                     ("d", 0): 1800.0 * GPU, ("d", 1): 1800.0 * GPU}
    assert set(past.buckets) == {"a", "d"}
    assert account(past, usage, quotas, 5400.0, 5400.0) == {}


def test_the_decayed_use_is_the_same_read_once_or_every_minute():
    """The closed buckets are summed once per bucket; reading at any time, whatever was read
    or added before, gives what a sum over all buckets gives."""
    for window in (2 * DAY, 5000.0):  # hourly-ish buckets; and a window no bucket divides
        clock = FairShareTime(half_life_s=6 * 3600.0, window_s=window)
        cached, fresh = PastUse(clock), PastUse(clock)
        for minute in range(0, 3 * 24 * 60, 7):
            t = minute * 60.0
            for p, gpus in (("a", minute % 3), ("b", 2)):
                cached.add(p, t - 420.0, t, gpus * GPU)
                fresh.add(p, t - 420.0, t, gpus * GPU)
            if minute % 91 == 0:  # now and then, into a bucket already closed
                cached.add("b", t - 3 * clock.bucket_s, t - 2 * clock.bucket_s, GPU)
                fresh.add("b", t - 3 * clock.bucket_s, t - 2 * clock.bucket_s, GPU)
            if minute % 200 == 0:
                cached.forget_before(t)
                fresh.forget_before(t)
            got = cached.decayed(t)
            want = PastUse(clock, [(p, b, v) for p, per in fresh.buckets.items()
                                   for b, v in per.items()]).decayed(t)
            assert got.keys() == want.keys()
            for p in want:
                assert got[p] == pytest.approx(want[p], rel=1e-9)


def test_weights_scale_by_due_share_over_used_share_within_bounds():
    assert weight_factors({"a": 1, "b": 1}, {}) == {"a": 1.0, "b": 1.0}
    f = weight_factors({"a": 1, "b": 1, "c": 2}, {"a": 50.0, "b": 25.0, "c": 25.0})
    assert f["a"] == pytest.approx(0.5) and f["b"] == pytest.approx(1.0)
    assert f["c"] == pytest.approx(2.0)  # half the weights, a quarter of the use
    f = weight_factors({"a": 1, "b": 1}, {"a": 1000.0, "b": 0.0})
    assert f == {"a": max(MIN_FACTOR, 0.5), "b": MAX_FACTOR}


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), 1e300])
def test_a_half_life_that_is_not_a_positive_number_is_refused(bad):
    with pytest.raises(ValueError, match="half-life must be a positive number"):
        FairShareTime(bad)


# -- the policy ---------------------------------------------------------------------------

def snapshot(past):
    # 8 GPUs: a and b (quota 2 each) run their quotas; 4 GPUs are idle, each wants 4 more.
    return replace(cluster(nodes=1, gpus_per_node=8)
                   .projects(project("a").quota(2), project("b").quota(2))
                   .jobs(running("a0", "a", 2, 0), running("b0", "b", 2, 0),
                         *(pending(f"a{i}", "a", gpus=1, submitted=10 + i) for i in range(1, 5)),
                         *(pending(f"b{i}", "b", gpus=1, submitted=20 + i) for i in range(1, 5)))
                   .at(100), past_use=past)


def test_without_past_use_the_idle_gpus_are_split_by_weight():
    result = cycle(snapshot({}), PolicyConfig())
    assert sorted(started(result)) == ["a1", "a2", "b1", "b2"]
    assert result.deserved == {"a": 4 * GPU, "b": 4 * GPU}


def test_a_project_that_borrowed_more_lately_gets_less_of_the_idle_gpus():
    # a borrowed three times what b did: a's weight counts 2/3, b's 2 (1/2 over 1/4).
    result = cycle(snapshot({"a": 3000.0, "b": 1000.0}), PolicyConfig())
    assert abs(result.deserved["a"] - 3 * GPU) <= 1 and abs(result.deserved["b"] - 5 * GPU) <= 1
    assert sorted(started(result)) == ["a1", "b1", "b2", "b3"]


@pytest.mark.parametrize("past", [{"a": 1e9}, {"a": 1e9, "b": 1.0}, {"b": 1e9}])
def test_past_use_never_touches_a_quota(past):
    # b borrows the whole pool; a, within its quota of 4, takes its 4 back by reclaim, and
    # both deserve at least their quota, whoever borrowed what lately.
    snap = (cluster(nodes=1, gpus_per_node=8)
            .projects(project("a").quota(4), project("b").quota(4))
            .jobs(running("b0", "b", 4, 0), running("b1", "b", 4, 10),
                  pending("a1", "a", gpus=4, submitted=5), pending("b2", "b", gpus=4, submitted=1))
            .at(100))
    result = cycle(replace(snap, past_use=past), PolicyConfig())
    assert result.deserved["a"] >= 4 * GPU and result.deserved["b"] >= 4 * GPU
    assert [(p.job, p.for_job, p.kind) for p in result.preemptions] == [("b1", "a1", "guarantee")]


# -- the simulator ------------------------------------------------------------------------

def catching_up():
    """a (quota 0) wants 8 GPUs from day 0, b (quota 0) from day 3 on; 8 one-GPU nodes."""
    jobs = [TraceJob(f"a{i:03d}-{k}", i * 3600.0, 3600.0, GPU, "a")
            for i in range(7 * 24) for k in range(8)]
    jobs += [TraceJob(f"b{i:03d}-{k}", i * 3600.0, 3600.0, GPU, "b")
             for i in range(3 * 24, 7 * 24) for k in range(8)]
    return jobs


def gpu_hours_per_day(run, day):
    got = {"a": 0.0, "b": 0.0}
    for (t, alloc, _), (t2, _, _) in zip(run.timeline, run.timeline[1:]):
        lo, hi = max(t, day * DAY), min(t2, (day + 1) * DAY)
        if hi > lo:
            for p in got:
                got[p] += alloc.get(p, 0) / GPU * (hi - lo) / 3600
    return {p: round(v) for p, v in got.items()}


def test_the_project_that_borrowed_nothing_lately_catches_up_then_both_share_evenly():
    jobs, quotas = catching_up(), {"a": 0, "b": 0}
    plain = Simulator(jobs, quotas, SimConfig(8, gpus_per_node=1, cycle_interval_s=10),
                      timeline=True).run()
    timed = Simulator(jobs, quotas, SimConfig(8, gpus_per_node=1, cycle_interval_s=10,
                                              fair_share=FairShareTime(DAY)),
                      timeline=True).run()
    # Measured: plain 96/96 every day; fair share over time 52/140 on day 3, 88/104 on day 4,
    # then 96/96 once the decayed uses are even.
    assert gpu_hours_per_day(plain, 3) == {"a": 96, "b": 96}
    day3 = gpu_hours_per_day(timed, 3)
    assert day3["b"] > 2 * day3["a"] and day3["a"] + day3["b"] == 192
    day6 = gpu_hours_per_day(timed, 6)
    assert abs(day6["a"] - day6["b"]) <= 8
    assert summarize(timed)["within_quota_preemptions"] == 0
    # The week's borrowing is closer to the weights: b got more of what it wanted.
    gap = lambda run: borrow_gaps(run)[0]["gap"]  # noqa: E731
    assert gap(timed) < gap(plain)


def test_the_simulator_counts_borrowing_and_wanting_by_week_from_an_odd_first_submit():
    # a (quota 0) borrows 2 GPUs for 8 days from t = 36.034 s; b (quota 2) runs its 2 and
    # wants 2 more for the first day. Weeks count from the first submit; a week boundary
    # that floats place just short of itself must not stop the run.
    first = 36.034
    jobs = [TraceJob("a1", first, 8 * DAY, 2 * GPU, "a"),
            TraceJob("b1", first, 8 * DAY, 2 * GPU, "b"),
            TraceJob("b2", first, DAY, 4 * GPU, "b")]  # never fits beside a and b1: waits
    run = Simulator(jobs, {"a": 0, "b": 2 * GPU}, SimConfig(4, gpus_per_node=4)).run()
    week = 7 * DAY
    assert run.borrowed_s[0]["a"] == pytest.approx(2 * week)
    assert run.borrowed_s[1]["a"] == pytest.approx(2 * DAY)
    assert "b" not in run.borrowed_s[0]  # within its quota all along
    assert run.wanted_s[0]["a"] == pytest.approx(2 * week)
    assert run.wanted_s[0]["b"] == pytest.approx(4 * week)  # b2 waits all week, and after
    assert run.records["b2"].finish is not None


def test_a_borrower_counts_until_it_is_told_to_stop():
    # a (quota 0) holds all 4 GPUs from 0; b's job within quota takes them back at 1000 s.
    # a borrowed 4 GPUs for 1000 s (its grace is not borrowing: the GPUs are on their way
    # back); then, requeued, it wants them again.
    jobs = [TraceJob("a1", 0.0, 5000.0, 4 * GPU, "a"), TraceJob("b1", 1000.0, 500.0, 4 * GPU, "b")]
    run = Simulator(jobs, {"a": 0, "b": 4 * GPU}, SimConfig(4, gpus_per_node=4)).run()
    assert run.records["a1"].preemptions == 1
    # b1 starts after the grace, at 1030 s, and ends at 1530 s; a1 starts again then and runs
    # its 5000 s again (no checkpoint in 1030 s).
    assert run.records["a1"].finish == 1530.0 + 5000.0
    assert run.borrowed_s[0]["a"] == pytest.approx(4 * 1000.0 + 4 * 5000.0)
    assert run.wanted_s[0]["a"] == pytest.approx(4 * 1000.0 + 4 * 500.0 + 4 * 5000.0)


def test_fair_targets_cap_what_a_project_wanted_and_give_the_rest_by_weight():
    assert fair_targets(10.0, {"a": 1, "b": 1}, {"a": 2.0, "b": 100.0}) == {"a": 2.0, "b": 8.0}
    assert fair_targets(10.0, {"a": 1, "b": 3}, {"a": 100.0, "b": 100.0}) == \
        {"a": 2.5, "b": 7.5}


# -- the service --------------------------------------------------------------------------

def exposition(store, scheduler) -> str:
    """The pool's metrics as the service exposes them, checked by promtool where it is."""
    import shutil
    import subprocess

    from prometheus_client import CollectorRegistry, generate_latest

    from jupyter_gpushare.pool.metrics import _PoolCollector

    registry = CollectorRegistry()
    registry.register(_PoolCollector(store, scheduler))
    text = generate_latest(registry).decode()
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "metrics"], input=text,
                               capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
    return text


@pytest.mark.asyncio
async def test_the_borrowed_gpu_time_is_kept_in_the_store_and_survives_a_restart(tmp_path):
    from test_pool_loop import TwoGPUs, submit

    from jupyter_gpushare.backends import Launch
    from jupyter_gpushare.pool.train.scheduler import Scheduler
    from jupyter_gpushare.pool.store.models import ProjectRow
    from jupyter_gpushare.pool.store.database import Store

    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    store.quotas.add_missing_projects([ProjectRow(name="x", quota=0, groups=["x"])])
    backend = TwoGPUs(state_dir=str(tmp_path / "state"), run_as_service_user=True)

    def launch_for(row):
        return Launch(row.id, row.attempt, row.user, row.project, tuple(row.command),
                      dict(row.env), dict(row.placement), str(tmp_path / "ckpt" / row.id),
                      str(tmp_path))

    clock = FairShareTime(half_life_s=3600.0, window_s=DAY)

    def scheduler():
        s = Scheduler(store, backend, PolicyConfig(), grace_s=3.0, launch_for=launch_for,
                      log=logging.getLogger("test"), fair_share=clock)
        s.SAVE_EVERY_S = 0.0  # every cycle, for the test
        return s

    first = scheduler()
    job = submit(store, "x", "sleep 30")
    try:
        for _ in range(6):
            await first.tick()
            await asyncio.sleep(0.1)
        assert store.jobs.get(job.id).state == "running"
        kept = store.past_use.buckets(round(clock.bucket_s), 0)
        assert [p for p, _, _ in kept] == ["x"]
        borrowed = sum(v for _, _, v in kept) / GPU  # GPU-seconds: 2 GPUs since it started
        assert borrowed > 0
        again = scheduler()  # a restart reads what was kept
        await again.tick()  # the first cycle after it counts nothing yet
        now = time.time()
        assert again.past.decayed(now)["x"] == pytest.approx(first.past.decayed(now)["x"])
        text = exposition(store, again)
        line = next(x for x in text.splitlines()
                    if x.startswith('gpushare_project_recent_borrowed_gpu_seconds{project="x"}'))
        assert float(line.split()[-1]) > 0
        assert "gpushare_project_recent_borrowed" not in exposition(
            store, Scheduler(store, backend, PolicyConfig(), grace_s=3.0, launch_for=launch_for))
    finally:
        await backend.stop(job.id, 1, 0.1)


@pytest.mark.parametrize("line, sentence", [
    ("c.PoolService.fair_share_half_life = -1",
     "PoolService.fair_share_half_life is -1.0: give a number of seconds from 0 to 31622400 "
     "(a year), 0 to turn fair share over time off."),
    ("c.PoolService.fair_share_window = 10",
     "PoolService.fair_share_window is 10.0: give a number of seconds from 60 to 31622400 "
     "(a year)."),
    ("c.PoolService.fair_share_window = 1e300",
     "PoolService.fair_share_window is 1e+300: give a number of seconds from 60 to 31622400"),
    ("c.PoolService.fair_share_half_life = float('nan')",
     "PoolService.fair_share_half_life is nan: give a number of seconds from 0"),
])
def test_the_service_does_not_start_with_a_bad_fair_share_setting(line, sentence, tmp_path,
                                                                  capsys):
    assert sentence in refused_at_start(line + "\n", tmp_path, capsys)
