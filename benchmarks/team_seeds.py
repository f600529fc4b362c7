"""gpushare against pooled over several seeds of the team scenario: the closed loop's noise
(which long jobs are in flight when the window ends) moves one seed's figures by points, so
the question "is gpushare at least pooled at every demand level?" is asked of the mean over
seeds. Prints, per activity profile and demand level, both configurations' mean average
utilization and experiments, and gpushare minus pooled per seed.

    .venv/bin/python benchmarks/team_seeds.py [SEEDS]      # default 8 (about 5 minutes)
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from jupyter_gpushare.sim.scenario import DEMANDS
from jupyter_gpushare.sim.team import TeamParameters, load_jobs, make_team
from jupyter_gpushare.sim.team_run import TeamRun


def main(seeds: int) -> None:
    jobs, began = load_jobs(), time.perf_counter()
    print(f"{seeds} seeds (21 to {20 + seeds}); utilization in %, gpushare − pooled per seed")
    for profile in ("philly", "llm"):
        print(f"\nprofile {profile}")
        print(f"{'demand':>7} {'pooled':>7} {'gpushare':>8} {'Δ mean':>7} {'Δ min':>6} {'Δ max':>6}"
              f" {'exp pooled':>10} {'exp gpushare':>12}")
        for demand in DEMANDS:
            util = {"pooled": [], "gpushare": []}
            exps = {"pooled": [], "gpushare": []}
            for seed in range(21, 21 + seeds):
                p = replace(TeamParameters(), seed=seed)
                team = make_team(p)
                for config in util:
                    f = TeamRun(p, team, jobs, config, demand, profile).run()
                    util[config].append(100 * f["avg_utilization"])
                    exps[config].append(f["experiments_completed"])
            diff = [g - q for g, q in zip(util["gpushare"], util["pooled"])]
            mean = {c: sum(v) / seeds for c, v in util.items()}
            print(f"{demand:>7g} {mean['pooled']:>7.2f} {mean['gpushare']:>8.2f} "
                  f"{sum(diff) / seeds:>+7.2f} {min(diff):>+6.2f} {max(diff):>+6.2f} "
                  f"{sum(exps['pooled']) / seeds:>10.0f} {sum(exps['gpushare']) / seeds:>12.0f}")
    print(f"\n{time.perf_counter() - began:.0f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
