"""Lent build GPUs as properties of the team scenario (one week, random teams, pools and
settings), which lends and takes back as the pool does and decides with the pool's own
cycle: no build session waits longer than the grace period and a cycle; no job within its
project's quota is ever preempted, lending or not; only jobs beyond their project's quota
start on lent GPUs. (A slice is never preempted: only jobs are, the take-back included.)"""

from __future__ import annotations

import os
from dataclasses import replace

from hypothesis import given, note, settings
from hypothesis import strategies as st

from jupyter_gpushare.sim.engine import on_lent
from jupyter_gpushare.sim.team import TeamParameters, load_jobs, make_team
from jupyter_gpushare.sim.team_run import TeamRun

SETTINGS = settings(max_examples=int(os.environ.get("GPUSHARE_EXAMPLES", 150)) // 5 or 1,
                    deadline=None)
JOBS = load_jobs()


@st.composite
def teams(draw):
    """One build server, large enough that every researcher can hold a slice at once (as in
    the scenario): a wait beyond the bound is then lending's, not a full build pool's."""
    researchers = draw(st.integers(2, 12))
    build = draw(st.sampled_from([g for g in (4, 8) if g * 4 >= researchers]))
    train = draw(st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=4))
    return replace(
        TeamParameters(weeks=1),
        researchers=researchers,
        projects=draw(st.integers(1, 4)),
        servers=(*train, build),
        build_servers=1,
        build_reserve=draw(st.integers(0, 2)),
        grace_s=draw(st.sampled_from([5.0, 30.0, 120.0])),
        cycle_interval_s=draw(st.sampled_from([1.0, 10.0, 30.0])),
        leave_open=draw(st.sampled_from([0.0, 0.5, 1.0])),
        seed=draw(st.integers(0, 10**6)))


@SETTINGS
@given(teams(), st.sampled_from([0.5, 2.0, 8.0]))
def test_lending_keeps_sessions_quick_and_the_guarantee_whole(p, demand):
    p = replace(p, projects=min(p.projects, p.researchers))
    note(f"{p}, demand {demand}")
    run = TeamRun(p, make_team(p), JOBS, "gpushare", demand, "philly")
    sim, decide, lent_starts = run.sim, run.sim.decide, []

    def checked(snap):
        """Each start on lent GPUs is a borrower's: its project holds its quota or more of
        the train pool's own GPUs without it (what ran before the cycle, not being preempted,
        and what the cycle started there before it)."""
        result = decide(snap)
        quota = {q.name: q.quota for q in snap.projects}
        own = {}
        for job in snap.queues.jobs() if snap.queues is not None else snap.jobs:
            if job.running and not job.preempting and not on_lent(job.placement):
                own[job.project] = own.get(job.project, 0) + job.gpus
        gpus = {job.id: job for job in (snap.queues.jobs() if snap.queues is not None
                                        else snap.jobs)}
        for start in result.starts:
            job = gpus[start.job]
            if on_lent(start.placement):
                lent_starts.append(job.id)
                assert own.get(job.project, 0) + job.gpus > quota.get(job.project, 0), job
            else:
                own[job.project] = own.get(job.project, 0) + job.gpus
        return result
    sim.decide = checked
    f = run.run()
    note(f"lent starts: {len(lent_starts)}, build waits: {f['build_waits']}")
    assert f["max_build_wait_s"] <= p.grace_s + p.cycle_interval_s
    assert sim.metrics.within_quota == 0
