"""The local build-slice spawner in a real JupyterHub, with the real proxy, the real pool
service (one simulated build GPU) and real single-user servers and kernels.

Servers run as the hub's user (run_as_hub_user): this machine's Python may not be usable by
other accounts. One hub for the module; the tests run in order and share its state."""

import json
import secrets
import signal
import sys
import threading
import time
import uuid
from importlib.metadata import entry_points
from pathlib import Path
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest
from tornado.httpclient import HTTPRequest
from tornado.ioloop import IOLoop
from tornado.websocket import websocket_connect

from hubtest import running_hub
from jupyter_gpushare.spawner import LocalGPUShareSpawner

POOL_CONFIG = """
c = get_config()
c.PoolService.projects = {"vision": {"quota": 1, "groups": ["vision"]}}
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 2
c.PoolService.build_nodes = {"sim-build-0": 1}
c.PoolService.build_allowance = 0.5
"""

SPAWNER_TOKEN = secrets.token_hex(16)

HUB_EXTRA = f"""
from jupyter_gpushare.spawner import LocalGPUShareSpawner

class FailingLocalGPUShareSpawner(LocalGPUShareSpawner):
    '''Servers named "missing" cannot be run and servers named "exits" end at once: starts
    that fail after their slice was reserved.'''

    async def start(self):
        if self.name == "missing":
            self.cmd = ["{{dir}}/no-such-jupyterhub-singleuser"]
        elif self.name == "exits":
            self.cmd = [sys.executable, "-c", "raise SystemExit(3)"]
        return await super().start()

c.JupyterHub.spawner_class = FailingLocalGPUShareSpawner
c.JupyterHub.allow_named_servers = True
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 1}}  # answer POSTs soon, poll early
c.JupyterHub.services.append({{"name": "gpushare-spawner", "api_token": "{SPAWNER_TOKEN}"}})
c.JupyterHub.load_roles.append({{"name": "gpushare-spawner", "services": ["gpushare-spawner"],
                                "scopes": ["access:services!service=gpushare"]}})
c.LocalGPUShareSpawner.run_as_hub_user = True
c.LocalGPUShareSpawner.hub_user_home_template = "{{dir}}/home/{{username}}"
c.LocalGPUShareSpawner.slice_wait_timeout = 5
c.LocalGPUShareSpawner.build_profiles = [
    {{"gpus": 0.25, "default": True}}, {{"gpus": 0.5}}, {{"gpus": 0}},
    {{"gpus": 1, "groups": ["nlp"]}}]
c.Spawner.cmd = [{str(Path(sys.executable).with_name("jupyterhub-singleuser"))!r}]
# A bare jupyter_server: the test needs its REST API and kernels, not JupyterLab.
c.Spawner.args = ["--ServerApp.jpserver_extensions={{'jupyterlab': False, 'jupyter_lsp': False, "
                  "'notebook_shim': False, 'jupyter_server_terminals': False}}"]
c.Spawner.default_url = "/api"
c.Spawner.start_timeout = 60
c.Spawner.http_timeout = 60
"""

GROUPS = {"vision": ["alice", "carol"], "nlp": ["bob"]}
ALICE_GPU = "GPU-SIMULATED-sim-build-0-0"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    with running_hub(tmp_path_factory.mktemp("spawnerhub"), GROUPS, POOL_CONFIG, HUB_EXTRA,
                     users=["alice", "bob", "carol", "admin"]) as hub:
        yield hub
        for user in ("alice", "carol"):
            hub.request("DELETE", f"{hub.url}/hub/api/users/{user}/server", hub.token(user))


# -- helpers ------------------------------------------------------------------------------------

def hub_api(hub, method, path, user, body=None):
    return hub.request(method, f"{hub.url}/hub/api/{path}", hub.token(user), body)


