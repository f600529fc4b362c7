"""GPU activity in the simulator: utilization from a trace's util column or a published
profile, the figures made of it, and idle jobs taken first when GPUs are reclaimed."""

import random

import pytest

from jupyter_gpushare import cli
from jupyter_gpushare.policy.model import GPU
from jupyter_gpushare.sim import activity
from jupyter_gpushare.sim.engine import SimConfig, Simulator
from jupyter_gpushare.sim.metrics import summarize
from jupyter_gpushare.sim.trace import TraceJob


def tj(job_id, t, duration, gpus, project, util=None):
    return TraceJob(job_id, t, duration, gpus * GPU, project, util=util)


def test_utilization_by_hand():
    # Two 1-GPU jobs side by side on 2 GPUs for 100 s: one at 50 %, one idle.
    # Utilized: 50 GPU-s of 200 -> 25 %; allocated 100 %; idle-allocated 100 of 200 GPU-s.
    run = Simulator([tj("busy", 0, 100, 1, "p", 0.5), tj("idle", 0, 100, 1, "p", 0.0)],
                    {"p": 2 * GPU}, SimConfig(2, gpus_per_node=2)).run()
    s = summarize(run)
    assert (s["allocation"], s["avg_utilization"], s["utilization"], s["idle_allocated"]) == \
        (1.0, 0.25, 0.25, 0.5)


def test_without_activity_nothing_is_made_up():
    s = summarize(Simulator([tj("a", 0, 100, 1, "p")], {"p": GPU}, SimConfig(1)).run())
    assert s["avg_utilization"] is None and s["idle_allocated"] is None


@pytest.mark.parametrize("idle_first, victim", [(True, "old-idle"), (False, "new-busy")])
def test_an_idle_borrower_goes_first_once_the_pool_would_flag_it(idle_first, victim):
    # a (quota 0) borrows both GPUs: an idle job, then a busy one. b claims its quota of 1
    # after both ran beyond idle_job_after: one of a's jobs goes; without the idle flag,
    # the most recently started.
    jobs = [tj("old-idle", 0, 10_000, 1, "a", 0.0), tj("new-busy", 10, 10_000, 1, "a", 0.9),
            tj("claim", 4000, 100, 1, "b", 0.9)]
    run = Simulator(jobs, {"a": 0, "b": GPU},
                    SimConfig(2, gpus_per_node=2, idle_first=idle_first)).run()
    assert [j for j, r in run.records.items() if r.preemptions] == [victim]


def test_an_idle_job_is_not_flagged_before_idle_job_after():
    jobs = [tj("old-idle", 0, 10_000, 1, "a", 0.0), tj("new-busy", 10, 10_000, 1, "a", 0.9),
            tj("claim", activity.IDLE_JOB_AFTER_S - 100, 100, 1, "b", 0.9)]
    run = Simulator(jobs, {"a": 0, "b": GPU}, SimConfig(2, gpus_per_node=2)).run()
    assert [j for j, r in run.records.items() if r.preemptions] == ["new-busy"]


@pytest.mark.parametrize("profile, median, idle", [("philly", 0.484, 0.34), ("llm", 0.99, 0.32)])
def test_profiles_draw_the_published_median_and_idle_share(profile, median, idle):
    rng = random.Random(7)
    draws = sorted(activity.draw_util(profile, rng) for _ in range(20_000))
    assert abs(draws[len(draws) // 2] - median) < 0.02
    share = sum(u < activity.IDLE_THRESHOLD for u in draws) / len(draws)
    assert abs(share - idle) < 0.02


def write(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(text)
    return str(path)


def test_bad_util_is_one_sentence_and_status_2(tmp_path, capsys):
    path = write(tmp_path, "job_id,submit_time,duration,gpus,project,util\na,0,10,1,p,150\n")
    assert cli.main(["simulate", "--trace", path, "--capacity", "4"]) == 2
    err = capsys.readouterr().err
    assert err == (f"gpushare simulate: {path}, line 2: util is the job's GPU utilization in "
                   f"percent, from 0 to 100, not 150\n")


def test_some_jobs_without_util_need_a_profile(tmp_path, capsys):
    path = write(tmp_path, "job_id,submit_time,duration,gpus,project,util\n"
                           "a,0,10,1,p,50\nb,0,10,1,p,\n")
    assert cli.main(["simulate", "--trace", path, "--capacity", "4"]) == 2
    assert "1 of 2 train jobs have no util; fill the column in, or give --activity" in \
        capsys.readouterr().err
    assert cli.main(["simulate", "--trace", path, "--capacity", "4", "--activity", "llm",
                     "--json"]) == 0
    assert '"jobs_with_util": 1' in capsys.readouterr().out


def test_activity_is_printed_with_the_figures(tmp_path, capsys):
    path = write(tmp_path, "job_id,submit_time,duration,gpus,project,util\na,0,100,1,p,40\n")
    assert cli.main(["simulate", "--trace", path, "--capacity", "2"]) == 0
    assert "average GPU utilization 20.0% (of what was allocated 40.0%, idle-allocated 0.0%); " \
           "job activity: the trace's util column (1 jobs)" in capsys.readouterr().out


def test_a_job_on_lent_build_gpus_counts_toward_no_quota_in_the_simulator():
    """As in the pool: p's job on lent GPUs is not its usage, so taking it back (the build
    pool wants its GPUs) is no within-quota preemption, even once p's other job ended."""
    from jupyter_gpushare.policy.model import Node, PolicyConfig
    from jupyter_gpushare.sim.trace import TraceJob

    train = (Node("n0", 2),)
    jobs = [TraceJob("A", 0, 10, 2 * GPU, "p"), TraceJob("B", 1, 1000, 2 * GPU, "p")]
    sim = Simulator(jobs, {"p": 2 * GPU}, SimConfig(capacity_gpus=2,
                                                    policy_config=PolicyConfig(min_runtime_s=0)),
                    nodes=train + (Node("b0/lent", 2, lent=True),))

    def take_back(t):
        sim.nodes = train + (Node("b0/lent", 0, lent=True),)
        sim.changed(t)
    sim.at(20, take_back)
    run = sim.run()
    assert run.records["B"].preemptions == 1
    assert run.within_quota_preemptions == 0
