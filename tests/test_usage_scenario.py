"""Done when: on a real hub with the pool on the local backend, real notebook servers (the
gpushare-local spawner) and real train jobs, the NVML stand-in plays a scripted 10-minute
scenario (a busy job, an idle job, a busy slice, an idle slice; at 60× speed, so in 10 s), and
``gpushare usage`` shows the allocation and utilization it was told to play, within one
percentage point.

The scenario fills one whole minute row: everything is allocated before the minute starts, the
stand-in's clock starts with it, and the window asked for is that minute up to now."""

import json
import sys
import time
from pathlib import Path

import pytest

from hubtest import running_hub
from jupyter_gpushare.cli import main
from jupyter_gpushare.usage.nvml_standin import write_script

GiB = 2**30
ARTIFACTS = Path(__file__).parent / "artifacts" / "usage"
SPAWNER = "0123456789abcdef0123456789abcdef"
SCALE = 60  # scenario seconds per second
LENGTH = 600  # scenario seconds: 10 minutes
BEFORE = -10**9  # a step from "always"

POOL_CONFIG = """
c = get_config()
c.PoolService.projects = {"vision": {"quota": 2, "groups": ["vision"]},
                          "nlp": {"quota": 2, "groups": ["nlp"]}}
c.PoolService.cycle_interval = 0.2
c.PoolService.grace_period = 2
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 4
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]
c.PoolService.build_nodes = {"sim-build-0": 1}
c.PoolService.build_allowance = 0.25
c.GPUUsage.sample_interval = 0.2
c.GPUUsage.nvml_standin_script = "{dir}/standin.json"
"""

HUB_EXTRA = f"""
c.JupyterHub.services.append({{"name": "gpushare-spawner", "api_token": "{SPAWNER}"}})
c.JupyterHub.load_roles.append({{"name": "gpushare-spawner", "services": ["gpushare-spawner"],
                                "scopes": ["access:services!service=gpushare"]}})
c.JupyterHub.spawner_class = "gpushare-local"
c.LocalGPUShareSpawner.run_as_hub_user = True
c.LocalGPUShareSpawner.hub_user_home_template = "{{dir}}/home/{{username}}"
c.LocalGPUShareSpawner.build_profiles = [{{"gpus": 0.25, "default": True}}]
c.Spawner.cmd = [{str(Path(sys.executable).with_name("jupyterhub-singleuser"))!r}]
c.Spawner.args = ["--ServerApp.jpserver_extensions={{'jupyterlab': False, 'jupyter_lsp': False, "
                  "'notebook_shim': False, 'jupyter_server_terminals': False}}"]
c.Spawner.default_url = "/api"
c.Spawner.start_timeout = 90
c.Spawner.http_timeout = 90
"""

JOB = ("import os, time\nprint('pid', os.getpid(), 'gpus', os.environ['CUDA_VISIBLE_DEVICES'], "
       "flush=True)\ntime.sleep(600)\n")