def slices(hub):
    """The pool's slices, as the spawner's service sees them."""
    status, body = hub.request("GET", hub.pool_url + "api/slices", SPAWNER_TOKEN)
    assert status == 200, body
    return [{k: s[k] for k in ("user", "server", "gpus", "node", "gpu", "uuid")}
            for s in body["slices"]]


def spawn(hub, user, server="", profile=None):
    path = f"users/{user}/servers/{server}" if server else f"users/{user}/server"
    return hub_api(hub, "POST", path, user, {"profile": profile} if profile else {})


def progress(hub, user, server="") -> list[dict]:
    """Every event of the spawn page's progress stream, until the spawn ends."""
    path = f"users/{user}/servers/{server}/progress" if server else f"users/{user}/server/progress"
    req = Request(f"{hub.url}/hub/api/{path}",
                  headers={"Authorization": f"token {hub.token(user)}"})
    events = []
    with urlopen(req, timeout=90) as stream:
        for line in stream:
            if line.startswith(b"data:"):
                events.append(json.loads(line[5:]))
    return events


def spawn_and_watch(hub, user, server="", profile=None, meanwhile=None):
    """Start a server and read its progress stream while it starts (the hub's POST answers
    when the start has ended), after calling ``meanwhile()`` once the start is under way:
    (POST status, POST body, progress events)."""
    answer = {}
    post = threading.Thread(target=lambda: answer.update(
        zip(("status", "body"), spawn(hub, user, server, profile))))
    post.start()
    if meanwhile:
        wait_until(lambda: hub_api(hub, "GET", f"users/{user}", user)[1]["servers"]
                   .get(server, {}).get("pending"), what="a pending start")
        meanwhile()
    events = []
    deadline = time.monotonic() + 30
    while not events and time.monotonic() < deadline:
        try:
            events = progress(hub, user, server)
        except HTTPError:  # not pending yet
            time.sleep(0.2)
    post.join(90)
    return answer["status"], answer["body"], events


def wait_ready(hub, user, server="", timeout=90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, model = hub_api(hub, "GET", f"users/{user}", user)
        found = model.get("servers", {}).get(server)
        if found and found.get("ready"):
            return found
        if not found or not found.get("pending"):
            raise AssertionError(f"{user}'s server {server!r} is not starting: {model}")
        time.sleep(0.5)
    raise TimeoutError(f"{user}'s server did not become ready; see {hub.dir / 'hub.log'}")


def wait_until(condition, timeout=30, what="the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.3)
    raise TimeoutError(f"{what} did not come true in {timeout} s")


def run_in_kernel(hub, user, code: str) -> str:
    """Start a kernel in the user's server through its REST API, run ``code`` over the
    kernel's websocket, and return what it printed (the kernel is shut down after)."""
    base = f"{hub.url}/user/{user}/api/kernels"
    token = hub.token(user)
    status, kernel = hub.request("POST", base, token, {"name": "python3"})
    assert status == 201, kernel
    try:
        return IOLoop.current().run_sync(lambda: _execute(
            f"ws{base[4:]}/{kernel['id']}/channels", token, code), timeout=60)
    finally:
        hub.request("DELETE", f"{base}/{kernel['id']}", token)


async def _execute(url, token, code) -> str:
    ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}))
    msg_id, out = uuid.uuid4().hex, []
    ws.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                   "session": uuid.uuid4().hex, "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": False,
                    "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
    while True:
        message = json.loads(await ws.read_message())
        if message.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind = message["header"]["msg_type"]
        if kind == "stream":
            out.append(message["content"]["text"])
        elif kind == "error":
            out.append("\n".join(message["content"]["traceback"]))
        elif kind == "status" and message["content"]["execution_state"] == "idle":
            ws.close()
            return "".join(out)


# -- the tests ----------------------------------------------------------------------------------

def test_the_entry_point_names_the_local_spawner():
    (point,) = entry_points(group="jupyterhub.spawners", name="gpushare-local")
    assert point.load() is LocalGPUShareSpawner


