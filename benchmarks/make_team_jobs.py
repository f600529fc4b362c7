"""Write jupyter_gpushare/sim/examples/philly_jobs.csv, the train jobs the team scenario
draws its experiments from (``gpushare simulate --scenario team``): 400 jobs of the Philly
trace, picked evenly by the trace's order of GPU-hours (every 1/400th of it, so the table
keeps the trace's mix of sizes and durations). A job of more than 8 GPUs is made 8 GPUs
running as much longer (its GPU-hours kept: the team's largest server has 8); a job longer
than two days is cut to two days (the scenario's window is four weeks of working days).

    python benchmarks/make_team_jobs.py [../shared/traces/philly.csv.gz]
"""

import csv
import sys
from pathlib import Path

from jupyter_gpushare.policy.model import GPU
from jupyter_gpushare.sim.trace import read_trace

PICKS = 400
MAX_GPUS = 8
MAX_DURATION_S = 2 * 86400.0
OUT = Path(__file__).resolve().parent.parent / "jupyter_gpushare/sim/examples/philly_jobs.csv"


def main() -> None:
    source = sys.argv[1] if len(sys.argv) > 1 else \
        str(Path(__file__).resolve().parent.parent.parent / "shared/traces/philly.csv.gz")
    jobs = sorted(read_trace(source), key=lambda j: (j.gpus * j.duration, j.id))
    rows = []
    for k in range(PICKS):
        job = jobs[int((k + 0.5) * len(jobs) / PICKS)]
        gpus = job.gpus // GPU
        duration = job.duration * gpus / min(gpus, MAX_GPUS)
        rows.append((min(gpus, MAX_GPUS), round(min(duration, MAX_DURATION_S))))
    with OUT.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["gpus", "duration"])
        out.writerows(rows)
    hours = sum(g * d for g, d in rows) / len(rows) / 3600
    print(f"wrote {len(rows)} jobs to {OUT}: mean {hours:.2f} GPU-hours, "
          f"{sum(g > 1 for g, _ in rows)} of more than 1 GPU")


if __name__ == "__main__":
    main()
