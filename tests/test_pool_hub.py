"""The pool service in a real JupyterHub with the real proxy, on the local backend with 4
simulated GPUs: jobs run and log, preemption and resume, every endpoint's rights, bad input,
idempotent submits, and a service that is killed and started again at once. All of it on
SQLite and on PostgreSQL."""

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hubtest import running_hub

POOL_CONFIG = """
c = get_config()
c.PoolService.projects = {"vision": {"quota": 2, "groups": ["vision"]},
                          "nlp": {"quota": 2, "groups": ["nlp"]}}
c.PoolService.cycle_interval = 0.2
c.PoolService.grace_period = 3
c.PoolService.min_runtime = 0  # preempt at once: these tests watch preemption
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 4
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]  # the root service's PATH is not the users'
c.PoolService.build_nodes = {"sim-build-0": 1}
c.PoolService.build_allowance = 0.5
c.PoolService.spawner_service = "tester"  # the hub's test service plays the spawner
"""

GROUPS = {"vision": ["alice", "carol"], "nlp": ["bob"]}

# A job that checkpoints its attempt, says when it is told to stop, and runs a while.
LONG = ("import os, signal, sys, time\n"
        "d = os.environ['GPUSHARE_CHECKPOINT_DIR']\n"
        "print('attempt', os.environ['GPUSHARE_ATTEMPT'], 'ckpt', d, flush=True)\n"
        "open(os.path.join(d, 'attempt-' + os.environ['GPUSHARE_ATTEMPT']), 'w').close()\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM', flush=True), sys.exit(143)))\n"
        "time.sleep({seconds})\n"
        "print('done', flush=True)\n")


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def hub(request, tmp_path_factory):
    """The whole module runs on each store: SQLite, and the tests' own PostgreSQL server."""
    config = POOL_CONFIG
    if request.param == "postgresql":
        url = request.getfixturevalue("postgresql").database()
        config += f"c.PoolService.db_url = {url!r}\n"
    with running_hub(tmp_path_factory.mktemp("hub"), GROUPS, config,
                     users=["alice", "bob", "carol", "admin"]) as hub:
        yield hub


def submit(hub, user, **spec):
    status, job = hub.api("POST", "api/jobs", user, spec)
    assert status == 201, job
    return job


