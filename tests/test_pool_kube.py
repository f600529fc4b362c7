"""The pool service on the Kubernetes backend, end to end: a real JupyterHub and proxy, the
pool service as the hub's managed service with c.PoolService.backend_class = "kubernetes" and
the hub service account's kubeconfig (hub_config/kubernetes-rbac.yaml), the real control plane
and its simulated GPU nodes. A job submitted through the REST API runs as a gang of pods, says
why Kubernetes keeps it waiting, writes its output to api/jobs/{id}/logs, is preempted for a
project within its quota, and is requeued and resumed."""

import sys
import time
from pathlib import Path

import pytest

from hubtest import Hub, need_proxy
from kube_account import Account

pytestmark = pytest.mark.kube

PY = sys.executable
NODES = ("pk-a", "pk-b")
GROUPS = {"vision": ["alice"], "nlp": ["bob"]}
POOL_CONFIG = """
c = get_config()
c.PoolService.backend_class = "kubernetes"
c.PoolService.projects = {{"vision": {{"quota": 2, "groups": ["vision"]}},
                          "nlp": {{"quota": 2, "groups": ["nlp"]}}}}
c.PoolService.cycle_interval = 0.2
c.PoolService.grace_period = 3
c.PoolService.min_runtime = 0  # preempt at once: these tests watch preemption
c.KubernetesBackend.kubeconfig = {kubeconfig!r}
c.KubernetesBackend.namespace = {namespace!r}
c.KubernetesBackend.train_node_selector = {{"pool-kube-test": {namespace!r}}}
c.KubernetesBackend.home_dir = {home!r}
c.KubernetesBackend.rendezvous = "pod-ip"  # the test control plane has no DNS
"""

# Checkpoints its attempt (rank 0; the ranks share the home volume), says when it is told to stop, runs until then.
TRAIN = ("import os, signal, sys, time\n"
         "d = os.environ['GPUSHARE_CHECKPOINT_DIR']\n"
         "print('attempt', os.environ['GPUSHARE_ATTEMPT'], 'rank', os.environ['GPUSHARE_RANK'],"
         " 'resumes', sorted(os.listdir(d)), flush=True)\n"
         "if os.environ['GPUSHARE_RANK'] == '0':\n"
         "    open(os.path.join(d, 'attempt-' + os.environ['GPUSHARE_ATTEMPT']), 'w').close()\n"
         "signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM', flush=True),"
         " sys.exit(143)))\n"
         "time.sleep(120)\n")


@pytest.fixture(scope="module")
def hub(kube_cluster, tmp_path_factory):
    need_proxy()
    account = Account(kube_cluster)
    directory = tmp_path_factory.mktemp("kubehub")
    home = directory / "home"
    home.mkdir()
    for name in NODES:
        kube_cluster.kubelet.add_node(name, gpus=2, labels={"pool-kube-test": account.namespace})
    hub = Hub(directory, GROUPS, POOL_CONFIG.format(
        kubeconfig=str(account.kubeconfig), namespace=account.namespace, home=str(home)))
    hub.account = account
    try:
        yield hub.start()
    finally:
        hub.stop()
        account.clear_pods()
        for name in NODES:
            if name in kube_cluster.kubelet.nodes:
                kube_cluster.kubelet.remove_node(name)
        account.close()


def wait(check, timeout=30, what="the condition"):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"{what} did not come true in {timeout} s"
        time.sleep(0.2)
    return result


def job(hub, user, job_id):
    status, body = hub.api("GET", f"api/jobs/{job_id}", user)
    assert status == 200, body
    return body


def log(hub, user, job_id, attempt=None):
    query = f"?attempt={attempt}" if attempt else ""
    status, body = hub.api("GET", f"api/jobs/{job_id}/logs{query}", user)
    assert status == 200, body
    return body


