"""Write the small example trace shipped with the package (jupyter_gpushare/sim/examples/).

Three projects on 32 GPUs over two days: vision runs a few large gangs, nlp a steady stream
of small jobs, speech comes in bursts. Seeded, so the file is the same every time.
"""

import csv
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "jupyter_gpushare" / "sim" / "examples"


def main():
    rng = random.Random(7)
    rows = []
    day = 86400
    for i in range(60):  # vision: large, long gangs
        rows.append((rng.uniform(0, 2 * day), rng.choice([4, 8, 8, 16]),
                     rng.uniform(3600, 6 * 3600), "vision", "alice"))
    for i in range(240):  # nlp: many small jobs
        rows.append((rng.uniform(0, 2 * day), rng.choice([1, 1, 1, 2]),
                     rng.expovariate(1 / 1800) + 60, "nlp", "bob"))
    for burst in (0.3, 1.1, 1.6):  # speech: bursts of medium jobs
        for i in range(25):
            rows.append((burst * day + rng.uniform(0, 1800), rng.choice([2, 4]),
                         rng.uniform(1800, 4 * 3600), "speech", "carol"))
    rows.sort()
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "small.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_id", "submit_time", "duration", "gpus", "project", "user"])
        for i, (t, g, d, p, u) in enumerate(rows):
            w.writerow([f"job-{i:04d}", int(t), int(d), g, p, u])
    with open(OUT / "small_quotas.csv", "w", newline="") as f:
        f.write("project,quota\nvision,16\nnlp,8\nspeech,8\n")


if __name__ == "__main__":
    main()
