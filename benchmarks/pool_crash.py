"""Benchmark: the pool service killed with SIGKILL under load, ten times over.

Each run is tests/crashrun.py's scenario in a fresh real JupyterHub behind the real proxy:
two users submit 8 jobs a second for 10 s (the local backend, 4 simulated GPUs) while the
pool service is killed twice at random moments; then every job the API accepted must have
finished, succeeded, exactly once (marker files per attempt), and none may exist twice.
Prints per run the submits accepted and the downtimes (kill to the API answering a user
again, through the proxy), and the worst downtime overall. The baseline is the hub alone:
the same kill of the supervisor, which the hub notices only at its poll of the process.

    .venv/bin/python benchmarks/pool_crash.py [--runs 10] [--baseline]

Needs root (jobs run as the test users) and the proxy (the README's test command).
"""

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from crashrun import GROUPS, POOL_CONFIG, crash_under_load  # noqa: E402
from hubtest import Hub, system_users  # noqa: E402


def one_run(seed: int, kills: int) -> tuple:
    base = Path(tempfile.mkdtemp(prefix="gpushare-crash-"))
    base.chmod(0o755)
    markers = base / "markers"
    (base / "hub").mkdir()
    (base / "hub").chmod(0o755)
    hub = Hub(base / "hub", GROUPS, POOL_CONFIG).start()
    try:
        run = crash_under_load(hub, markers, kills=kills, seconds=10.0,
                               rng=random.Random(seed))
    finally:
        hub.stop()
        shutil.rmtree(base, ignore_errors=True)
    return run


def baseline_downtime() -> float:
    """Without the supervisor: kill it and the service; the hub restarts it at its poll."""
    base = Path(tempfile.mkdtemp(prefix="gpushare-crash-"))
    base.chmod(0o755)
    hub = Hub(base, GROUPS, POOL_CONFIG).start()
    try:
        import os
        import signal
        for pid in hub.supervisor_pids() + hub.service_pids():
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        hub.wait_for_pool(120)
        return time.monotonic() - killed
    finally:
        hub.stop()
        shutil.rmtree(base, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--kills", type=int, default=2)
    ap.add_argument("--baseline", action="store_true",
                    help="also measure the hub's own restart of a dead service, once")
    args = ap.parse_args()
    system_users(["alice", "bob", "admin"])
    downtimes, accepted, failures = [], 0, 0
    for i in range(args.runs):
        run = one_run(1000 + i, args.kills)
        downtimes += run.downtimes
        accepted += len(run.accepted)
        failures += bool(run.problems)
        print(f"run {i + 1}: {len(run.accepted)} jobs accepted, downtimes "
              f"{', '.join(f'{d:.2f} s' for d in run.downtimes)}, "
              + ("nothing lost, run twice or made twice" if not run.problems
                 else f"PROBLEMS: {run.problems[:3]}"), flush=True)
    print(f"{args.runs} runs, {len(downtimes)} kills, {accepted} jobs accepted, "
          f"{failures} run(s) with problems")
    print(f"downtime after a kill: median {statistics.median(downtimes):.2f} s, worst "
          f"{max(downtimes):.2f} s")
    if args.baseline:
        d = baseline_downtime()
        print(f"baseline, the hub restarting the service itself: {d:.1f} s "
              f"({d / max(downtimes):.0f}x the worst with the supervisor)")


if __name__ == "__main__":
    main()
