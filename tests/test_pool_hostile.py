"""The pool service as a hostile user would try it, in a real JupyterHub with the real proxy
(issue 12): crafted user names, a service named like a user, bodies larger than allowed
(declared, chunked), floods of jobs and of random tokens, abandoned log followers, an
endless log, a removed admin while the hub does not answer, priorities beyond the project's
range, a planted module, a newline in an env name, and the files the service leaves on disk.

The service asks the hub through a relay of the test's (``hubrelay.py``), which counts its
questions and can slow them down or fail them."""

import http.client
import json
import secrets
import shutil
import stat
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote, urlparse

import pytest

from hubrelay import HubRelay
from hubtest import Hub, need_proxy, system_users

LIMIT = 256 * 1024  # max_body_size
LOG_LIMIT = 64 * 1024
TOKEN_TTL = 3  # token_cache_ttl: short, so that entries expire while a test floods

POOL_CONFIG = f"""
c = get_config()
c.PoolService.projects = {{"vision": {{"quota": 2, "groups": ["vision"], "job_priority_max": 5}},
                          "nlp": {{"quota": 1, "groups": ["nlp"], "limit": 1}}}}
c.PoolService.cycle_interval = 0.2
c.PoolService.grace_period = 2
c.PoolService.max_body_size = {LIMIT}
c.PoolService.max_job_size = 64 * 1024
c.PoolService.max_pending_per_user = 3
c.PoolService.max_followers_per_user = 2
c.PoolService.token_cache_size = 20
c.PoolService.token_cache_ttl = {TOKEN_TTL}
c.PoolService.unknown_token_waiting = 48
c.PoolService.rights_ttl = 0.5
c.PoolService.rights_max_stale = 2
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 4
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]
c.LocalBackend.log_limit = {LOG_LIMIT}
"""

GROUPS = {"vision": ["alice"], "nlp": ["bob"]}
SERVICE_TOKEN = secrets.token_hex(16)

EXTRA = """
c.JupyterHub.services[0]["command"] = {prefix!r} + c.JupyterHub.services[0]["command"]
# A service named like a user: it must not be taken for her.
c.JupyterHub.services.append({{"name": "alice", "api_token": {token!r}}})
c.JupyterHub.load_roles.append({{"name": "alice-service", "services": ["alice"],
                                "scopes": ["access:services!service=gpushare"]}})
"""


@pytest.fixture(scope="module")
def relay():
    relay = HubRelay().start()
    yield relay
    relay.stop()


@pytest.fixture(scope="module")
def hub(tmp_path_factory, relay):
    need_proxy()
    system_users(["alice", "bob", "admin"])
    directory = tmp_path_factory.mktemp("hostile")
    directory.chmod(0o755)
    hub = Hub(directory, GROUPS, POOL_CONFIG,
              EXTRA.format(prefix=relay.command_prefix, token=SERVICE_TOKEN))
    relay.target = f"http://127.0.0.1:{hub.hub_port}"
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()


def hub_api(hub, method, path, body=None, as_admin=False):
    """The hub's own REST API, as the test service (or as the hub's admin user, who alone
    may grant and take admin)."""
    token = hub.token("admin") if as_admin else hub.tester_token
    return hub.request(method, f"{hub.url}/hub/api/{path}", token, body)


def submit(hub, user, **spec):
    status, job = hub.api("POST", "api/jobs", user, spec)
    assert status == 201, job
    return job


