"""Benchmark: a what-if over 90 days of a 256-GPU pool's recorded history.

The history: the Philly trace (../shared/traces, 2,816 GPUs) cut to its first 90 days, every
job kept with probability 256/2816 (by its id, so the same jobs each run), quotas scaled to
256 GPUs; run once by the simulator on 32 nodes of 8 GPUs, and its starts, preemptions and
ends written into a fresh pool store as jobs and attempts, ending an hour ago. Then a real hub
and pool service (tests/hubtest.py, 32 simulated nodes of 8 GPUs) serve that store, and:

1. ``gpushare simulate --from-pool --since 90d --capacity +32`` (history fetch over HTTP, both
   replays) is timed, end to end, in a process of its own;
2. ``GET api/jobs?all=1`` is asked ``--requests`` times, one after another, idle, and again
   while a what-if (``POST api/whatif``, the same replays in the service's worker process)
   runs (until it ends); ``--turns`` times each, taking turns; p50/p99 of both are printed.

    .venv/bin/python benchmarks/whatif_history.py [--requests 300]

Needs root (the hub's users) and the proxy (the README's test command).
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
import zlib
from io import StringIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from hubtest import Hub, system_users  # noqa: E402

from jupyter_gpushare.policy.model import GPU  # noqa: E402
from jupyter_gpushare.sim.engine import SimConfig, Simulator  # noqa: E402
from jupyter_gpushare.sim.metrics import percentile  # noqa: E402
from jupyter_gpushare.sim.trace import apportion, read_quotas, read_trace  # noqa: E402

TRACES = ROOT.parent / "shared" / "traces"
DAYS, GPUS, NODE = 90, 256, 8


def recorded_history(end: float):
    """Jobs and attempts of the scaled trace as the pool would have recorded them."""
    keep = GPUS / 2816
    jobs = [j for j in read_trace(TRACES / "philly.csv.gz")
            if j.submit_time < DAYS * 86400 and j.gpus <= 64 * GPU
            and zlib.crc32(j.id.encode()) / 2**32 < keep]
    quotas = apportion({p: q for p, q in read_quotas(TRACES / "philly_quotas.csv").items()},
                       GPUS)
    events = StringIO()
    run = Simulator(jobs, quotas, SimConfig(GPUS, NODE), events=events).run()
    start = end - DAYS * 86400
    attempts: dict[str, list] = {}
    for line in events.getvalue().splitlines():
        e = json.loads(line)
        if e["event"] == "start":
            attempts.setdefault(e["job"], []).append([e["attempt"], start + e["t"], None])
        elif e["event"] in ("preempt", "finish") and attempts.get(e["job"]):
            a = attempts[e["job"]][-1]
            if a[2] is None:
                a[2] = start + e["t"] + (30.0 if e["event"] == "preempt" else 0.0)
    rows, att = [], []
    for j in jobs:
        rec = run.records[j.id]
        if rec.finish is None or start + rec.finish > end or j.id not in attempts:
            continue
        t = start + j.submit_time
        rows.append({"id": j.id, "user": "admin", "project": j.project, "name": "", "gpus": j.gpus,
                     "priority": 0, "command": ["true"], "env": {}, "checkpoint_dir": "",
                     "state": "succeeded", "attempt": len(attempts[j.id]), "submitted": t,
                     "pending_since": t, "started": attempts[j.id][-1][1],
                     "finished": start + rec.finish, "placement": {}, "handle": {},
                     "preempting": False, "cancel_requested": False, "exit_code": 0,
                     "message": ""})
        att += [{"job_id": j.id, "attempt": n, "started": s, "ended": e or start + rec.finish,
                 "placement": {}, "outcome": "succeeded", "exit_code": 0}
                for n, s, e in attempts[j.id]]
    return rows, att, quotas


def fill_store(path: Path, rows, att) -> None:
    from sqlalchemy import insert

    from jupyter_gpushare.pool.store.models import AttemptRow, JobRow
    from jupyter_gpushare.pool.store.database import Store

    store = Store(f"sqlite:///{path}")
    with store.engine.begin() as conn:
        for i in range(0, len(rows), 2000):
            conn.execute(insert(JobRow), rows[i:i + 2000])
        for i in range(0, len(att), 2000):
            conn.execute(insert(AttemptRow), att[i:i + 2000])
    store.engine.dispose()


def latencies(hub, path: str, n: int, while_running=None) -> list[float]:
    out = []
    token = hub.token("admin")
    for _ in range(n):
        t = time.perf_counter()
        status, _ = hub.request("GET", hub.pool_url + path, token)
        out.append((time.perf_counter() - t) * 1000)
        assert status == 200, status
        if while_running is not None and not while_running():
            break
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300, help="requests a phase")
    parser.add_argument("--turns", type=int, default=3, help="idle and busy phases, in turns")
    args = parser.parse_args()
    system_users(["admin"])
    tick = time.perf_counter()
    rows, att, quotas = recorded_history(time.time() - 3600)
    print(f"history: {len(rows)} jobs, {len(att)} attempts over {DAYS} days on {GPUS} GPUs "
          f"(made in {time.perf_counter() - tick:.1f} s)")
    projects = {p: {"quota": q // GPU, "groups": []} for p, q in quotas.items()}
    pool = (f"c = get_config()\nc.PoolService.projects = {projects!r}\n"
            "c.LocalBackend.simulate_gpus = True\n"
            f"c.LocalBackend.simulated_nodes = {GPUS // NODE}\n"
            f"c.LocalBackend.simulated_gpus_per_node = {NODE}\n")
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        d.chmod(0o755)
        (d / "pool").mkdir(mode=0o700)
        fill_store(d / "pool" / "gpushare.sqlite", rows, att)
        hub = Hub(d, {}, pool).start(timeout=180)
        try:
            token = hub.token("admin")
            hub.request("GET", hub.pool_url + "api/jobs?all=1", token)  # warm
            t = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-m", "jupyter_gpushare", "simulate", "--from-pool", "--since",
                 f"{DAYS}d", "--capacity", "+32", "--json", "--url", hub.pool_url,
                 "--token", token], capture_output=True, text=True)
            wall = time.perf_counter() - t
            if done.returncode:
                sys.exit(done.stderr)
            r = json.loads(done.stdout)
            print(f"--from-pool: {wall:.1f} s end to end (history fetch {r['fetch_s']} s, "
                  f"{r['jobs']} jobs; replays {r['wall_s'] - r['fetch_s']:.1f} s)")
            idle, busy, took = [], [], []
            for _ in range(args.turns):  # taking turns: the machine's noise hits both
                idle += latencies(hub, "api/jobs?all=1", args.requests)
                status, run = hub.request("POST", hub.pool_url + "api/whatif", token,
                                          {"since": f"{DAYS}d", "capacity": "+32"})
                assert status == 202, run

                def running():
                    return hub.request("GET", hub.pool_url + f"api/whatif/{run['id']}",
                                       token)[1]["state"] == "replaying"
                t = time.perf_counter()
                busy += latencies(hub, "api/jobs?all=1", args.requests, running)
                while running():
                    time.sleep(0.5)
                took.append(time.perf_counter() - t)
            for name, xs in (("idle", idle), ("during a what-if", busy)):
                print(f"GET api/jobs?all=1 {name}: n={len(xs)} p50 {percentile(xs, 50):.1f} ms, "
                      f"p99 {percentile(xs, 99):.1f} ms")
            print(f"p99 ratio {percentile(busy, 99) / percentile(idle, 99):.2f}; the service's "
                  f"what-ifs took {', '.join(f'{x:.1f}' for x in took)} s")
        finally:
            hub.stop()


if __name__ == "__main__":
    main()
