"""Benchmark: drawing the admin dashboard (``jupyter_gpushare.dashboard.render``) for pools of
64, 256 and 1,024 GPUs.

The page is built from the API's answers; what it costs beyond them is the HTML and SVG. Each
size gets a plausible pool: 8 GPUs per node (7 train nodes for each build node), a job on
every second train GPU, four ¼ slices on each build GPU, a project per 16 GPUs with a 6-hour
series in 5-minute buckets, a queue of one waiting job per 8 GPUs, 50 culling events. Timed,
``--repeat`` times: ``render(data)``; the baseline, in the same run: ``json.dumps(data)``,
serialising the same answers as the API would send them. Printed: p50/p99 of both, their
ratio, and the page's size.

    .venv/bin/python benchmarks/dashboard_render.py [--repeat 30]
"""

import argparse
import json
import random
import statistics
import time

from jupyter_gpushare.dashboard import choose_window, render

GiB = 2**30
NOW = 1_800_000_000.0


def pool_of(n_gpus: int, rng: random.Random) -> dict:
    nodes = n_gpus // 8
    build_nodes = max(1, nodes // 8)
    train_nodes = nodes - build_nodes
    projects = [f"project-{i:03d}" for i in range(max(1, n_gpus // 16))]
    gpus, jobs, slices = [], [], []
    for n in range(train_nodes):
        for i in range(8):
            holders = []
            if i % 2 == 0:
                job = f"j-{n:04d}{i}"
                project, user = rng.choice(projects), f"user{rng.randrange(200)}"
                sm = rng.random()
                holders.append({"kind": "job", "gpus": 1.0, "sm": round(sm, 4),
                                "memory_bytes": 20 * GiB, "project": project, "user": user,
                                "job": job, "attempt": 1,
                                "idle_for_s": 900 if sm < 0.05 else None})
                jobs.append({"id": job, "name": f"train-{n}-{i}", "user": user,
                             "project": project, "gpus": 1.0, "state": "running",
                             "attempt": 1, "submitted": NOW - 3600, "queue_position": None,
                             "reason": "", "usage": {"idle_for_s": holders[0]["idle_for_s"]}})
            gpus.append({"node": f"train-{n}", "index": i, "uuid": f"GPU-t{n}-{i}",
                         "pool": "train", "name": "H100", "lost": False,
                         "utilization": round(rng.random(), 4), "memory_used_bytes": 20 * GiB,
                         "memory_total_bytes": 80 * GiB, "held": len(holders),
                         "holders": holders, "outside": {"processes": 0, "memory_bytes": 0},
                         "at": NOW})
    for n in range(build_nodes):
        for i in range(8):
            holders = []
            for k in range(4):
                slice_id = f"s-{n}-{i}-{k}"
                user = f"user{rng.randrange(200)}"
                holders.append({"kind": "slice", "gpus": 0.25, "sm": round(rng.random() / 4, 4),
                                "memory_bytes": 2 * GiB, "user": user, "slice": slice_id,
                                "idle_for_s": None})
                slices.append({"id": slice_id, "user": user, "server": "", "gpus": 0.25,
                               "usage": {"idle_for_s": None}, "cull": None})
            gpus.append({"node": f"build-{n}", "index": i, "uuid": f"GPU-b{n}-{i}",
                         "pool": "build", "name": "H100", "lost": False, "utilization": 0.3,
                         "memory_used_bytes": 8 * GiB, "memory_total_bytes": 80 * GiB,
                         "held": 1.0, "holders": holders,
                         "outside": {"processes": 0, "memory_bytes": 0}, "at": NOW})
    for q in range(n_gpus // 8):
        jobs.append({"id": f"p-{q}", "name": f"wait-{q}", "user": f"user{q % 200}",
                     "project": rng.choice(projects), "gpus": 4.0, "state": "pending",
                     "attempt": 1, "submitted": NOW - 60 * q, "queue_position": q + 1,
                     "reason": "waiting for 4 GPUs on one node; reclaiming 2 GPUs from "
                               "project project-001"})
    window = choose_window("6h", NOW)
    series = [{"t": (window.since // 300 + k) * 300, "project": p,
               "allocation": rng.random() / len(projects), "utilization": rng.random()}
              for k in range(72) for p in projects]
    rows = [{"project": p, "allocated_gpu_seconds": 3600.0, "allocation": 0.1,
             "utilization": 0.5, "idle_ratio": 0.1, "memory_peak_bytes": 40 * GiB}
            for p in projects]
    events = [{"at": NOW - 60 * k, "kind": "warn", "user": f"user{k}", "server": "",
               "slice": f"s-{k}", "reason": "no GPU use and no activity for 2 h; it will be "
                                            "stopped in 10 min unless used"} for k in range(50)]
    return {
        "now": NOW, "offset": 0, "zone": "UTC", "user": "admin", "window": window,
        "refresh_s": 15,
        "pool": {"capacity": train_nodes * 8, "in_use": train_nodes * 4, "simulated": False,
                 "usage_source": "nvml",
                 "nodes": [{"name": f"train-{n}", "gpus": 8} for n in range(train_nodes)],
                 "build": {"capacity": build_nodes * 8, "in_use": build_nodes * 8,
                           "nodes": [{"name": f"build-{n}", "gpus": 8}
                                     for n in range(build_nodes)]},
                 "gpus": gpus, "usage_notes": [],
                 "culling": {"after": 7200, "warning": 600, "culled": 3, "events": events}},
        "projects": [{"name": p, "quota": 8, "in_use": 8} for p in projects],
        "usage": {"idle_threshold": 0.05, "series": series, "rows": rows, "pools": {}},
        "idle_jobs": [{"job": j["id"], "user": j["user"], "project": j["project"],
                       "idle_gpu_seconds": 3600, "idle_ratio": 0.9, "utilization": 0.02}
                      for j in jobs[:10]],
        "idle_slices": [{"slice": s["id"], "user": s["user"], "idle_gpu_seconds": 1800,
                         "idle_ratio": 1.0, "utilization": 0.0} for s in slices[:10]],
        "jobs": jobs, "slices": slices}


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return sorted(out)


def p(values, q):
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    print(f"{'GPUs':>6} {'render p50/p99 ms':>20} {'json.dumps p50/p99 ms':>24} "
          f"{'ratio p50':>10} {'page KiB':>9} {'JSON KiB':>9}")
    for n_gpus in (64, 256, 1024):
        data = pool_of(n_gpus, random.Random(n_gpus))
        page = render(data)
        plain = {**data, "window": [data["window"].since, data["window"].until]}
        ours = timed(lambda: render(data), args.repeat)
        base = timed(lambda: json.dumps(plain), args.repeat)
        print(f"{n_gpus:>6} {p(ours, .5):>9.1f} / {p(ours, .99):<8.1f} "
              f"{p(base, .5):>11.1f} / {p(base, .99):<10.1f} "
              f"{statistics.median(ours) / statistics.median(base):>9.1f}x "
              f"{len(page.encode()) / 1024:>9.0f} {len(json.dumps(plain)) / 1024:>9.0f}")


if __name__ == "__main__":
    main()
