"""The team scenario's results in words and tables, for ``gpushare simulate --scenario team``."""

from __future__ import annotations

CONFIGS = ("static", "pooled", "gpushare")
CASE_UTILIZATION, CASE_EXPERIMENTS = 2.5, 2.0  # the case's claims: 28 % -> 70 %, 2x experiments


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h"


def format_team(r: dict) -> str:
    p = r["parameters"]
    lines = [
        f"team scenario: {p['researchers']} researchers in {p['projects']} projects, "
        f"{sum(p['servers'])} GPUs (servers of {' '.join(map(str, p['servers']))}), "
        f"{p['weeks']} weeks of working days",
        f"job activity: {r['activity']}, {r['activity_source']}",
        "static: each researcher owns whole GPUs; pooled: the last "
        f"{p['build_servers']} servers cut into {p['slice_gpu']:g}-GPU build slices, the rest a "
        "train pool with guaranteed quotas per project; gpushare: pooled + culling + idle-first "
        "reclaim + build GPUs lent to train jobs",
        "",
        "sweep (utilization: average GPU utilization over time, of all GPUs; experiments "
        "completed in the window)",
        f"  {'demand':>6} {'GPUs':>5}" + "".join(f" | {c:>8} util   exps" for c in CONFIGS),
    ]
    seeds = p.get("seeds") or [p["seed"]]
    if len(seeds) > 1:
        lines[-2] = (f"sweep, mean of {len(seeds)} teams (seeds {seeds[0]}–{seeds[-1]}; "
                     "utilization: average GPU utilization over time, of all GPUs; experiments "
                     "completed in the window; Δ: gpushare − pooled, the smallest and largest "
                     "of one team)")
        lines[-1] += f" | {'Δ util, points':>16} {'Δ exps':>12}"
    for row in r["sweep"]:
        line = f"  {row['demand']:>6g} {row['demand_gpus']:>5g}" + "".join(
            f" | {row[c]['avg_utilization']:>13.1%} {row[c]['experiments_completed']:>6.0f}"
            for c in CONFIGS)
        if "gpushare_minus_pooled" in row:
            util = [100 * d for d in row["gpushare_minus_pooled"]["avg_utilization"]]
            exps = row["gpushare_minus_pooled"]["experiments_completed"]
            line += (f" | {min(util):>+7.1f} to {max(util):>+4.1f} "
                     f"{min(exps):>+5.0f} to {max(exps):>+4.0f}")
        lines.append(line)
    c = r["calibration"]
    lines.append("")
    if not c:
        lines.append(f"no calibration: {r['calibration_note']}")
    else:
        lines += [
            f"calibration: demand {c['demand']:g} ({c['demand_gpus']:g} GPUs), where static's "
            f"average utilization is {p['calibration_static_utilization']:.0%}",
            f"  {'':<9}{'util':>7}{'alloc':>7}{'idle-alloc':>11}{'exps':>6}{'median JCT':>12}"
            f"{'p95 JCT':>11}{'avg queue':>11}{'max build wait':>16}",
        ]
        for name in CONFIGS:
            x = c[name]
            lines.append(f"  {name:<9}{x['avg_utilization']:>7.1%}{x['allocation']:>7.1%}"
                         f"{x['idle_allocated']:>11.1%}{x['experiments_completed']:>6.0f}"
                         f"{_h(x['median_jct_s']):>12}{_h(x['p95_jct_s']):>11}"
                         f"{_h(x['avg_queue_s']):>11}{x['max_build_wait_s']:>14.0f} s")
        for name in ("pooled", "gpushare"):
            pools = c[name]["pools"]
            lines.append(f"  {name} by pool: build {pools['build']['gpus']} GPUs "
                         f"{pools['build']['avg_utilization']:.1%} utilized "
                         f"({pools['build']['lent_gpu_hours']:g} GPU-hours lent to train jobs), "
                         f"train {pools['train']['gpus']} GPUs "
                         f"{pools['train']['avg_utilization']:.1%}; culls {c[name]['culls']}")
        s = c["static"]
        for name in ("pooled", "gpushare"):
            x = c[name]
            util = x["avg_utilization"] / s["avg_utilization"] if s["avg_utilization"] else 0.0
            exps = x["experiments_completed"] / max(1, s["experiments_completed"])
            lines.append(f"  {name} against static: utilization {util:.2f}x (the case: "
                         f"{CASE_UTILIZATION:g}x), experiments {exps:.2f}x (the case: "
                         f"{CASE_EXPERIMENTS:g}x), median JCT {_h(x['median_jct_s'])} against "
                         f"{_h(s['median_jct_s'])}")
        bound = p["grace_s"] + p["cycle_interval_s"]
        lines.append(f"  longest build-slice wait {c['gpushare']['max_build_wait_s']:g} s "
                     f"(bound: grace + cycle = {bound:g} s)")
    lines += ["", "parameters" + (" (the weights, lines of work and static GPUs: the first "
                                  "team's)" if len(seeds) > 1 else "") + ":"]
    for key, value in p.items():
        lines.append(f"  {key} = {value}")
    return "\n".join(lines)