KERNEL_CHECK = """
import json, os, sys
from jupyter_gpushare.client import PoolClient
names = ["CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPUSHARE_SLICE_MODE",
         "GPUSHARE_SLICE_GPUS", "GPUSHARE_SLICE_UUID", "GPUSHARE_TORCH_MEMORY_FRACTION",
         "TF_FORCE_GPU_ALLOW_GROWTH", "XLA_PYTHON_CLIENT_PREALLOCATE",
         "XLA_PYTHON_CLIENT_MEM_FRACTION", "CUPY_GPU_MEMORY_LIMIT", "GPUSHARE_URL"]
shell = get_ipython()
print(json.dumps({
    "env": {n: os.environ.get(n) for n in names},
    "extension": "jupyter_gpushare" in shell.extension_manager.loaded,
    "train_magic": "train" in shell.magics_manager.magics["cell"],
    "torch_hook": any(type(f).__name__ == "_AfterImport" for f in sys.meta_path),
    "startup_names": sorted(n for n in shell.user_ns if "gpushare" in n.lower()),
    "pool_says_i_am": PoolClient().quota()["user"],
}))
"""


def test_alice_gets_her_slice_and_her_kernels_see_it(hub):
    status, body = spawn(hub, "alice")
    assert status in (201, 202), body
    wait_ready(hub, "alice")
    assert slices(hub) == [{"user": "alice", "server": "", "gpus": 0.25, "node": "sim-build-0",
                            "gpu": 0, "uuid": ALICE_GPU}]
    seen = json.loads(run_in_kernel(hub, "alice", KERNEL_CHECK))
    assert seen == {
        "env": {"CUDA_VISIBLE_DEVICES": ALICE_GPU, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "GPUSHARE_SLICE_MODE": "pinned", "GPUSHARE_SLICE_GPUS": "0.25",
                "GPUSHARE_SLICE_UUID": ALICE_GPU, "GPUSHARE_TORCH_MEMORY_FRACTION": "0.25",
                "TF_FORCE_GPU_ALLOW_GROWTH": "true", "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
                "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.25", "CUPY_GPU_MEMORY_LIMIT": "25%",
                "GPUSHARE_URL": hub.pool_url},
        "extension": True, "train_magic": True, "torch_hook": True,
        "startup_names": [],  # the start-up file leaves nothing in the user's namespace
        "pool_says_i_am": "alice",  # the server's token reaches the pool as alice
    }


def test_a_spawn_beyond_the_allowance_waits_then_says_why(hub):
    status, body, events = spawn_and_watch(hub, "alice", "second", "half-gpu")
    reason = ("Alice already holds 0.25 GPU of a build allowance of 0.5 GPU; stop another "
              "notebook server or pick a smaller slice")
    # The hub answers the POST when the start has ended or after slow_spawn_timeout.
    assert (status, body) in [(400, {"status": 400, "message": f"{reason}."}), (202, "")]
    assert [e.get("message") for e in events][1:] == [
        "Reserving ½ GPU on the build pool.", f"{reason}: waiting up to 5 s for room.",
        f"Spawn failed: {reason}."]
    assert events[-1]["failed"] is True
    _, model = hub_api(hub, "GET", "users/alice", "alice")
    assert "second" not in model["servers"]
    assert [s["server"] for s in slices(hub)] == [""]  # nothing reserved, nothing left


def test_profiles_a_user_may_not_have_are_refused_in_one_sentence(hub):
    status, body = spawn(hub, "carol", "big", "1-gpu")  # for the nlp group only
    assert (status, body) == (400, {"status": 400, "message": (
        "There is no build profile '1-gpu' for you; choose one of quarter-gpu, half-gpu, cpu.")})
    assert [s["server"] for s in slices(hub)] == [""]


