"""Benchmark: the pool service under load, in a real JupyterHub behind the real proxy.

200 concurrent clients poll ``GET api/jobs`` (each with a user's token) while 20 jobs a second
are submitted for 60 s on the local backend (8 simulated nodes of 8 GPUs; the jobs run
``true``).
Each client asks again at once, with the last answer's ETag as PoolClient does (the widget
and the lab panel poll through it), so an unchanged answer is a 304 (``--no-etag``: never).
Prints request latency p50/p99, 304s, answer sizes and errors, and submit-to-running latency
(from the job's own timestamps), split by whether a GPU was free at the submit. Baseline in
the same run: the same clients on ``api/openapi.json``, which goes through the same proxy and tornado but asks neither
JupyterHub nor the database, while the same stream of jobs is submitted
(``--quiet-baseline``: without it, as this benchmark did at first). The two take turns
(``--turns``, 3 by default), each running ``--seconds`` in all.

    .venv/bin/python benchmarks/pool_api_load.py [--clients 200] [--rate 20] [--seconds 60]

Needs root (jobs run as the test users) and the proxy (the README's test command).
"""

import argparse
import asyncio
import json
import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hubtest import Hub, system_users  # noqa: E402

from jupyter_gpushare.sim.metrics import percentile  # noqa: E402

POOL = """
c = get_config()
c.PoolService.projects = {"vision": {"quota": 4, "groups": ["vision"]},
                          "nlp": {"quota": 4, "groups": ["nlp"]}}
c.PoolService.cycle_interval = 0.5
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = {nodes}
c.LocalBackend.simulated_gpus_per_node = 8
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]
"""


async def poll(url, token, until, latencies, errors, seen, revalidate=True):
    """Ask again and again, as PoolClient does: with the last answer's ETag, so that an
    unchanged answer comes back as 304 without a body (``revalidate``)."""
    client, etag = AsyncHTTPClient(), None
    while time.monotonic() < until:
        headers = {"Authorization": f"token {token}"}
        if etag and revalidate:
            headers["If-None-Match"] = etag
        t = time.perf_counter()
        try:
            resp = await client.fetch(HTTPRequest(url, headers=headers, request_timeout=30),
                                      raise_error=False)
            if resp.code not in (200, 304):
                raise HTTPClientError(resp.code, response=resp)
            latencies.append(time.perf_counter() - t)
            seen["304"] += resp.code == 304
            seen["bytes"] += len(resp.body or b"")
            etag = resp.headers.get("Etag", etag)
        except (HTTPClientError, OSError) as e:
            errors.append(str(e))


async def submit_stream(hub, tokens, rate, until, ids, errors):
    """POST a job every 1/rate seconds, without waiting for earlier answers."""
    client = AsyncHTTPClient()

    async def one(n):
        user = ("alice", "bob")[n % 2]
        body = json.dumps({"gpus": 1, "command": ["true"], "name": f"load-{n}"})
        try:
            resp = await client.fetch(HTTPRequest(hub.pool_url + "api/jobs", method="POST",
                                                  body=body, request_timeout=60, headers={
                                                      "Authorization": f"token {tokens[user]}",
                                                      "Content-Type": "application/json"}))
            ids.append((user, json.loads(resp.body)["id"]))
        except (HTTPClientError, OSError) as e:
            errors.append(str(e))

    tasks, n, start = [], 0, time.monotonic()
    while time.monotonic() < until:
        tasks.append(asyncio.ensure_future(one(n)))
        n += 1
        await asyncio.sleep(max(0.0, start + n / rate - time.monotonic()))
    await asyncio.gather(*tasks)


def submitter(hub, tokens, rate, seconds, out):
    """In its own process, so the pollers cannot slow the submit rate down."""
    ids, errors = [], []
    asyncio.run(submit_stream(hub, tokens, rate, time.monotonic() + seconds, ids, errors))
    out.put((ids, errors))


