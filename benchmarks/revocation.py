"""Benchmark: how long a revoked admin token keeps working on the pool's API and on its
dashboard, in a real JupyterHub behind the real proxy, with the default ``token_cache_ttl``.

An admin token reads ``api/audit`` and ``dashboard/audit`` once a second (so both hold a
fresh answer for it), is revoked through the hub's API at a random moment of the cache's
life, and both are then asked every 0.25 s until each refuses it. Prints, per round, the
seconds from the revocation to the first refusal on each, and the largest of all rounds.

    .venv/bin/python benchmarks/revocation.py [--rounds 3] [--ttl 60]

Needs root (the hub's test users) and the proxy (the README's test command).
"""

import argparse
import http.client
import random
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hubtest import Hub, system_users  # noqa: E402

POOL = """
c = get_config()
c.PoolService.projects = {{"vision": {{"quota": 1, "groups": ["vision"]}}}}
c.PoolService.token_cache_ttl = {ttl}
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
"""
PATHS = {"api": "api/audit", "dashboard": "dashboard/audit"}


def status(hub: Hub, path: str, token: str) -> int:
    """The answer's status, redirects not followed (the dashboard sends strangers to the
    hub's login)."""
    url = urlparse(hub.pool_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    conn.request("GET", url.path + path, headers={"Authorization": f"token {token}"})
    code = conn.getresponse().status
    conn.close()
    return code


def one_round(hub: Hub, ttl: float) -> dict[str, float]:
    code, body = hub.request("POST", f"{hub.url}/hub/api/users/admin/tokens", hub.tester_token,
                             {"note": "revocation benchmark"})
    assert code == 201, body
    token, token_id = body["token"], body["id"]
    warm_until = time.monotonic() + ttl * (1 + random.random())  # revoke at any age
    while time.monotonic() < warm_until:
        assert {k: status(hub, p, token) for k, p in PATHS.items()} == \
            {"api": 200, "dashboard": 200}
        time.sleep(1)
    code, _ = hub.request("DELETE", f"{hub.url}/hub/api/users/admin/tokens/{token_id}",
                          hub.tester_token)
    assert code == 204
    revoked, refused = time.monotonic(), {}
    while len(refused) < len(PATHS) and time.monotonic() < revoked + 10 * ttl:
        for kind, path in PATHS.items():
            if kind not in refused and status(hub, path, token) != 200:
                refused[kind] = time.monotonic() - revoked
        time.sleep(0.25)
    return refused


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ttl", type=float, default=60.0,
                        help="PoolService.token_cache_ttl (the default: 60)")
    args = parser.parse_args()
    system_users(["alice", "admin"])
    directory = Path(tempfile.mkdtemp(prefix="gpushare-revocation-"))
    directory.chmod(0o755)
    hub = Hub(directory, {"vision": ["alice"]}, POOL.format(ttl=args.ttl)).start()
    try:
        worst = {}
        for i in range(args.rounds):
            refused = one_round(hub, args.ttl)
            print(f"round {i + 1}: refused after " + ", ".join(
                f"{k} {refused.get(k, float('inf')):.1f} s" for k in PATHS), flush=True)
            for k in PATHS:
                worst[k] = max(worst.get(k, 0.0), refused.get(k, float("inf")))
        print(f"token_cache_ttl {args.ttl:g} s; a revoked token refused within: " +
              ", ".join(f"{k} {worst[k]:.1f} s" for k in PATHS))
    finally:
        hub.stop()


if __name__ == "__main__":
    main()
