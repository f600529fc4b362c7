"""Crashing the pool service under load: two users submit through the real proxy while the
service is killed with SIGKILL at random moments. Shared by tests/test_pool_crash.py (twice,
once) and benchmarks/pool_crash.py (ten runs, the worst downtime).

Every job leaves a marker file per attempt when it starts (``<job>.<attempt>.start``) and
when it has done its work (``<job>.<attempt>.done``), created exclusively, so the files show
how often each job ran. Each submit carries its own key and is retried by the client
(``PoolClient``) through the restarts, so the API's answers say which jobs it accepted.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from jupyter_gpushare.client import ClientError, PoolClient

POOL_CONFIG = """
c = get_config()
c.PoolService.projects = {"vision": {"quota": 2, "groups": ["vision"]},
                          "nlp": {"quota": 2, "groups": ["nlp"]}}
c.PoolService.cycle_interval = 0.5
c.PoolService.grace_period = 3
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 4
"""
GROUPS = {"vision": ["alice"], "nlp": ["bob"]}

# Runs as the job's user with /bin/sh: a marker when it starts, work, a marker when done.
JOB = ('set -C; d="$1"; m="$d/$GPUSHARE_JOB_ID.$GPUSHARE_ATTEMPT"; : > "$m.start" && '
       'sleep "$2" && : > "$m.done"')


@dataclass
class CrashRun:
    accepted: dict[str, str] = field(default_factory=dict)  # request key -> job id
    failed_submits: list[str] = field(default_factory=list)
    downtimes: list[float] = field(default_factory=list)  # seconds from kill to API answering
    problems: list[str] = field(default_factory=list)


def crash_under_load(hub, markers: Path, *, kills: int = 2, seconds: float = 10.0,
                     rate: float = 8.0, rng: random.Random | None = None) -> CrashRun:
    """Submit ``rate`` jobs a second (two users, half each) for ``seconds``, SIGKILL the pool
    service ``kills`` times at random moments meanwhile, wait for every job to end, and say
    what went wrong (``problems``: empty when nothing was lost, run twice or made twice)."""
    rng = rng or random.Random()
    markers.mkdir(parents=True, exist_ok=True)
    markers.chmod(0o1777)  # the jobs run as alice and bob
    run, lock, stop = CrashRun(), threading.Lock(), threading.Event()

    def submitter(user: str, seed: int):
        mine = random.Random(seed)
        client = PoolClient(hub.pool_url, hub.token(user), timeout=10, retry_s=30)
        while not stop.is_set():
            key = str(uuid.uuid4())
            spec = {"gpus": 1, "name": key[:8], "command": [
                "/bin/sh", "-c", JOB, "job", str(markers), f"{mine.uniform(0.1, 1.0):.2f}"]}
            try:
                job = client.submit(spec, request_id=key)
                with lock:
                    run.accepted[key] = job["id"]
            except ClientError as e:
                with lock:
                    run.failed_submits.append(f"{user}: {e}")
            time.sleep(mine.expovariate(rate / 2))

    threads = [threading.Thread(target=submitter, args=(u, rng.random()), daemon=True)
               for u in ("alice", "bob")]
    began = time.monotonic()
    for t in threads:
        t.start()
    moments = sorted(rng.uniform(1.0, seconds - 1.0) for _ in range(kills))
    for moment in moments:
        time.sleep(max(0.0, began + moment - time.monotonic()))
        run.downtimes.append(kill_and_time(hub))
    time.sleep(max(0.0, began + seconds - time.monotonic()))
    stop.set()
    for t in threads:
        t.join(60)
    run.problems = check(hub, markers, run)
    return run


def kill_and_time(hub, timeout: float = 60.0) -> float:
    """SIGKILL the pool service; seconds until its API answers a user again."""
    pids = hub.service_pids()
    assert pids, "no pool service process to kill"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    while any(os.path.exists(f"/proc/{pid}") and "Z" not in _state(pid) for pid in pids):
        time.sleep(0.005)
    token = hub.token("admin")
    while time.monotonic() - killed < timeout:
        status, _ = hub.request("GET", hub.pool_url + "api/quota", token)
        if status == 200:
            return time.monotonic() - killed
        time.sleep(0.02)
    raise TimeoutError(f"the pool service did not answer {timeout} s after it was killed")


def check(hub, markers: Path, run: CrashRun, timeout: float = 120.0) -> list[str]:
    """Every accepted job ends, succeeded, having done its work exactly once; no job the
    clients did not get back exists (no retried submit made a second job)."""
    problems = [f"a submit failed: {e}" for e in run.failed_submits]
    deadline = time.monotonic() + timeout
    while True:
        status, body = hub.api("GET", "api/jobs?all=1&limit=1000", "admin")
        jobs = {j["id"]: j for j in body["jobs"]} if status == 200 else {}
        active = [j for j in jobs.values() if j["state"] in ("pending", "running")]
        if status == 200 and not active:
            break
        if time.monotonic() > deadline:
            problems.append(f"stuck: {len(active)} job(s) still pending or running, e.g. "
                            f"{active[:1]}")
            break
        time.sleep(0.5)
    ids = set(run.accepted.values())
    if len(ids) != len(run.accepted):
        problems.append("two keys got the same job")
    made = {j["id"] for j in jobs.values() if j.get("request_id") in run.accepted}
    extra = set(jobs) - ids
    if extra:
        problems.append(f"{len(extra)} job(s) exist that no client got back: {sorted(extra)[:3]}")
    for key, job_id in run.accepted.items():
        job = jobs.get(job_id)
        if job is None:
            problems.append(f"accepted job {job_id} is lost")
            continue
        if job["state"] != "succeeded":
            problems.append(f"job {job_id} {job['state']}: {job['reason']}")
        done = sorted(markers.glob(f"{job_id}.*.done"))
        if len(done) != 1:
            problems.append(f"job {job_id} did its work {len(done)} times: {done}")
        elif done[0].name != f"{job_id}.{job['attempt']}.done":
            problems.append(f"job {job_id} ended as attempt {job['attempt']} but did its work "
                            f"in {done[0].name}")
        if job_id not in made:
            problems.append(f"job {job_id} does not carry its key {key}")
    return problems


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
