"""The team scenario as ``gpushare simulate --scenario team`` runs it: the three
configurations (``team_run.py``) over a sweep of demand, and at the demand where static's
average utilization is the case's 28 % (docs/explanation/before-and-after.md)."""

from __future__ import annotations

from dataclasses import asdict, replace

from . import activity
from .team import JOBS_TABLE, Researcher, TeamParameters, load_jobs, make_team, unlimited_demand
from .team_run import CONFIGS, TeamRun


DEMANDS = (0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 11.0)
"""Demand levels of the sweep, in units of the thinking rate ``think_h`` is given for: from a
light team to one whose experiments would keep about twice the GPUs busy."""
CALIBRATION = 0.28  # static's average utilization in the case the scenario is checked against


MAX_SEEDS = 16


def scenario(p: TeamParameters, profile: str, demands=DEMANDS, on_level=None,
             seeds: int = 1) -> dict:
    """The three configurations over the demand sweep, and at the demand where static's
    average utilization is ``CALIBRATION`` (interpolated between the sweep's levels). With
    ``seeds`` > 1, each figure is the mean over the teams of seeds ``p.seed`` onwards (the
    longest build wait their largest), and each level says gpushare minus pooled per seed."""
    jobs = load_jobs()
    teams = [(q, make_team(q)) for q in (replace(p, seed=p.seed + k) for k in range(seeds))]

    def runs(config: str, demand: float) -> list[dict]:
        return [TeamRun(q, team, jobs, config, demand, profile).run() for q, team in teams]

    def level(demand: float) -> dict:
        gpus = sum(unlimited_demand(q, team, jobs, demand) for q, team in teams) / seeds
        row = {"demand": round(demand, 3), "demand_gpus": round(gpus, 1)}
        each = {config: runs(config, demand) for config in CONFIGS}
        for config in CONFIGS:
            row[config] = _mean(each[config])
        if seeds > 1:
            row["gpushare_minus_pooled"] = {
                key: [round(g[key] - q[key], 4) for g, q in zip(each["gpushare"], each["pooled"])]
                for key in ("avg_utilization", "experiments_completed")}
        if on_level is not None:
            on_level(row)
        return row

    def static(demand: float) -> float:
        return _mean(runs("static", demand))["avg_utilization"]

    sweep = [level(d) for d in demands]
    calibration, why = None, ""
    for lo, hi in zip(sweep, sweep[1:]):
        a, b = lo["static"]["avg_utilization"], hi["static"]["avg_utilization"]
        if a <= CALIBRATION <= b and b > a:
            calibration = level(_between(static, (lo["demand"], a), (hi["demand"], b)))
            break
    else:
        static = [r["static"]["avg_utilization"] for r in sweep]
        why = (f"static's average utilization stays within {min(static):.1%}–{max(static):.1%} "
               f"over the sweep, so no level gives {CALIBRATION:.0%}")
    for row in sweep:
        for config in CONFIGS:
            row[config].pop("series")
    return {"scenario": "team", "activity": profile,
            "activity_source": activity.PROFILE_SOURCES[profile],
            "lending": True, "calibration": calibration, "calibration_note": why,
            "sweep": sweep, "parameters": parameters(p, teams[0][1], seeds)}


def _mean(figures: list[dict]):
    """One configuration's figures over seeds: each number's mean (the longest build wait,
    the largest), each series' mean hour by hour."""
    first = figures[0]
    if len(figures) == 1:
        return first
    if isinstance(first, dict):
        return {key: (max(f[key] for f in figures) if key == "max_build_wait_s"
                      else _mean([f.get(key) for f in figures])) for key in first}
    if isinstance(first, list):
        return [_mean(list(column)) for column in zip(*figures)]
    if all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in figures):
        return round(sum(figures) / len(figures), 4)
    return first  # a name, a flag, or a figure some team lacks: the first team's


def _between(static, lo: tuple[float, float], hi: tuple[float, float]) -> float:
    """The demand between ``lo`` and ``hi`` (demand, static's utilization) where static's
    utilization is ``CALIBRATION``: by bisection, to within 0.3 percentage points or 10 steps
    (the closed loop's noise may keep it from getting closer)."""
    best = min((lo, hi), key=lambda x: abs(x[1] - CALIBRATION))
    for _ in range(10):
        demand = (lo[0] + hi[0]) / 2
        got = static(demand)
        if abs(got - CALIBRATION) < abs(best[1] - CALIBRATION):
            best = (demand, got)
        if abs(got - CALIBRATION) < 0.003:
            break
        if got < CALIBRATION:
            lo = (demand, got)
        else:
            hi = (demand, got)
    return best[0]


def parameters(p: TeamParameters, team: list[Researcher], seeds: int = 1) -> dict:
    out = asdict(p)
    out["seeds"] = list(range(p.seed, p.seed + seeds))
    out["servers"] = list(p.servers)
    out["window_s"] = p.window_s
    out["jobs_table"] = f"{JOBS_TABLE.name} ({len(load_jobs())} jobs of the Philly trace)"
    out["researcher_weights"] = [round(r.weight, 3) for r in team]
    out["lines_of_work"] = [r.lines for r in team]
    out["static_gpus"] = [r.owned for r in team]
    out["idle_threshold"] = activity.IDLE_THRESHOLD
    out["idle_job_after_s"] = activity.IDLE_JOB_AFTER_S
    out["calibration_static_utilization"] = CALIBRATION
    return out