def test_jobs_run_as_pods_wait_for_kubernetes_and_are_preempted_and_resumed(hub):
    api = hub.account.cluster.api
    ns = hub.account.namespace
    status, pool = hub.api("GET", "api/pool", "alice")
    assert status == 200 and pool["capacity"] == 4
    assert sorted(n["name"] for n in pool["nodes"]) == list(NODES)

    # Something outside the pool service holds both GPUs of pk-a: the policy does not know,
    # Kubernetes does, and the job's reason says what Kubernetes says.
    api.post(f"/api/v1/namespaces/{ns}/pods", {
        "metadata": {"name": "squatter",
                     "annotations": {"sim.gpushare.jupyter.org/run-locally": "false"}},
        "spec": {"nodeName": "pk-a", "containers": [{
            "name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}})
    status, alice = hub.api("POST", "api/jobs", "alice",
                            {"project": "vision", "gpus": 4, "command": [PY, "-c", TRAIN]})
    assert status == 201, alice
    waiting = wait(lambda: "Insufficient nvidia.com/gpu" in job(hub, "alice", alice["id"])[
        "reason"] and job(hub, "alice", alice["id"]), what="the scheduler's reason")
    assert waiting["state"] == "running"
    assert waiting["reason"].startswith("starting on Kubernetes: 0/")
    assert waiting["placement"] == {"pk-a": 2, "pk-b": 2}
    api.delete(f"/api/v1/namespaces/{ns}/pods/squatter", {"gracePeriodSeconds": 0})
    wait(lambda: "attempt 1 rank 0 resumes []" in log(hub, "alice", alice["id"]),
         what="alice's job to run")
    wait(lambda: job(hub, "alice", alice["id"])["reason"] == "", what="the reason to go")
    pods = api.get(f"/api/v1/namespaces/{ns}/pods",
                   labelSelector=f"gpushare.jupyter.org/job={alice['id']}")["items"]
    assert sorted(p["spec"]["nodeName"] for p in pods) == list(NODES)

    # bob's project is within its quota: alice's (borrowing) gang is preempted for it.
    status, bob = hub.api("POST", "api/jobs", "bob", {
        "project": "nlp", "gpus": 2, "command": [PY, "-c", "print('bob was here')"]})
    assert status == 201, bob
    done = hub.wait_job("bob", bob["id"], ("succeeded", "failed"), timeout=40)
    assert done["state"] == "succeeded", done
    assert log(hub, "bob", bob["id"]) == "bob was here\n"
    first = log(hub, "alice", alice["id"], attempt=1)
    assert first.endswith("got SIGTERM\n"), first
    status, other = hub.api("GET", f"api/jobs/{alice['id']}/logs?attempt=1&rank=1", "alice")
    assert status == 200 and "rank 1" in other and other.endswith("got SIGTERM\n"), other

    # Requeued with the same id and checkpoint directory: attempt 2 resumes from attempt 1.
    wait(lambda: "attempt 2 rank 0 resumes ['attempt-1']" in log(hub, "alice", alice["id"]),
         timeout=40, what="alice's second attempt")
    assert job(hub, "alice", alice["id"])["attempt"] == 2
    status, _ = hub.api("DELETE", f"api/jobs/{alice['id']}", "alice")
    assert status in (200, 202)
    assert hub.wait_job("alice", alice["id"], ("cancelled",))["state"] == "cancelled"
    wait(lambda: not api.get(f"/api/v1/namespaces/{ns}/pods")["items"],
         what="every job pod deleted")


ALLREDUCE = str(Path(__file__).with_name("allreduce.py"))


def test_a_two_node_job_all_reduces_through_the_api(hub):
    for user, per_gpu, world in (("alice", False, 2), ("bob", True, 4)):
        status, job_ = hub.api("POST", "api/jobs", user,
                               {"gpus": 4, "command": [PY, ALLREDUCE], "per_gpu": per_gpu})
        assert status == 201, job_
        done = hub.wait_job(user, job_["id"], ("succeeded", "failed"), timeout=60)
        assert (done["state"], done["ranks"]) == ("succeeded", world), done
        total = sum(range(1, world + 1))
        for rank in range(world):
            status, text = hub.api("GET", f"api/jobs/{job_['id']}/logs?rank={rank}", user)
            assert status == 200 and f"rank {rank} done" in text, text
            assert f'"sum": [{total}, {total}, {total}, {total}]' in text
        other = "bob" if user == "alice" else "alice"
        assert hub.api("GET", f"api/jobs/{job_['id']}/logs?rank=1", other)[0] == 403
