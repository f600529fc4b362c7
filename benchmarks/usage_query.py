"""Benchmark: ``api/usage`` over 90 days of rollups for 256 GPUs.

A SQLite store (the default) is filled as the service leaves it after 90 days on 256 GPUs
(224 train, 32 build): minute rows for the last 7 days, hour and day rows for all 90, per GPU,
pool, project (16), job attempt (56 running at a time, 8 hours each) and slice (64 at a time). Then
the answers of ``api/usage`` are timed as its handler makes them (``UsageMeter.query``: the
database read in a worker thread, the figures from the sums), ``--repeat`` times each:
  project 90d        allocation and utilization per project (the dashboard's table)
  project 90d 1d     the same as a daily series (the dashboard's chart)
  job 90d idle top10 the ten most idle-allocated jobs
  gpu 90d            every GPU
  project 7d         a week
and the baseline, in the same run: a week by project read from minute rows only, as it would
be without hour rows (90 days of minute rows are not kept).

    .venv/bin/python benchmarks/usage_query.py [--days 90] [--gpus 256] [--repeat 30]
"""

import argparse
import asyncio
import random
import sqlite3
import statistics
import tempfile
import time

from jupyter_gpushare.pool.store.database import Store
from jupyter_gpushare.pool.store.usage_rollups import DAY, HOUR, MINUTE, Scope, UsageStore
from jupyter_gpushare.usage.meter import UsageMeter, UsageSettings
from jupyter_gpushare.usage.report import BY

COLUMNS = ("t", "step", "kind", "key", "node", "project", "user", "job", "capacity",
           "allocated", "measured", "utilized", "idle", "seconds", "memory_peak", "memory_total")


def rows_of_bucket(t, step, n_gpus, rng_state):
    """Plausible rows of one bucket: every GPU, the pools, projects, running jobs, slices."""
    rng = random.Random(rng_state)
    train, build = n_gpus * 7 // 8, n_gpus // 8
    cap = 1000.0 * step
    out = []
    for g in range(n_gpus):
        util = rng.random() * 100
        out.append((t, step, "gpu", f"GPU-{g:04d}", f"node-{g // 8:03d}", "", "", "", cap,
                    cap * 0.8, cap, util * 10 * step, cap * 0.1, float(step), 2**33, 2**36))
    for name, n in (("train", train), ("build", build)):
        out.append((t, step, "pool", name, "", "", "", "", cap * n, cap * n * 0.8, cap * n * 0.8,
                    cap * n * 0.4, cap * n * 0.1, 0.0, 2**40, 2**42))
    for p in range(16):
        out.append((t, step, "project", f"p{p:02d}", "", f"p{p:02d}", "", "", 0.0,
                    cap * 12, cap * 12, cap * 6, cap, float(step), 2**36, 0))
    epoch = t // (8 * 3600)  # jobs and slices live 8 hours
    for j in range(56):
        job = f"j-{epoch:05d}-{j:02d}"
        out.append((t, step, "job", f"{job}/1", "", f"p{j % 16:02d}", f"u{j % 40:02d}", job,
                    0.0, cap * 4, cap * 4, cap * 4 * rng.random(), cap * rng.random(),
                    float(step), 2**35, 0))
    for s in range(64):
        out.append((t, step, "slice", f"s-{epoch:05d}-{s:02d}", "", "", f"u{s % 40:02d}", "",
                    0.0, cap / 4, cap / 4, cap / 4 * rng.random(), cap / 8, float(step),
                    2**32, 0))
    return out


def fill(path, end, days, n_gpus):
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    sql = f"INSERT INTO usage ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
    count = 0
    for step, back in ((DAY, days * DAY), (HOUR, days * DAY), (MINUTE, 7 * DAY)):
        batch = []
        for t in range((end - back) // step * step, end // step * step, step):  # closed ones
            batch += rows_of_bucket(t, step, n_gpus, t)
            if len(batch) > 200_000:
                conn.executemany(sql, batch)
                count += len(batch)
                batch = []
        conn.executemany(sql, batch)
        count += len(batch)
    conn.commit()
    conn.execute("ANALYZE")
    conn.close()
    return count


def percentiles(samples):
    samples = sorted(samples)
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


async def time_query(meter, repeat, *args, **kw):
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        answer = await meter.query(*args, **kw)
        out.append((time.perf_counter() - start) * 1000)
    return percentiles(out), answer


async def main_async(args):
    end = int(time.time()) // DAY * DAY + 13 * HOUR + 17 * MINUTE  # now: mid-day, mid-hour
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/pool.sqlite"
        store = Store(f"sqlite:///{path}")
        started = time.monotonic()
        count = fill(path, end, args.days, args.gpus)
        print(f"{count:,} rollup rows ({args.days} days, {args.gpus} GPUs) written in "
              f"{time.monotonic() - started:.0f} s")
        meter = UsageMeter(UsageStore(store), UsageSettings(), clock=lambda: end)
        cases = [("project 90d", (end - args.days * DAY, end, BY["project"], Scope()), {}),
                 ("project 90d 1d", (end - args.days * DAY, end, BY["project"], Scope()),
                  {"series_step": DAY}),
                 ("job 90d idle top10", (end - args.days * DAY, end, BY["job"], Scope()),
                  {"sort": "idle", "limit": 10}),
                 ("gpu 90d", (end - args.days * DAY, end, BY["gpu"], Scope()), {}),
                 ("project 7d", (end - 7 * DAY, end, BY["project"], Scope()), {})]
        print(f"{'query':<22}{'p50 ms':>10}{'p99 ms':>10}  rows")
        results = {}
        for name, a, kw in cases:
            (p50, p99), answer = await time_query(meter, args.repeat, *a, **kw)
            results[name] = (p50, p99)
            print(f"{name:<22}{p50:>10.1f}{p99:>10.1f}  {len(answer['rows'])}")
        # Baseline: the week by project from minute rows only.
        rows = UsageStore(store)
        timings = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            await asyncio.to_thread(rows.sums, ("project",), [(MINUTE, end - 7 * DAY, end)],
                                    ("key",))
            await asyncio.to_thread(rows.sums, ("pool",), [(MINUTE, end - 7 * DAY, end)],
                                    ("key",))
            timings.append((time.perf_counter() - start) * 1000)
        p50, p99 = percentiles(timings)
        print(f"{'baseline: 7d minutes':<22}{p50:>10.1f}{p99:>10.1f}")
        ours = results["project 7d"]
        print(f"project 7d: {p50 / ours[0]:.1f}x faster than the baseline at p50, "
              f"{p99 / ours[1]:.1f}x at p99")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=30)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
