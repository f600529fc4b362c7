"""The simulator around the policy: lost work, baselines, events, and a slice of Philly."""

import io
import json
from pathlib import Path

import pytest

from jupyter_gpushare.policy import Department, Snapshot
from jupyter_gpushare.policy.model import DEFAULT_MIN_RUNTIME_S, GPU, PolicyConfig
from jupyter_gpushare.sim.engine import SimConfig, Simulator, make_nodes
from jupyter_gpushare.sim.metrics import percentile, summarize
from jupyter_gpushare.sim.trace import (TraceJob, apportion, departments_problem, hold_projects,
                                        read_departments, read_quotas, read_trace)


def tj(job_id, t, duration, gpus, project):
    return TraceJob(job_id, t, duration, gpus * GPU, project)


def simulate(jobs, quotas, capacity=8, **kw):
    events = io.StringIO()
    run = Simulator(jobs, {p: q * GPU for p, q in quotas.items()},
                    SimConfig(capacity, **kw), events=events).run()
    return summarize(run), [json.loads(line) for line in events.getvalue().splitlines()]


def test_borrower_loses_work_since_checkpoint_plus_grace():
    # A borrows all 8 GPUs; at t=4000 B claims its quota of 4. With checkpoints every 1800 s
    # and a grace of 30 s, A keeps the work up to 3600 s and loses 4030 - 3600 = 430 s on 8 GPUs.
    jobs = [tj("a", 0, 10_000, 8, "A"), tj("b", 4000, 1000, 4, "B")]
    summary, events = simulate(jobs, {"A": 4, "B": 4}, checkpoint_interval_s=1800, grace_s=30)
    assert summary["preemptions"] == 1
    assert summary["within_quota_preemptions"] == 0
    assert summary["lost_gpu_hours"] == pytest.approx(8 * 430 / 3600, abs=0.01)
    starts = {(e["job"], e["attempt"]): e["t"] for e in events if e["event"] == "start"}
    assert starts[("b", 1)] == 4030  # one cycle plus the grace period
    assert summary["p99_reclaim_s"] == 30
    # A resumes once B is done and runs the 6400 s it had left: 5030 + 6400.
    assert starts[("a", 2)] == 5030
    finish = {e["job"]: e["t"] for e in events if e["event"] == "finish"}
    assert finish["a"] == 5030 + 10_000 - 3600


def test_events_are_in_time_order_and_starts_carry_placement():
    jobs = [tj(f"j{i}", i * 10, 500 + i, 1 + i % 4, "AB"[i % 2]) for i in range(40)]
    _, events = simulate(jobs, {"A": 4, "B": 4}, capacity=16)
    times = [e["t"] for e in events]
    assert times == sorted(times)
    for e in events:
        assert set(e) >= {"t", "event", "job", "project", "gpus"}
        if e["event"] == "start":
            assert sum(e["placement"].values()) == e["gpus"]
    by_job = {}
    for e in events:
        by_job.setdefault(e["job"], []).append(e["event"])
    assert all(seq[0] == "submit" and seq[-1] == "finish" for seq in by_job.values())


def test_static_confines_projects_and_reports_jobs_above_quota():
    jobs = [tj("big", 0, 100, 6, "A"), tj("a1", 0, 100, 2, "A"), tj("a2", 0, 100, 2, "A"),
            tj("b1", 0, 100, 1, "B")]
    summary, events = simulate(jobs, {"A": 2, "B": 6}, policy="static")
    assert summary["unschedulable"] == 1 and summary["completed"] == 3
    starts = {e["job"]: e["t"] for e in events if e["event"] == "start"}
    assert starts["a1"] == 0 and starts["a2"] == 100  # never more than A's quota at once
    assert summary["preemptions"] == 0


def test_fifo_never_preempts_and_ignores_quotas():
    jobs = [tj("a", 0, 1000, 8, "A"), tj("b", 10, 100, 4, "B")]
    summary, events = simulate(jobs, {"A": 4, "B": 4}, policy="fifo")
    starts = {e["job"]: e["t"] for e in events if e["event"] == "start"}
    assert summary["preemptions"] == 0 and starts["b"] == 1000