def wait_for_output(hub, user, job_id, text, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, log = hub.api("GET", f"api/jobs/{job_id}/logs", user)
        if status == 200 and text in log:
            return log
        time.sleep(0.2)
    raise TimeoutError(f"job {job_id} never printed {text!r}")


def settle(hub):
    """Cancel whatever still runs, so the next test starts with an idle pool."""
    status, body = hub.api("GET", "api/jobs?all=1", "admin")
    for job in body["jobs"]:
        if job["state"] in ("pending", "running"):
            hub.api("DELETE", f"api/jobs/{job['id']}", "admin")
    for job in body["jobs"]:
        if job["state"] in ("pending", "running"):
            hub.wait_job("admin", job["id"], ("cancelled", "succeeded", "failed"))


def test_a_job_runs_on_its_gpus_and_its_logs_come_back(hub):
    job = submit(hub, "alice", gpus=2, name="hello", source=(
        "import os\nprint('hello from', os.getlogin() if False else os.environ.get('USER'))\n"
        "print('devices', os.environ['CUDA_VISIBLE_DEVICES'])\n"
        "print('order', os.environ['CUDA_DEVICE_ORDER'])\n"
        "print('token' in ''.join(os.environ).lower())\n"))
    assert job["project"] == "vision" and job["user"] == "alice" and job["gpus"] == 2
    done = hub.wait_job("alice", job["id"], ("succeeded", "failed"))
    assert done["state"] == "succeeded", (done, hub.api("GET", f"api/jobs/{job['id']}/logs", "alice"))
    status, log = hub.api("GET", f"api/jobs/{job['id']}/logs", "alice")
    assert status == 200
    devices = log.split("devices ")[1].split()[0].split(",")
    assert len(devices) == 2 and len(set(devices)) == 2
    assert "order PCI_BUS_ID" in log
    assert log.strip().endswith("False")  # no token reached the job's environment


def test_follow_streams_until_the_job_ends(hub):
    job = submit(hub, "bob", gpus=1, source="import time\nfor i in range(3):\n"
                                             "    print('tick', i, flush=True); time.sleep(0.3)\n")
    status, log = hub.api("GET", f"api/jobs/{job['id']}/logs?follow=1", "bob")
    assert status == 200 and "tick 2" in log
    assert hub.wait_job("bob", job["id"], ("succeeded",))


def test_the_whole_preemption_story(hub):
    settle(hub)
    v1 = submit(hub, "alice", gpus=2, name="v1", source=LONG.format(seconds=60))
    hub.wait_job("alice", v1["id"], ("running",))
    time.sleep(0.3)
    v2 = submit(hub, "alice", gpus=2, name="v2", source=LONG.format(seconds=4))
    hub.wait_job("alice", v2["id"], ("running",))  # vision borrows all 4 GPUs
    wait_for_output(hub, "alice", v2["id"], "attempt 1")  # its SIGTERM handler is in place
    n1 = submit(hub, "bob", gpus=2, name="n1", source="print('nlp got its quota')")
    # nlp is within its quota: vision's newest job is told to stop and requeued ...
    done = hub.wait_job("bob", n1["id"], ("succeeded",), timeout=30)
    assert done["state"] == "succeeded"
    status, log1 = hub.api("GET", f"api/jobs/{v2['id']}/logs?attempt=1", "alice")
    assert "got SIGTERM" in log1
    status, v1_now = hub.api("GET", f"api/jobs/{v1['id']}", "alice")
    assert v1_now["attempt"] == 1 and v1_now["state"] == "running"  # the older one kept on
    # ... and resumes later with attempt 2 and the same checkpoint directory.
    resumed = hub.wait_job("alice", v2["id"], ("succeeded",), timeout=30)
    assert resumed["attempt"] == 2
    status, log2 = hub.api("GET", f"api/jobs/{v2['id']}/logs?attempt=2", "alice")
    ckpt1 = log1.split("ckpt ")[1].split()[0]
    ckpt2 = log2.split("ckpt ")[1].split()[0]
    assert ckpt1 == ckpt2 and "attempt 2" in log2 and "done" in log2
    settle(hub)


def test_query_numbers_are_ascii_digits(hub):
    """Other scripts' digits ('\u0663', %D9%A3, is 3 to int()) and 5,000-digit numbers are a 400 in one
    short sentence, never a 500 or an echo of the whole number."""
    job = submit(hub, "alice", gpus=1, command=["true"])
    for query in ("attempt=%D9%A3", "attempt=" + "9" * 5000, "rank=" + "9" * 5000):
        status, body = hub.api("GET", f"api/jobs/{job['id']}/logs?{query}", "alice")
        assert status == 400 and len(body["error"]) < 200, (query[:20], status, body)
    status, body = hub.api("GET", "api/usage?since=%D9%A3h", "alice")
    assert status == 400, body


def test_who_may_see_and_do_what(hub):
    job = submit(hub, "alice", gpus=1, source="import time; time.sleep(30)",
                 env={"SECRET_SETTING": "alice-only"})
    jid = job["id"]
    for path in (f"api/jobs/{jid}", f"api/jobs/{jid}/logs"):
        assert hub.api("GET", path, "alice")[0] == 200
        assert hub.api("GET", path, "admin")[0] == 200
        status, body = hub.api("GET", path, "bob")
        assert status == 403 and "not yours" in body["error"]
        assert hub.api("GET", path, "carol")[0] == 403  # same project, still not hers
        assert hub.api("GET", path, None)[0] == 403
    # Lists: your own; a project's queue for members, without others' command and env.
    assert jid not in [j["id"] for j in hub.api("GET", "api/jobs", "bob")[1]["jobs"]]
    status, queue = hub.api("GET", "api/jobs?project=vision", "carol")
    mine = [j for j in queue["jobs"] if j["id"] == jid]
    assert status == 200 and mine and "env" not in mine[0] and "command" not in mine[0]
    assert hub.api("GET", "api/jobs?project=vision", "bob")[0] == 403
    assert hub.api("GET", "api/jobs?all=1", "alice")[0] == 403
    assert jid in [j["id"] for j in hub.api("GET", "api/jobs?all=1", "admin")[1]["jobs"]]
    # Changing: only the owner or an admin cancels; only admins change projects or read metrics.
    assert hub.api("DELETE", f"api/jobs/{jid}", "bob")[0] == 403
    assert hub.api("DELETE", f"api/jobs/{jid}", "carol")[0] == 403
    assert hub.api("DELETE", f"api/jobs/{jid}", None)[0] == 403
    assert hub.api("PUT", "api/projects/nlp", "bob", {"quota": 3})[0] == 403
    assert hub.api("GET", "metrics", "alice")[0] == 403
    status, metrics = hub.api("GET", "metrics", "admin")
    assert status == 200 and "gpushare_project_quota_gpus" in metrics
    for path in ("api/pool", "api/quota", "api/projects", "api/jobs", "api/slices"):
        assert hub.api("GET", path, None)[0] == 403
        assert hub.api("GET", path, "bob")[0] == 200
    assert hub.api("GET", "metrics", None)[0] == 403
    assert hub.api("PUT", "api/projects/nlp", None, {"quota": 1})[0] == 403
    assert hub.api("POST", "api/jobs", None, {"gpus": 1, "command": ["true"]})[0] == 403
    assert hub.api("POST", "api/slices", None, {"user": "bob", "gpus": 0.25})[0] == 403
    assert hub.api("DELETE", "api/slices/s-0000", None)[0] == 403
    status, body = hub.api("DELETE", f"api/jobs/{jid}", "alice")
    assert status == 200
    assert hub.wait_job("alice", jid, ("cancelled",))["state"] == "cancelled"
    assert hub.api("DELETE", f"api/jobs/{jid}", "alice")[0] == 409


def test_a_failed_jobs_reason_quotes_its_command_to_its_owner_and_admins_only(hub):
    """A failure's reason can quote the command line (and the working folder), which the API
    shows only to the job's owner and admins: its project's other members see a generic
    reason."""
    secret = "deploy-key-sk_live_ABC123"
    job = submit(hub, "alice", gpus=1, command=[f"/nonexistent/{secret}", "--now"])
    failed = hub.wait_job("alice", job["id"], ("failed",))
    assert secret in failed["reason"], failed  # the owner sees why
    status, as_admin = hub.api("GET", f"api/jobs/{job['id']}", "admin")
    assert status == 200 and secret in as_admin["reason"]
    for query in ("api/jobs?project=vision", "api/jobs?project=vision&state=failed"):
        status, queue = hub.api("GET", query, "carol")
        seen = [j for j in queue.get("jobs", []) if j["id"] == job["id"]]
        if status != 200 or not seen:
            continue
        assert secret not in json.dumps(seen[0]), seen[0]
        assert seen[0]["reason"].startswith("failed") and "owner and admins" in seen[0]["reason"]
        break
    else:
        pytest.fail("carol never saw the failed job in her project's queue")


@pytest.mark.parametrize("body, status, words", [
    ({"gpus": -1, "command": ["true"]}, 400, "gpus must be 1 or more"),
    ({"gpus": 0, "command": ["true"]}, 400, "gpus must be 1 or more"),
    ({"gpus": "two", "command": ["true"]}, 400, "gpus must be a whole number"),
    ({"gpus": 1.5, "command": ["true"]}, 400, "gpus must be a whole number"),
    ({"gpus": 64, "command": ["true"]}, 400, "the train pool has only 4"),
    ({"gpus": 1, "command": ["true"], "project": "nlp"}, 403, "not a member of project nlp"),
    ({"gpus": 1, "command": ["true"], "project": "nope"}, 400, "there is no project 'nope'"),
    ({"gpus": 1}, 400, "give either command"),
    ({"gpus": 1, "command": []}, 400, "non-empty list of strings"),
    ({"gpus": 1, "command": ["true"], "user": "bob"}, 400, "unknown field(s) user"),
    ({"gpus": 1, "command": ["true"], "env": {"CUDA_VISIBLE_DEVICES": "0"}}, 400, "may not set"),
    ([1, 2], 400, "must be a JSON object"),
], ids=["negative", "zero", "non-numeric", "fraction", "beyond-pool", "not-member",
        "unknown-project", "no-command", "empty-command", "unknown-field", "reserved-env",
        "not-object"])
def test_bad_input_is_refused_in_one_sentence_and_stores_nothing(hub, body, status, words):
    before = len(hub.api("GET", "api/jobs?all=1", "admin")[1]["jobs"])
    got, answer = hub.api("POST", "api/jobs", "alice", body)
    assert got == status and words in answer["error"], answer
    assert len(hub.api("GET", "api/jobs?all=1", "admin")[1]["jobs"]) == before


def test_not_json_and_oversized_bodies(hub):
    status, answer = hub.api("POST", "api/jobs", "alice", raw=b"{gpus: 1")
    assert status == 400 and "not valid JSON" in answer["error"]
    status, answer = hub.api("POST", "api/jobs", "alice",
                             {"gpus": 1, "source": "x" * (2 * 1024 * 1024)})
    assert status == 413 and "larger than" in answer["error"]


@pytest.mark.parametrize("path, method", [("api/jobs", "POST"), ("api/projects/nlp", "PUT"),
                                          ("api/slices", "POST")])
@pytest.mark.parametrize("raw, words", [
    (b'{"gpus": 1, "name": "\xff\xfe"}', "not UTF-8 text (byte 21 is not)"),
    (b"\xef\xbb\xbf{}", "not valid JSON"),  # a byte-order mark is not JSON
    (b"[" * 100_000, "nests deeper than 32 levels"),  # beyond Python's recursion limit
    (b"[" * 40 + b"]" * 40, "nests deeper than 32 levels"),
    (b'{"gpus": 1, "command": ["\\ud800"]}', "lone UTF-16 surrogate"),
    (b'{"quota": 1e308}', ""),  # a number no store holds: refused, never a 500
], ids=["not-utf8", "bom", "deep", "deep-but-parses", "surrogate", "huge-number"])
def test_bad_bytes_get_a_400_with_a_sentence(hub, path, method, raw, words):
    user = "admin" if method == "PUT" else "alice" if path == "api/jobs" else None
    if user is None:
        status, answer = hub.request(method, hub.pool_url + path, hub.tester_token, raw=raw)
    else:
        status, answer = hub.api(method, path, user, raw=raw)
    assert status == 400 and words in answer["error"], answer
    assert "\n" not in answer["error"] and "Traceback" not in answer["error"]


def test_a_retried_submit_returns_the_first_job(hub):
    spec = {"gpus": 1, "command": ["true"], "name": "once"}
    key = "9b2f6c1e-retry"
    status, first = hub.request("POST", hub.pool_url + "api/jobs", hub.token("bob"),
                                {**spec, "request_id": key})
    assert status == 201 and first["request_id"] == key
    again = hub.api("POST", "api/jobs", "bob", {**spec, "request_id": key})
    assert again[0] == 200 and again[1]["id"] == first["id"]
    # The same key in the header; a different spec under the same key is a conflict.
    from urllib.request import Request, urlopen
    req = Request(hub.pool_url + "api/jobs", data=json.dumps(spec).encode(), method="POST",
                  headers={"Authorization": f"token {hub.token('bob')}",
                           "Idempotency-Key": key, "Content-Type": "application/json"})
    with urlopen(req) as r:
        assert r.status == 200 and json.loads(r.read())["id"] == first["id"]
    status, answer = hub.api("POST", "api/jobs", "bob", {**spec, "gpus": 2, "request_id": key})
    assert status == 409 and "use a new request_id" in answer["error"]
    # Keys are per user: alice's own key makes her own job.
    status, hers = hub.api("POST", "api/jobs", "alice", {**spec, "request_id": key})
    assert status == 201 and hers["id"] != first["id"]
    status, answer = hub.api("POST", "api/jobs", "bob", {**spec, "request_id": "no spaces"})
    assert status == 400 and "request_id" in answer["error"]
    listed = hub.api("GET", "api/jobs?all=1", "admin")[1]["jobs"]
    assert [j["id"] for j in listed if j.get("request_id") == key and j["user"] == "bob"] == \
        [first["id"]]


def test_quota_changes_are_checked_against_the_pool(hub):
    status, answer = hub.api("PUT", "api/projects/nlp", "admin", {"quota": 3})
    assert status == 409 and "a guarantee that cannot be honoured is refused" in answer["error"]
    status, answer = hub.api("PUT", "api/projects/nlp", "admin", {"quota": 2, "limit": 1})
    assert status == 400 and "may not be below the quota" in answer["error"]
    status, project = hub.api("PUT", "api/projects/nlp", "admin", {"over_quota_weight": 3})
    assert status == 200 and project["over_quota_weight"] == 3 and project["quota"] == 2
    assert hub.api("PUT", "api/projects/nlp", "admin", {"quota": "lots"})[0] == 400


def test_killing_the_service_loses_nothing(hub):
    settle(hub)
    running = submit(hub, "alice", gpus=2, source=LONG.format(seconds=6))
    wait_for_output(hub, "alice", running["id"], "attempt 1")
    for pid in hub.service_pids():
        os.kill(pid, signal.SIGKILL)
    # The hub restarts its managed service; the job it ran goes on and is adopted.
    time.sleep(1)
    hub.wait_for_pool(60)
    status, job = hub.api("GET", f"api/jobs/{running['id']}", "alice")
    assert status == 200 and job["state"] in ("running", "succeeded") and job["attempt"] == 1
    done = hub.wait_job("alice", running["id"], ("succeeded", "failed"), timeout=30)
    assert done["state"] == "succeeded" and done["attempt"] == 1
    status, log = hub.api("GET", f"api/jobs/{running['id']}/logs", "alice")
    assert "done" in log


def gpushare(hub, user, *args, timeout=60):
    """The gpushare command as a person in a notebook terminal runs it."""
    env = {**os.environ, "GPUSHARE_URL": hub.pool_url, "JUPYTERHUB_API_TOKEN": hub.token(user)}
    exe = Path(sys.executable).with_name("gpushare")
    return subprocess.run([str(exe), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_the_cli_submits_waits_lists_and_is_refused_clearly(hub):
    settle(hub)
    done = gpushare(hub, "bob", "submit", "--gpus", "1", "--name", "from-cli", "--wait", "--",
                    "python3", "-c", "print('hello from the cli')")
    assert done.returncode == 0, done.stderr
    assert "hello from the cli" in done.stdout
    listed = gpushare(hub, "bob", "jobs", "--json")
    jobs = json.loads(listed.stdout)["jobs"]
    assert listed.returncode == 0 and any(j["name"] == "from-cli" for j in jobs)
    table = gpushare(hub, "bob", "jobs")
    assert "from-cli" in table.stdout and "succeeded" in table.stdout
    quota = gpushare(hub, "bob", "quota")
    assert quota.returncode == 0 and "nlp" in quota.stdout
    job = submit(hub, "alice", gpus=1, source="import time; time.sleep(20)")
    refused = gpushare(hub, "bob", "cancel", job["id"])
    assert refused.returncode == 2 and "not yours" in refused.stderr
    assert "Traceback" not in refused.stderr and refused.stderr.count("\n") == 1
    bad = gpushare(hub, "bob", "submit", "--gpus", "0", "--", "true")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    cancelled = gpushare(hub, "alice", "cancel", job["id"])
    assert cancelled.returncode == 0, cancelled.stderr


def test_build_slices_are_packed_within_allowances_by_the_spawner_only(hub):
    def as_spawner(method, path, body=None):  # the test service plays the hub's spawner
        return hub.request(method, hub.pool_url + path, hub.tester_token, body)

    status, a1 = as_spawner("POST", "api/slices", {"user": "alice", "gpus": 0.25, "server": ""})
    assert status == 201 and (a1["node"], a1["gpu"], a1["gpus"]) == ("sim-build-0", 0, 0.25)
    # No GPU here: the build pool is simulated too, and its UUIDs say so (pinned slices use them).
    assert a1["uuid"] == "GPU-SIMULATED-sim-build-0-0"
    assert as_spawner("POST", "api/slices", {"user": "alice", "gpus": 0.25})[0] == 201
    status, answer = as_spawner("POST", "api/slices", {"user": "alice", "gpus": 0.25})
    assert status == 409 and "build allowance of 0.5 GPU" in answer["error"]
    status, b1 = as_spawner("POST", "api/slices", {"user": "bob", "gpus": 0.5})
    assert status == 201
    status, answer = as_spawner("POST", "api/slices", {"user": "carol", "gpus": 0.25})
    assert status == 409 and "the build pool is full" in answer["error"]
    status, answer = as_spawner("POST", "api/slices", {"user": "carol", "gpus": 1.5})
    assert status == 400 and "fraction of one GPU" in answer["error"]
    # Users see their own slices and cannot reserve or release any.
    status, mine = hub.api("GET", "api/slices", "alice")
    assert status == 200 and {s["user"] for s in mine["slices"]} == {"alice"}
    assert len(mine["slices"]) == 2
    assert hub.api("POST", "api/slices", "alice", {"user": "alice", "gpus": 0.25})[0] == 403
    assert hub.api("DELETE", f"api/slices/{b1['id']}", "alice")[0] == 403
    assert hub.api("GET", "api/slices", None)[0] == 403
    status, pool = hub.api("GET", "api/pool", "bob")
    assert pool["build"] == {"capacity": 1, "in_use": 1.0, "allowance": 0.5,
                             "nodes": [{"name": "sim-build-0", "gpus": 1}], "lending": False}
    # The spawner releases them when servers stop; then there is room again.
    assert as_spawner("DELETE", f"api/slices/{b1['id']}")[0] == 200
    assert as_spawner("DELETE", f"api/slices/{b1['id']}")[0] == 404
    assert as_spawner("POST", "api/slices", {"user": "carol", "gpus": 0.25})[0] == 201


def test_an_admins_changes_of_slices_are_in_the_audit_trail_and_the_spawners_are_not(hub):
    status, s = hub.api("POST", "api/slices", "admin", {"user": "bob", "gpus": 0.25})
    assert status == 201, s
    assert hub.api("PATCH", f"api/slices/{s['id']}", "admin", {"pid": 4242})[0] == 200
    assert hub.api("DELETE", f"api/slices/{s['id']}", "admin")[0] == 200
    status, trail = hub.api("GET", "api/audit?limit=50", "admin")
    assert status == 200, trail
    mine = [(e["who"], e["action"], e["before"], e["after"]) for e in trail["entries"]
            if e["target"] == s["id"]]
    released = {"user": "bob", "server": "", "gpus": 0.25, "node": s["node"], "gpu": s["gpu"],
                "pid": 4242}
    assert mine == [("admin", "release slice", released, None),
                    ("admin", "set slice server", None, {"pid": 4242}),
                    ("admin", "reserve slice", None, {**released, "pid": None})], mine
    slices = {e["target"] for e in trail["entries"] if "slice" in e["action"]}
    assert slices == {s["id"]}, slices  # the spawner's own reserves and releases are not there


def test_lists_are_revalidated_by_etag_and_never_shared_between_users(hub):
    from urllib.error import HTTPError
    from urllib.request import Request, urlopen

    from jupyter_gpushare.client import PoolClient

    def get(user, path, etag=None):
        req = Request(hub.pool_url + path, headers={"Authorization": f"token {hub.token(user)}"})
        if etag:
            req.add_header("If-None-Match", etag)
        try:
            with urlopen(req, timeout=30) as r:
                return r.status, r.headers.get("Etag"), json.loads(r.read())
        except HTTPError as e:
            with e:
                return e.code, e.headers.get("Etag"), e.read()

    settle(hub)
    job = submit(hub, "alice", gpus=1, source="import time; time.sleep(30)",
                 env={"SECRET_SETTING": "alice-only"})
    for _ in range(10):  # a usage sample between the two may change the list: ask again
        status, etag, body = get("alice", "api/jobs")
        again = get("alice", "api/jobs", etag)
        if again[0] == 304:
            break
    assert status == 200 and job["id"] in [j["id"] for j in body["jobs"]]
    assert again[0] == 304 and again[2] == b""  # not modified: no body
    # Another user's tag gets that user's own list, never alice's.
    status, bob_etag, bob_body = get("bob", "api/jobs", etag)
    assert status == 200 and bob_etag != etag
    assert job["id"] not in [j["id"] for j in bob_body["jobs"]]
    # A member of the project sees the queue without alice's env, whatever tag she sends.
    _, queue_etag, queue = get("alice", "api/jobs?project=vision")
    status, _, carols = get("carol", "api/jobs?project=vision", queue_etag)
    assert status == 200 and "alice-only" in json.dumps(queue)
    assert "alice-only" not in json.dumps(carols)
    # A change makes the old tag stale.
    hub.api("DELETE", f"api/jobs/{job['id']}", "alice")
    hub.wait_job("alice", job["id"], ("cancelled",))
    status, _, body = get("alice", "api/jobs", etag)
    assert status == 200 and body["jobs"][0]["state"] == "cancelled"
    # Taken gzipped, the same list.
    req = Request(hub.pool_url + "api/jobs", headers={
        "Authorization": f"token {hub.token('alice')}", "Accept-Encoding": "gzip"})
    with urlopen(req, timeout=30) as r:
        assert r.headers["Content-Encoding"] == "gzip" and r.headers["Etag"] != etag
        assert json.loads(gzip.decompress(r.read()))["jobs"][0]["id"] == job["id"]
    # PoolClient (the CLI, the widget, the lab panel's server extension) sends the tag back
    # and gets the same list from a 304.
    client = PoolClient(hub.pool_url, hub.token("alice"), retry_s=0)
    first = client.jobs()
    assert client.jobs() == first and [j["id"] for j in first][:1] == [job["id"]]
    assert len(client._answers) == 1  # kept, with its tag, for the next poll
