"""GPU-aware culling of build sessions in a real hub: real notebook servers (the gpushare-local
spawner, named servers too) whose slices show no GPU use are warned, then stopped through the
hub's API and their slices released; a server with a busy kernel, and one whose user follows a
train job's output, are spared. Every warning and stop is logged and listed in api/pool."""

import asyncio
import json
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from tornado.httpclient import HTTPRequest
from tornado.ioloop import IOLoop
from tornado.websocket import websocket_connect

from hubtest import running_hub
from jupyter_gpushare.pool.build.culler import SliceCuller
from jupyter_gpushare.pool.hub import HubAPI
from jupyter_gpushare.pool.store.database import Store
from jupyter_gpushare.usage.cull import CullSettings, Evidence, decide
from jupyter_gpushare.usage.meter import UsageMeter

SPAWNER = "fedcba9876543210fedcba9876543210"

POOL_CONFIG = """
c = get_config()
c.PoolService.projects = {"vision": {"quota": 2, "groups": ["vision"]}}
c.PoolService.cycle_interval = 0.2
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 2
c.LocalBackend.env_keep = ["LANG", "LC_ALL"]
c.PoolService.build_nodes = {"sim-build-0": 1}
c.PoolService.build_allowance = 0.25
c.GPUUsage.sample_interval = 0.2
c.GPUUsage.cull_idle_slices_after = 8
c.GPUUsage.cull_warning = 3
"""

HUB_EXTRA = f"""
c.JupyterHub.services.append({{"name": "gpushare-spawner", "api_token": "{SPAWNER}"}})
c.JupyterHub.load_roles.append({{"name": "gpushare-spawner", "services": ["gpushare-spawner"],
                                "scopes": ["access:services!service=gpushare"]}})
for role in c.JupyterHub.load_roles:  # culling: the service reads activity, stops servers
    if role["name"] == "gpushare-service":
        role["scopes"] += ["read:servers", "servers"]
c.JupyterHub.spawner_class = "gpushare-local"
c.JupyterHub.allow_named_servers = True
c.LocalGPUShareSpawner.run_as_hub_user = True
c.LocalGPUShareSpawner.hub_user_home_template = "{{dir}}/home/{{username}}"
c.LocalGPUShareSpawner.build_profiles = [{{"gpus": 0.25, "default": True}}]
c.Spawner.cmd = [{str(Path(sys.executable).with_name("jupyterhub-singleuser"))!r}]
c.Spawner.args = ["--ServerApp.jpserver_extensions={{'jupyterlab': False, 'jupyter_lsp': False, "
                  "'notebook_shim': False, 'jupyter_server_terminals': False}}",
                  "--GPUShareExtension.activity_interval=0.5"]
c.Spawner.environment = {{"JUPYTERHUB_ACTIVITY_INTERVAL": "1"}}
c.Spawner.default_url = "/api"
c.Spawner.start_timeout = 90
c.Spawner.http_timeout = 90
"""


# -- the decision, on paper ----------------------------------------------------------------------

S = CullSettings(after=600, warning=300)


def ev(**kw):
    base = dict(user="ann", server="", slice_id="s-1", gpu_idle_for=900.0, hub_idle_for=900.0,
                kernels_busy=0, kernels_said_ago=10.0, following=False)
    return Evidence(**{**base, **kw})


@pytest.mark.parametrize("evidence, why", [
    (ev(kernels_busy=1), "1 kernel(s) busy"),
    (ev(following=True), "following a train job's output"),
    (ev(kernels_said_ago=None, kernels_busy=None), "has not said lately"),
    (ev(kernels_said_ago=500.0), "has not said lately"),
    (ev(gpu_idle_for=None), "its slice uses the GPU"),
    (ev(hub_idle_for=None), "no activity record"),
    (ev(hub_idle_for=100.0), "it was used again"),
])
def test_nothing_busy_or_followed_is_culled(evidence, why):
    assert decide([evidence], {}, 1000.0, S) == []
    [spared] = decide([evidence], {"s-1": 900.0}, 1000.0, S)
    assert spared.kind == "spare" and why in spared.reason