def raw(hub, method, path, headers, body_parts=(), token=None, timeout=20):
    """A request written by hand through the proxy: ``body_parts`` are sent as they are
    (chunked framing included where the headers say so). Returns (status, body) or raises
    on a connection the server closed without answering."""
    url = urlparse(hub.pool_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    conn.putrequest(method, url.path + path)
    for k, v in {"Authorization": f"token {token}", **headers}.items():
        conn.putheader(k, v)
    conn.endheaders()
    try:
        for part in body_parts:
            conn.send(part)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server answered early and closed; read what it said
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def chunked(data: bytes, size: int = 64 * 1024):
    for i in range(0, len(data), size):
        piece = data[i:i + size]
        yield f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    yield b"0\r\n\r\n"


# -- identity: names, services, tokens, stale rights -------------------------------------

@pytest.mark.parametrize("name", ["%61dmin", "admin?", "admin#x", "admin?x=1"])
def test_a_user_named_like_admin_is_not_admin(hub, name):
    status, body = hub_api(hub, "POST", f"users/{quote(name, safe='')}")
    assert status in (201, 409), body
    status, quota = hub.api("GET", "api/quota", name)
    assert status == 200 and quota["user"] == name and quota["admin"] is False, quota
    assert hub.api("GET", "api/jobs?all=1", name)[0] == 403
    assert hub.api("GET", "metrics", name)[0] == 403


def test_a_service_named_like_a_user_is_not_that_user(hub):
    job = submit(hub, "alice", gpus=1, command=["sleep", "20"], env={"SECRET": "alice's"})
    as_service = hub.request("GET", f"{hub.pool_url}api/jobs/{job['id']}", SERVICE_TOKEN)
    assert as_service[0] == 403, as_service
    assert hub.request("GET", f"{hub.pool_url}api/jobs/{job['id']}/logs", SERVICE_TOKEN)[0] == 403
    assert hub.request("DELETE", f"{hub.pool_url}api/jobs/{job['id']}", SERVICE_TOKEN)[0] == 403
    status, listed = hub.request("GET", f"{hub.pool_url}api/jobs", SERVICE_TOKEN)
    assert status == 200 and listed["jobs"] == []
    status, quota = hub.request("GET", f"{hub.pool_url}api/quota", SERVICE_TOKEN)
    assert status == 200 and not any(quota["jobs"].values())
    # ... and alice's own list is hers, not the service's (the list cache tells them apart)
    assert job["id"] in [j["id"] for j in hub.api("GET", "api/jobs", "alice")[1]["jobs"]]
    hub.api("DELETE", f"api/jobs/{job['id']}", "alice")


def test_a_removed_admin_does_not_stay_admin_while_the_hub_does_not_answer(hub, relay):
    hub_api(hub, "POST", "users/dave")
    assert hub_api(hub, "PATCH", "users/dave", {"admin": True}, as_admin=True)[0] == 200
    status, quota = hub.api("GET", "api/quota", "dave")
    assert status == 200 and quota["admin"] is True
    relay.failing.add("rights")
    try:
        assert hub_api(hub, "PATCH", "users/dave", {"admin": False}, as_admin=True)[0] == 200
        time.sleep(3)  # rights_max_stale = 2
        status, answer = hub.api("GET", "api/quota", "dave")
        assert status == 503 and "cannot say what dave may do" in answer["error"], answer
        assert hub.api("GET", "api/jobs?all=1", "dave")[0] == 503
    finally:
        relay.failing.discard("rights")
    status, quota = hub.api("GET", "api/quota", "dave")
    assert status == 200 and quota["admin"] is False


def test_unknown_tokens_do_not_hold_up_everyone_else(hub, relay):
    """Each unknown token costs a question to the hub; those questions are asked without
    blocking the service, so a known token is answered meanwhile."""
    assert hub.api("GET", "api/quota", "alice")[0] == 200  # alice's token is known now
    relay.delays["token"] = 0.6
    answers = []

    def stranger():
        answers.append(hub.request("GET", hub.pool_url + "api/quota", secrets.token_hex(16))[0])

    threads = [threading.Thread(target=stranger) for _ in range(10)]
    try:
        for t in threads:
            t.start()
        time.sleep(0.2)
        began = time.monotonic()
        status, _ = hub.api("GET", "api/quota", "alice")
        took = time.monotonic() - began
        for t in threads:
            t.join(30)
    finally:
        relay.delays.clear()
    assert status == 200 and answers == [403] * 10
    # Asked one after the other (a blocking lookup) the strangers would take 10 x 0.6 s.
    assert took < 2.0, f"a known token waited {took:.1f} s behind unknown ones"


def test_the_token_cache_is_bounded(hub, relay):
    """token_cache_size = 20: of 25 tokens used in turn, the first is forgotten."""
    tokens = []
    for i in range(25):
        status, body = hub_api(hub, "POST", "users/alice/tokens", {"note": f"cache {i}"})
        assert status == 201, body
        tokens.append(body["token"])
    for token in tokens:
        assert hub.request("GET", hub.pool_url + "api/pool", token)[0] == 200
    asked = relay.counts["token"]
    assert hub.request("GET", hub.pool_url + "api/pool", tokens[-1])[0] == 200
    assert relay.counts["token"] == asked  # the newest is kept
    assert hub.request("GET", hub.pool_url + "api/pool", tokens[0])[0] == 200
    assert relay.counts["token"] == asked + 1  # the oldest was forgotten: asked again


# -- bodies ------------------------------------------------------------------------------

def test_a_chunked_body_over_the_limit_is_refused(hub):
    token = hub.token("alice")
    body = json.dumps({"gpus": 1, "source": "#" * (LIMIT + 100 * 1024)}).encode()
    status, answer = raw(hub, "POST", "api/jobs", {"Content-Type": "application/json",
                                                   "Transfer-Encoding": "chunked"},
                         chunked(body), token)
    assert status == 413 and b"larger than 256 KiB" in answer, (status, answer[:200])
    assert hub.api("GET", "api/quota", "alice")[0] == 200


@pytest.mark.parametrize("framing", ["chunked", "length"])
def test_a_body_of_8_mb_answers_413_through_the_proxy_every_time(hub, framing):
    """Far beyond the limit (32 times it), chunked or with its length given: the service
    reads it to its end without keeping it and answers 413, never the proxy's 503 for a
    connection dropped mid-body (a retryable error for the client's mistake)."""
    token = hub.token("alice")
    huge = json.dumps({"gpus": 1, "source": "#" * (8 * 1024 * 1024)}).encode()
    headers = {"Content-Type": "application/json"}
    headers.update({"Transfer-Encoding": "chunked"} if framing == "chunked" else
                   {"Content-Length": str(len(huge))})
    statuses = [raw(hub, "POST", "api/jobs", headers,
                    chunked(huge) if framing == "chunked" else [huge], token)[0]
                for _ in range(10)]
    assert statuses == [413] * 10, statuses
    assert not [j for j in hub.api("GET", "api/jobs", "alice")[1]["jobs"]
                if len(j.get("command", [""])[-1]) > LIMIT]
    assert hub.api("GET", "api/quota", "alice")[0] == 200


def test_a_large_declared_body_is_refused_before_it_is_read(hub):
    """100 MiB announced, 64 KiB sent: the refusal comes without waiting for the rest (the
    server drops the connection; through the proxy that reads 400 or the proxy's 503)."""
    began = time.monotonic()
    try:
        status, _ = raw(hub, "POST", "api/jobs", {"Content-Type": "application/json",
                                                  "Content-Length": str(100 * 1024 * 1024)},
                        [b"{" + b" " * (64 * 1024)], hub.token("alice"), timeout=15)
        assert status in (400, 413, 502, 503), status
    except (http.client.HTTPException, ConnectionError):
        pass  # dropped without an answer is a refusal too
    assert time.monotonic() - began < 10
    assert hub.api("GET", "api/quota", "alice")[0] == 200


# -- caps ---------------------------------------------------------------------------------

def test_a_flood_of_jobs_stops_at_the_pending_cap(hub):
    """nlp may use 1 GPU: bob's first job runs, the others wait, up to 3 of them."""
    ids, refused = [], None
    for _ in range(8):
        status, body = hub.api("POST", "api/jobs", "bob", {"gpus": 1, "command": ["sleep", "30"]})
        if status != 201:
            refused = (status, body)
            break
        ids.append(body["id"])
        time.sleep(0.3)
    try:
        assert refused is not None and refused[0] == 429, refused
        assert "you have 3 jobs waiting, the most one user may" in refused[1]["error"]
        pending = hub.api("GET", "api/jobs?state=pending", "bob")[1]["jobs"]
        assert len(pending) == 3
    finally:
        for job_id in ids:
            hub.api("DELETE", f"api/jobs/{job_id}", "bob")


def test_concurrent_submits_stop_at_the_pending_cap_too(hub):
    """Submits are stored in a worker thread: those still being stored count as waiting, so
    that 20 at once cannot all pass the check before the first is written."""
    from concurrent.futures import ThreadPoolExecutor

    def one(_):
        return hub.api("POST", "api/jobs", "bob", {"gpus": 1, "command": ["sleep", "30"]})

    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(one, range(20)))
    ids = [body["id"] for status, body in answers if status == 201]
    try:
        assert {status for status, _ in answers} <= {201, 429}
        assert 3 <= len(ids) <= 4, answers  # 3 waiting, and one may have started meanwhile
        pending = hub.api("GET", "api/jobs?state=pending", "bob")[1]["jobs"]
        assert len(pending) <= 3
    finally:
        for job_id in ids:
            hub.api("DELETE", f"api/jobs/{job_id}", "bob")


