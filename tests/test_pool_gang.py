"""Distributed jobs through the pool service in a real JupyterHub with the real proxy, on
the local backend's simulated pool of 2 nodes × 2 GPUs: a two-node gang meets at its
rendezvous and all-reduces, every rank's log through ``?rank=`` (and who may read it), a
failing rank fails the job, preemption requeues and resumes the whole gang, cancel stops every
rank, and a killed service adopts every rank of a running gang."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hubtest import running_hub

ALLREDUCE = str(Path(__file__).with_name("allreduce.py"))
PYTHON = "python3"  # the job user's Python, found on the jobs' PATH

POOL_CONFIG = """
c = get_config()
c.PoolService.projects = {"vision": {"quota": 2, "groups": ["vision"]},
                          "nlp": {"quota": 2, "groups": ["nlp"]}}
c.PoolService.cycle_interval = 0.2
c.PoolService.grace_period = 3
c.PoolService.min_runtime = 0  # the preemption test preempts a gang that has just started
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 2
c.LocalBackend.simulated_gpus_per_node = 2
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]  # the root service's PATH is not the users'
"""
# A gang's private network needs a machine that lets the service make namespaces (a container
# may not); elsewhere gangs meet on the host's loopback, as an admin would set.
if subprocess.run([sys.executable, "-c", "from jupyter_gpushare.backends import netns; "
                   "netns.make()"], capture_output=True).returncode:
    POOL_CONFIG += 'c.LocalBackend.gang_network = "host"\n'

GROUPS = {"vision": ["alice", "carol"], "nlp": ["bob"]}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with running_hub(tmp_path_factory.mktemp("hub"), GROUPS, POOL_CONFIG,
                     users=["alice", "bob", "carol", "admin"]) as hub:
        yield hub


def submit(hub, user, *args, **spec):
    status, job = hub.api("POST", "api/jobs", user,
                          {"command": [PYTHON, ALLREDUCE, *args], **spec})
    assert status == 201, job
    return job


def rank_log(hub, user, job_id, rank, attempt=None, until=None, timeout=30):
    query = f"rank={rank}" + (f"&attempt={attempt}" if attempt else "")
    deadline = time.monotonic() + timeout
    while True:
        status, log = hub.api("GET", f"api/jobs/{job_id}/logs?{query}", user)
        assert status == 200, log
        if until is None or until in log:
            return log
        assert time.monotonic() < deadline, f"{until!r} not in rank {rank}'s log: {log!r}"
        time.sleep(0.2)


def report(log):
    [line] = [line for line in log.splitlines() if line.startswith("RANK-REPORT ")]
    return json.loads(line.split(" ", 1)[1])


def settle(hub):
    status, body = hub.api("GET", "api/jobs?all=1", "admin")
    for job in body["jobs"]:
        if job["state"] in ("pending", "running"):
            hub.api("DELETE", f"api/jobs/{job['id']}", "admin")
    for job in body["jobs"]:
        if job["state"] in ("pending", "running"):
            hub.wait_job("admin", job["id"], ("cancelled", "succeeded", "failed"))


def test_a_two_node_job_all_reduces_and_every_rank_has_its_log(hub):
    job = submit(hub, "alice", gpus=4)  # 2 GPUs per node: it needs both nodes
    done = hub.wait_job("alice", job["id"], ("succeeded", "failed"))
    assert done["state"] == "succeeded", (done, rank_log(hub, "alice", job["id"], 0))
    assert done["placement"] == {"sim-node-0": 2, "sim-node-1": 2}
    assert (done["ranks"], done["per_gpu"]) == (2, False)
    reports = [report(rank_log(hub, "alice", job["id"], r)) for r in range(2)]
    assert [r["sum"] for r in reports] == [[3, 3, 3, 3]] * 2
    assert [(r["env"]["RANK"], r["env"]["WORLD_SIZE"], r["env"]["MASTER_ADDR"])
            for r in reports] == [("0", "2", "127.0.0.1"), ("1", "2", "127.0.0.1")]
    assert reports[0]["env"]["MASTER_PORT"] == reports[1]["env"]["MASTER_PORT"]
    # the same through the default (rank 0) and per GPU: four ranks
    assert "rank 0 done" in hub.api("GET", f"api/jobs/{job['id']}/logs", "alice")[1]
    job = submit(hub, "alice", gpus=4, per_gpu=True)
    done = hub.wait_job("alice", job["id"], ("succeeded", "failed"))
    assert done["state"] == "succeeded" and done["ranks"] == 4
    sums = [report(rank_log(hub, "alice", job["id"], r))["sum"] for r in range(4)]
    assert sums == [[10, 10, 10, 10]] * 4


def test_rank_logs_are_the_owners_and_ranks_are_checked(hub):
    job = submit(hub, "alice", "--hold", "/nonexistent-forever", gpus=4)
    jid = job["id"]
    hub.wait_job("alice", jid, ("running",))
    rank_log(hub, "alice", jid, 1, until="RANK-REPORT")
    for user, status in (("admin", 200), ("bob", 403), ("carol", 403), (None, 403)):
        assert hub.api("GET", f"api/jobs/{jid}/logs?rank=1", user)[0] == status, user
    for query, words in (("rank=2", "has ranks 0 to 1, not 2"), ("rank=-1", "whole number"),
                         ("rank=one", "whole number"), ("rank=1&attempt=2", "attempts 1 to 1")):
        status, body = hub.api("GET", f"api/jobs/{jid}/logs?{query}", "alice")
        assert status == 400 and words in body["error"], (query, body)
    status, body = hub.api("POST", "api/jobs", "alice",
                           {"gpus": 1, "command": ["true"], "env": {"MASTER_PORT": "1"}})
    assert status == 400 and "may not set MASTER_PORT" in body["error"]
    status, body = hub.api("POST", "api/jobs", "alice",
                           {"gpus": 1, "command": ["true"], "per_gpu": "yes"})
    assert status == 400 and "per_gpu must be true" in body["error"]
    # cancel stops every rank within the grace period
    began = time.monotonic()
    assert hub.api("DELETE", f"api/jobs/{jid}", "alice")[0] == 200
    assert hub.wait_job("alice", jid, ("cancelled",), timeout=20)["state"] == "cancelled"
    assert time.monotonic() - began < 3 + 2
    for rank in range(2):
        assert f"rank {rank} got SIGTERM" in rank_log(hub, "alice", jid, rank)


def test_a_failing_rank_fails_the_job(hub):
    job = submit(hub, "bob", "--fail-rank", "1", "--code", "5", gpus=2, per_gpu=True)
    done = hub.wait_job("bob", job["id"], ("succeeded", "failed"), timeout=30)
    assert (done["state"], done["exit_code"]) == ("failed", 5)
    assert done["reason"] == "rank 1: exited with code 5"
    assert "rank 0 stopped" in rank_log(hub, "bob", job["id"], 0)


def test_a_preempted_gang_is_requeued_and_resumed_whole(hub):
    settle(hub)
    ckpt = "import os; open(os.path.join(os.environ['GPUSHARE_CHECKPOINT_DIR'], 'r' + os.environ['RANK'] + '-' + os.environ['GPUSHARE_ATTEMPT']), 'w').close()"
    hold = "/nonexistent-hold"
    # vision borrows the whole pool (4 GPUs on both nodes) for a job that holds after its
    # all-reduce; on attempt 2 it lists what attempt 1 left in the checkpoint directory.
    source = (f"import os, runpy, sys\n"
              f"print('found', sorted(f for f in os.listdir(os.environ['GPUSHARE_CHECKPOINT_DIR']) if f.endswith('-1')), flush=True)\n"
              f"{ckpt}\n"
              f"sys.argv = ['allreduce'] + (['--hold', {hold!r}] if os.environ['GPUSHARE_ATTEMPT'] == '1' else [])\n"
              f"runpy.run_path({ALLREDUCE!r}, run_name='__main__')\n")
    status, big = hub.api("POST", "api/jobs", "alice", {"gpus": 4, "source": source})
    assert status == 201, big
    for rank in range(2):
        rank_log(hub, "alice", big["id"], rank, until="RANK-REPORT")
    status, small = hub.api("POST", "api/jobs", "bob",
                            {"gpus": 2, "command": ["python3", "-c", "print('nlp runs')"]})
    assert status == 201
    assert hub.wait_job("bob", small["id"], ("succeeded",), timeout=30)
    for rank in range(2):  # every rank was told to stop
        assert f"rank {rank} got SIGTERM" in rank_log(hub, "alice", big["id"], rank, attempt=1)
    done = hub.wait_job("alice", big["id"], ("succeeded", "failed"), timeout=40)
    assert (done["state"], done["attempt"], done["ranks"]) == ("succeeded", 2, 2)
    for rank in range(2):  # resumed together, from the same checkpoint directory
        log = rank_log(hub, "alice", big["id"], rank, attempt=2)
        assert "found ['r0-1', 'r1-1']" in log and report(log)["sum"] == [3, 3, 3, 3]


def test_a_killed_service_adopts_every_rank_of_a_gang(hub):
    settle(hub)
    shared = Path(tempfile.mkdtemp(prefix="gpushare-gang-"))  # the job's user can look here
    shared.chmod(0o755)
    go = shared / "go"
    job = submit(hub, "alice", "--hold", str(go), gpus=4, per_gpu=True)
    for rank in range(4):
        rank_log(hub, "alice", job["id"], rank, until="RANK-REPORT")
    for pid in hub.service_pids():
        os.kill(pid, signal.SIGKILL)
    time.sleep(1)
    hub.wait_for_pool(60)
    status, now = hub.api("GET", f"api/jobs/{job['id']}", "alice")
    assert (now["state"], now["attempt"]) == ("running", 1)
    go.touch()
    done = hub.wait_job("alice", job["id"], ("succeeded", "failed"), timeout=30)
    assert (done["state"], done["attempt"]) == ("succeeded", 1)
    for rank in range(4):
        assert f"rank {rank} done" in rank_log(hub, "alice", job["id"], rank)
    shutil.rmtree(shared)


def test_the_cli_reads_any_rank(hub):
    job = submit(hub, "bob", gpus=2, per_gpu=True)
    hub.wait_job("bob", job["id"], ("succeeded",))
    env = {**os.environ, "GPUSHARE_URL": hub.pool_url, "JUPYTERHUB_API_TOKEN": hub.token("bob")}
    exe = str(Path(sys.executable).with_name("gpushare"))
    out = subprocess.run([exe, "logs", job["id"], "--rank", "1"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == "rank 1 done", out
    out = subprocess.run([exe, "logs", job["id"], "--rank", "5"], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "has ranks 0 to 1, not 5" in out.stderr
