"""Lent build GPUs on Kubernetes, end to end: a real JupyterHub and proxy, the pool service
with the Kubernetes backend and the hub's service account (hub_config/kubernetes-rbac.yaml),
GPUShareKubeSpawner, and the real control plane whose real scheduler binds the pods to
simulated nodes: a train node of one whole GPU and a build node of one GPU that the device
plugin time-slices into 4 replicas (``nvidia.com/gpu.shared``), tainted like a build node.

With the train pool full of a borrower, bob's next job runs on the build GPU as a pod on the
build node that requests the GPU's 4 replicas and tolerates the build pool's taint. alice
then starts her server: the spawn page says the GPU is being taken back, bob's pod is
stopped and his job requeued, the scheduler binds her notebook pod once his pod is gone,
and her server is up within the grace period + a cycle + the spawner's 2 s between asks +
her spawn time without lending (measured first). The spawner's slice_wait_timeout is 0: it
waits only because the pool says when the GPU is back (Retry-After)."""

import json
import sys
import time
from urllib.request import Request, urlopen

import pytest

from hubtest import Hub, need_proxy, system_users
from kube_account import Account
from test_spawner_kube import SPAWNER_TOKEN
from test_spawner_kube import hub_extra as spawner_hub

pytestmark = pytest.mark.kube

PY = sys.executable
TRAIN_NODE, BUILD_NODE = "lk-train-0", "lk-build-0"
GRACE = 3
BUILD_TAINT = {"key": "gpushare.jupyter.org/pool", "value": "build", "effect": "NoSchedule"}
TOLERATE_BUILD = {"key": "gpushare.jupyter.org/pool", "operator": "Equal", "value": "build",
                  "effect": "NoSchedule"}

POOL_CONFIG = """
c = get_config()
c.PoolService.backend_class = "kubernetes"
c.PoolService.projects = {{"vision": {{"quota": 1, "groups": ["vision"]}},
                          "nlp": {{"quota": 0, "groups": ["nlp"]}}}}
c.PoolService.cycle_interval = 0.5
c.PoolService.grace_period = {grace}
c.PoolService.min_runtime = 0
c.PoolService.build_nodes = {{{build!r}: 1}}
c.PoolService.build_allowance = 0.5
c.PoolService.lend_build_gpus = True
c.PoolService.build_reserve = 0
c.KubernetesBackend.kubeconfig = {kubeconfig!r}
c.KubernetesBackend.namespace = {namespace!r}
c.KubernetesBackend.train_node_selector = {{"lend-kube-test": {namespace!r}}}
c.KubernetesBackend.home_dir = {home!r}
c.KubernetesBackend.rendezvous = "pod-ip"
c.KubernetesBackend.lent_gpu_resources = {{"nvidia.com/gpu.shared": 4}}  # one GPU per build node
c.KubernetesBackend.lent_tolerations = [{toleration!r}]
c.KubernetesBackend.build_node_selector = {{"lend-kube-build": {namespace!r}}}
"""


def hub_extra(namespace: str, node_selector: dict) -> str:
    """test_spawner_kube's hub (GPUShareKubeSpawner on the real control plane), with the
    build taint tolerated and the take-back awaited."""
    return spawner_hub(namespace, node_selector) + f"""
c.GPUShareKubeSpawner.build_tolerations = [{TOLERATE_BUILD!r}]
c.KubeSpawner.start_timeout = 90
"""


@pytest.fixture
def hub(kube_cluster, tmp_path, monkeypatch):
    need_proxy()
    system_users(["alice", "bob", "admin"])
    account = Account(kube_cluster)
    ns = account.namespace
    kubelet = kube_cluster.kubelet
    kubelet.add_node(TRAIN_NODE, gpus=1, labels={"lend-kube-test": ns})
    build_labels = {"lend-kube-build": ns}
    kubelet.add_node(BUILD_NODE, shared_gpus=4, labels=build_labels, taints=[BUILD_TAINT])
    home = tmp_path / "home"
    home.mkdir()
    tmp_path.chmod(0o755)
    monkeypatch.setenv("KUBECONFIG", str(kube_cluster.kubeconfig))  # the spawner's
    hub = Hub(tmp_path, {"vision": ["alice"], "nlp": ["bob"]},
              POOL_CONFIG.format(grace=GRACE, build=BUILD_NODE,
                                 kubeconfig=str(account.kubeconfig), namespace=ns,
                                 home=str(home), toleration=TOLERATE_BUILD),
              hub_extra(ns, build_labels))
    hub.account = account
    try:
        yield hub.start()
    finally:
        hub.request("DELETE", f"{hub.url}/hub/api/users/alice/server", hub.token("alice"))
        hub.stop()
        account.clear_pods()
        for name in (TRAIN_NODE, BUILD_NODE):
            if name in kubelet.nodes:
                kubelet.remove_node(name)
        account.close()


def until(check, timeout=60, what="the condition"):
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout} s"
        time.sleep(0.3)
    return found