def test_a_job_too_large_in_total_is_refused(hub):
    env = {f"BIG{i}": "x" * 30_000 for i in range(3)}  # 90 KiB, each under the 32 KiB per value
    status, answer = hub.api("POST", "api/jobs", "alice",
                             {"gpus": 1, "command": ["true"], "env": env})
    assert status == 413 and "more than the 64 KiB allowed" in answer["error"], answer


def test_abandoned_followers_are_let_go_and_followers_are_capped(hub):
    job = submit(hub, "alice", gpus=1, command=[  # one line, then silence
        "python3", "-c", "import time; print('started', flush=True); time.sleep(60)"])
    hub.wait_job("alice", job["id"], ("running",))
    path = f"api/jobs/{job['id']}/logs?follow=1"
    url = urlparse(hub.pool_url)
    token = hub.token("alice")

    def open_follower():
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
        conn.request("GET", url.path + path, headers={"Authorization": f"token {token}"})
        return conn, conn.getresponse()

    try:
        followers = [open_follower() for _ in range(2)]
        assert [r.status for _, r in followers] == [200, 200]
        conn, third = open_follower()
        assert third.status == 429 and b"you follow 2 logs already" in third.read()
        conn.close()
        for conn, resp in followers:  # the clients go away without reading on
            resp.close()
            conn.close()
        deadline, status = time.monotonic() + 10, None
        while time.monotonic() < deadline:
            conn, resp = open_follower()
            status = resp.status
            conn.close()
            if status == 200:
                break
            time.sleep(0.3)
        assert status == 200, "the service still follows for clients that are gone"
    finally:
        hub.api("DELETE", f"api/jobs/{job['id']}", "alice")


