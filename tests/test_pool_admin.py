"""The admins' console in a real JupyterHub (issue 23): the audit trail (``api/audit``,
``gpushare audit``) and drained nodes (``api/nodes/{node}``, ``gpushare drain``), on the
local backend with two simulated nodes of two GPUs."""

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
                          "nlp": {"quota": 1, "groups": ["nlp"]}}
c.PoolService.cycle_interval = 0.2
c.PoolService.grace_period = 3
c.PoolService.min_runtime = 0
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 2
c.LocalBackend.simulated_gpus_per_node = 2
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]
"""

GROUPS = {"vision": ["alice"], "nlp": ["bob"]}

# Checkpoints on SIGTERM (exit 143, as a preempted job should) and runs a while.
LONG = ("import os, signal, sys, time\n"
        "print('attempt', os.environ['GPUSHARE_ATTEMPT'], flush=True)\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('checkpoint', flush=True), sys.exit(143)))\n"
        "time.sleep(60)\n")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with running_hub(tmp_path_factory.mktemp("adminhub"), GROUPS, POOL_CONFIG,
                     users=["alice", "bob", "admin"]) as hub:
        yield hub


def gpushare(hub, user, *args):
    env = {**os.environ, "GPUSHARE_URL": hub.pool_url, "JUPYTERHUB_API_TOKEN": hub.token(user)}
    exe = Path(sys.executable).with_name("gpushare")
    return subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=60)


def entries(hub, query=""):
    status, answer = hub.api("GET", f"api/audit{query}", "admin")
    assert status == 200, answer
    return answer["entries"]


def until(check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise TimeoutError("it did not happen in time")


def test_only_admins_read_the_trail_and_drain_nodes(hub):
    status, answer = hub.api("GET", "api/audit", "alice")
    assert status == 403 and answer["error"] == "only admins can read the audit trail"
    status, answer = hub.api("PUT", "api/nodes/sim-node-0", "alice", {"drained": True})
    assert status == 403 and answer["error"] == "only admins can drain or undrain nodes"
    refused = gpushare(hub, "bob", "audit")
    assert refused.returncode == 2 and "only admins" in refused.stderr
    assert "Traceback" not in refused.stderr
    refused = gpushare(hub, "bob", "drain", "sim-node-0")
    assert refused.returncode == 2 and "only admins" in refused.stderr
    assert not any(e["action"] == "drain node" for e in entries(hub))


@pytest.mark.parametrize("query, words", [
    ("?limit=0", "limit must be a whole number from 1 to 1000"),
    ("?limit=5000", "limit must be a whole number from 1 to 1000"),
    ("?since=someday", "since must be a time like 7d"),
    ("?before=x", "before must be an entry's id"),
    ("?limit=%C2%B2", "limit must be a whole number from 1 to 1000"),  # '²', a digit to isdigit
    ("?before=%C2%B2", "before must be an entry's id"),
    ("?who=admin", "unknown parameter(s) who"),
])
def test_bad_audit_queries_get_a_sentence(hub, query, words):
    status, answer = hub.api("GET", f"api/audit{query}", "admin")
    assert status == 400 and words in answer["error"], answer


@pytest.mark.parametrize("node, body, status, words", [
    ("nowhere", {"drained": True}, 404, "there is no train node 'nowhere'"),
    ("sim-node-0", {}, 400, 'like {"drained": true}'),
    ("sim-node-0", [True], 400, 'like {"drained": true}'),
    ("sim-node-0", {"drained": "yes"}, 400, "drained must be true or false"),
    ("sim-node-0", {"drained": True, "requeue": 1}, 400, "requeue must be true or false"),
    ("sim-node-0", {"drained": False, "requeue": True}, 400, "requeue goes with drained"),
    ("sim-node-0", {"drained": True, "why": "x"}, 400, "unknown field(s) why"),
])
def test_bad_drains_get_a_sentence_and_change_nothing(hub, node, body, status, words):
    got, answer = hub.api("PUT", f"api/nodes/{node}", "admin", body)
    assert got == status and words in answer["error"], answer
    status, pool = hub.api("GET", "api/pool", "admin")
    assert not any(n["drained"] for n in pool["nodes"])


def test_configured_and_changed_projects_are_in_the_trail(hub):
    created = {e["target"]: e for e in entries(hub) if e["action"] == "create project"}
    assert set(created) == {"vision", "nlp"}
    assert created["vision"]["who"] == "configuration" and created["vision"]["via"] == "config"
    assert created["vision"]["before"] is None and created["vision"]["after"]["quota"] == 2
    status, _ = hub.api("PUT", "api/projects/nlp", "admin", {"quota": 2, "priority": 1})
    assert status == 200
    status, _ = hub.api("PUT", "api/projects/nlp", "admin", {"quota": 2})  # no change: no entry
    status, _ = hub.api("PUT", "api/projects/speech", "admin", {"quota": 0})
    newest = entries(hub, "?limit=2")
    assert [(e["action"], e["target"]) for e in newest] == [("create project", "speech"),
                                                            ("change project", "nlp")]
    change = newest[1]
    assert (change["who"], change["via"]) == ("admin", "api") and change["address"]
    assert (change["before"], change["after"]) == ({"priority": 0, "quota": 1},
                                                   {"priority": 1, "quota": 2})
    # Paging: before= the answer's next gives the entries after it, newest first.
    status, page = hub.api("GET", "api/audit?limit=1", "admin")
    status, rest = hub.api("GET", f"api/audit?limit=1&before={page['next']}", "admin")
    assert rest["entries"][0]["id"] < page["entries"][0]["id"]
    assert rest["entries"][0]["target"] == "nlp"
    assert hub.api("GET", "api/audit?since=1h", "admin")[1]["entries"][0]["target"] == "speech"
    status, everything = hub.api("GET", "api/audit?limit=1000", "admin")
    assert everything["next"] is None


def test_an_admins_cancel_of_someone_elses_job_is_noted(hub):
    own = hub.api("POST", "api/jobs", "alice", {"gpus": 1, "source": "import time; "
                                                "time.sleep(30)"})[1]
    assert hub.api("DELETE", f"api/jobs/{own['id']}", "alice")[0] == 200
    theirs = hub.api("POST", "api/jobs", "alice", {"gpus": 1, "source": "import time; "
                                                   "time.sleep(30)"})[1]
    assert hub.api("DELETE", f"api/jobs/{theirs['id']}", "admin")[0] == 200
    cancels = [e for e in entries(hub) if e["action"] == "cancel job"]
    assert [e["target"] for e in cancels] == [theirs["id"]]
    assert cancels[0]["who"] == "admin" and cancels[0]["before"]["user"] == "alice"
    assert cancels[0]["before"]["state"] in ("pending", "running")
    assert cancels[0]["after"]["state"] == {"pending": "cancelled",  # never running → running
                                            "running": "stopping (cancelled)"}[
        cancels[0]["before"]["state"]]
    done = hub.wait_job("alice", theirs["id"], ("cancelled",))
    assert done["reason"] == "cancelled by an admin (admin)", done  # not "by its user"
    mine = hub.wait_job("alice", own["id"], ("cancelled",))
    assert mine["reason"] == "cancelled by its user"


def test_an_admins_cancel_of_a_running_job_says_so_while_it_stops_and_after(hub):
    job = hub.api("POST", "api/jobs", "alice", {"gpus": 1, "source": "import time; "
                                                "time.sleep(30)"})[1]
    hub.wait_job("alice", job["id"], ("running",))
    assert hub.api("DELETE", f"api/jobs/{job['id']}", "admin")[0] == 200
    [cancel] = [e for e in entries(hub) if e["action"] == "cancel job"
                and e["target"] == job["id"]]
    assert (cancel["before"]["state"], cancel["after"]["state"]) == \
        ("running", "stopping (cancelled)")
    done = hub.wait_job("alice", job["id"], ("cancelled",))
    assert done["reason"] == "cancelled by an admin (admin)"


def test_a_drained_node_starts_nothing_and_requeue_moves_its_jobs(hub):
    drained = gpushare(hub, "admin", "drain", "sim-node-0")
    assert drained.returncode == 0, drained.stderr
    assert "node sim-node-0 is drained" in drained.stdout
    status, pool = hub.api("GET", "api/pool", "admin")
    node = next(n for n in pool["nodes"] if n["name"] == "sim-node-0")
    assert node["drained"] and node["drained_by"] == "admin" and node["drained_since"]
    table = gpushare(hub, "alice", "pool").stdout.splitlines()
    assert table[1].split() == ["NAME", "GPUS", "POOL", "LABELS", "DRAINED", "DRAINED", "BY",
                                "DRAINED", "SINCE"]
    assert table[2].split()[4:7] == ["yes", "admin", "just"]
    first = hub.api("POST", "api/jobs", "alice", {"gpus": 2, "source": LONG})[1]
    job = hub.wait_job("alice", first["id"], ("running",))
    assert job["placement"] == {"sim-node-1": 2}
    second = hub.api("POST", "api/jobs", "bob", {"gpus": 1, "source": LONG})[1]
    waiting = until(lambda: (lambda j: "drained node sim-node-0" in j["reason"] and j)(
        hub.api("GET", f"api/jobs/{second['id']}", "bob")[1]))
    assert waiting["state"] == "pending", waiting
    # Requeue: alice's job is stopped as a preemption stops it, and waits again (once it
    # runs its code: before, a SIGTERM finds no handler to print its checkpoint line).
    until(lambda: "attempt 1" in hub.api("GET", f"api/jobs/{first['id']}/logs?attempt=1",
                                         "alice")[1])
    status, answer = hub.api("PUT", "api/nodes/sim-node-1", "admin",
                             {"drained": True, "requeue": True})
    assert status == 200 and answer["requeued"] == [first["id"]], answer
    requeued = until(lambda: (lambda j: j["attempt"] == 2 and j)(
        hub.api("GET", f"api/jobs/{first['id']}", "alice")[1]))
    assert requeued["state"] == "pending" and "drained" in requeued["requeued"]
    assert "checkpoint" in hub.api("GET", f"api/jobs/{first['id']}/logs?attempt=1", "alice")[1]
    # A restart of the service keeps both nodes drained: nothing starts.
    for pid in hub.service_pids():
        os.kill(pid, signal.SIGKILL)
    time.sleep(1)
    hub.wait_for_pool(60)
    status, pool = hub.api("GET", "api/pool", "admin")
    assert [n["drained"] for n in pool["nodes"]] == [True, True], pool["nodes"]
    time.sleep(1)
    assert hub.api("GET", f"api/jobs/{first['id']}", "alice")[1]["state"] == "pending"
    # Undrained, the jobs start again.
    undrained = gpushare(hub, "admin", "undrain", "sim-node-1")
    assert undrained.returncode == 0 and "takes new jobs again" in undrained.stdout
    assert hub.api("PUT", "api/nodes/sim-node-0", "admin", {"drained": False})[0] == 200
    hub.wait_job("alice", first["id"], ("running",))
    hub.wait_job("bob", second["id"], ("running",))
    trail = [(e["action"], e["target"], e["via"]) for e in entries(hub, "?limit=4")]
    assert trail == [("undrain node", "sim-node-0", "api"), ("undrain node", "sim-node-1", "cli"),
                     ("drain node", "sim-node-1", "api"), ("drain node", "sim-node-0", "cli")]
    requeue = entries(hub, "?limit=3")[2]
    assert requeue["before"] == {"drained": False}
    assert requeue["after"]["drained"] and requeue["after"]["requeued"] == [first["id"]]
    for job_id, user in ((first["id"], "alice"), (second["id"], "bob")):
        hub.api("DELETE", f"api/jobs/{job_id}", user)


def test_gpushare_audit_prints_a_table_and_json(hub):
    table = gpushare(hub, "admin", "audit", "--limit", "5")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["WHEN", "WHO", "WHAT", "TARGET", "BEFORE", "→", "AFTER", "VIA"]
    assert len(lines) == 6 and "undrain node" in lines[1]
    assert "drained=no" in table.stdout or "drained=yes" in table.stdout
    as_json = gpushare(hub, "admin", "audit", "--since", "1h", "--json")
    answer = json.loads(as_json.stdout)
    assert {"entries", "next"} <= set(answer) and answer["entries"]
    bad = gpushare(hub, "admin", "audit", "--since", "someday")
    assert bad.returncode == 2 and "since must be a time like 7d" in bad.stderr
