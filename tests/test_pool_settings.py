"""What decides is one object (``policy/settings.py``): its defaults are the service's, the
simulator's command line's and the replay's; ``api/history`` sends it whole, and a replay of
the history decides by all of it (fair share, reclaim, moves, departments), saying what it
could not replay (lending)."""

import pytest

from jupyter_gpushare.cli import build_parser
from jupyter_gpushare.policy.model import DEFAULT_MIN_RUNTIME_S, GPU, PolicyConfig
from jupyter_gpushare.policy.past_use import FairShareTime
from jupyter_gpushare.policy.settings import (DEFAULT_CYCLE_S, DEFAULT_FAIR_SHARE_WINDOW_S,
                                              DEFAULT_GRACE_S, PoolSettings)
from jupyter_gpushare.pool.app import PoolService
from jupyter_gpushare.pool.utilization.service import GPUUsage
from jupyter_gpushare.sim import activity, history
from jupyter_gpushare.sim.engine import SimConfig
from jupyter_gpushare.sim.history import BadChange
from jupyter_gpushare.sim.team import TeamParameters
from jupyter_gpushare.sim.trace import TraceJob
from jupyter_gpushare.usage.meter import UsageSettings
from jupyter_gpushare.validate import MAX_JOB_SIZE

POOL = {"nodes": [{"name": "n0", "gpus": 4, "pool": "train"},
                  {"name": "n1", "gpus": 4, "pool": "train"}]}
PROJECTS = [{"name": "vision", "quota": 3, "department": "ml"},
            {"name": "nlp", "quota": 3, "department": "ml"},
            {"name": "ops", "quota": 2}]
DEPARTMENTS = [{"name": "ml", "quota": 6, "limit": 7, "over_quota_weight": 2,
                "projects": ["vision", "nlp"]}]
ALL_ON = PoolSettings(cycle_interval_s=2.0, grace_period_s=5.0,
                      policy=PolicyConfig(min_runtime_s=10.0, reserve_after_s=600.0,
                                          preempt_within_project=True, reclaim_fair_share=True,
                                          consolidate=False),
                      fair_share=FairShareTime(3600.0, 86400.0), lend_build_gpus=True)


def _trait(name):
    return PoolService.class_traits()[name].default_value


def test_each_default_is_written_once():
    s = PoolSettings()
    assert (s.cycle_interval_s, s.grace_period_s) == (DEFAULT_CYCLE_S, DEFAULT_GRACE_S) == \
        (_trait("cycle_interval"), _trait("grace_period"))
    assert s.policy.min_runtime_s == DEFAULT_MIN_RUNTIME_S == _trait("min_runtime")
    for name in ("reserve_after", "preempt_within_project", "reclaim_fair_share",
                 "consolidate"):
        key = name + "_s" if name == "reserve_after" else name
        assert getattr(s.policy, key) == getattr(PolicyConfig(), key) == _trait(name), name
    assert s.fair_share is None and _trait("fair_share_half_life") == 0
    assert _trait("fair_share_window") == DEFAULT_FAIR_SHARE_WINDOW_S
    assert s.lend_build_gpus is _trait("lend_build_gpus") is False
    args = build_parser().parse_args(["simulate", "--trace", "t.csv"])
    assert args.grace_period == DEFAULT_GRACE_S
    assert args.reserve_after == PolicyConfig().reserve_after_s
    assert SimConfig(capacity_gpus=1).grace_s == TeamParameters().grace_s == DEFAULT_GRACE_S
    # GPU use: the meter's defaults are the options' and the simulator's
    usage, traits = UsageSettings(), GPUUsage.class_traits()
    assert (usage.sample_interval, usage.idle_threshold, usage.idle_job_after) == tuple(
        traits[k].default_value for k in ("sample_interval", "idle_threshold", "idle_job_after"))
    assert (activity.IDLE_THRESHOLD * 100, activity.IDLE_JOB_AFTER_S) == \
        (usage.idle_threshold, usage.idle_job_after)
    assert (usage.rollup_after, usage.retention) == tuple(
        traits[k].default_value * 86400 for k in ("usage_rollup_after_days",
                                                  "usage_retention_days"))
    assert _trait("max_job_size") == MAX_JOB_SIZE


def test_the_settings_go_whole_through_json_and_an_older_pools_keep_their_defaults():
    assert PoolSettings.from_json(ALL_ON.to_json()) == ALL_ON
    assert PoolSettings.from_json(PoolSettings().to_json()) == PoolSettings()
    old = PoolSettings.from_json({"cycle_interval_s": 1.0, "grace_period_s": 2.0,
                                  "min_runtime_s": 30.0, "reserve_after_s": 1800.0})
    assert old.grace_period_s == 2.0 and old.policy.min_runtime_s == 30.0
    assert old.policy.consolidate and not old.policy.reclaim_fair_share and not old.fair_share
    with pytest.raises(ValueError, match="consolidate must be true or false, not 'yes'"):
        PoolSettings.from_json({"consolidate": "yes"})
    with pytest.raises(ValueError, match="grace_period_s must be 0 or more seconds"):
        PoolSettings.from_json({"grace_period_s": -1})
    with pytest.raises(BadChange, match="reclaim_fair_share must be true or false"):
        history.settings_from(POOL, PROJECTS, {"reclaim_fair_share": 1})


def _jobs():
    return [TraceJob(f"j{i}", float(i), 60.0, (1 + i % 3) * GPU, ("vision", "nlp", "ops")[i % 3],
                     "u", 0) for i in range(12)]


def test_a_replay_decides_by_all_of_the_pools_settings():
    settings = history.settings_from(POOL, PROJECTS, ALL_ON.to_json(), DEPARTMENTS)
    run = history.replay(_jobs(), settings)
    assert run.config.policy_config == ALL_ON.policy
    assert run.config.fair_share == ALL_ON.fair_share and run.config.grace_s == 5.0
    [(ml, members)] = run.departments.items()
    assert (ml.name, ml.quota, ml.limit, ml.over_quota_weight, members) == \
        ("ml", 6 * GPU, 7 * GPU, 2, ("vision", "nlp"))
    assert {p.name: p.department for p in settings.projects} == \
        {"vision": "ml", "nlp": "ml", "ops": ""}
    described = history.compare(
        [{"job_id": j.id, "submitted": 1000.0 + j.submit_time, "submit_time": j.submit_time,
          "duration": j.duration, "gpus": j.gpus // GPU, "project": j.project, "user": "u",
          "priority": 0, "held_s": j.duration, "queued_s": 0.0, "first_start_s": 0.0,
          "end_s": j.duration, "utilization": None} for j in _jobs()], settings, None)
    today = described["settings"]["today"]
    assert today["replayed"] == ALL_ON.to_json() and today["departments"] == {"ml": 6}
    assert today["not_replayed"] and today["not_replayed"][0].startswith("lend_build_gpus")


def test_a_changed_quota_beyond_its_departments_is_one_sentence():
    today = history.settings_from(POOL, PROJECTS, {}, DEPARTMENTS)
    assert history.settings_from(POOL, PROJECTS, {}).departments == ()
    with pytest.raises(BadChange, match="ml"):
        history.changed_settings(today, None, {"vision": 4 * GPU, "ops": 1 * GPU})
    assert history.changed_settings(today, None, {"vision": 2 * GPU}).projects[-1].department