def test_an_endless_log_keeps_its_beginning_and_its_end(hub):
    job = submit(hub, "alice", gpus=1, command=[
        "python3", "-c", "import sys\nprint('the beginning')\n"
        "for i in range(20000): sys.stdout.write('%06d' % i + 'x' * 93 + '\\n')\n"
        "print('the end')"])
    done = hub.wait_job("alice", job["id"], ("succeeded", "failed"), timeout=60)
    assert done["state"] == "succeeded"
    status, log = hub.api("GET", f"api/jobs/{job['id']}/logs", "alice")
    assert status == 200
    assert log.startswith("the beginning\n") and log.rstrip().endswith("the end")
    assert "bytes of output were dropped here" in log
    assert len(log) < LOG_LIMIT + 200  # 2 MB printed
    kept = [p for p in (hub.dir / "pool" / "local" / job["id"]).iterdir() if ".log" in p.name]
    assert sum(p.stat().st_size for p in kept) <= LOG_LIMIT


# -- files on disk -------------------------------------------------------------------------

def test_the_service_files_are_readable_by_the_service_only(hub):
    submit(hub, "alice", gpus=1, command=["true"])  # the local backend's folders exist
    state = hub.dir / "pool"
    for folder in (state, state / "local"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
    files = [p for p in state.iterdir() if p.name.startswith("gpushare.sqlite")]
    assert {p.name for p in files} >= {"gpushare.sqlite", "gpushare.sqlite-wal"}
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p


# -- priorities, planted modules, newlines --------------------------------------------------

def test_job_priority_stays_within_the_projects_range(hub):
    status, answer = hub.api("POST", "api/jobs", "alice",
                             {"gpus": 1, "command": ["true"], "priority": 50})
    assert status == 403 and "takes job priorities from -100 to 5, not 50" in answer["error"]
    assert hub.api("PUT", "api/projects/vision", "alice", {"job_priority_max": 100})[0] == 403
    status, answer = hub.api("PUT", "api/projects/vision", "admin",
                             {"job_priority_min": 10, "job_priority_max": 0})
    assert status == 400 and "may not be above" in answer["error"]
    status, project = hub.api("PUT", "api/projects/vision", "admin", {"job_priority_max": 50})
    assert status == 200 and project["job_priority_max"] == 50
    job = submit(hub, "alice", gpus=1, command=["true"], priority=50)
    assert job["priority"] == 50
    hub.api("PUT", "api/projects/vision", "admin", {"job_priority_max": 5})


def test_a_module_planted_in_the_workdir_does_not_shadow_the_standard_library(hub):
    folder = Path(tempfile.mkdtemp(prefix="gpushare-planted-"))
    try:
        folder.chmod(0o777)  # a shared project folder
        marker = folder / "shadowed"
        (folder / "json.py").write_text(f"open({str(marker)!r}, 'w').write('planted')\n"
                                        f"dumps = lambda x: 'planted'\n")
        job = submit(hub, "alice", gpus=1, workdir=str(folder),
                     source="import json\nprint('json says', json.dumps([1]))")
        done = hub.wait_job("alice", job["id"], ("succeeded", "failed"))
        log = hub.api("GET", f"api/jobs/{job['id']}/logs", "alice")[1]
        assert not marker.exists() and done["state"] == "succeeded", log
        assert "json says [1]" in log
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_newline_at_the_end_of_a_name_is_refused(hub):
    status, answer = hub.api("POST", "api/jobs", "alice",
                             {"gpus": 1, "command": ["true"], "env": {"PATH\n": "/evil"}})
    assert status == 400 and "is not a valid variable name" in answer["error"], answer
    status, answer = hub.api("PUT", "api/projects/evil%0A", "admin", {"quota": 0})
    assert status == 400 and "must be 1-100 letters" in answer["error"], answer


# -- floods of random tokens ---------------------------------------------------------------

class Flood:
    """Strangers sending random tokens as fast as they get answers, from ``threads``
    threads, until stopped; their answers are kept."""

    def __init__(self, hub, threads=4):
        self.hub, self.statuses, self.stop = hub, [], threading.Event()
        self.threads = [threading.Thread(target=self._send, daemon=True) for _ in range(threads)]

    def _send(self):
        while not self.stop.is_set():
            status, _ = self.hub.request("GET", self.hub.pool_url + "api/pool",
                                         secrets.token_hex(16))
            self.statuses.append(status)

    def __enter__(self):
        self.began = time.monotonic()
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(30)
        self.rate = len(self.statuses) / (time.monotonic() - self.began)


def test_a_flood_of_random_tokens_locks_no_valid_token_out(hub, relay):
    """Strangers with random tokens, no credentials at all, while a valid user's cached
    entry expires (used while re-checked, then re-checked before use) and while she makes
    a new token: every one of hers is answered. Before, unknown tokens spent one budget
    for the whole service, and once it was spent every token not in the cache got 429."""
    stale = hub.token("alice")  # used below after its entry expired (ttl < age < 2 ttl)
    expired = hub.token("bob")  # used below after twice the ttl: checked again first
    for token in (stale, expired):
        assert hub.request("GET", hub.pool_url + "api/quota", token)[0] == 200
    answers = {}
    with Flood(hub) as flood:
        time.sleep(TOKEN_TTL + 0.5)
        answers["stale"] = [hub.request("GET", hub.pool_url + "api/quota", stale)[0]
                            for _ in range(5)]
        time.sleep(TOKEN_TTL + 0.5)
        answers["expired"] = hub.request("GET", hub.pool_url + "api/quota", expired)[0]
        status, body = hub_api(hub, "POST", "users/alice/tokens", {"note": "during a flood"})
        assert status == 201, body
        answers["new"] = [hub.request("GET", hub.pool_url + "api/quota", body["token"])[0]
                          for _ in range(3)]
        time.sleep(1)
    assert answers == {"stale": [200] * 5, "expired": 200, "new": [200] * 3}, answers
    assert flood.rate >= 20, f"the flood sent only {flood.rate:.0f} tokens a second"
    assert set(flood.statuses) == {403}, sorted(set(flood.statuses))


def test_a_revoked_token_works_for_at_most_the_ttl(hub):
    """An answer is used for token_cache_ttl; after that the hub is asked again before the
    token is used (an old answer is used only while the hub does not answer within a
    second)."""
    status, body = hub_api(hub, "POST", "users/alice/tokens", {"note": "revoked"})
    assert status == 201, body
    assert hub.request("GET", hub.pool_url + "api/quota", body["token"])[0] == 200
    assert hub_api(hub, "DELETE", f"users/alice/tokens/{body['id']}")[0] == 204
    time.sleep(TOKEN_TTL + 0.3)
    assert hub.request("GET", hub.pool_url + "api/quota", body["token"])[0] == 403


def test_an_unknown_token_is_asked_about_once(hub, relay):
    token = secrets.token_hex(16)
    asked = relay.counts["token"]
    statuses = [hub.request("GET", hub.pool_url + "api/pool", token)[0] for _ in range(10)]
    assert statuses == [403] * 10 and relay.counts["token"] == asked + 1


def test_new_tokens_beyond_the_waiting_line_are_refused_and_confirmed_ones_are_not(hub, relay):
    """unknown_token_waiting = 48, so 12 from one address: with the hub slow to answer, 40
    strangers at once (all from the proxy's address here) fill their share of the line and
    the rest are refused with a sentence; alice's confirmed token is answered meanwhile,
    even when her entry must be checked again."""
    assert hub.api("GET", "api/quota", "alice")[0] == 200
    time.sleep(2 * TOKEN_TTL + 0.2)  # her next request waits for a check with the hub
    relay.delays["token"] = 1.5
    answers = []

    def stranger():
        answers.append(hub.request("GET", hub.pool_url + "api/pool", secrets.token_hex(16)))

    threads = [threading.Thread(target=stranger) for _ in range(40)]
    try:
        for t in threads:
            t.start()
        time.sleep(0.5)
        status, _ = hub.api("GET", "api/quota", "alice")
        for t in threads:
            t.join(30)
    finally:
        relay.delays.clear()
    assert status == 200
    refused = [a for s, a in answers if s == 429]
    assert sorted({s for s, _ in answers}) == [403, 429] and len(refused) >= 40 - 12 - 4
    assert "waiting for JupyterHub's answer; try again in a few seconds" in refused[0]["error"]


def test_a_revoked_admin_token_stops_opening_the_dashboard_within_the_ttl(hub):
    """The dashboard keeps the hub's answer for a token as long as the API does
    (token_cache_ttl), not HubOAuth's 300 s: a leaked admin token, once revoked, can no longer
    read the audit trail or drain a node there (a token in the header needs no XSRF token)."""
    status, body = hub_api(hub, "POST", "users/admin/tokens", {"note": "leaked"})
    assert status == 201, body
    token = body["token"]
    assert raw(hub, "GET", "dashboard/audit", {}, token=token)[0] == 200
    assert raw(hub, "GET", "api/audit", {}, token=token)[0] == 200
    form = {"Content-Type": "application/x-www-form-urlencoded", "Content-Length": "3"}
    assert raw(hub, "POST", "dashboard/nodes/nowhere/drain", form, [b"x=1"], token=token)[0] \
        == 404  # taken: an admin's token needs no XSRF token; no such node
    assert hub_api(hub, "DELETE", f"users/admin/tokens/{body['id']}")[0] == 204
    time.sleep(TOKEN_TTL + 1.2)  # the dashboard's age is the ttl rounded up to a second
    status, _ = raw(hub, "GET", "dashboard/audit", {}, token=token)
    assert status in (302, 403), status  # to the hub's login, or refused: not the page
    status, _ = raw(hub, "POST", "dashboard/nodes/nowhere/drain", form, [b"x=1"], token=token)
    assert status in (302, 403), status
    assert raw(hub, "GET", "api/audit", {}, token=token)[0] == 403