def test_idle_sessions_are_warned_then_stopped():
    [warn] = decide([ev()], {}, 1000.0, S)
    assert warn.kind == "warn" and warn.reason == ("no GPU use and no activity for 15m; it "
                                                   "will be stopped in 5m unless used")
    assert decide([ev()], {"s-1": 1000.0}, 1299.0, S) == []  # the warning is not over yet
    [cull] = decide([ev()], {"s-1": 1000.0}, 1300.0, S)
    assert cull.kind == "cull" and "warned 5m ago" in cull.reason


# -- the reports the culler keeps ------------------------------------------------------------------

class QuietHub(HubAPI):
    """A hub whose users run no servers: nothing has a hub activity record, nothing is culled."""

    def __init__(self):
        super().__init__("http://hub.invalid/hub/api", "unused")

    async def user(self, name):
        return {"name": name, "servers": {}}


def test_kernel_reports_are_kept_only_for_servers_that_hold_a_slice(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    held = store.slices.add(1.0, user="ann", server="exp", milli=250, node="n", gpu=0)
    culler = SliceCuller(store, UsageMeter(None), QuietHub(), lambda user: False, S)
    # a flood of reports for servers that hold no slice (names up to the 255 a name may have)
    for i in range(2000):
        assert not culler.kernels_said("ann", f"{i:0>255}", 1, 1)
    assert not culler.kernels_said("bob", "exp", 1, 1)  # another user's name for it
    assert culler.kernels == {}
    assert culler.kernels_said("ann", "exp", 2, 1)
    asyncio.run(culler.once())
    assert set(culler.kernels) == {("ann", "exp")}  # held: kept through a round
    store.slices.remove(held.id)
    asyncio.run(culler.once())
    assert culler.kernels == {}  # its slice is gone: so is its entry


# -- in a real hub ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with running_hub(tmp_path_factory.mktemp("cullhub"), {"vision": ["alice", "bob", "carol"]},
                     POOL_CONFIG, HUB_EXTRA, users=["alice", "bob", "carol", "admin"]) as hub:
        yield hub
        for user, name in (("alice", "exp"), ("bob", ""), ("carol", "")):
            path = f"servers/{name}" if name else "server"
            hub.request("DELETE", f"{hub.url}/hub/api/users/{user}/{path}", hub.token(user))


def server_path(user, name):
    return f"users/{user}/servers/{name}" if name else f"users/{user}/server"


def start(hub, user, name=""):
    status, body = hub.request("POST", f"{hub.url}/hub/api/{server_path(user, name)}",
                               hub.token(user), {})
    assert status in (201, 202), body
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if running(hub, user, name):
            return
        time.sleep(0.3)
    raise TimeoutError(f"{user}'s server {name!r} did not start; see {hub.dir / 'hub.log'}")


def running(hub, user, name="") -> bool:
    status, model = hub.request("GET", f"{hub.url}/hub/api/users/{user}", hub.token("admin"))
    return bool(model.get("servers", {}).get(name, {}).get("ready"))


def busy_kernel(hub, user):
    """A kernel of the user's server running a long cell (the websocket is closed after it
    says busy; the cell goes on)."""
    base = f"{hub.url}/user/{user}/api/kernels"
    token = hub.token(user)
    status, kernel = hub.request("POST", base, token, {"name": "python3"})
    assert status == 201, kernel

    async def run():
        ws = await websocket_connect(HTTPRequest(f"ws{base[4:]}/{kernel['id']}/channels",
                                                 headers={"Authorization": f"token {token}"}))
        msg_id = uuid.uuid4().hex
        ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "t",
                       "session": uuid.uuid4().hex, "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": "import time; time.sleep(120)", "silent": False,
                        "store_history": False, "user_expressions": {}, "allow_stdin": False,
                        "stop_on_error": True}}))
        while True:
            m = json.loads(await ws.read_message())
            if m.get("parent_header", {}).get("msg_id") == msg_id and \
                    m["header"]["msg_type"] == "status" and \
                    m["content"]["execution_state"] == "busy":
                ws.close()
                return

    IOLoop.current().run_sync(run, timeout=60)