class JobsTupleSimulator(Simulator):
    """Hands the policy a plain tuple of jobs instead of the maintained queues."""

    def snapshot(self, t):
        return Snapshot(t, self.nodes, self.projects, self.active.jobs())


def test_maintained_queues_decide_exactly_as_a_plain_job_list(example):
    jobs = read_trace(example[0])
    quotas = read_quotas(example[1])
    outputs = []
    for cls in (Simulator, JobsTupleSimulator):
        buf = io.StringIO()
        cls(jobs, quotas, SimConfig(32), events=buf).run()
        outputs.append(buf.getvalue())
    assert outputs[0] == outputs[1]
    assert '"preempt"' in outputs[0]  # the example exercises reclaim


def test_json_has_every_contract_key(example):
    run = Simulator(read_trace(example[0]), read_quotas(example[1]), SimConfig(32)).run()
    summary = summarize(run)
    for key in ("policy", "capacity_gpus", "jobs", "completed", "span_s", "allocation",
                "avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_queue_s", "p99_queue_s",
                "preemptions", "lost_gpu_hours", "allocation_to_last_submit", "within_quota_preemptions", "p99_reclaim_s",
                "decision_ms", "wall_s", "per_project"):
        assert key in summary
    assert set(summary["decision_ms"]) == {"p50", "p99", "max"}
    assert 0 < summary["allocation"] <= 1
    assert summary["completed"] == summary["jobs"] == 375


@pytest.mark.parametrize("min_runtime", [0.0, DEFAULT_MIN_RUNTIME_S, 300.0])
def test_guarantee_holds_on_a_slice_of_philly(philly, min_runtime):
    # The bound: one cycle plus the grace period, plus the minimum runtime.
    trace, quotas = philly
    jobs = read_trace(trace)[:3000]
    config = SimConfig(256, cycle_interval_s=1.0,
                       policy_config=PolicyConfig(min_runtime_s=min_runtime))
    run = Simulator(jobs, apportion(read_quotas(quotas), 256), config).run()
    summary = summarize(run)
    assert summary["completed"] == 3000
    assert summary["preemptions"] > 0  # contention happened ...
    assert summary["within_quota_preemptions"] == 0  # ... and the guarantee held
    bound = config.grace_s + config.cycle_interval_s + min_runtime
    assert max(run.reclaim_s) <= bound
    # From the first cycle that finds a job within quota and waiting, a cycle more (one to
    # claim, one to start): the simulator's own report of the bound, and what it measured.
    assert summary["guarantee_bound_s"] == bound + config.cycle_interval_s
    assert summary["guarantee_waits"] > 100
    assert summary["guarantee_wait_max_s"] <= summary["guarantee_bound_s"]
    assert summary["guarantee_waits_over_bound"] == 0
    if min_runtime >= 60:  # no attempt younger than the minimum is ever preempted
        assert summary["preemptions_under_60s"] == 0


def test_the_guarantee_wait_counts_from_wanting_not_from_the_reclaim():
    # b (quota 4) wants its GPUs at 5 s; a's borrower is young until 30 s, is reclaimed then
    # and gone after the 30 s grace: b waited 55 s, of which the reclaim took 30 s.
    jobs = [TraceJob("borrower", 0.0, 1000.0, 4 * GPU, "a"),
            TraceJob("owed", 5.0, 100.0, 4 * GPU, "b")]
    config = SimConfig(4, gpus_per_node=4, policy_config=PolicyConfig(min_runtime_s=30.0))
    run = Simulator(jobs, {"a": 0, "b": 4 * GPU}, config).run()
    assert run.guarantee_wait_s == [55.0] and run.reclaim_s == [30.0]
    summary = summarize(run)
    assert summary["guarantee_bound_s"] == 60.0 and summary["guarantee_waits_over_bound"] == 0