def test_failed_starts_release_their_slice(hub):
    # The command cannot be run: start() fails after the reservation.
    status, body = spawn(hub, "alice", "missing")
    if status in (201, 202):
        assert progress(hub, "alice", "missing")[-1]["failed"] is True
    wait_until(lambda: [s["server"] for s in slices(hub)] == [""], what="release after a failed start")
    # The server starts and ends at once: the hub finds it gone, and the slice is released.
    status, body = spawn(hub, "alice", "exits")
    wait_until(lambda: [s["server"] for s in slices(hub)] == [""], what="release of an ended server")
    hub_api(hub, "DELETE", "users/alice/servers/exits", "alice")


def test_a_full_build_pool_waits_for_room_and_stopping_a_server_releases_its_slice(hub):
    # Bob holds half of the one build GPU (reserved here as the spawner would), alice a
    # quarter: carol's half does not fit, so her start waits ...
    status, bob = hub.request("POST", hub.pool_url + "api/slices", SPAWNER_TOKEN,
                              {"user": "bob", "gpus": 0.5, "server": "elsewhere"})
    assert status == 201, bob

    def alice_stops():  # ... until alice stops her server, which releases her slice.
        time.sleep(1.5)
        status, body = hub_api(hub, "DELETE", "users/alice/server", "alice")
        assert status in (202, 204), body

    try:
        status, body, events = spawn_and_watch(hub, "carol", profile="half-gpu",
                                               meanwhile=alice_stops)
        assert status in (201, 202), body
        messages = [e.get("message") for e in events]
        assert messages[1:4] == [
            "Reserving ½ GPU on the build pool.",
            "The build pool is full: no GPU has 0.5 GPU free; try a smaller slice or a "
            "CPU-only server, or try again later: waiting up to 5 s for room.",
            "Reserved ½ GPU: GPU 0 of sim-build-0."]
        assert events[-1].get("ready") is True, events
        assert sorted((s["user"], s["gpus"]) for s in slices(hub)) == [("bob", 0.5),
                                                                      ("carol", 0.5)]
        status, body = hub_api(hub, "DELETE", "users/carol/server", "carol")
        assert status in (202, 204), body
        wait_until(lambda: [s["user"] for s in slices(hub)] == ["bob"],
                   what="release of carol's slice")
    finally:
        hub.request("DELETE", hub.pool_url + f"api/slices/{bob['id']}", SPAWNER_TOKEN)


def test_cpu_only_servers_hold_no_slice_and_see_no_gpu(hub):
    status, body = spawn(hub, "bob", profile="cpu")
    assert status in (201, 202), body
    try:
        wait_ready(hub, "bob")
        assert slices(hub) == []
        env = json.loads(run_in_kernel(hub, "bob", "import os, json; print(json.dumps({k: "
                                       "os.environ.get(k) for k in ('NVIDIA_VISIBLE_DEVICES', "
                                       "'CUDA_VISIBLE_DEVICES', 'GPUSHARE_SLICE_MODE')}))"))
        assert env == {"NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": "",
                       "GPUSHARE_SLICE_MODE": "cpu"}
    finally:
        hub_api(hub, "DELETE", "users/bob/server", "bob")


def test_a_hub_that_stops_leaves_its_slices_to_the_pool_which_releases_them_on_start(hub):
    # The hub stops its services before its servers, so alice's spawner cannot release her
    # slice as the hub stops: it says so once, quietly, and the pool keeps the slice ...
    status, body = spawn(hub, "alice")
    assert status in (201, 202), body
    wait_ready(hub, "alice")
    assert sorted(s["user"] for s in slices(hub)) == ["alice"]
    hub.proc.send_signal(signal.SIGTERM)  # a clean stop, as an admin's Ctrl-C or systemd
    hub.proc.wait(60)
    log = (hub.dir / "hub.log").read_text()
    assert "is kept by the pool service, which is not running" in log
    assert "was not released" not in log
    # ... and releases it when it starts again, as the hub runs no server of alice's now.
    hub.start()
    wait_until(lambda: "alice" not in [s["user"] for s in slices(hub)], timeout=30,
               what="the pool's release of alice's slice")
    assert "Released build slice" in (hub.dir / "hub.log").read_text()
