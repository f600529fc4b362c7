"""What modelling GPU activity costs the simulator, measured end to end through the command.

1. The team scenario's whole sweep (3 configurations × 9 demand levels, and the calibration
   search): ``gpushare simulate --scenario team --json``, once per activity profile.
   Target: at most 60 s each.
2. The whole Philly trace on 512 GPUs with the 10-second cycle, without job activity and
   then with it (``--activity philly``), back to back: the time of each and their ratio.
   Target: with activity within 1.5x of without.

Each run is a fresh process, timed from outside (start-up and reading the trace included).
Heavy: run it with ``nice -n 19`` beside other work.

    .venv/bin/python benchmarks/utilization_cost.py [--traces ../shared/traces] [--skip-philly]
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GPUSHARE = [sys.executable, "-m", "jupyter_gpushare"]


def timed(args: list[str]) -> tuple[float, dict]:
    start = time.perf_counter()
    done = subprocess.run(GPUSHARE + args, capture_output=True, text=True, cwd=ROOT)
    took = time.perf_counter() - start
    if done.returncode:
        sys.exit(f"gpushare {' '.join(args)} failed: {done.stderr.strip()}")
    return took, json.loads(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--traces", default=str(ROOT.parent / "shared" / "traces"))
    ap.add_argument("--skip-philly", action="store_true")
    args = ap.parse_args()
    for profile in ("philly", "llm"):
        took, result = timed(["simulate", "--scenario", "team", "--activity", profile, "--json"])
        runs = 3 * len(result["sweep"])
        c = result["calibration"]
        print(f"team scenario, activity {profile}: {took:.1f} s for {runs} runs of the sweep "
              f"and the calibration (target 60 s); static 28 % at demand "
              f"{c['demand'] if c else '-'}")
    if args.skip_philly:
        return
    traces = Path(args.traces)
    base = ["simulate", "--trace", str(traces / "philly.csv.gz"), "--quotas",
            str(traces / "philly_quotas.csv"), "--capacity", "512", "--scale-quotas",
            "--cycle-interval", "10", "--json"]
    without, plain = timed(base)
    with_, modelled = timed(base + ["--activity", "philly"])
    print(f"Philly, no job activity:   {without:.1f} s (simulator {plain['wall_s']} s), "
          f"allocation {plain['allocation']:.1%}")
    print(f"Philly, --activity philly: {with_:.1f} s (simulator {modelled['wall_s']} s), "
          f"allocation {modelled['allocation']:.1%}, average utilization "
          f"{modelled['avg_utilization']:.1%}, idle-allocated {modelled['idle_allocated']:.1%}")
    print(f"ratio {with_ / without:.2f} (target at most 1.5)")


if __name__ == "__main__":
    main()
