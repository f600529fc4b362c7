"""GPUShareKubeSpawner end to end: a real JupyterHub with the real proxy and pool service,
KubeSpawner talking to the real control plane (tests/kube), whose real scheduler places the
notebook pod on a simulated build node; the kubelet simulator runs the pod's
jupyterhub-singleuser as a local process, so the hub reaches a real server.

One story in one test: alice's server gets a ¼ slice (pod resources, node pin, environment),
bob's start is refused by the cluster itself (no gpu.shared replica left, which reaches the
spawn page through KubeSpawner's events) and releases his slice when stopped, and stopping
alice's server deletes her pod and releases hers."""

import json
import secrets
import sys
import time
from pathlib import Path

import pytest

from hubtest import Hub, free_port, need_proxy, system_users
from kube.podrun import ANN_RUN_LOCALLY

pytestmark = pytest.mark.kube

BUILD_NODE = "gs-build-0"
SPAWNER_TOKEN = secrets.token_hex(16)

POOL_CONFIG = f"""
c = get_config()
c.LocalBackend.simulate_gpus = True
c.LocalBackend.simulated_nodes = 1
c.LocalBackend.simulated_gpus_per_node = 1
c.PoolService.build_nodes = {{"{BUILD_NODE}": 1}}
c.PoolService.build_allowance = 0.5
"""


def hub_extra(namespace: str, node_selector: dict) -> str:
    singleuser = str(Path(sys.executable).with_name("jupyterhub-singleuser"))
    return f"""
c.JupyterHub.spawner_class = "gpushare-kubernetes"
c.JupyterHub.tornado_settings = {{"slow_spawn_timeout": 1}}
c.JupyterHub.services.append({{"name": "gpushare-spawner", "api_token": "{SPAWNER_TOKEN}"}})
c.JupyterHub.load_roles.append({{"name": "gpushare-spawner", "services": ["gpushare-spawner"],
                                "scopes": ["access:services!service=gpushare"]}})
c.KubeSpawner.namespace = {namespace!r}
c.KubeSpawner.k8s_api_verify_ssl = False
c.KubeSpawner.image = "local/not-pulled:1"
c.KubeSpawner.cmd = [{singleuser!r}]
c.KubeSpawner.args = ["--allow-root", "--ServerApp.jpserver_extensions={{'jupyterlab': False, "
                      "'jupyter_lsp': False, 'notebook_shim': False, "
                      "'jupyter_server_terminals': False}}"]
c.KubeSpawner.port = {free_port()}
c.KubeSpawner.default_url = "/api"
# The kubelet simulator runs the notebook container as a local process.
c.KubeSpawner.extra_annotations = {{"{ANN_RUN_LOCALLY}": "true"}}
c.KubeSpawner.start_timeout = 60
c.KubeSpawner.http_timeout = 60
c.GPUShareKubeSpawner.build_node_selector = {node_selector!r}
c.GPUShareKubeSpawner.gpushare_url = "http://proxy.example/services/gpushare/"
c.GPUShareKubeSpawner.slice_wait_timeout = 0
"""


@pytest.fixture
def hub(kube, tmp_path, monkeypatch):
    need_proxy()
    system_users(["alice", "bob", "admin"])
    # One build GPU that the device plugin shares as a single replica: the pool (which counts
    # quarters) has room for bob, the cluster has not.
    kube.add_node(BUILD_NODE, shared_gpus=1)
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig))  # the hub inherits it
    tmp_path.chmod(0o755)
    hub = Hub(tmp_path, {"vision": ["alice"], "nlp": ["bob"]}, POOL_CONFIG,
              hub_extra(kube.namespace, kube.node_selector)).start()
    yield hub
    for user in ("alice", "bob"):
        hub.request("DELETE", f"{hub.url}/hub/api/users/{user}/server", hub.token(user))
    hub.stop()


def hub_api(hub, method, path, user, body=None):
    return hub.request(method, f"{hub.url}/hub/api/{path}", hub.token(user), body)