async def phase(hub, tokens, path, clients, seconds, rate=0, revalidate=True):
    latencies, errors, ids, seen = [], [], [], {"304": 0, "bytes": 0}
    until = time.monotonic() + seconds
    users = list(tokens)
    if rate:
        out = multiprocessing.Queue()
        proc = multiprocessing.Process(target=submitter, args=(hub, tokens, rate, seconds, out))
        proc.start()
    await asyncio.gather(*[poll(hub.pool_url + path, tokens[users[i % len(users)]], until,
                                latencies, errors, seen, revalidate)
                           for i in range(clients)])
    if rate:
        ids, submit_errors = out.get()
        proc.join()
        errors += submit_errors
    return latencies, errors, ids, seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--rate", type=float, default=20)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--turns", type=int, default=3,
                    help="the baseline and ours take turns this many times, each for "
                         "seconds/turns: both run --seconds in all")
    ap.add_argument("--nodes", type=int, default=8,
                    help="simulated nodes of 8 GPUs: enough that a job finds a free GPU (each "
                         "holds one for the start of its process, 0.2-0.5 s on 2 busy cores); "
                         "with 1, the jobs queue for GPUs at 20 submits/s")
    ap.add_argument("--no-etag", dest="revalidate", action="store_false",
                    help="clients that never send If-None-Match (every answer has a body)")
    ap.add_argument("--quiet-baseline", action="store_true",
                    help="no submits during the baseline (as before): its machine then has "
                         "no jobs to start, so it is lighter loaded than ours")
    args = ap.parse_args()
    for name in ("clients", "seconds", "turns", "nodes"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name} must be more than 0")
    if args.rate < 0:
        ap.error("--rate must be 0 (no submits) or more")
    system_users(["alice", "bob"])
    AsyncHTTPClient.configure(None, max_clients=args.clients + 10)
    tmp = tempfile.mkdtemp(prefix="gpushare-load-")
    if True:
        Path(tmp).chmod(0o755)
        hub = Hub(Path(tmp), {"vision": ["alice"], "nlp": ["bob"]},
                  POOL.replace("{nodes}", str(args.nodes))).start()
        try:
            tokens = {u: hub.token(u) for u in ("alice", "bob")}
            # The baseline under the same stream of submits: the same jobs start on the
            # same machine, and only what the clients ask differs. Baseline and ours take
            # turns (``--turns``), so that both see the machine's slow and quick moments.
            lat, err, ids, ours_seen = [], [], [], {"304": 0, "bytes": 0}
            base_lat, base_err, base_ids, base_seen = [], [], [], {"304": 0, "bytes": 0}
            for _ in range(args.turns):
                for path, (latencies, errors, jobs_of, seen) in (
                        ("api/openapi.json", (base_lat, base_err, base_ids, base_seen)),
                        ("api/jobs", (lat, err, ids, ours_seen))):
                    turn = asyncio.run(phase(
                        hub, tokens, path, args.clients, args.seconds / args.turns,
                        0 if args.quiet_baseline and path != "api/jobs" else args.rate,
                        revalidate=args.revalidate))
                    latencies += turn[0]
                    errors += turn[1]
                    jobs_of += turn[2]
                    for k in seen:
                        seen[k] += turn[3][k]
            time.sleep(3)
            jobs, ours = [], set(ids)
            for user, job_id in ids + base_ids:
                status, job = hub.api("GET", f"api/jobs/{job_id}", user)
                if status == 200 and job["started"]:
                    jobs.append(job)
            to_running = [j["started"] - j["submitted"] for j in jobs
                          if (j["user"], j["id"]) in ours]
        finally:
            hub.stop()

    def ms(values, q):
        return percentile([v * 1000 for v in values], q)

    print(f"{args.clients} clients polling ({'with' if args.revalidate else 'without'} "
          f"If-None-Match), {args.rate:g} submits/s, {args.seconds:g} s each in {args.turns} turns "
          f"({len(ids)} jobs submitted; baseline "
          f"{'without submits' if args.quiet_baseline else 'under the same submits'})")
    print(f"{'':24}{'requests':>10}{'304':>8}{'kB/answer':>10}{'p50 ms':>9}{'p99 ms':>9}"
          f"{'errors':>8}")
    for name, values, errs, seen in (("GET api/jobs (ours)", lat, err, ours_seen),
                                     ("GET api/openapi.json", base_lat, base_err, base_seen)):
        print(f"{name:24}{len(values):>10}{seen['304']:>8}"
              f"{seen['bytes'] / max(1, len(values)) / 1000:>10.1f}{ms(values, 50):>9.1f}"
              f"{ms(values, 99):>9.1f}{len(errs):>8}")
    print(f"ours / baseline: p50 {ms(lat, 50) / ms(base_lat, 50):.2f}x, "
          f"p99 {ms(lat, 99) / ms(base_lat, 99):.2f}x")
    print(f"submit to running: p50 {ms(to_running, 50):.0f} ms, p99 {ms(to_running, 99):.0f} ms "
          f"({len(to_running)} of {len(ids)} jobs started)")
    # Why a start waited: every one of the pool's GPUs held at the submit (the jobs queue
    # for GPUs; how long each holds one is the start of its process, ``true``, and the
    # noticing of its end), or a GPU free and the wait the service's own.
    gpus = args.nodes * 8
    free, full = [], []
    for j in jobs:
        if (j["user"], j["id"]) not in ours:
            continue
        held = sum(k["started"] <= j["submitted"] < (k["finished"] or float("inf"))
                   for k in jobs if k is not j)
        (full if held >= gpus else free).append(j["started"] - j["submitted"])
    held_for = [j["finished"] - j["started"] for j in jobs if j["finished"]]
    for name, values in (("a GPU was free at submit", free),
                         ("all GPUs held at submit", full)):
        if values:
            print(f"  {name}: {len(values)} jobs, submit to running p50 {ms(values, 50):.0f} "
                  f"ms, p99 {ms(values, 99):.0f} ms")
    if held_for:
        print(f"  a job holds its GPU (start to recorded end) p50 {ms(held_for, 50):.0f} ms, "
              f"p99 {ms(held_for, 99):.0f} ms; {gpus} GPUs serve at most "
              f"{gpus / (sum(held_for) / len(held_for)):.1f} jobs/s")
    if err:
        print("first errors:", *sorted(set(err))[:3], sep="\n  ")
        print(f"the hub's and the service's log: {tmp}/hub.log")
    else:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
