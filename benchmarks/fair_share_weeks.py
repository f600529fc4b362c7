"""Fair share over time on the Philly trace: the weekly gap between borrowing and weights.

512 GPUs (8 per node), philly_quotas.csv scaled to the capacity, a 10 s cycle and a 30 s
minimum runtime, as ``philly_policies.py``; four runs side by side:

- off: the defaults;
- half-life: ``fair_share_half_life`` one day (borrowers ordered by their decayed use);
- reclaim: ``reclaim_fair_share`` alone;
- both: a one-day half-life and ``reclaim_fair_share``.

Prints, per run, allocation, average JCT, preemptions, lost GPU-hours, the guarantee (its
wait at p99 and at most, the bound, within-quota preemptions) and the weekly gap
(docs/explanation/scheduling.md, "Fair share over time"): the mean over the weeks of each
week's largest gap, and the largest week. Then each week's largest gap, off against both.

Every run may move jobs within quota for a gang within quota, as the pool does
(``PoolService.consolidate``; the row "moves" counts them); ``--no-consolidate`` turns that
off in every run.

    .venv/bin/python benchmarks/fair_share_weeks.py [--jobs N] [--half-life 86400] [--parallel 2]
                                                    [--no-consolidate]
"""

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from jupyter_gpushare.policy.model import PolicyConfig
from jupyter_gpushare.policy.past_use import FairShareTime
from jupyter_gpushare.sim.engine import SimConfig, Simulator
from jupyter_gpushare.sim.metrics import summarize

from philly_policies import philly_arguments, philly_workload  # beside this script

RUNS = {"off": (False, False), "half-life": (True, False), "reclaim": (False, True),
        "both": (True, True)}
ROWS = [("allocation", "{:.1%}"), ("allocation_to_last_submit", "{:.1%}"), ("avg_jct_s", "{:,.0f}"), ("preemptions", "{:,}"),
        ("lost_gpu_hours", "{:,.0f}"), ("within_quota_preemptions", "{:,}"), ("moves", "{:,}"),
        ("guarantee_wait_p99_s", "{:,.0f}"), ("guarantee_wait_max_s", "{:,.0f}"),
        ("guarantee_bound_s", "{:g}"), ("borrow_gap_mean", "{:.1%}"),
        ("borrow_gap_max", "{:.1%}"), ("wall_s", "{:.0f}")]


def one(args, name):
    timed, reclaim = RUNS[name]
    jobs, quotas = philly_workload(args)
    config = SimConfig(args.capacity, cycle_interval_s=10,
                       policy_config=PolicyConfig(min_runtime_s=30, reclaim_fair_share=reclaim,
                                                  consolidate=args.consolidate),
                       fair_share=FairShareTime(args.half_life) if timed else None)
    summary = summarize(Simulator(jobs, quotas, config).run())
    print(f"{name}: done in {summary['wall_s']} s", file=sys.stderr)
    return name, summary


def main():
    ap = philly_arguments(argparse.ArgumentParser())
    ap.add_argument("--half-life", type=float, default=86400.0, help="seconds (default a day)")
    ap.add_argument("--parallel", type=int, default=2, help="runs at once (default 2)")
    ap.add_argument("--no-consolidate", dest="consolidate", action="store_false",
                    help="no run moves jobs within quota for gangs (default: they may)")
    args = ap.parse_args()
    with ProcessPoolExecutor(max(1, args.parallel)) as pool:
        results = dict(pool.map(one, [args] * len(RUNS), list(RUNS)))
    print(f"{results['off']['jobs']:,} jobs of {Path(args.trace).name} on {args.capacity} GPUs, "
          f"half-life {args.half_life:g} s" + ("" if args.consolidate else ", no moves"))
    print(f"{'':28}" + "".join(f"{name:>12}" for name in RUNS))
    for key, fmt in ROWS:
        print(f"{key:28}" + "".join(f"{fmt.format(results[n][key]):>12}" for n in RUNS))
    off, both = results["off"], results["both"]
    print(f"{'both / off':28}gap mean {both['borrow_gap_mean'] / max(off['borrow_gap_mean'], 1e-9):.2f}x, "
          f"gap max {both['borrow_gap_max'] / max(off['borrow_gap_max'], 1e-9):.2f}x, "
          f"allocation {100 * (both['allocation'] - off['allocation']):+.1f} points "
          f"({100 * (both['allocation_to_last_submit'] - off['allocation_to_last_submit']):+.1f} "
          f"until the last submit), "
          f"preemptions {both['preemptions'] / max(off['preemptions'], 1):.2f}x")
    weeks = {w["week"]: w for w in both["borrow_gap_weeks"]}
    print("week  projects  gap off (project)        gap both (project)")
    for w in off["borrow_gap_weeks"]:
        b = weeks.get(w["week"])
        after = f"{b['gap']:>7.1%} ({b['project']})" if b else "      -"
        print(f"{w['week']:>4}  {w['projects']:>8}  {w['gap']:>7.1%} ({w['project']})    {after}")


if __name__ == "__main__":
    main()
