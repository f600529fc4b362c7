"""Benchmark: a valid user's requests while strangers flood the pool service with random
tokens, in a real JupyterHub behind the real proxy.

Strangers send ``--rate`` (50) requests a second, each with a new random token and no other
credentials, from a process of their own. Meanwhile one user asks ``GET api/quota``:
- with a token whose answer the service holds (*cached*, 5 a second),
- with tokens last used between one and two ``token_cache_ttl`` ago (*stale*: used while
  the service checks them again in the background), and more than two ago (*expired*: the
  request waits for that check), one a second each,
- with a token made a moment before (*new*), one every 2 s.
A request's kind is the age of its token's last answer, measured, not planned.
Flooded and quiet turns alternate (``--turns``), ``--seconds`` of each in all; prints each
kind's count, errors and p50/p99, flooded and quiet, and the p99 ratio.

    .venv/bin/python benchmarks/token_flood.py [--rate 50] [--seconds 120] [--ttl 10]

Needs root (the hub's test users) and the proxy (the README's test command).
"""

import argparse
import asyncio
import json
import multiprocessing
import secrets
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from tornado.httpclient import AsyncHTTPClient, HTTPRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hubtest import Hub, system_users  # noqa: E402

from jupyter_gpushare.sim.metrics import percentile  # noqa: E402

POOL = """
c = get_config()
c.PoolService.projects = {{"vision": {{"quota": 1, "groups": ["vision"]}}}}
c.PoolService.token_cache_ttl = {ttl}
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
"""
KINDS = ("cached", "stale", "expired", "new")


async def flood(url, rate, seconds):
    """Open loop: a request every 1/rate s with a fresh random token, not waiting for the
    answers of earlier ones."""
    client, answers = AsyncHTTPClient(max_clients=1000), Counter()

    async def one():
        try:
            resp = await client.fetch(HTTPRequest(url, headers={
                "Authorization": f"token {secrets.token_hex(16)}"}, request_timeout=30),
                raise_error=False)
            answers[resp.code] += 1
        except OSError as e:
            answers[type(e).__name__] += 1

    tasks, n, start = [], 0, time.monotonic()
    while time.monotonic() < start + seconds:
        tasks.append(asyncio.ensure_future(one()))
        n += 1
        await asyncio.sleep(max(0.0, start + n / rate - time.monotonic()))
    await asyncio.gather(*tasks)
    return answers, n / (time.monotonic() - start)


def flooder(url, rate, seconds, out):
    out.put(asyncio.run(flood(url, rate, seconds)))