def start_server(hub) -> tuple[float, list[str]]:
    """Start alice's server and read the spawn page's messages until it is up: (seconds
    taken, messages)."""
    token = hub.token("alice")
    began = time.monotonic()
    status, body = hub.request("POST", f"{hub.url}/hub/api/users/alice/server", token)
    assert status in (201, 202), body
    messages = []
    req = Request(f"{hub.url}/hub/api/users/alice/server/progress",
                  headers={"Authorization": f"token {token}"})
    with urlopen(req, timeout=120) as stream:
        for line in stream:
            if line.startswith(b"data:"):
                event = json.loads(line[5:])
                messages.append(event.get("message", ""))
                if event.get("ready") or event.get("failed"):
                    break
    assert "ready" in str(messages[-1]).lower() or hub_ready(hub), messages
    return time.monotonic() - began, messages


def hub_ready(hub) -> bool:
    status, body = hub.request("GET", f"{hub.url}/hub/api/users/alice", hub.token("alice"))
    return status == 200 and bool((body["servers"].get("") or {}).get("ready"))


def stop_server(hub):
    status, body = hub.request("DELETE", f"{hub.url}/hub/api/users/alice/server",
                               hub.token("alice"))
    assert status in (202, 204), body
    until(lambda: not hub.request("GET", f"{hub.url}/hub/api/users/alice",
                                  hub.token("alice"))[1]["servers"], what="alice's server to stop")
    until(lambda: not pods(hub, "component=singleuser-server"), what="her pod to go")


def pods(hub, selector):
    ns = hub.account.namespace
    return hub.account.cluster.api.get(f"/api/v1/namespaces/{ns}/pods",
                                       labelSelector=selector)["items"]


def test_a_notebook_takes_back_a_build_gpu_lent_to_a_train_job_on_kubernetes(hub):
    alone, _ = start_server(hub)  # the build GPU is lent, but no job holds it
    assert hub_ready(hub)
    stop_server(hub)
    sleep = [PY, "-c", "import time; time.sleep(300)"]
    jobs = []

    def submit():
        status, job = hub.api("POST", "api/jobs", "bob", {"gpus": 1, "command": sleep})
        assert status == 201, job
        jobs.append(job["id"])
        return job["id"]

    def job(job_id):
        return hub.api("GET", f"api/jobs/{job_id}", "bob")[1]

    try:
        borrower = submit()
        until(lambda: job(borrower)["state"] == "running", what="bob's first job to run")
        assert job(borrower)["placement"] == {TRAIN_NODE: 1}
        lent = submit()
        until(lambda: job(lent)["state"] == "running", what="bob's job on the build GPU")
        assert job(lent)["placement"] == {f"{BUILD_NODE}/lent": 1}
        [pod] = until(lambda: [p for p in pods(hub, f"gpushare.jupyter.org/job={lent}")
                               if p["spec"].get("nodeName")], what="its pod to be bound")
        assert pod["spec"]["nodeName"] == BUILD_NODE
        assert pod["spec"]["containers"][0]["resources"]["limits"] == \
            {"nvidia.com/gpu.shared": "4"}
        assert TOLERATE_BUILD in pod["spec"]["tolerations"]
        assert pod["metadata"]["annotations"]["gpushare.jupyter.org/lent-gpus"] == "0"
        status, pool = hub.api("GET", "api/pool", "bob")
        assert status == 200
        assert pool["build"]["lent"] == [{"node": BUILD_NODE, "gpu": 0, "job": lent,
                                          "held": True, "taking_back": False}]
        assert pool["capacity"] == 1  # lent GPUs are in no quota's capacity
        # alice sees that the GPU holds a job, not whose
        status, seen = hub.api("GET", "api/pool", "alice")
        assert status == 200 and seen["build"]["lent"][0]["job"] is None

        took, messages = start_server(hub)
        said = [m for m in messages if f"taking back gpu 0 of {BUILD_NODE}" in m.lower()]
        assert said and "lent to train jobs" in said[0], messages
        until(lambda: job(lent)["attempt"] == 2 and job(lent)["state"] == "pending",
              what="bob's job to be requeued")
        assert job(borrower)["state"] == "running"  # alice's project took nothing from it
        bound = GRACE + 0.5 + 2 + alone
        print(f"alice's server: {alone:.1f} s alone, {took:.1f} s taking the GPU back "
              f"(bound {bound:.1f} s)")
        assert took <= bound + 3, (took, alone, messages)  # 3 s: a loaded machine
        [notebook] = pods(hub, "component=singleuser-server")
        assert notebook["spec"]["nodeName"] == BUILD_NODE
        until(lambda: not pods(hub, f"gpushare.jupyter.org/job={lent}"),
              what="bob's ended pod to be deleted once its log is kept")
        [mine] = hub.request("GET", hub.pool_url + "api/slices", SPAWNER_TOKEN)[1]["slices"]
        assert (mine["user"], mine["node"], mine["gpu"]) == ("alice", BUILD_NODE, 0)
        # The requeued job waits: the build GPU holds a slice, the train GPU a borrower.
        time.sleep(1.5)
        assert job(lent)["state"] == "pending"
    finally:
        for job_id in jobs:
            hub.api("DELETE", f"api/jobs/{job_id}", "bob")