def test_idle_sessions_are_culled_and_busy_or_followed_ones_spared(hub):
    start(hub, "bob")  # a kernel runs a long cell
    busy_kernel(hub, "bob")
    start(hub, "carol")  # idle, but carol follows a train job's output
    status, job = hub.api("POST", "api/jobs", "carol", {"gpus": 1, "source": (
        "import time\nfor i in range(120):\n    print(i, flush=True); time.sleep(0.5)\n")})
    assert status == 201, job
    follow = threading.Thread(target=hub.api, args=("GET", f"api/jobs/{job['id']}/logs?follow=1",
                                                    "carol"), daemon=True)
    follow.start()
    start(hub, "alice", "exp")  # a named server: idle
    warned = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and running(hub, "alice", "exp"):
        status, body = hub.request("GET", hub.pool_url + "api/slices", SPAWNER)
        warned = warned or next((s["cull"] for s in body["slices"]
                                 if s["user"] == "alice" and s["cull"]), None)
        time.sleep(0.2)
    assert not running(hub, "alice", "exp"), "alice's idle named server was not culled"
    assert warned and warned["cull_at"] - warned["warned_at"] == 3, warned
    assert warned["reason"].startswith("no GPU use and no activity for")
    # alice's slice goes when her server's stop is done (ready is false from the stop's start)
    deadline, users = time.monotonic() + 30, None
    while time.monotonic() < deadline:
        status, body = hub.request("GET", hub.pool_url + "api/slices", SPAWNER)
        users = sorted(s["user"] for s in body["slices"])
        if "alice" not in users:
            break
        time.sleep(0.2)
    assert users == ["bob", "carol"], users  # alice's released, the others kept
    time.sleep(3)  # the others had as long, and longer
    assert running(hub, "bob") and running(hub, "carol")
    status, pool = hub.api("GET", "api/pool", "admin")
    kinds = [(e["kind"], e["user"], e["server"]) for e in pool["culling"]["events"]]
    assert ("warn", "alice", "exp") in kinds and ("cull", "alice", "exp") in kinds
    assert not any(user in ("bob", "carol") and kind == "cull" for kind, user, _ in kinds)
    assert pool["culling"]["culled"] == 1
    status, audit = hub.api("GET", "api/audit", "admin")
    [culled] = [e for e in audit["entries"] if e["action"] == "cull server"]
    assert (culled["who"], culled["target"], culled["via"]) == \
        ("gpushare (culling)", "alice/exp", "culling")
    assert culled["before"]["reason"].startswith("no GPU use") and \
        culled["after"] == {"server": "stopped"}
    status, mine = hub.api("GET", "api/pool", "bob")
    assert all(e["user"] == "bob" for e in mine["culling"]["events"])
    log = (hub.dir / "hub.log").read_text()
    assert "Culling: warned alice's server 'exp'" in log
    assert "Culling: stopped alice's server 'exp'" in log
    hub.api("DELETE", f"api/jobs/{job['id']}", "carol")


def test_kernel_reports_are_checked(hub):
    for bad, words in (({"server": "", "kernels": 1, "busy": 2}, "busy must be at most"),
                       ({"server": "", "kernels": -1, "busy": 0}, "kernels must be a whole"),
                       ({"server": 5, "kernels": 0, "busy": 0}, "server must be a string"),
                       ({"x": 1}, "the body must be")):
        status, body = hub.api("POST", "api/activity", "alice", bad)
        assert status == 400 and words in body["error"], body
    status, body = hub.request("POST", hub.pool_url + "api/activity", SPAWNER,
                               {"server": "", "kernels": 0, "busy": 0})
    assert status == 403
    status, body = hub.api("POST", "api/activity", "alice",
                           {"server": "x" * 255, "kernels": 0, "busy": 0})
    assert status == 404 and body["error"] == (
        f"your server {'x' * 255!r} holds no build slice; kernel activity is taken only from "
        "servers that hold one"), body