def test_a_wait_within_quota_ends_when_the_projects_later_job_takes_the_room():
    # a (quota 4) holds 2 GPUs on each node once a1 and a3 end; b's gang of 4 (quota 4) is
    # within quota at 10 s but finds no node with 4 free, and nothing to reclaim. Without
    # moves, b's later 2-GPU job starts at 20 s: b got GPUs within its quota, and the gang
    # would now borrow, so its wait ends there (10 s), not when the gang starts at 1,000 s.
    # Once that job ends (120 s) the gang is within quota again: a new wait, to 1,000 s.
    # With moves (the default) a2 moves and the gang starts after the grace: one 30 s wait.
    jobs = [TraceJob("a1", 0.0, 5.0, 2 * GPU, "a"), TraceJob("a2", 0.0, 1000.0, 2 * GPU, "a"),
            TraceJob("a3", 0.0, 5.0, 2 * GPU, "a"), TraceJob("a4", 0.0, 1000.0, 2 * GPU, "a"),
            TraceJob("gang", 10.0, 100.0, 4 * GPU, "b"),
            TraceJob("later", 20.0, 100.0, 2 * GPU, "b")]
    quotas = {"a": 4 * GPU, "b": 4 * GPU}
    config = SimConfig(8, gpus_per_node=4, policy_config=PolicyConfig(consolidate=False))
    run = Simulator(jobs, quotas, config).run()
    assert run.records["later"].attempt_start == 20.0
    assert run.records["gang"].attempt_start == 1000.0
    assert run.guarantee_wait_s == [10.0, 880.0]
    run = Simulator(jobs, quotas, SimConfig(8, gpus_per_node=4)).run()
    assert run.moves == 1 and run.records["gang"].attempt_start == 40.0
    assert run.guarantee_wait_s == [30.0] and run.reclaim_s == [30.0]


def test_a_young_jobs_wake_up_is_one_cycle_however_many_cycles_ran_before_it():
    # One borrower becomes preemptible at 30 s; 200 submits come before that, each with a
    # cycle of its own. The wake-up is one cycle at 30 s, not one per cycle before it (each
    # cycle asked for it again, and every copy at 30 s asked for the next wake-up: a burst of
    # 1,000 jobs never ended).
    jobs = [TraceJob("young", 0.0, 5000.0, 4 * GPU, "a")]
    jobs += [TraceJob(f"j{i:03d}", 1.0 + i / 10, 100.0, GPU, "b") for i in range(200)]
    config = SimConfig(4, gpus_per_node=4, policy_config=PolicyConfig(min_runtime_s=30.0))
    run = Simulator(jobs, {"a": 0, "b": 4 * GPU}, config).run()
    assert all(r.finish is not None for r in run.records.values())
    # A cycle per submit, finish and release, and the one wake-up; nothing per copy.
    events = len(jobs) + sum(r.attempt for r in run.records.values()) + 1
    assert len(run.decision_s) <= events


def test_allocation_to_the_last_submit_leaves_out_the_drain_after_it():
    # Both GPUs busy until the last submit at 100 s, then one job alone for 900 s: the whole
    # run's allocation counts the drain, the figure to the last submit does not. a preempted
    # borrower's attempt that spans the last submit counts only its part before it.
    jobs = [TraceJob("a", 0.0, 100.0, 2 * GPU, "x"), TraceJob("b", 100.0, 900.0, GPU, "x")]
    summary = summarize(Simulator(jobs, {"x": 2 * GPU}, SimConfig(2, gpus_per_node=2)).run())
    assert summary["allocation"] == round((200 + 900) / (2 * 1000), 4)
    assert summary["allocation_to_last_submit"] == 1.0
    jobs = [TraceJob("borrow", 0.0, 1000.0, 2 * GPU, "x"), TraceJob("own", 50.0, 10.0, 2 * GPU, "y")]
    run = Simulator(jobs, {"x": 0, "y": 2 * GPU}, SimConfig(2, gpus_per_node=2)).run()
    assert run.records["borrow"].preemptions == 1  # reclaimed at 50 s, gone at 80 s (grace)
    assert summarize(run)["allocation_to_last_submit"] == 1.0  # 2 GPUs held 0..50 s


def test_percentile_nearest_rank():
    assert percentile([], 99) == 0.0
    assert percentile([5.0], 50) == 5.0
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile(list(range(1, 101)), 50) == 50


def test_nodes_cover_the_capacity():
    nodes = make_nodes(20, 8)
    assert [n.gpus for n in nodes] == [8, 8, 4]
    assert len({n.name for n in nodes}) == 3


