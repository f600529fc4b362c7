"""The team scenario: utilization by hand, culling by the pool's rule, the bound on a build
session's wait for a lent GPU, gpushare against pooled, and the command's refusals."""

from dataclasses import replace

import pytest

from jupyter_gpushare import cli
from jupyter_gpushare.sim.scenario import scenario
from jupyter_gpushare.sim.team import TeamParameters, load_jobs, make_team
from jupyter_gpushare.sim.team_run import CONFIGS, TeamRun

WEEK = TeamParameters(weeks=1)


def run(p, config, demand=0.0, profile="philly"):
    team = make_team(p)
    result = TeamRun(p, team, load_jobs(), config, demand, profile)
    return team, result, result.run()


@pytest.mark.parametrize("config", CONFIGS)
def test_sessions_alone_by_hand(config):
    # No training (demand 0), every server stopped at the end of its stretch: what the GPUs
    # did is the test bursts, 0.2 GPU each, and a pool holds a 1/4 slice through each stretch.
    p = replace(WEEK, leave_open=0.0)
    team, _, f = run(p, config)
    window = p.gpus * p.window_s
    bursts = sum(b - a for r in team for a, b in r.bursts)
    assert f["avg_utilization"] == round(0.2 * bursts / window, 4)
    if config == "static":  # every GPU is someone's
        assert f["allocation"] == 1.0
    else:
        stretches = sum(b - a for r in team for a, b in r.stretches)
        assert f["allocation"] == round(0.25 * stretches / window, 4)
        assert f["idle_allocated"] == round(1 - bursts / stretches, 4)  # idle between bursts
    assert f["experiments_completed"] == 0 and f["max_build_wait_s"] == 0


def test_culling_stops_a_server_left_open_after_idle_time_and_warning():
    p = replace(WEEK, leave_open=1.0, cull_after_s=3600.0, cull_warning_s=600.0)
    team, sim, f = run(p, "gpushare")
    by_name = {r.name: r for r in team}
    assert f["culls"] == len(sim.build.held) > 0
    # each ended by a cull, 3600 + 600 s after its user left
    for name, opened, closed in sim.build.held:
        stretches = by_name[name].stretches
        left = max(end for start, end in stretches if end <= closed)
        assert closed - left == pytest.approx(4200.0)
        assert not any(start < closed < end for start, end in stretches)
    _, kept, g = run(p, "pooled")
    assert g["culls"] == 0 and not kept.build.held  # without culling a server left open stays open


def test_a_session_waits_for_a_lent_gpu_at_most_grace_plus_a_cycle():
    # No reserve: busy train jobs hold every empty build GPU overnight, so mornings take
    # GPUs back from them.
    p = replace(WEEK, build_reserve=0)
    _, sim, f = run(p, "gpushare", demand=8.0)
    assert f["build_waits"] > 0 and f["pools"]["build"]["lent_gpu_hours"] > 0
    assert f["max_build_wait_s"] <= p.grace_s + p.cycle_interval_s


@pytest.mark.parametrize("demand, noise", [(0.5, 0.005), (1.0, 0.0), (8.0, 0.0)])
def test_gpushare_is_at_least_pooled_across_demand(demand, noise):
    # The 4-week scenario. At light demand the train pool is seldom full and the two differ
    # by the closed loop's noise (which jobs are in flight when the window ends): measured
    # 15.8 against 15.9 % at demand 0.5, with more experiments; from demand 1 it lends.
    p, team, jobs = TeamParameters(), make_team(TeamParameters()), load_jobs()
    pooled = TeamRun(p, team, jobs, "pooled", demand, "philly").run()
    ours = TeamRun(p, team, jobs, "gpushare", demand, "philly").run()
    assert ours["avg_utilization"] >= pooled["avg_utilization"] - noise
    assert ours["experiments_completed"] >= pooled["experiments_completed"]
    assert ours["max_build_wait_s"] <= p.grace_s + p.cycle_interval_s
    if demand >= 1:
        assert ours["avg_utilization"] > pooled["avg_utilization"]
        assert ours["pools"]["build"]["lent_gpu_hours"] > 0


def test_the_result_has_the_contract_keys():
    result = scenario(WEEK, "llm", demands=(0.5, 30.0))
    assert set(result) >= {"calibration", "sweep", "parameters"}
    keys = {"avg_utilization", "allocation", "idle_allocated", "experiments_completed",
            "median_jct_s", "p95_jct_s", "max_build_wait_s"}
    for row in result["sweep"]:
        assert {"demand", "demand_gpus", *CONFIGS} <= set(row)
        assert all(keys <= set(row[c]) for c in CONFIGS)
    calibration = result["calibration"]
    if calibration is None:
        assert "no level gives 28%" in result["calibration_note"]
    else:
        assert abs(calibration["static"]["avg_utilization"] - 0.28) < 0.01
        assert "demand" in calibration
    assert result["parameters"]["researchers"] == 20


def test_a_bad_scenario_is_one_sentence(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["simulate", "--scenario", "teams"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == ("gpushare simulate: argument --scenario: the one scenario "
                                       "is team, not 'teams'; see 'gpushare simulate --help'\n")


def test_a_scenario_makes_its_own_pool(capsys):
    assert cli.main(["simulate", "--scenario", "team", "--capacity", "8"]) == 2
    assert capsys.readouterr().err == ("gpushare simulate: --scenario team makes its own demand, "
                                       "pool and quotas; leave out --capacity\n")


def test_several_teams_give_each_figure_as_their_mean():
    """--seeds: each figure the mean over the teams of consecutive seeds (the longest build
    wait their largest), and gpushare minus pooled per team."""
    both = scenario(WEEK, "philly", demands=(2.0,), seeds=2)
    alone = [scenario(replace(WEEK, seed=WEEK.seed + k), "philly", demands=(2.0,))["sweep"][0]
             for k in range(2)]
    [row] = both["sweep"]
    for config in CONFIGS:
        for key in ("avg_utilization", "experiments_completed", "median_jct_s"):
            assert row[config][key] == pytest.approx(
                sum(a[config][key] for a in alone) / 2, abs=1e-4), (config, key)
        assert row[config]["max_build_wait_s"] == max(a[config]["max_build_wait_s"]
                                                      for a in alone)
    assert row["gpushare_minus_pooled"]["experiments_completed"] == [
        a["gpushare"]["experiments_completed"] - a["pooled"]["experiments_completed"]
        for a in alone]
    assert both["parameters"]["seeds"] == [WEEK.seed, WEEK.seed + 1]


@pytest.mark.parametrize("argv, said", [
    (["--scenario", "team", "--seeds", "0"], "argument --seeds: must be a whole number of "
     "teams from 1 to 16, not '0'; see 'gpushare simulate --help'"),
    (["--scenario", "team", "--seeds", "many"], "argument --seeds: must be a whole number of "
     "teams from 1 to 16, not 'many'; see 'gpushare simulate --help'"),
    (["--trace", "x.csv", "--seeds", "2"], "--seeds is for --scenario team; a trace is "
     "replayed as it is"),
])
def test_bad_seeds_are_one_sentence(argv, said, capsys):
    try:
        code = cli.main(["simulate", *argv])
    except SystemExit as e:
        code = e.code
    assert code == 2
    assert capsys.readouterr().err == f"gpushare simulate: {said}\n"