class User:
    """One user's tokens and when the service last answered for each."""

    def __init__(self, hub, ttl):
        self.hub, self.ttl = hub, ttl
        self.client = AsyncHTTPClient()
        self.answered: dict[str, float] = {}

    async def make_token(self) -> str:
        resp = await self.client.fetch(HTTPRequest(
            f"{self.hub.url}/hub/api/users/alice/tokens", method="POST",
            body=json.dumps({"note": "token_flood"}),
            headers={"Authorization": f"token {self.hub.tester_token}"}))
        return json.loads(resp.body)["token"]

    async def ask(self, token, results, new=False):
        age = time.monotonic() - self.answered.get(token, -1e9)
        kind = "new" if new else ("cached" if age < self.ttl else
                                  "stale" if age < 2 * self.ttl else "expired")
        began = time.perf_counter()
        resp = await self.client.fetch(HTTPRequest(self.hub.pool_url + "api/quota", headers={
            "Authorization": f"token {token}"}, request_timeout=30), raise_error=False)
        took = time.perf_counter() - began
        if resp.code == 200:
            results[kind].append(took)
            self.answered[token] = time.monotonic()
        else:
            results[f"{kind} errors"].append(resp.code)

    async def loop(self, every, tokens, until, results):
        n = 0
        while time.monotonic() < until:
            await self.ask(tokens[n % len(tokens)], results)
            n += 1
            await asyncio.sleep(every)

    async def news(self, until, results):
        while time.monotonic() < until:
            await self.ask(await self.make_token(), results, new=True)
            await asyncio.sleep(2)

    async def turn(self, tokens, seconds):
        results = {k: [] for k in KINDS} | {f"{k} errors": [] for k in KINDS}
        until = time.monotonic() + seconds
        await asyncio.gather(self.loop(0.2, tokens["cached"], until, results),
                             self.loop(1.0, tokens["stale"], until, results),
                             self.loop(1.0, tokens["expired"], until, results),
                             self.news(until, results))
        return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=50, help="random-token requests a second")
    ap.add_argument("--seconds", type=float, default=120,
                    help="seconds of flood, and as many without, in all")
    ap.add_argument("--turns", type=int, default=2,
                    help="quiet and flooded turns alternate this many times each")
    ap.add_argument("--ttl", type=float, default=10,
                    help="the service's token_cache_ttl: short, so that many answers expire")
    args = ap.parse_args()
    for name in ("rate", "seconds", "turns", "ttl"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name} must be more than 0")
    system_users(["alice"])
    tmp = Path(tempfile.mkdtemp(prefix="gpushare-flood-"))
    tmp.chmod(0o755)
    hub = Hub(tmp, {"vision": ["alice"]}, POOL.format(ttl=args.ttl)).start()
    quiet = {k: [] for k in KINDS} | {f"{k} errors": [] for k in KINDS}
    flooded = {k: list(v) for k, v in quiet.items()}
    floods, rates = Counter(), []
    try:
        user = User(hub, args.ttl)

        async def prepare():
            # Used one a second in turn: stale tokens come round after 1.5 ttl, expired
            # ones after 2.5 ttl.
            tokens = {"cached": [await user.make_token()],
                      "stale": [await user.make_token() for _ in range(round(1.5 * args.ttl))],
                      "expired": [await user.make_token()
                                  for _ in range(round(2.5 * args.ttl))]}
            for token in sum(tokens.values(), []):
                await user.ask(token, {k: [] for k in KINDS} | {
                    f"{k} errors": [] for k in KINDS}, new=True)
            return tokens

        loop = asyncio.new_event_loop()
        tokens = loop.run_until_complete(prepare())
        each = args.seconds / args.turns
        for _ in range(args.turns):
            for flooding, into in ((False, quiet), (True, flooded)):
                if flooding:
                    out = multiprocessing.Queue()
                    proc = multiprocessing.Process(target=flooder, args=(
                        hub.pool_url + "api/pool", args.rate, each, out))
                    proc.start()
                results = loop.run_until_complete(user.turn(tokens, each))
                if flooding:
                    answers, rate = out.get()
                    proc.join()
                    floods.update(answers)
                    rates.append(rate)
                for k, v in results.items():
                    into[k] += v
        loop.close()
    finally:
        hub.stop()

    def ms(values, q):
        return percentile([v * 1000 for v in values], q) if values else float("nan")

    print(f"a flood of random tokens at {args.rate:g}/s (sent {min(rates):.1f}-"
          f"{max(rates):.1f}/s) for {args.seconds:g} s, and as long without, in "
          f"{args.turns} turns each; token_cache_ttl {args.ttl:g} s")
    print(f"{'':10}{'quiet: n':>10}{'p50':>8}{'p99':>8}{'errors':>8}"
          f"{'flood: n':>10}{'p50':>8}{'p99':>8}{'errors':>8}{'p99 ratio':>11}")
    rows = [(k, quiet[k], flooded[k], quiet[f"{k} errors"], flooded[f"{k} errors"])
            for k in KINDS]
    rows.append(("all", sum((quiet[k] for k in KINDS), []), sum((flooded[k] for k in KINDS), []),
                 sum((quiet[f"{k} errors"] for k in KINDS), []),
                 sum((flooded[f"{k} errors"] for k in KINDS), [])))
    for name, q, f, qe, fe in rows:
        print(f"{name:10}{len(q):>10}{ms(q, 50):>8.1f}{ms(q, 99):>8.1f}{len(qe):>8}"
              f"{len(f):>10}{ms(f, 50):>8.1f}{ms(f, 99):>8.1f}{len(fe):>8}"
              f"{ms(f, 99) / ms(q, 99):>10.2f}x")
    print("the strangers' answers:", ", ".join(f"{k}: {v}" for k, v in sorted(
        floods.items(), key=str)))
    errors = Counter(sum((flooded[f"{k} errors"] + quiet[f"{k} errors"] for k in KINDS), []))
    if errors:
        print("the user's errors:", dict(errors))


if __name__ == "__main__":
    main()