def slices(hub):
    status, body = hub.request("GET", hub.pool_url + "api/slices", SPAWNER_TOKEN)
    assert status == 200, body
    return [(s["user"], s["gpus"], s["node"]) for s in body["slices"]]


def wait_for(condition, timeout=60, what="the condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.3)
    raise TimeoutError(f"{what} did not happen in {timeout} s")


def server(hub, user):
    return hub_api(hub, "GET", f"users/{user}", user)[1]["servers"].get("")


def progress_messages(hub, user, until: str, timeout=45) -> list[str]:
    """The spawn page's progress messages, read until one contains ``until``."""
    from urllib.request import Request, urlopen
    req = Request(f"{hub.url}/hub/api/users/{user}/server/progress",
                  headers={"Authorization": f"token {hub.token(user)}"})
    messages = []
    with urlopen(req, timeout=timeout) as stream:
        for line in stream:
            if line.startswith(b"data:"):
                messages.append(json.loads(line[5:]).get("message", ""))
                if until in messages[-1]:
                    break
    return messages


def test_notebook_pods_get_their_slice_on_the_build_pool(hub, kube):
    status, body = hub_api(hub, "POST", "users/alice/server", "alice", {"profile": "quarter-gpu"})
    assert status in (201, 202), body
    wait_for(lambda: (server(hub, "alice") or {}).get("ready"), what="alice's server")
    assert slices(hub) == [("alice", 0.25, BUILD_NODE)]

    pod = kube.api.get(f"/api/v1/namespaces/{kube.namespace}/pods/jupyter-alice")
    assert pod["spec"]["nodeName"] == BUILD_NODE  # placed by the real scheduler
    assert pod["spec"]["nodeSelector"] == {**kube.node_selector,
                                           "kubernetes.io/hostname": BUILD_NODE}
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu.shared"] == "1"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert {k: env[k] for k in ("GPUSHARE_SLICE_MODE", "GPUSHARE_SLICE_GPUS",
                                "GPUSHARE_TORCH_MEMORY_FRACTION", "CUPY_GPU_MEMORY_LIMIT",
                                "GPUSHARE_URL", "PYTHONSTARTUP")} == {
        "GPUSHARE_SLICE_MODE": "timeslice", "GPUSHARE_SLICE_GPUS": "0.25",
        "GPUSHARE_TORCH_MEMORY_FRACTION": "0.25", "CUPY_GPU_MEMORY_LIMIT": "25%",
        "GPUSHARE_URL": "http://proxy.example/services/gpushare/",
        "PYTHONSTARTUP": "/etc/gpushare/pythonstartup.py"}
    assert "jupyter_gpushare.spawner.kernel" in \
        pod["metadata"]["annotations"]["gpushare.io/pythonstartup"]

    # Bob's quarter fits the pool's count but not the node's one replica: the scheduler says
    # so, and KubeSpawner's events bring it to bob's spawn page.
    status, body = hub_api(hub, "POST", "users/bob/server", "bob")
    assert status in (201, 202), body
    messages = progress_messages(hub, "bob", until="Insufficient nvidia.com/gpu.shared")
    assert messages[1:3] == ["Reserving ¼ GPU on the build pool.",
                             f"Reserved ¼ GPU: GPU 0 of {BUILD_NODE}."]
    assert "Insufficient nvidia.com/gpu.shared" in messages[-1]
    assert sorted(slices(hub)) == [("alice", 0.25, BUILD_NODE), ("bob", 0.25, BUILD_NODE)]
    status, body = hub_api(hub, "DELETE", "users/bob/server", "bob")
    assert status in (202, 204), body
    wait_for(lambda: slices(hub) == [("alice", 0.25, BUILD_NODE)], what="release of bob's slice")

    # Stopping alice's server deletes her pod and releases her slice.
    status, body = hub_api(hub, "DELETE", "users/alice/server", "alice")
    assert status in (202, 204), body
    wait_for(lambda: slices(hub) == [], what="release of alice's slice")
    kube.wait_pod("jupyter-alice", None, timeout=30)
