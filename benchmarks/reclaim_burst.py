"""Benchmark: a burst of reclaims at scale (issue 14).

20,000 jobs submitted in the first minute (ids in submit order, submit time uniform in
0–60 s, duration uniform in 600–36,000 s, 1/2/4/8/16 GPUs with weights 70/10/10/8/2, each
in one of 500 projects, seeded) are written as a trace CSV and simulated as

    gpushare simulate --trace burst.csv --quotas proportional --capacity 8000 --gpus-per-node 8

would (in this process, with the command's defaults), under three policies:
  guaranteed  ours, with the victim index,
  reference   the policy before the victim index (tests/reference_policy), same events,
  fifo        one queue, no preemption: what a cycle costs without reclaim.
For each it prints the decision time per cycle (p50, p99, max) and the simulator's wall time,
and checks that ours and the reference reach the same figures. The cycles counted are those
decided: the simulator spares a cycle that could decide nothing new (``sim/engine.py``), for
all three alike.

    .venv/bin/python benchmarks/reclaim_burst.py [--jobs 20000] [--projects 500] [--capacity 8000]
        [--policies guaranteed,reference,fifo] [--trace-out FILE] [--profile FILE]
        [--departments N] [--no-consolidate]

``--departments N`` puts the projects in N departments (round-robin), each with its projects'
quotas (they add up to the pool): two levels. The reference policy knows one level only, so
it is left out then. Ours moves jobs within quota for a gang within quota
(``consolidate``, on by default), which the reference does not: the moves are printed, and
``--no-consolidate`` turns them off to compare the two decision for decision.
"""

import argparse
import cProfile
import csv
import random
import sys
import tempfile
from pathlib import Path

from jupyter_gpushare.policy.model import DEFAULT_MIN_RUNTIME_S, PolicyConfig
from jupyter_gpushare.sim.engine import SimConfig, Simulator
from jupyter_gpushare.sim.metrics import summarize
from jupyter_gpushare.sim.trace import departments_over, proportional_quotas, read_trace

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import reference_policy  # noqa: E402  (tests/ is not a package on the path by default)

SIZES, WEIGHTS = (1, 2, 4, 8, 16), (70, 10, 10, 8, 2)


def write_burst(path: Path, jobs: int, projects: int, seed: int = 14) -> None:
    """The burst as a trace CSV in the simulator's format (docs/reference/trace-format.md)."""
    rng = random.Random(seed)
    submits = sorted(rng.uniform(0, 60) for _ in range(jobs))
    width = len(str(jobs - 1))
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["job_id", "submit_time", "duration", "gpus", "project"])
        for i, t in enumerate(submits):
            out.writerow([f"job-{i:0{width}d}", f"{t:.3f}", f"{rng.uniform(600, 36000):.0f}",
                          rng.choices(SIZES, WEIGHTS)[0], f"p{rng.randrange(projects):03d}"])


class ReferenceSimulator(Simulator):
    """The same simulation, decided by the policy before the victim index."""

    def decide(self, snap):
        return reference_policy.cycle(snap, self.policy_config)


def simulate(jobs, capacity: int, policy: str, departments: int = 0,
             consolidate: bool = True) -> dict:
    """What ``gpushare simulate --quotas proportional`` runs, with its defaults."""
    quotas = proportional_quotas(jobs, capacity)
    config = SimConfig(capacity, gpus_per_node=8,
                       policy="guaranteed" if policy == "reference" else policy,
                       policy_config=PolicyConfig(min_runtime_s=DEFAULT_MIN_RUNTIME_S,
                                                  consolidate=consolidate))
    kind = ReferenceSimulator if policy == "reference" else Simulator
    levels = departments_over(quotas, departments) \
        if departments and policy == "guaranteed" else None
    return summarize(kind(jobs, quotas, config, departments=levels).run())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--projects", type=int, default=500)
    ap.add_argument("--capacity", type=int, default=8000)
    ap.add_argument("--policies", default="guaranteed,reference,fifo")
    ap.add_argument("--trace-out", help="keep the trace CSV here")
    ap.add_argument("--profile", help="write a cProfile of the guaranteed run to this file")
    ap.add_argument("--departments", type=int, default=0,
                    help="put the projects in this many departments (0: one level)")
    ap.add_argument("--no-consolidate", action="store_true",
                    help="ours moves no jobs, as the reference (default: it may)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.trace_out or Path(tmp) / "burst.csv")
        write_burst(path, args.jobs, args.projects)
        jobs = read_trace(path)
    level = f" in {args.departments} departments" if args.departments else ""
    print(f"{len(jobs):,} jobs in the first minute, {args.projects} projects{level}, "
          f"{args.capacity:,} GPUs (8 per node), quotas proportional")
    results = {}
    policies = args.policies.split(",")
    if args.departments:
        policies = [p for p in policies if p != "reference"]  # it knows one level only
    for policy in policies:
        if policy == "guaranteed" and args.profile:
            profile = cProfile.Profile()
            results[policy] = profile.runcall(simulate, jobs, args.capacity, policy,
                                              args.departments, not args.no_consolidate)
            profile.dump_stats(args.profile)
        else:
            results[policy] = simulate(jobs, args.capacity, policy, args.departments,
                                       not args.no_consolidate)
        r = results[policy]
        print(f"  {policy}: {r['cycles']:,} cycles, {r['preemptions']:,} preemptions, "
              f"done in {r['wall_s']:.1f} s", file=sys.stderr)
    print(f"{'':12}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'run s':>9}{'preemptions':>13}"
          f"{'moves':>7}{'guarantee wait max s':>22}")
    for policy, r in results.items():
        d = r["decision_ms"]
        print(f"{policy:12}{d['p50']:>9.2f}{d['p99']:>9.2f}{d['max']:>9.2f}{r['wall_s']:>9.1f}"
              f"{r['preemptions']:>13,}{r['moves']:>7,}{r['guarantee_wait_max_s']:>22,.0f}")
    if "guaranteed" in results and "reference" in results:
        ours, ref = results["guaranteed"], results["reference"]
        same = [k for k in ("completed", "preemptions", "avg_jct_s", "p99_reclaim_s", "cycles")
                if ours[k] != ref[k]]
        print("ours vs reference: " + ", ".join(
            f"{key} {ref['decision_ms'][key] / ours['decision_ms'][key]:.1f}x faster"
            for key in ("p50", "p99", "max")) +
            f", run {ref['wall_s'] / ours['wall_s']:.1f}x faster; " +
            ("the same completions, preemptions, JCT and reclaim times" if not same
             else "DIFFERENT " + ", ".join(same)
             + (f" (ours moved {ours['moves']} jobs: run --no-consolidate to compare)"
                if ours["moves"] else "")))


if __name__ == "__main__":
    main()
