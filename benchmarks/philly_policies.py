"""Benchmarks 1 and 3: the whole Philly trace under guaranteed, static and fifo.

512 GPUs (8 per node) with philly_quotas.csv scaled to the capacity, defaults otherwise
(grace 30 s, checkpoints every 1800 s, a cycle at most every 10 s, the service's default
minimum runtime). Prints the figures side by side, the ratios against the baselines, and
the simulator's own wall time.

Then anti-thrash: guaranteed at the service's own cycle (at most every 1 s) without a
minimum runtime (the baseline) and with the default one: what it saves in preemptions (and
preemptions of attempts younger than a minute) and lost GPU-hours, and what it costs in
reclaim time and JCT.

    .venv/bin/python benchmarks/philly_policies.py [--jobs N] [--capacity 512] [--json FILE]
"""

import argparse
import json
import sys
from pathlib import Path

from jupyter_gpushare.policy.model import DEFAULT_MIN_RUNTIME_S, PolicyConfig
from jupyter_gpushare.sim.engine import SimConfig, Simulator
from jupyter_gpushare.sim.metrics import summarize
from jupyter_gpushare.sim.trace import apportion, read_quotas, read_trace

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
ROWS = [("allocation", "{:.1%}"), ("avg_queue_s", "{:,.0f}"), ("p99_queue_s", "{:,.0f}"),
        ("avg_jct_s", "{:,.0f}"), ("p99_jct_s", "{:,.0f}"), ("completed", "{:,}"),
        ("unschedulable", "{:,}"), ("preemptions", "{:,}"), ("preemptions_under_60s", "{:,}"),
        ("finished_while_preempted", "{:,}"), ("lost_gpu_hours", "{:,.1f}"),
        ("within_quota_preemptions", "{:,}"), ("p99_reclaim_s", "{:,.0f}"),
        ("cycles", "{:,}"), ("wall_s", "{:.1f}")]


def philly_arguments(ap: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options every whole-Philly benchmark takes: the trace, its quotas, the capacity
    and how many of its jobs."""
    ap.add_argument("--trace", default=str(TRACES / "philly.csv.gz"))
    ap.add_argument("--quotas", default=str(TRACES / "philly_quotas.csv"))
    ap.add_argument("--capacity", type=int, default=512)
    ap.add_argument("--jobs", type=int, default=0, help="only the first N jobs (0: all)")
    return ap


def philly_workload(args) -> tuple[list, dict[str, int]]:
    """The jobs ``philly_arguments`` asked for, and the quotas scaled to the capacity."""
    jobs = read_trace(args.trace)
    if args.jobs:
        jobs = jobs[: args.jobs]
    return jobs, apportion(read_quotas(args.quotas), args.capacity)


def main():
    ap = philly_arguments(argparse.ArgumentParser())
    ap.add_argument("--json", help="also write the summaries to this file")
    ap.add_argument("--min-runtime", type=float, default=DEFAULT_MIN_RUNTIME_S)
    ap.add_argument("--no-thrash", action="store_true", help="skip the anti-thrash comparison")
    args = ap.parse_args()
    jobs, quotas = philly_workload(args)
    results = {}
    for policy in ("guaranteed", "static", "fifo"):
        # The baselines never preempt: a minimum runtime means nothing to them.
        min_runtime = args.min_runtime if policy == "guaranteed" else 0.0
        run = Simulator(jobs, quotas, SimConfig(
            args.capacity, policy=policy, cycle_interval_s=10,
            policy_config=PolicyConfig(min_runtime_s=min_runtime))).run()
        results[policy] = summarize(run)
        print(f"{policy}: done in {results[policy]['wall_s']} s", file=sys.stderr)
    print(f"{len(jobs):,} jobs of {Path(args.trace).name} on {args.capacity} GPUs, "
          f"quotas scaled to the capacity")
    print(f"{'':26}{'guaranteed':>14}{'static':>14}{'fifo':>14}")
    for key, fmt in ROWS:
        print(f"{key:26}" + "".join(f"{fmt.format(results[p][key]):>14}" for p in results))
    g, s, f = results["guaranteed"], results["static"], results["fifo"]
    print(f"{'decision_ms p50/p99':26}" + "".join(
        f"{r['decision_ms']['p50']:>7.2f}/{r['decision_ms']['p99']:<6.2f}" for r in (g, s, f)))
    print("ratios (guaranteed vs static, vs fifo):")
    for key in ("avg_queue_s", "p99_queue_s", "avg_jct_s"):
        print(f"  {key}: {g[key] / s[key]:.2f}x static, {g[key] / f[key]:.2f}x fifo")
    print(f"  allocation: {g['allocation'] / s['allocation']:.2f}x static, "
          f"{g['allocation'] / f['allocation']:.2f}x fifo")
    print(f"simulator throughput (guaranteed): {g['jobs'] / g['wall_s']:,.0f} jobs/s, "
          f"{g['wall_s']:.1f} s for the trace")
    if not args.no_thrash:
        results["thrash"] = thrash(jobs, quotas, args.capacity, args.min_runtime)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def thrash(jobs, quotas, capacity: int, min_runtime: float) -> dict:
    runs = {}
    for mr in (0.0, min_runtime):
        run = Simulator(jobs, quotas, SimConfig(capacity, cycle_interval_s=1.0,
                                                policy_config=PolicyConfig(min_runtime_s=mr))).run()
        runs[mr] = summarize(run)
        print(f"guaranteed, 1 s cycle, min_runtime {mr:g} s: done in {runs[mr]['wall_s']} s",
              file=sys.stderr)
    base, ours = runs[0.0], runs[min_runtime]
    print(f"\nanti-thrash, a cycle at most every 1 s (the service's): min_runtime 0 vs "
          f"{min_runtime:g} s")
    keys = [("preemptions", "{:,}"), ("preemptions_under_60s", "{:,}"),
            ("lost_gpu_hours", "{:,.1f}"), ("p99_reclaim_s", "{:,.0f}"),
            ("avg_queue_s", "{:,.0f}"), ("avg_jct_s", "{:,.0f}"), ("allocation", "{:.1%}")]
    print(f"{'':26}{'0 s':>14}{f'{min_runtime:g} s':>14}{'ratio':>10}")
    for key, fmt in keys:
        ratio = ours[key] / base[key] if base[key] else float("nan")
        print(f"{key:26}{fmt.format(base[key]):>14}{fmt.format(ours[key]):>14}{ratio:>9.2f}x")
    return {str(k): v for k, v in runs.items()}


if __name__ == "__main__":
    main()