@pytest.mark.parametrize("claim_at, outcome", [(80, "finished"), (50, "requeued")])
def test_a_victim_whose_work_ends_within_its_grace_finishes_and_is_never_rerun(claim_at,
                                                                               outcome):
    # A borrows both GPUs for 100 s; B claims its quota at claim_at with a 30 s grace. At 80
    # A's work ends (at 100) within the grace: it exits 0 by itself and has finished, as the
    # service records it (tests/test_pool_loop.py). At 50 the grace ends first: requeued.
    jobs = [tj("a", 0, 100, 2, "A"), tj("b", claim_at, 10, 2, "B")]
    summary, events = simulate(jobs, {"A": 0, "B": 2}, capacity=2, grace_s=30,
                               checkpoint_interval_s=0)
    starts = [(e["job"], e["attempt"]) for e in events if e["event"] == "start"]
    assert summary["preemptions"] == 1
    if outcome == "finished":
        assert starts == [("a", 1), ("b", 1)]
        assert summary["finished_while_preempted"] == 1 and summary["lost_gpu_hours"] == 0
        finish = {e["job"]: e["t"] for e in events if e["event"] == "finish"}
        assert finish["a"] == 100
    else:
        assert starts == [("a", 1), ("b", 1), ("a", 2)]
        assert summary["finished_while_preempted"] == 0
        assert summary["lost_gpu_hours"] == pytest.approx(2 * 80 / 3600, abs=0.01)


def test_a_projects_idle_quota_goes_to_its_sibling_before_another_department():
    # a (quota 4) is idle; b (quota 0, a's sibling) and c (quota 4, in another department)
    # each want 8 GPUs at once. On one level a's 4 idle GPUs are shared by weight, b 2 and c
    # 2; with departments they are d1's, so b has them all. x, named only in d2, has quota 0.
    jobs = [tj(f"c{i}", 0, 1000, 1, "c") for i in range(8)]
    jobs += [tj(f"b{i}", 0, 1000, 1, "b") for i in range(8)]
    two = {Department("d1", 4 * GPU): ("a", "b"), Department("d2", 4 * GPU): ("c", "x")}
    held = []
    for departments in (None, two):
        events = io.StringIO()
        run = Simulator(jobs, {"a": 4 * GPU, "c": 4 * GPU}, SimConfig(8), events=events,
                        departments=departments).run()
        first = {}
        for e in map(json.loads, events.getvalue().splitlines()):
            if e["event"] == "start" and e["t"] == 0:
                first[e["project"]] = first.get(e["project"], 0) + e["gpus"]
        held.append(first)
    assert held == [{"b": 2, "c": 6}, {"b": 4, "c": 4}]
    assert run.quotas == {"a": 4 * GPU, "b": 0, "c": 4 * GPU, "x": 0}
    assert {p.name: p.department for p in Simulator(jobs, {}, SimConfig(8),
                                                    departments=two).projects} == \
        {"a": "d1", "b": "d1", "c": "d2", "x": "d2"}
    summary = summarize(run)
    assert summary["within_quota_preemptions"] == 0
    assert summary["departments"]["d1"] == {
        "quota_gpus": 4.0, "limit_gpus": None, "over_quota_weight": 1, "projects": ["a", "b"],
        "jobs": 8, "gpu_hours": round(8 * 1000 / 3600, 2),
        "avg_allocated_gpus": 4.0, "avg_queue_s": 500.0, "preemptions": 0}  # 8 GPU-ks in 2 ks


def test_departments_are_for_the_guaranteed_policy():
    with pytest.raises(ValueError, match="departments are for the guaranteed policy"):
        Simulator([tj("a", 0, 10, 1, "a")], {}, SimConfig(8, policy="static"),
                  departments={Department("d", 0): ("a",)})


def test_philly_departments_hold_exactly_their_projects_scaled_quotas(philly):
    # docs/howto/simulate.md: each department's quota is its projects' quotas scaled to 512.
    quotas = apportion(read_quotas(philly[1]), 512)
    departments = read_departments(Path(__file__).parents[1] / "benchmarks" /
                                   "philly_departments.csv")
    assert {p for names in departments.values() for p in names} == set(quotas)
    assert all(d.quota == sum(quotas[p] for p in names) for d, names in departments.items())
    assert hold_projects(departments, quotas) == (departments, [])
    assert departments_problem(departments, quotas, 512 * GPU) is None
