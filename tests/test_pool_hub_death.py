"""A hub killed with SIGKILL (the OOM killer, a crashed host's hub process) takes its pool
service down with it, cleanly: the supervisor sees its parent gone and stops the service as
the hub would have, so the hub started again is up with its pool within 15 s, and the train
job that ran meanwhile is adopted once, never run twice (issue 43)."""

import os
import signal
import time

from hubtest import _descendants, running_hub

POOL_CONFIG = """
c = get_config()
c.PoolService.projects = {"vision": {"quota": 2, "groups": ["vision"]}}
c.PoolService.cycle_interval = 0.2
c.PoolService.grace_period = 2
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 2
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]
"""
JOB = ("import os, time\nprint('attempt', os.environ['GPUSHARE_ATTEMPT'], flush=True)\n"
       "time.sleep(600)\n")


def _gone(pids, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not [p for p in pids if os.path.exists(f"/proc/{p}")
                and "Z" not in open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[:1]]:
            return True
        time.sleep(0.1)
    return False


def test_a_hub_killed_and_started_again_has_its_pool_back_and_every_job_adopted_once(
        tmp_path):
    with running_hub(tmp_path, {"vision": ["alice"]}, POOL_CONFIG,
                     users=["alice", "admin"]) as hub:
        status, job = hub.api("POST", "api/jobs", "alice", {"gpus": 1, "source": JOB})
        assert status == 201, job
        job = hub.wait_job("alice", job["id"], ("running",))
        pool = hub.pool_pids()
        assert pool, "the pool's processes were not found"
        orphans = _descendants(hub.proc.pid)  # killed below if the test fails
        os.kill(hub.proc.pid, signal.SIGKILL)  # the hub alone; its children are orphaned
        hub.proc.wait()
        try:
            assert _gone(pool, 10), "the pool service outlived its hub"
        except AssertionError:
            for pid in orphans:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            raise

        began = time.monotonic()
        hub.start(timeout=60)  # the same hub, its ports and its state
        took = time.monotonic() - began
        print(f"the hub was back with its pool {took:.1f} s after its start")
        assert took <= 15, f"the hub was back with its pool after {took:.1f} s"

        again = hub.wait_job("alice", job["id"], ("running",))
        assert (again["attempt"], again["started"]) == (job["attempt"], job["started"])
        status, log = hub.api("GET", f"api/jobs/{job['id']}/logs", "alice")
        assert status == 200 and log.count("attempt 1") == 1, log  # it ran once
        assert hub.api("DELETE", f"api/jobs/{job['id']}", "alice")[0] == 200
        hub.wait_job("alice", job["id"], ("cancelled",), timeout=30)