# What the stand-in plays (percent of each GPU), and what that means over the 10 minutes.
BUSY_JOB = ([[BEFORE, 90], [200, 50], [400, 90]], [[BEFORE, 70]])  # its two GPUs: 76.7 %, 70 %
IDLE_JOB = [[BEFORE, 2]]
BUSY_SLICE = [[BEFORE, 15], [300, 25]]  # 20 % of the GPU: 80 % of a ¼ slice
IDLE_SLICE = [[BEFORE, 0]]
EXPECTED = {
    "project": {"vision": (2 / 4, (230 / 3 + 70) / 2 / 100), "nlp": (1 / 4, 0.02)},
    "user": {"alice": (2.25 / 5, (2 * (230 / 3 + 70) / 2 + 0.25 * 80) / 2.25 / 100),
             "bob": (1.25 / 5, (1 * 2 + 0.25 * 0) / 1.25 / 100)},
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    d = tmp_path_factory.mktemp("scenariohub")
    with running_hub(d, {"vision": ["alice"], "nlp": ["bob"]},
                     POOL_CONFIG.replace("{dir}", str(d)), HUB_EXTRA,
                     users=["alice", "bob", "admin"]) as hub:
        yield hub
        for user in ("alice", "bob"):
            hub.request("DELETE", f"{hub.url}/hub/api/users/{user}/server", hub.token(user))


def job_pid(hub, user, job_id):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, log = hub.api("GET", f"api/jobs/{job_id}/logs", user)
        if status == 200 and "pid" in log:
            words = log.split()
            return int(words[1]), words[3].split(",")
        time.sleep(0.1)
    raise TimeoutError(f"job {job_id} did not start")


def start_server(hub, user):
    status, body = hub.request("POST", f"{hub.url}/hub/api/users/{user}/server",
                               hub.token(user), {})
    assert status in (201, 202), body
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        status, model = hub.request("GET", f"{hub.url}/hub/api/users/{user}",
                                    hub.token(user))
        if model.get("servers", {}).get("", {}).get("ready"):
            return
        time.sleep(0.3)
    raise TimeoutError(f"{user}'s server did not start; see {hub.dir / 'hub.log'}")


def test_usage_shows_what_the_standin_played(hub, capsys, monkeypatch):
    for user in ("alice", "bob"):
        start_server(hub, user)
    status, body = hub.request("GET", hub.pool_url + "api/slices", SPAWNER)
    servers = {s["user"]: s["pid"] for s in body["slices"]}
    assert set(servers) == {"alice", "bob"} and all(servers.values()), body
    for pid in servers.values():  # the spawner told the pool its server's process
        assert b"jupyterhub-singleuser" in Path(f"/proc/{pid}/cmdline").read_bytes()
    jobs = {}
    for user, gpus in (("alice", 2), ("bob", 1)):
        status, job = hub.api("POST", "api/jobs", user, {"gpus": gpus, "source": JOB})
        assert status == 201, job
        jobs[user] = job_pid(hub, user, job["id"])
    (busy, busy_gpus), (idle, [idle_gpu]) = jobs["alice"], jobs["bob"]
    build = "GPU-SIMULATED-sim-build-0-0"
    processes = [
        {"pid": busy, "gpu": busy_gpus[0], "sm": BUSY_JOB[0], "memory": 20 * GiB},
        {"pid": busy, "gpu": busy_gpus[1], "sm": BUSY_JOB[1], "memory": 20 * GiB},
        {"pid": idle, "gpu": idle_gpu, "sm": IDLE_JOB, "memory": 30 * GiB},
        {"pid": servers["alice"], "gpu": build, "sm": BUSY_SLICE, "memory": 3 * GiB},
        {"pid": servers["bob"], "gpu": build, "sm": IDLE_SLICE, "memory": GiB}]
    # The scenario starts with the next minute (at least 3 s away), so one minute row holds it.
    minute = (int(time.time()) + 3) // 60 * 60 + 60
    write_script(hub.dir / "standin.json", {"start": minute, "time_scale": SCALE,
                                            "processes": processes})
    time.sleep(minute + LENGTH / SCALE - time.time() + 0.05)
    until = time.time()

    monkeypatch.setenv("GPUSHARE_URL", hub.pool_url)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", hub.token("admin"))
    window = ["--since", str(minute), "--until", f"{until:.3f}"]
    for by, expected in EXPECTED.items():
        assert main(["usage", "--by", by, "--json", *window]) == 0
        answer = json.loads(capsys.readouterr().out)
        rows = {r[by]: r for r in answer["rows"]}
        for name, (allocation, utilization) in expected.items():
            assert abs(rows[name]["allocation"] - allocation) <= 0.01, (by, name, rows[name])
            assert abs(rows[name]["utilization"] - utilization) <= 0.01, (by, name, rows[name])
    assert main(["usage", "--by", "project", *window]) == 0
    text = capsys.readouterr().out
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "usage-by-project.txt").write_text(text)  # what docs/howto/utilization.md shows
    table = text.splitlines()
    vision = next(line.split() for line in table if line.startswith("vision"))
    nlp = next(line.split() for line in table if line.startswith("nlp"))
    # The table says what the JSON said, in whole percents (73.3 % may print as 73 or 74).
    shown = [int(cell.rstrip("%")) for cell in vision[2:4] + nlp[2:4]]
    assert all(abs(a - b) <= 1 for a, b in zip(shown, [50, 73, 25, 2])), table
    assert table[0].startswith("train pool: allocation 75%, utilization"), table
    assert main(["usage", "--json", *window]) == 0
    train = json.loads(capsys.readouterr().out)["pools"]["train"]
    played = (230 / 3 + 70 + 2) / 100  # GPU-seconds used per second, of 3 held and 4 present
    assert abs(train["allocation"] - 0.75) <= 0.01
    assert abs(train["utilization"] - played / 3) <= 0.01
    assert abs(train["average_utilization"] - played / 4) <= 0.01
    # The slices, each against its ¼ of the build GPU.
    assert main(["usage", "--by", "slice", "--json", *window]) == 0
    slices = {r["user"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert abs(slices["alice"]["utilization"] - 0.8) <= 0.01
    assert slices["bob"]["utilization"] == 0 and slices["bob"]["idle_ratio"] == 1
