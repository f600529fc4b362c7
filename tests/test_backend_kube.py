"""The Kubernetes backend: manifests compared whole and validated against Kubernetes' schemas
without a cluster, then the Backend contract against the real control plane (tests/kube),
under exactly the RBAC that hub_config/kubernetes-rbac.yaml grants the hub's service account:
gangs of pods, logs, exits, stops with grace, Events as reasons, adoption after a restart, and
faults (the API server restarting, dropped and expired watches, pods and nodes vanishing,
transient and permanent API errors)."""

import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import kubernetes_validate
import pytest
from kubernetes_asyncio.client import ApiClient
from kubespawner.objects import make_pod

from jupyter_gpushare.backends import BackendError, Exit, Handle, Launch
from jupyter_gpushare.backends.kube import KubernetesBackend, adoption
from jupyter_gpushare.backends.kube import objects as k8s
from jupyter_gpushare.backends.kube.gang import Gang, PodRanks, judge
from jupyter_gpushare.policy.model import GPU, Node
from kube_account import Account
from kube_faults import FaultProxy

PY = sys.executable
# The jobs' checkpoint folders: in a folder of this module's own, not at names in /tmp that
# another run (or another account) could hold; removed when the module is done.
CHECKPOINTS = Path(tempfile.mkdtemp(prefix="gpushare-kube-ckpt-"))


@pytest.fixture(scope="module", autouse=True)
def _checkpoints():
    yield
    shutil.rmtree(CHECKPOINTS, ignore_errors=True)
TRAIN = {"gpushare.jupyter.org/pool": "train"}
SCHEMA_VERSION = "1.25.0"  # the oldest kubernetes-validate knows; the cluster itself is 1.20
kube = pytest.mark.kube


def validate(obj):
    kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)


def notebook_pod(user="alice", server=""):
    """A notebook pod as KubeSpawner makes it (its own make_pod), as the API's JSON: home
    volume, hub token and slice settings in the environment, the kernel start-up volume."""
    pod = make_pod(
        name=f"jupyter-{user}", cmd=["jupyterhub-singleuser"], port=8888,
        image="quay.io/jupyter/pytorch-notebook:2025-01-01", image_pull_policy="IfNotPresent",
        image_pull_secrets=["registry"], uid=1000, gid=100, fs_gid=100,
        env={"JUPYTERHUB_API_TOKEN": "secret-token", "JPY_API_TOKEN": "secret-token",
             "JUPYTERHUB_USER": user, "GPUSHARE_URL": "http://proxy-public/services/gpushare/",
             "DATA_DIR": "/home/jovyan/data", "GPUSHARE_SLICE_GPUS": "0.25",
             "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.25", "PYTHONSTARTUP": "/etc/gpushare/s.py",
             "DB_PASSWORD": {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {
                 "name": "db", "key": "password"}}}},
        working_dir="/home/jovyan",
        volumes=[{"name": "home", "persistentVolumeClaim": {"claimName": f"claim-{user}"}},
                 {"name": "gpushare-startup", "downwardAPI": {"items": []}},
                 {"name": "creds", "secret": {"secretName": "user-creds"}}],
        volume_mounts=[{"name": "home", "mountPath": "/home/jovyan"},
                       {"name": "gpushare-startup", "mountPath": "/etc/gpushare"},
                       {"name": "creds", "mountPath": "/etc/creds"}],
        labels={"component": "singleuser-server", "hub.jupyter.org/username": user},
        annotations={"hub.jupyter.org/username": user,
                     **({"hub.jupyter.org/servername": server} if server else {})},
        extra_resource_limits={"nvidia.com/gpu.shared": "1"})
    # The client's serializer, without a client (which would open a connection pool).
    return ApiClient.__new__(ApiClient).sanitize_for_serialization(pod)


def gang_launch(**kw):
    fields = dict(job_id="j-0a1b2c3d", attempt=2, user="alice", project="vision",
                  command=("python3", "train.py"), env={"EPOCHS": "3", "HF_TOKEN": "x"},
                  placement={"gpu-b": 4 * GPU, "gpu-a": 2 * GPU},
                  checkpoint_dir="/home/jovyan/.gpushare/checkpoints/j-0a1b2c3d")
    fields.update(kw)
    return Launch(**fields)


# -- without a cluster --------------------------------------------------------------------

def test_a_gang_is_one_pod_per_node_in_the_notebooks_image_home_and_environment():
    template = k8s.notebook_template(notebook_pod())
    settings = k8s.PodSettings(namespace="jhub", grace_s=30, cpu_per_gpu=4,
                               memory_per_gpu_gib=60, tolerations=({"key": "nvidia.com/gpu",
                                                                    "operator": "Exists",
                                                                    "effect": "NoSchedule"},),
                               annotations={"team": "ml"})
    address = k8s.service_address("j-0a1b2c3d", 2, "jhub")
    pods = k8s.job_pods(gang_launch(), template, settings, k8s.Rendezvous(address))
    assert [p["metadata"]["name"] for p in pods] == ["gpushare-j-0a1b2c3d-2-0",
                                                     "gpushare-j-0a1b2c3d-2-1"]
    assert pods[0] == {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "gpushare-j-0a1b2c3d-2-0", "namespace": "jhub",
            "labels": {"app.kubernetes.io/managed-by": "jupyter-gpushare",
                       "app.kubernetes.io/component": "train-job",
                       "gpushare.jupyter.org/job": "j-0a1b2c3d",
                       "gpushare.jupyter.org/attempt": "2", "gpushare.jupyter.org/rank": "0",
                       "gpushare.jupyter.org/user": "alice",
                       "gpushare.jupyter.org/project": "vision"},
            "annotations": {"team": "ml", "gpushare.jupyter.org/user": "alice",
                            "gpushare.jupyter.org/project": "vision"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["gpu-a"]}]}]}}},
            "containers": [{
                "name": "job",
                "image": "quay.io/jupyter/pytorch-notebook:2025-01-01",
                "command": ["/bin/sh", "-c", 'mkdir -p "$GPUSHARE_CHECKPOINT_DIR" && exec "$@"',
                            "gpushare-job", "python3", "train.py"],
                "workingDir": "/home/jovyan",
                "env": [
                    {"name": "DATA_DIR", "value": "/home/jovyan/data"},
                    {"name": "GPUSHARE_URL", "value": "http://proxy-public/services/gpushare/"},
                    {"name": "EPOCHS", "value": "3"},
                    {"name": "PYTHONUNBUFFERED", "value": "1"},
                    {"name": "GPUSHARE_JOB_ID", "value": "j-0a1b2c3d"},
                    {"name": "GPUSHARE_ATTEMPT", "value": "2"},
                    {"name": "GPUSHARE_CHECKPOINT_DIR",
                     "value": "/home/jovyan/.gpushare/checkpoints/j-0a1b2c3d"},
                    {"name": "MASTER_ADDR", "value": "gpushare-j-0a1b2c3d-2.jhub.svc.cluster.local"},
                    {"name": "MASTER_PORT", "value": "29500"},
                    {"name": "WORLD_SIZE", "value": "2"},
                    {"name": "RANK", "value": "0"},
                    {"name": "LOCAL_RANK", "value": "0"},
                    {"name": "LOCAL_WORLD_SIZE", "value": "1"},
                    {"name": "NODE_RANK", "value": "0"},
                    {"name": "GROUP_RANK", "value": "0"},
                    {"name": "GROUP_WORLD_SIZE", "value": "2"},
                    {"name": "JAX_COORDINATOR_ADDRESS", "value": "$(MASTER_ADDR):29500"},
                    {"name": "JAX_NUM_PROCESSES", "value": "2"},
                    {"name": "JAX_PROCESS_ID", "value": "0"},
                    {"name": "GPUSHARE_RANK", "value": "0"},
                    {"name": "GPUSHARE_NUM_NODES", "value": "2"},
                    {"name": "GPUSHARE_NODE_GPUS", "value": "2"},
                    {"name": "PET_NNODES", "value": "2"},
                    {"name": "PET_NODE_RANK", "value": "0"},
                    {"name": "PET_NPROC_PER_NODE", "value": "2"},
                    {"name": "PET_MASTER_ADDR", "value": "$(MASTER_ADDR)"},
                    {"name": "PET_MASTER_PORT", "value": "29500"}],
                "resources": {"limits": {"nvidia.com/gpu": "2", "memory": "122880Mi"},
                              "requests": {"cpu": "8000m", "memory": "122880Mi"}},
                "imagePullPolicy": "IfNotPresent",
                "volumeMounts": [{"name": "home", "mountPath": "/home/jovyan"}],
                "securityContext": {"runAsUser": 1000, "runAsGroup": 100,
                                    "allowPrivilegeEscalation": False},
            }],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                             "effect": "NoSchedule"}],
            "volumes": [{"name": "home", "persistentVolumeClaim": {"claimName": "claim-alice"}}],
            "securityContext": {"fsGroup": 100},
            "imagePullSecrets": [{"name": "registry"}],
        }}
    second = pods[1]["spec"]
    assert second["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["gpu-b"]
    assert second["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    env = {e["name"]: e["value"] for e in second["containers"][0]["env"]}
    assert (env["RANK"], env["NODE_RANK"], env["PET_NPROC_PER_NODE"], env["MASTER_ADDR"]) == \
        ("1", "1", "4", address)
    for pod in pods:
        validate(pod)
        text = json.dumps(pod)
        # Nothing secret, nothing of the build slice, no CUDA_VISIBLE_DEVICES of ours.
        for leaked in ("secret-token", "HF_TOKEN", "DB_PASSWORD", "user-creds", "SLICE",
                       "XLA_", "PYTHONSTARTUP", "gpu.shared", "CUDA_VISIBLE_DEVICES"):
            assert leaked not in text


def test_without_a_notebook_pod_the_configured_template_is_used():
    backend = KubernetesBackend(
        image="registry.example/train:1", home_dir="/home/jovyan",
        volumes=[{"name": "home", "persistentVolumeClaim": {"claimName": "claim-{username}"}}],
        volume_mounts=[{"name": "home", "mountPath": "/home/jovyan", "subPath": "{username}"}])
    template = backend._template("Ann.Lee@example.org")
    assert template.source == "configuration" and template.image == "registry.example/train:1"
    claim = template.volumes[0]["persistentVolumeClaim"]["claimName"]
    assert claim.startswith("claim-ann-lee-example-org") and claim == claim.lower()
    assert template.volume_mounts[0]["subPath"] == claim[len("claim-"):]
    assert template.security_context["runAsNonRoot"] is True
    assert backend.user_home("Ann.Lee@example.org") == "/home/jovyan"
    pod = k8s.job_pods(gang_launch(user="Ann.Lee@example.org", placement={"n": GPU}),
                       template, k8s.PodSettings(namespace="ns", grace_s=5))[0]
    validate(pod)
    assert pod["metadata"]["annotations"]["gpushare.jupyter.org/user"] == "Ann.Lee@example.org"
    assert k8s.label_value("Ann.Lee@example.org") == pod["metadata"]["labels"][
        "gpushare.jupyter.org/user"]


def test_per_gpu_pods_run_their_nodes_ranks_under_the_launcher():
    template = k8s.notebook_template(notebook_pod())
    settings = k8s.PodSettings(namespace="jhub", grace_s=30, launcher_python="/opt/py/bin/python")
    launch = gang_launch(per_gpu=True)
    first, second = k8s.job_pods(launch, template, settings, k8s.Rendezvous(""))
    for pod in (first, second):
        validate(pod)
    command = second["spec"]["containers"][0]["command"]
    assert command[:4] == ["/bin/sh", "-c", 'mkdir -p "$GPUSHARE_CHECKPOINT_DIR" && exec "$@"',
                           "gpushare-job"]
    assert command[4:6] == ["/opt/py/bin/python", "-c"]
    assert command[6] == k8s.launcher_source() and "def supervise(" in command[6]
    assert command[7:] == ["--grace", "30", "--", "python3", "train.py"]
    assert first["metadata"]["annotations"]["gpushare.jupyter.org/ranks"] == "0-1"
    assert second["metadata"]["annotations"]["gpushare.jupyter.org/ranks"] == "2-5"
    env = second["spec"]["containers"][0]["env"]
    named = {e["name"]: e for e in env}
    # rank 0's own pod IP from the downward API ("pod-ip" before the IP is known)
    assert named["MASTER_ADDR"] == {"name": "MASTER_ADDR", "valueFrom": {
        "fieldRef": {"fieldPath": "status.podIP"}}}
    assert [e["name"] for e in env].index("MASTER_ADDR") < \
        [e["name"] for e in env].index("JAX_COORDINATOR_ADDRESS")  # $(MASTER_ADDR) expands
    values = {k: v.get("value") for k, v in named.items()}
    # the node's first rank; the launcher gives the others theirs
    assert (values["RANK"], values["LOCAL_RANK"], values["LOCAL_WORLD_SIZE"],
            values["WORLD_SIZE"], values["JAX_LOCAL_DEVICE_IDS"]) == ("2", "0", "4", "6", "0")
    assert "PET_NNODES" not in values  # torchrun is not what a per-GPU job runs


def test_a_gangs_rendezvous_service_and_network_policy():
    settings = k8s.PodSettings(namespace="jhub", grace_s=30, labels={"team": "ml"})
    owner = {"metadata": {"name": "gpushare-j-0a1b2c3d-2-0", "uid": "u-1"}}
    meta = {"name": "gpushare-j-0a1b2c3d-2", "namespace": "jhub",
            "labels": {"team": "ml", "app.kubernetes.io/managed-by": "jupyter-gpushare",
                       "app.kubernetes.io/component": "train-job",
                       "gpushare.jupyter.org/job": "j-0a1b2c3d",
                       "gpushare.jupyter.org/attempt": "2", "gpushare.jupyter.org/user": "alice",
                       "gpushare.jupyter.org/project": "vision"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                 "name": "gpushare-j-0a1b2c3d-2-0", "uid": "u-1"}]}
    gang = {"app.kubernetes.io/managed-by": "jupyter-gpushare",
            "app.kubernetes.io/component": "train-job", "gpushare.jupyter.org/job": "j-0a1b2c3d",
            "gpushare.jupyter.org/attempt": "2"}
    service = k8s.rendezvous_service(gang_launch(), settings, owner, 29400)
    assert service == {
        "apiVersion": "v1", "kind": "Service", "metadata": meta,
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {**gang, "gpushare.jupyter.org/rank": "0"},
                 "ports": [{"name": "rendezvous", "port": 29400, "targetPort": 29400,
                            "protocol": "TCP"}]}}
    policy = k8s.gang_network_policy(gang_launch(), settings, owner)
    assert policy == {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": meta,
        "spec": {"podSelector": {"matchLabels": gang}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": [{"podSelector": {"matchLabels": gang}}]}]}}
    validate(service)
    validate(policy)
    assert k8s.service_address("j-0a1b2c3d", 2, "jhub", "corp.example") == \
        "gpushare-j-0a1b2c3d-2.jhub.svc.corp.example"
    # the pods of the gang carry every label the selectors ask for
    pod = k8s.job_pods(gang_launch(), k8s.PodTemplate("img", "/home/jovyan"), settings)[0]
    assert gang.items() <= pod["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()


def _gang(*counts, prefixed=False):
    pods, first = [], 0
    for i, count in enumerate(counts):
        pods.append(PodRanks(f"p{i}", first, count, prefixed))
        first += count
    return Gang("j", 1, tuple(pods), {}, 0.0)


@pytest.mark.parametrize("states, failure, end", [
    (["running", "running"], None, None),
    (["succeeded", "running"], None, None),
    (["succeeded", "succeeded"], None, ("succeeded", 0, "")),
    (["running", ("failed", 3, "exited with code 3")], ("failed", 3, "rank 1: exited with code 3"),
     None),
    ([("failed", 3, "exited with code 3"), "succeeded"], ("failed", 3, "rank 0: exited with code 3"),
     ("failed", 3, "rank 0: exited with code 3")),
    (["running", ("gone", None, "its node n left the train pool")],
     ("lost", None, "rank 1: its node n left the train pool"), None),
], ids=["running", "one-done", "all-done", "failed-others-run", "failed-others-done", "lost"])
def test_one_life_judging_a_gang(states, failure, end):
    gang = _gang(1, 1)
    read = [k8s.PodState(s) if isinstance(s, str) else k8s.PodState(*s) for s in states]
    exit = judge(gang, read)
    as_tuple = (lambda e: None if e is None else (e.state, e.exit_code, e.reason))
    assert as_tuple(gang.failure) == failure and as_tuple(exit) == end
    if failure:  # once the others are gone, the first failure is the attempt's end
        assert as_tuple(judge(gang, [k8s.PodState("gone")] * 2)) == failure


def test_judging_names_the_ranks_of_a_per_gpu_pod_and_a_stopped_gang():
    gang = _gang(2, 2, prefixed=True)
    judge(gang, [k8s.PodState("running"), k8s.PodState("failed", 1, "exited with code 1")])
    assert gang.failure.reason == "ranks 2-3: exited with code 1"
    single = _gang(1)
    assert judge(single, [k8s.PodState("failed", 2, "exited with code 2")]).reason == \
        "exited with code 2"
    stopped = _gang(1, 1)
    stopped.stopping = True
    assert judge(stopped, [k8s.PodState("failed", 143, "x"), k8s.PodState("running")]) is None
    assert judge(stopped, [k8s.PodState("failed", 143, "x"), k8s.PodState("gone")]) == \
        Exit("j", 1, "failed", 143, "stopped")


def test_adoption_takes_back_every_rank_and_cleans_up_the_rest():
    def pod(name, job, attempt, rank, phase="Running"):
        return {"metadata": {"name": name, "labels": {
            "gpushare.jupyter.org/job": job, "gpushare.jupyter.org/attempt": str(attempt),
            "gpushare.jupyter.org/rank": str(rank)}}, "status": {"phase": phase}}
    pods = {p["metadata"]["name"]: p for p in (
        pod("g-1-0", "g", 1, 0), pod("g-1-1", "g", 1, 1), pod("old-1-0", "old", 1, 0),
        pod("done-1-1", "done", 1, 1, "Succeeded"), pod("stray-1-0", "stray", 1, 0))}
    handles = [
        Handle("g", 1, {"namespace": "ns", "placement": {"a": 1000, "b": 1000},
                        "rendezvous": "gpushare-g-1",
                        "ranks": [{"name": "g-1-0", "first": 0, "count": 1},
                                  {"name": "g-1-1", "first": 1, "count": 1}]}),
        Handle("old", 1, {"namespace": "ns", "pods": ["old-1-0"], "placement": {"a": 1000}}),
        Handle("gone", 1, {"namespace": "ns", "pods": ["gone-1-0"]}),
        Handle("elsewhere", 1, {"namespace": "other", "pods": ["x"]}),
        Handle("told", 2, {"namespace": "ns", "pods": ["told-2-0"]}),
    ]
    told = Exit("told", 2, "succeeded", 0)
    plan = adoption.plan(handles, pods, lambda key: told if key == ("told", 2) else None, "ns",
                         set(), {})
    assert [(g.key, g.names, g.rendezvous) for g in plan.gangs] == [
        (("g", 1), ("g-1-0", "g-1-1"), "gpushare-g-1"), (("old", 1), ("old-1-0",), None)]
    assert [(e.job_id, e.state, e.reason) for e in plan.exits] == [
        ("gone", "lost", "its pods are gone"),
        ("elsewhere", "lost", "its record does not name its pods"),
        ("told", "succeeded", "")]
    assert plan.clean == [(("done", 1), "done-1-1", 1)] and plan.orphans == ["stray-1-0"]

def claim(name, user, server=""):
    """A home volume claim as KubeSpawner makes it (labels and annotations)."""
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "labels": {"component": "singleuser-storage"},
                         "annotations": {"hub.jupyter.org/username": user,
                                         **({"hub.jupyter.org/servername": server}
                                            if server else {})}},
            "spec": {"accessModes": ["ReadWriteMany"],
                     "resources": {"requests": {"storage": "1Gi"}}}}


def test_names_as_kubespawner_writes_them_under_each_slug_scheme():
    from jupyter_gpushare.backends.kube.backend import user_names
    # Under "escape" (KubeSpawner < 7) a.b is a-2eb; under "safe" a-2eb is itself: two users.
    assert user_names("a.b", "escape")["username"] == "a-2eb"
    assert user_names("a-2eb", "safe")["username"] == "a-2eb"
    assert user_names("a.b", "safe")["username"] == "a-b---2e7336dc"
    long = user_names("x" * 60)["username"]
    assert len(long) == 48 and long.startswith("x" * 37)  # KubeSpawner's 48, not 63


@pytest.mark.parametrize("claims, user, wanted, found", [
    ([claim("claim-a-2eb", "a.b")], "a-2eb", "claim-a-2eb", None),  # the name is not enough
    ([claim("claim-a-2eb", "a.b")], "a.b", "claim-a-b---2e7336dc", "claim-a-2eb"),  # kept name
    ([claim("claim-alice", "alice"), claim("claim-alice-gpu", "alice", "gpu")], "alice",
     "claim-alice", "claim-alice"),
    ([claim("claim-alice-gpu", "alice", "gpu")], "alice", "claim-alice", None),
    ([claim("claim-alice", "alice"), claim("home-alice", "alice")], "alice", "home-alice",
     "home-alice"),
    ([claim("claim-alice", "alice"), claim("home-alice", "alice")], "alice", "x", None),
], ids=["same-name-other-user", "kept-from-escape", "default-server", "named-server-only",
        "two-wanted", "two-neither"])
def test_a_users_claim_is_known_by_its_annotation(claims, user, wanted, found):
    assert k8s.claim_of(claims, user, wanted) == found


@pytest.mark.parametrize("status, expected", [
    ({"phase": "Pending"}, k8s.PodState("pending")),
    ({"phase": "Running"}, k8s.PodState("running")),
    ({"phase": "Succeeded"}, k8s.PodState("succeeded", 0)),
    ({"phase": "Failed", "containerStatuses": [{"state": {"terminated": {
        "exitCode": 3, "reason": "Error"}}}]}, k8s.PodState("failed", 3, "exited with code 3")),
    ({"phase": "Failed", "containerStatuses": [{"state": {"terminated": {
        "exitCode": 137, "reason": "OOMKilled"}}}]},
     k8s.PodState("failed", 137, "exited with code 137 (OOMKilled)")),
    ({"phase": "Failed", "reason": "Evicted", "message": "The node was low on memory."},
     k8s.PodState("failed", None, "failed: The node was low on memory.")),
])
def test_pod_states(status, expected):
    assert k8s.pod_state({"status": status}) == expected


@pytest.mark.parametrize("status, readable", [
    ({}, False),
    ({"phase": "Pending"}, False),
    ({"phase": "Pending", "containerStatuses": [{"state": {"waiting": {
        "reason": "ContainerCreating"}}}]}, False),
    ({"phase": "Pending", "containerStatuses": [{"state": {"running": {}}}]}, True),
    ({"phase": "Pending", "containerStatuses": [{"state": {"waiting": {
        "reason": "CrashLoopBackOff"}}, "lastState": {"terminated": {"exitCode": 1}}}]}, True),
    ({"phase": "Running"}, True),
    ({"phase": "Failed", "reason": "Evicted"}, True),
], ids=["new", "pending", "creating", "started", "restarting", "running", "evicted"])
def test_a_pods_log_is_asked_for_once_a_container_started(status, readable):
    assert k8s.has_log({"status": status}) is readable


def test_waiting_reasons_say_what_kubernetes_says():
    unscheduled = {"status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False",
         "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."}]}}
    assert k8s.waiting_reason(unscheduled, None) == \
        "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
    event = {"message": "Back-off pulling image \"x\"", "type": "Warning"}
    assert k8s.waiting_reason(unscheduled, event) == "Back-off pulling image \"x\""
    pulling = {"spec": {"nodeName": "n"}, "status": {"phase": "Pending", "containerStatuses": [
        {"state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}}}]}}
    assert k8s.waiting_reason(pulling, None) == "ErrImagePull: not found"
    assert k8s.waiting_reason({"status": {"phase": "Running"}}, event) == ""
    newest = k8s.newest_event([{"lastTimestamp": "2026-01-01T00:00:01Z", "message": "old"},
                               {"lastTimestamp": "2026-01-01T00:00:02Z", "message": "new"}])
    assert newest["message"] == "new"


class ListThenWatch:
    """A list call as the reflector makes it, answering from memory: the list, then one watch
    whose lines are ``events``, then watches that stay open with nothing to say."""

    def __init__(self, items, events):
        self.answers = [{"metadata": {"resourceVersion": "1"}, "items": items},
                        [{"type": kind, "object": obj} for kind, obj in events]]

    async def __call__(self, **query):
        if not self.answers:
            await asyncio.Event().wait()
        return _Answer(self.answers.pop(0))


class _Answer:
    status = 200

    def __init__(self, body):
        lines = body if isinstance(body, list) else [body]
        self.content = _Lines([json.dumps(line).encode() + b"\n" for line in lines])
        self.body = json.dumps(body).encode()

    async def read(self):
        return self.body

    def release(self):
        pass


class _Lines:
    def __init__(self, lines):
        self.lines = lines

    def __aiter__(self):
        return self

    async def __anext__(self):
        if not self.lines:
            raise StopAsyncIteration
        return self.lines.pop(0)


def event(name, pod, rv):
    return {"metadata": {"name": name, "resourceVersion": rv},
            "involvedObject": {"kind": "Pod", "name": pod}}


@pytest.mark.asyncio
async def test_a_reflector_finds_objects_by_their_index_as_they_come_and_go():
    from jupyter_gpushare.backends.kube.reflector import Reflector
    listed = [event("e1", "pod-a", "1"), event("e2", "pod-b", "1"), event("e3", "pod-b", "1")]
    watched = [("ADDED", event("e4", "pod-a", "2")),
               ("MODIFIED", event("e2", "pod-c", "3")),  # its key changes: it moves
               ("DELETED", event("e3", "pod-b", "4")),
               ("DELETED", event("e9", "pod-d", "5")),   # never seen: nothing to forget
               ("BOOKMARK", {"metadata": {"resourceVersion": "6"}})]
    reflector = Reflector("events", ListThenWatch(listed, watched),
                          index=lambda e: e["involvedObject"]["name"]).start()
    try:
        await until(lambda: reflector.resource_version == "6", what="the watch read")
        names = {key: sorted(e["metadata"]["name"] for e in reflector.by(key))
                 for key in ("pod-a", "pod-b", "pod-c", "pod-d")}
        assert names == {"pod-a": ["e1", "e4"], "pod-b": [], "pod-c": ["e2"], "pod-d": []}
        assert sorted(reflector.objects) == ["e1", "e2", "e4"]
        assert set(reflector._index) == {"pod-a", "pod-c"}  # no empty keys are kept
    finally:
        await reflector.stop()


def test_the_train_pool_from_node_objects():
    def node(name, gpus, ready=True, cordoned=False):
        return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "H100",
                                                      "other": "x"}},
                "spec": {"unschedulable": True} if cordoned else {},
                "status": {"allocatable": {"nvidia.com/gpu": str(gpus)},
                           "conditions": [{"type": "Ready", "status": str(ready)}]}}
    nodes = [node("b", 8), node("a", 4), node("c", 8, cordoned=True), node("d", 8, ready=False),
             {"metadata": {"name": "e"}, "status": {}}]
    assert k8s.train_nodes(nodes, "nvidia.com/gpu", {"c": 3 * GPU}) == [
        Node("a", 4, labels={"nvidia.com/gpu.product": "H100"}),
        Node("b", 8, labels={"nvidia.com/gpu.product": "H100"}),
        Node("c", 3, labels={"nvidia.com/gpu.product": "H100"}),  # keeps what its jobs hold
        Node("d", 0, labels={"nvidia.com/gpu.product": "H100"}),
        Node("e", 0)]


def test_the_service_selects_a_backend_by_name():
    from traitlets import TraitError

    from jupyter_gpushare.backends.local import LocalBackend
    from jupyter_gpushare.pool.app import PoolService
    assert PoolService(backend_class="kubernetes").backend_class is KubernetesBackend
    assert PoolService(backend_class="local").backend_class is LocalBackend
    with pytest.raises(TraitError):
        PoolService(backend_class="nomad")


# -- against the real control plane ---------------------------------------------------------

@pytest.fixture(scope="module")
def account(kube_cluster):
    acc = Account(kube_cluster)
    yield acc
    acc.close()


@pytest.fixture
def make_backend(kube, account, tmp_path):
    """Backends of this test's train pool, as the hub's service account sees it."""
    made = []
    home = tmp_path / "home"
    home.mkdir()

    def make(**kw):
        kw.setdefault("kubeconfig", str(account.kubeconfig))
        kw.setdefault("namespace", account.namespace)
        kw.setdefault("train_node_selector", {**kube.node_selector, **TRAIN})
        kw.setdefault("state_dir", str(tmp_path / "state"))
        kw.setdefault("home_dir", str(home))
        kw.setdefault("grace_period", 5)
        kw.setdefault("api_retry_timeout", 15)
        kw.setdefault("rendezvous", "pod-ip")  # the test control plane has no DNS
        made.append(KubernetesBackend(**kw))
        return made[-1]

    yield make
    account.clear_pods()


async def stop_all(*backends):
    for b in backends:
        await b.shutdown()


def launch(job_id, script, placement, *, attempt=1, **kw):
    return Launch(job_id, attempt, kw.pop("user", "alice"), "vision", (PY, "-c", script),
                  kw.pop("env", {}), placement,
                  kw.pop("checkpoint_dir", str(CHECKPOINTS / job_id)), **kw)


async def ended(backend, count=1, timeout=20.0):
    exits, deadline = [], time.monotonic() + timeout
    while len(exits) < count:
        assert time.monotonic() < deadline, f"{len(exits)} of {count} attempts ended: {exits}"
        exits += await backend.poll()
        await asyncio.sleep(0.05)
    assert await backend.poll() == []
    return sorted(exits, key=lambda e: (e.job_id, e.attempt))


async def until(check, timeout=20.0, what="the condition"):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"{what} did not come true in {timeout} s"
        await asyncio.sleep(0.05)
    return result


async def log_of(backend, job_id, text, attempt=1, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        log = (await backend.read_log(job_id, attempt)).decode()
        if text in log:
            return log
        assert time.monotonic() < deadline, f"{text!r} not in the log of {job_id}: {log!r}"
        await asyncio.sleep(0.1)


def pods_of(account, job_id):
    return account.cluster.api.get(f"/api/v1/namespaces/{account.namespace}/pods",
                                   labelSelector=f"gpushare.jupyter.org/job={job_id}")["items"]


SHOW = ("import os, sys\n"
        "print('rank', os.environ['GPUSHARE_RANK'], 'of', os.environ['GPUSHARE_NUM_NODES'],"
        " 'in', os.getcwd(), 'data', os.environ.get('DATA_DIR'), flush=True)\n"
        "print('token', any('TOKEN' in k for k in os.environ), flush=True)\n"
        "print('ckpt', os.path.isdir(os.environ['GPUSHARE_CHECKPOINT_DIR']), flush=True)\n"
        "sys.exit(int(os.environ.get('CODE', '0')))\n")


@kube
@pytest.mark.asyncio
async def test_a_gang_runs_as_pods_in_the_users_notebook_environment(kube, account,
                                                                     make_backend, tmp_path):
    kube.add_node("bk-gang-a", gpus=4, labels=TRAIN)
    kube.add_node("bk-gang-b", gpus=4, labels=TRAIN)
    kube.add_node("bk-gang-build", shared_gpus=4, labels={"pool": "build"})
    backend = make_backend(rendezvous="dns")  # every rank at once (no DNS is asked here)
    # alice's notebook, as KubeSpawner would have created it, runs on the build node
    nb = notebook_pod("alice")
    nb["metadata"]["annotations"]["sim.gpushare.jupyter.org/run-locally"] = "false"
    nb["spec"]["nodeSelector"] = {"pool": "build"}
    nb["spec"]["containers"][0]["workingDir"] = str(tmp_path / "home")
    nb["spec"]["volumes"] = [v for v in nb["spec"]["volumes"] if v["name"] == "gpushare-startup"]
    nb["spec"]["containers"][0]["volumeMounts"] = []
    nb["spec"]["imagePullSecrets"] = []
    kube.cluster.api.post(f"/api/v1/namespaces/{account.namespace}/pods", nb)
    try:
        assert await backend.adopt([]) == []
        assert [(n.name, n.gpus) for n in backend.nodes()] == [("bk-gang-a", 4),
                                                                 ("bk-gang-b", 4)]
        await until(lambda: backend._template("alice").source == "notebook pod jupyter-alice",
                    what="the notebook pod in the cache")
        assert backend.user_home("alice") == str(tmp_path / "home")
        ckpt = str(tmp_path / "home" / ".gpushare" / "j-gang")
        handle = await backend.start(launch("j-gang", SHOW, {"bk-gang-a": 3 * GPU,
                                                            "bk-gang-b": 4 * GPU},
                                            checkpoint_dir=ckpt))
        assert handle.data["pods"] == ["gpushare-j-gang-1-0", "gpushare-j-gang-1-1"]
        pods = {p["metadata"]["name"]: p for p in pods_of(account, "j-gang")}
        assert len(pods) == 2
        rank0 = pods["gpushare-j-gang-1-0"]
        assert rank0["spec"]["containers"][0]["image"] == nb["spec"]["containers"][0]["image"]
        assert rank0["spec"]["automountServiceAccountToken"] is False
        assert not any("serviceaccount" in json.dumps(v) for v in rank0["spec"].get("volumes", []))
        # the real scheduler put each rank where the policy placed it (pods stay until polled)
        bound = await until(lambda: len(nodes := [p["spec"].get("nodeName") for p in pods_of(
            account, "j-gang") if p["spec"].get("nodeName")]) == 2 and nodes,
            what="both ranks bound")
        assert sorted(bound) == ["bk-gang-a", "bk-gang-b"]
        (exit,) = await ended(backend)
        assert (exit.job_id, exit.attempt, exit.state, exit.exit_code) == ("j-gang", 1,
                                                                           "succeeded", 0)
        # rank 0's output, in the notebook's working directory, with its DATA_DIR, no token
        log = (await backend.read_log("j-gang", 1)).decode()
        assert log == (f"rank 0 of 2 in {tmp_path / 'home'} data /home/jovyan/data\n"
                       "token False\nckpt True\n")
        assert (await backend.read_log("j-gang", 1, offset=7)).decode() == log[7:]
        await until(lambda: not pods_of(account, "j-gang"), what="the ended pods deleted")
        assert (await backend.read_log("j-gang", 1)).decode() == log  # kept after the pods

        await backend.start(launch("j-fail", SHOW, {"bk-gang-a": GPU}, env={"CODE": "3"}))
        (exit,) = await ended(backend)
        assert (exit.state, exit.exit_code, exit.reason) == ("failed", 3, "exited with code 3")
    finally:
        await stop_all(backend)


@kube
@pytest.mark.asyncio
async def test_events_are_the_reason_and_a_stop_keeps_the_log(kube, make_backend):
    kube.add_node("bk-small", gpus=2, labels=TRAIN)
    backend = make_backend()
    polite = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM', flush=True),"
              " sys.exit(143)))\n"
              "print('up', flush=True); time.sleep(60)")
    try:
        await backend.adopt([])
        # The policy thinks 4 GPUs fit; Kubernetes knows better and says so.
        await backend.start(launch("j-big", "print('never')", {"bk-small": 4 * GPU}))
        reason = await until(lambda: backend.reasons().get("j-big", "").count("Insufficient"),
                             what="the scheduler's event") and backend.reasons()["j-big"]
        assert reason.startswith("starting on Kubernetes: 0/")
        assert "Insufficient nvidia.com/gpu" in reason
        await backend.stop("j-big", 1, 5)
        (exit,) = await ended(backend)
        assert (exit.state, exit.reason) == ("failed", "stopped")

        await backend.start(launch("j-polite", polite, {"bk-small": 2 * GPU}))
        await log_of(backend, "j-polite", "up")
        assert backend.reasons() == {}
        t0 = time.monotonic()
        await backend.stop("j-polite", 1, 30)
        await backend.stop("j-polite", 1, 30)  # asked twice: still one exit
        (exit,) = await ended(backend)
        assert time.monotonic() - t0 < 10      # it exited on SIGTERM, long before 30 s
        assert (exit.state, exit.exit_code, exit.reason) == ("failed", 143, "stopped")
        assert (await backend.read_log("j-polite", 1)).decode() == "up\ngot SIGTERM\n"
        await backend.stop("j-polite", 1, 30)  # stopping an ended attempt does nothing
        assert await backend.poll() == []
    finally:
        await stop_all(backend)


@kube
@pytest.mark.asyncio
async def test_a_restarted_service_adopts_its_pods_and_deletes_the_rest(kube, account,
                                                                       make_backend, tmp_path):
    kube.add_node("bk-adopt", gpus=8, labels=TRAIN)
    first = make_backend()
    go = tmp_path / "go"
    wait = f"import os, time\nprint('up', flush=True)\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nprint('done')"
    try:
        await first.adopt([])
        keep = await first.start(launch("j-keep", wait, {"bk-adopt": 2 * GPU}))
        quick = await first.start(launch("j-quick", "print('quick')", {"bk-adopt": GPU}))
        await first.start(launch("j-orphan", wait, {"bk-adopt": GPU}))
        # recorded as ended by the service, which stopped before its pod was cleaned up
        await first.start(launch("j-told", "print('told')", {"bk-adopt": GPU}))
        await log_of(first, "j-keep", "up")
        await log_of(first, "j-orphan", "up")
    finally:
        await first.shutdown()  # the service stops; its pods keep running
    for job in ("j-quick", "j-told"):
        await until(lambda: pods_of(account, job)[0]["status"]["phase"] == "Succeeded",
                    what=f"{job} to end while no service runs")
    second = make_backend()
    try:
        vanished = keep.__class__("j-vanished", 1, {"namespace": account.namespace,
                                                    "pods": ["gpushare-j-vanished-1-0"]})
        exits = await second.adopt([keep, quick, vanished])
        assert [(e.job_id, e.state) for e in exits] == [("j-vanished", "lost")]
        await until(lambda: not pods_of(account, "j-orphan"), what="the orphan pod deleted")
        await until(lambda: not pods_of(account, "j-told"), what="the ended pod cleaned up")
        assert (await second.read_log("j-told", 1)).decode() == "told\n"  # its log kept
        (exit,) = await ended(second)  # j-quick ended while the service was away
        assert (exit.job_id, exit.state) == ("j-quick", "succeeded")
        assert (await second.read_log("j-quick", 1)).decode() == "quick\n"
        assert "up" in (await second.read_log("j-keep", 1)).decode()
        go.touch()
        (exit,) = await ended(second)
        assert (exit.job_id, exit.state) == ("j-keep", "succeeded")
        assert (await second.read_log("j-keep", 1)).decode() == "up\ndone\n"
    finally:
        await second.shutdown()
    # A third start finds the exits recorded in files, not in Kubernetes any more.
    third = make_backend()
    try:
        exits = await third.adopt([keep])
        assert [(e.job_id, e.state, e.exit_code) for e in exits] == [("j-keep", "succeeded", 0)]
    finally:
        await third.shutdown()


@kube
@pytest.mark.asyncio
async def test_pods_deleted_by_someone_else_and_nodes_that_leave_lose_their_jobs(kube, account,
                                                                                make_backend):
    kube.add_node("bk-lose-a", gpus=4, labels=TRAIN)
    kube.add_node("bk-lose-b", gpus=4, labels=TRAIN)
    backend = make_backend()
    sleep = "import time; print('up', flush=True); time.sleep(60)"
    try:
        await backend.adopt([])
        await backend.start(launch("j-del", sleep, {"bk-lose-a": GPU}))
        await backend.start(launch("j-node", sleep, {"bk-lose-b": 2 * GPU}))
        await backend.start(launch("j-gone", sleep, {"bk-lose-a": GPU, "bk-lose-b": GPU}))
        for job in ("j-del", "j-node", "j-gone"):
            await log_of(backend, job, "up")
        kube.api.delete(f"/api/v1/namespaces/{account.namespace}/pods/gpushare-j-del-1-0",
                        {"gracePeriodSeconds": 0})
        (exit,) = await ended(backend)
        assert (exit.job_id, exit.state) == ("j-del", "lost")
        assert "deleted outside the pool service" in exit.reason
        # The node dies and nothing deletes its pods (no pod GC yet): the backend notices.
        kube.kubelet.remove_node("bk-lose-b", delete_pods=False)
        exits = await ended(backend, 2)
        assert [(e.job_id, e.state) for e in exits] == [("j-gone", "lost"), ("j-node", "lost")]
        assert [e.reason for e in exits] == ["rank 1: its node bk-lose-b left the train pool",
                                             "its node bk-lose-b left the train pool"]
        assert [n.name for n in backend.nodes()] == ["bk-lose-a"]
        # ... and deletes what is left of them, the rank on the live node included.
        await until(lambda: not any(pods_of(account, j) for j in
                                    ("j-node", "j-gone")), what="the lost jobs' pods deleted")
    finally:
        await stop_all(backend)



# -- gangs: rendezvous, one life, every rank's log -----------------------------------------

ALLREDUCE = str(Path(__file__).with_name("allreduce.py"))


def reports(log: str) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in log.splitlines()
            if line.startswith("RANK-REPORT ")]


async def rank_log(backend, job_id, rank, text, attempt=1, timeout=30.0, polls=None):
    """Rank ``rank``'s log once it holds ``text``; the backend is polled meanwhile (it
    creates late ranks), its exits kept in ``polls``."""
    deadline = time.monotonic() + timeout
    while True:
        if polls is not None:
            polls += await backend.poll()
        log = (await backend.read_log(job_id, attempt, rank=rank)).decode()
        if text in log:
            return log
        assert time.monotonic() < deadline, f"{text!r} not in rank {rank}'s log: {log!r}"
        await asyncio.sleep(0.1)


def rendezvous_objects(account, job_id, attempt=1):
    api, ns, name = account.cluster.api, account.namespace, f"gpushare-{job_id}-{attempt}"
    found = []
    for path in (f"/api/v1/namespaces/{ns}/services/{name}",
                 f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{name}"):
        try:
            found.append(api.get(path))
        except Exception:
            pass
    return found


def allreduce_launch(job_id, placement, *args, **kw):
    return Launch(job_id, kw.pop("attempt", 1), "alice", "vision", (PY, ALLREDUCE, *args), {},
                  placement, str(CHECKPOINTS / job_id), **kw)


@kube
@pytest.mark.asyncio
@pytest.mark.parametrize("per_gpu", [False, True], ids=["per-node", "per-gpu"])
async def test_a_two_node_gang_meets_at_rank_0s_pod_ip_and_all_reduces(kube, account,
                                                                      make_backend, per_gpu):
    kube.add_node("bk-ar-a", gpus=2, labels=TRAIN)
    kube.add_node("bk-ar-b", gpus=2, labels=TRAIN)
    backend = make_backend()
    try:
        await backend.adopt([])
        job = f"j-ar-{int(per_gpu)}"
        handle = await backend.start(allreduce_launch(job, {"bk-ar-a": GPU, "bk-ar-b": 2 * GPU},
                                                      per_gpu=per_gpu))
        world = 3 if per_gpu else 2
        assert [r["count"] for r in handle.data["ranks"]] == ([1, 2] if per_gpu else [1, 1])
        # rank 0 alone at first, with the gang's Service and NetworkPolicy that it owns
        assert [p["metadata"]["name"] for p in pods_of(account, job)] == [f"gpushare-{job}-1-0"]
        service, policy = rendezvous_objects(account, job)
        rank0 = pods_of(account, job)[0]
        assert service["spec"]["clusterIP"] == "None"
        assert policy["spec"]["podSelector"]["matchLabels"]["gpushare.jupyter.org/job"] == job
        for obj in (service, policy):
            assert obj["metadata"]["ownerReferences"][0]["uid"] == rank0["metadata"]["uid"]
        ip = (await until(lambda: (pods_of(account, job)[0].get("status") or {}).get("podIP"),
                          what="rank 0's pod IP"))
        exits = []
        logs = [await rank_log(backend, job, r, "done", polls=exits) for r in range(world)]
        found = [reports(log)[0] for log in logs]
        total = sum(range(1, world + 1))
        assert [f["sum"] for f in found] == [[total] * 4] * world
        assert {f["env"]["MASTER_ADDR"] for f in found} == {ip}  # rank 0's pod IP
        assert [f["env"]["RANK"] for f in found] == [str(r) for r in range(world)]
        assert found[-1]["env"]["JAX_COORDINATOR_ADDRESS"] == f"{ip}:29500"
        if per_gpu:
            assert [f["env"]["LOCAL_RANK"] for f in found] == ["0", "0", "1"]
            assert all(f"rank {r} done" in logs[r] and "[rank" not in logs[r]
                       for r in range(world))  # each rank's lines alone, without the prefix
        exits += await ended(backend, 1 - len(exits)) if not exits else []
        assert [(e.state, e.exit_code) for e in exits] == [("succeeded", 0)]
        await until(lambda: not pods_of(account, job), what="the pods deleted")
        await until(lambda: not rendezvous_objects(account, job),
                    what="the Service and NetworkPolicy deleted with the gang")
        kept = [(await backend.read_log(job, 1, rank=r)).decode() for r in range(world)]
        assert kept == logs  # every rank's log kept after its pod
    finally:
        await stop_all(backend)


@kube
@pytest.mark.asyncio
@pytest.mark.parametrize("per_gpu, reason", [
    (False, "rank 1: exited with code 7"), (True, "ranks 1-2: exited with code 7")],
    ids=["per-node", "per-gpu"])
async def test_a_failing_rank_ends_the_gang_on_kubernetes(kube, account, make_backend,
                                                          per_gpu, reason):
    kube.add_node("bk-fail-a", gpus=2, labels=TRAIN)
    kube.add_node("bk-fail-b", gpus=2, labels=TRAIN)
    backend = make_backend()
    try:
        await backend.adopt([])
        job = f"j-fail-{int(per_gpu)}"
        began = time.monotonic()
        await backend.start(allreduce_launch(job, {"bk-fail-a": GPU, "bk-fail-b": 2 * GPU},
                                             "--fail-rank", "1", "--code", "7",
                                             per_gpu=per_gpu))
        (exit,) = await ended(backend, timeout=40)
        assert time.monotonic() - began < 30  # rank 0 did not sleep its 120 s
        assert (exit.state, exit.exit_code, exit.reason) == ("failed", 7, reason)
        assert "rank 0 stopped" in (await backend.read_log(job, 1, rank=0)).decode()
        if per_gpu:  # the launcher stopped rank 1's neighbour on its node
            assert "rank 2 stopped" in (await backend.read_log(job, 1, rank=2)).decode()
        await until(lambda: not pods_of(account, job), what="the gang's pods deleted")
    finally:
        await stop_all(backend)


@kube
@pytest.mark.asyncio
async def test_cancel_and_adoption_cover_every_rank(kube, account, make_backend, tmp_path):
    kube.add_node("bk-gad-a", gpus=2, labels=TRAIN)
    kube.add_node("bk-gad-b", gpus=2, labels=TRAIN)
    go = tmp_path / "go"
    first = make_backend()
    try:
        await first.adopt([])
        keep = await first.start(allreduce_launch("j-keep", {"bk-gad-a": GPU, "bk-gad-b": GPU},
                                                  "--hold", str(go)))
        stop = await first.start(allreduce_launch("j-stop", {"bk-gad-a": GPU, "bk-gad-b": GPU},
                                                  "--hold", "/nonexistent", per_gpu=True))
        for job in ("j-keep", "j-stop"):
            for rank in range(2):
                await rank_log(first, job, rank, "RANK-REPORT", polls=[])
    finally:
        await first.shutdown()  # the service stops; every rank keeps running
    second = make_backend()
    try:
        assert await second.adopt([keep, stop]) == []
        assert (await second.read_log("j-keep", 1, rank=1)).decode().startswith("RANK-REPORT")
        began = time.monotonic()
        await second.stop("j-stop", 1, 5)
        (exit,) = await ended(second)
        assert (exit.job_id, exit.reason) == ("j-stop", "stopped")
        assert time.monotonic() - began < 5 + 3
        for rank in range(2):
            assert f"rank {rank} got SIGTERM" in (await second.read_log("j-stop", 1,
                                                                        rank=rank)).decode()
        go.touch()
        (exit,) = await ended(second)
        assert (exit.job_id, exit.state) == ("j-keep", "succeeded")
        for rank in range(2):
            assert f"rank {rank} done" in (await second.read_log("j-keep", 1,
                                                                 rank=rank)).decode()
        await until(lambda: not rendezvous_objects(account, "j-keep") and
                    not rendezvous_objects(account, "j-stop"), what="the rendezvous deleted")
    finally:
        await second.shutdown()


# -- faults ---------------------------------------------------------------------------------

@kube
@pytest.mark.asyncio
async def test_the_api_server_restarting_mid_run(kube, make_backend):
    kube.add_node("bk-restart", gpus=4, labels=TRAIN)
    backend = make_backend(api_retry_timeout=40)
    try:
        await backend.adopt([])
        await backend.start(launch("j-before", "import time; print('up', flush=True); "
                                   "time.sleep(2); print('done')", {"bk-restart": GPU}))
        await log_of(backend, "j-before", "up")
        errors = backend.pods.failures
        restart = asyncio.create_task(asyncio.to_thread(
            kube.cluster.control_plane.restart_apiserver, 1.0))
        await until(lambda: backend.pods.failures > errors, what="the watch to break")
        # Started while the API server is away: tried again until it is back.
        await backend.start(launch("j-during", "print('during')", {"bk-restart": GPU}))
        assert backend.api.retries > 0
        assert await restart < 30
        exits = await ended(backend, 2, timeout=40)
        assert [(e.job_id, e.state) for e in exits] == [("j-before", "succeeded"),
                                                        ("j-during", "succeeded")]
        assert (await backend.read_log("j-before", 1)).decode() == "up\ndone\n"
        winding = ("j-during", 1) in backend._winding  # said if the log comes back wrong
        assert (await backend.read_log("j-during", 1)).decode() == "during\n", \
            f"still being kept when read: {winding}; after: {('j-during', 1) in backend._winding}"
        assert backend.pods.failures == 0  # the watch is back
    finally:
        await stop_all(backend)


@pytest.fixture
def proxy(kube_cluster):
    with FaultProxy(kube_cluster.url) as p:
        yield p


@kube
@pytest.mark.asyncio
async def test_dropped_and_expired_watches(kube, account, make_backend, proxy, tmp_path):
    kube.add_node("bk-watch", gpus=4, labels=TRAIN)
    backend = make_backend(kubeconfig=str(proxy.kubeconfig(account.token, tmp_path / "kc")))
    go = tmp_path / "go"
    wait = (f"import os, time\nprint('up', flush=True)\n"
            f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\nprint('done')")
    try:
        await backend.adopt([])
        await backend.start(launch("j-watched", wait, {"bk-watch": GPU}))
        await backend.start(launch("j-unseen", wait, {"bk-watch": GPU}))
        # (40 s: once, in a full run, the first log took over 20 s through the proxy)
        await log_of(backend, "j-watched", "up", timeout=40)
        await log_of(backend, "j-unseen", "up", timeout=40)
        # A dropped connection: each reflector watches again from where it was.
        await until(lambda: proxy.open_streams("watch") == 4, what="4 watches")  # pods, nodes...
        watches = backend.pods.watches
        assert proxy.drop_streams("watch") == 4
        await until(lambda: backend.pods.watches > watches and proxy.open_streams("watch") == 4,
                    what="the watches back")
        assert backend.pods.relists == 0
        # Cut off while a pod is deleted: its DELETED event is never seen. The next watch is
        # told its version is too old (410): the reflector lists again and finds it gone.
        proxy.paused = True
        assert proxy.drop_streams("watch") == 4
        kube.api.delete(f"/api/v1/namespaces/{account.namespace}/pods/gpushare-j-unseen-1-0",
                        {"gracePeriodSeconds": 0})
        proxy.expire_watches(4)
        await asyncio.sleep(0.5)
        assert await backend.poll() == []  # while blind, nothing is judged gone
        proxy.paused = False
        (exit,) = await ended(backend)
        assert (exit.job_id, exit.state) == ("j-unseen", "lost")
        assert backend.pods.relists == 1
        go.touch()  # and events flow on the new watch
        (exit,) = await ended(backend)
        assert (exit.job_id, exit.state) == ("j-watched", "succeeded")
    finally:
        await stop_all(backend)


@kube
@pytest.mark.asyncio
async def test_a_job_asks_the_api_server_for_its_pod_its_log_once_and_the_deletion(
        kube, account, make_backend, proxy, tmp_path):
    """Every request a one-pod job costs, counted at a proxy: its pod created, its log followed
    once (also when the log's answer comes after the pod has ended, and when it is empty), the
    pod deleted. The watches show the rest."""
    kube.add_node("bk-count", gpus=4, labels=TRAIN)
    backend = make_backend(kubeconfig=str(proxy.kubeconfig(account.token, tmp_path / "kc")))
    jobs = {"j-said": "print('said')", "j-silent": "pass", "j-late": "print('late')"}
    try:
        await backend.adopt([])
        asked_before = len(proxy.asked)
        proxy.delay(3, path_contains="/gpushare-j-late-1-0/log")  # answered 3 s late
        for job, script in jobs.items():
            await backend.start(launch(job, script, {"bk-count": GPU}))
        assert [e.state for e in await ended(backend, 3)] == ["succeeded"] * 3
        for job, said in (("j-said", "said\n"), ("j-silent", ""), ("j-late", "late\n")):
            assert (await backend.read_log(job, 1)).decode() == said
        await until(lambda: not any(pods_of(account, job) for job in jobs),
                    what="the pods deleted")
        asked = sorted((method, path.split("?")[0].rsplit("/pods", 1)[-1])
                       for method, path in proxy.asked[asked_before:]
                       if "watch=true" not in path.lower())
        assert asked == sorted([("POST", "")] * 3 + [
            (method, f"/gpushare-{job}-1-0{tail}")
            for job in jobs for method, tail in (("GET", "/log"), ("DELETE", ""))])
    finally:
        await stop_all(backend)


@kube
@pytest.mark.asyncio
async def test_api_errors_are_retried_and_refusals_said_in_one_sentence(kube, account,
                                                                       make_backend, proxy,
                                                                       tmp_path):
    kube.add_node("bk-err-a", gpus=2, labels=TRAIN)
    kube.add_node("bk-err-b", gpus=2, labels=TRAIN)
    backend = make_backend(kubeconfig=str(proxy.kubeconfig(account.token, tmp_path / "kc")),
                           rendezvous="dns")  # every rank created by start
    try:
        await backend.adopt([])
        proxy.fail(500, times=2, method="POST", path_contains="/pods")
        proxy.fail(429, times=2, method="POST", path_contains="/pods")
        await backend.start(launch("j-retried", "print('ok')", {"bk-err-a": GPU}))
        assert backend.api.retries == 4
        (exit,) = await ended(backend)
        assert exit.state == "succeeded"

        # A gang is all or none: the second rank is refused for good, the first is deleted.
        proxy.fail(422, method="POST", body_contains='"gpushare-j-half-1-1"')
        with pytest.raises(BackendError) as refused:
            await backend.start(launch("j-half", "print('x')", {"bk-err-a": GPU,
                                                                "bk-err-b": GPU}))
        assert str(refused.value) == ("Kubernetes refused the job's pod: injected by the "
                                      "test's fault proxy.")
        await until(lambda: not pods_of(account, "j-half"), what="the first rank deleted")

        # A failure that does not pass: given up after api_retry_timeout.
        backend.api.retry_s = 1.0
        proxy.fail(503, times=1000, method="POST")
        with pytest.raises(BackendError, match=r"^The Kubernetes API did not accept the job's "
                                                 r"pods within 15 s \(injected"):
            await backend.start(launch("j-late", "print('x')", {"bk-err-a": GPU}))
        proxy.rules.clear()

        # Real refusals of the real API server: an invalid pod (422) ...
        bad = make_backend(extra_annotations={"not a key!": "x"})
        await bad.adopt([])
        with pytest.raises(BackendError, match=r"^Kubernetes refused the job's pod: Pod "
                                                 r"\"gpushare-j-bad-1-0\" is invalid: "
                                                 r"metadata.annotations: Invalid value"):
            await bad.start(launch("j-bad", "print('x')", {"bk-err-a": GPU}))
        # ... and a namespace where the hub's account has no rights (403).
        elsewhere = make_backend(namespace=kube.namespace)
        with pytest.raises(BackendError, match=r"^The pool service may not list the job pods "
                                                 r"in t-\d+-\d+ \(Kubernetes said: .*forbidden"
                                                 r".*\); an administrator must grant it the "
                                                 r"rules of hub_config/kubernetes-rbac.yaml.$"):
            await elsewhere.start(launch("j-nope", "print('x')", {"bk-err-a": GPU}))
        assert await bad.poll() == [] and await backend.poll() == []
    finally:
        await stop_all(*backend_list(locals()))


@kube
@pytest.mark.asyncio
async def test_a_job_mounts_only_its_users_own_home_claim(kube, account, make_backend):
    """a.b's claim was made by KubeSpawner < 7 (escape: claim-a-2eb); a-2eb, a user of the
    safe scheme, would name the same claim. a-2eb's job is refused, a.b's mounts it."""
    kube.add_node("bk-claim-a", gpus=2, labels=TRAIN)
    claims = f"/api/v1/namespaces/{account.namespace}/persistentvolumeclaims"
    account.cluster.api.post(claims, claim("claim-a-2eb", "a.b"))
    backend = make_backend(use_notebook_pod=False, volumes=[
        {"name": "home", "persistentVolumeClaim": {"claimName": "claim-{username}"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}],
        volume_mounts=[{"name": "home", "mountPath": "/home/jovyan"}])
    try:
        assert await backend.adopt([]) == []
        with pytest.raises(BackendError, match=r"^You have no home volume yet: KubeSpawner "
                                                 r"makes it when your notebook server first"):
            await backend.start(launch("j-thief", "print(1)", {"bk-claim-a": GPU},
                                       user="a-2eb"))
        assert pods_of(account, "j-thief") == []
        await backend.start(launch("j-owner", "print(1)", {"bk-claim-a": GPU}, user="a.b"))
        volumes = pods_of(account, "j-owner")[0]["spec"]["volumes"]
        assert volumes == [
            {"name": "home", "persistentVolumeClaim": {"claimName": "claim-a-2eb"}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}]
        await backend.stop("j-owner", 1, 0)
    finally:
        await stop_all(*backend_list(locals()))


@kube
@pytest.mark.asyncio
async def test_an_endless_log_is_kept_capped(kube, account, make_backend, tmp_path):
    """2 MB printed, 64 KiB kept: the beginning, the end, and a line where output was
    dropped; followed into its file while it runs, never held whole."""
    kube.add_node("bk-loud", gpus=1, labels=TRAIN)
    backend = make_backend(log_limit=64 * 1024)
    loud = ("import sys\nprint('the beginning', flush=True)\n"
            "for i in range(20000): sys.stdout.write('%06d' % i + 'x' * 93 + '\\n')\n"
            "print('the end')")
    try:
        await backend.adopt([])
        await backend.start(launch("j-loud", loud, {"bk-loud": GPU}))
        await log_of(backend, "j-loud", "the beginning")
        (exit,) = await ended(backend, timeout=60)
        assert exit.state == "succeeded"
        log = (await backend.read_log("j-loud", 1)).decode()
        assert log.startswith("the beginning\n") and log.rstrip().endswith("the end")
        assert "bytes of output were dropped here" in log and len(log) < 64 * 1024 + 200
        kept = list((tmp_path / "state" / "j-loud").glob("1.log*"))
        assert kept and sum(p.stat().st_size for p in kept) <= 64 * 1024
    finally:
        await stop_all(*backend_list(locals()))


def backend_list(scope):
    return [v for v in scope.values() if isinstance(v, KubernetesBackend)]


@kube
def test_the_hub_account_may_do_what_the_backend_needs_and_no_more(account):
    def can(verb, resource, namespace=account.namespace, subresource=""):
        attributes = {"verb": verb, "resource": resource, "subresource": subresource}
        if resource == "networkpolicies":
            attributes["group"] = "networking.k8s.io"
        if resource in ("tokenreviews", "subjectaccessreviews"):
            attributes["group"] = "authentication.k8s.io" if resource == "tokenreviews" \
                else "authorization.k8s.io"
        if namespace:
            attributes["namespace"] = namespace
        review = account.api.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes}})
        return review["status"]["allowed"]

    allowed = [(v, "pods") for v in ("get", "list", "watch", "create", "delete")]
    allowed += [("get", "pods", account.namespace, "log")]
    allowed += [(v, "events") for v in ("get", "list", "watch")]
    allowed += [(v, "persistentvolumeclaims") for v in ("get", "list")]
    allowed += [(v, "nodes", None) for v in ("get", "list", "watch")]
    allowed += [(v, "services") for v in ("create", "delete")]
    allowed += [(v, "networkpolicies") for v in ("create", "delete")]
    allowed += [("create", "tokenreviews", None)]  # which node an agent's pod is on
    denied = [("create", "subjectaccessreviews", None), ("update", "pods"), ("patch", "pods"), ("deletecollection", "pods"),
              ("create", "pods", "default"), ("list", "pods", "default"),
              ("create", "pods", account.namespace, "exec"),
              ("create", "pods", account.namespace, "eviction"),
              ("get", "secrets"), ("list", "secrets"), ("get", "configmaps"),
              ("create", "persistentvolumeclaims"), ("delete", "persistentvolumeclaims"),
              ("update", "persistentvolumeclaims"), ("list", "persistentvolumeclaims", "default"),
              ("create", "events"), ("create", "serviceaccounts", account.namespace, "token"),
              ("delete", "nodes", None), ("patch", "nodes", None), ("update", "nodes", None, "status"),
              ("create", "rolebindings"), ("list", "namespaces", None),
              ("update", "services"), ("patch", "services"), ("create", "services", "default"),
              ("create", "services", account.namespace, "proxy"),
              ("update", "networkpolicies"), ("create", "networkpolicies", "default"),
              ("create", "endpoints")]
    assert [a for a in allowed if not can(*a)] == []
    assert [d for d in denied if can(*d)] == []


@kube
@pytest.mark.asyncio
async def test_jobs_on_lent_build_gpus_run_on_the_build_node_and_are_known_after_a_restart(
        kube, account, make_backend, tmp_path):
    from jupyter_gpushare.backends.base import LentGPUsGone
    from jupyter_gpushare.pool.build.build_pool import BuildPool, Wanted
    from jupyter_gpushare.pool.store.database import Store

    kube.add_node("bk-build", shared_gpus=8)  # two GPUs of 4 time-sliced replicas
    resources = {"nvidia.com/gpu.shared": 4}
    watched = {"build_node_selector": kube.node_selector}
    first = make_backend(lent_gpu_resources=resources, **watched)
    store = Store(f"sqlite:///{tmp_path / 'pool.sqlite'}")
    build = BuildPool({"bk-build": 2}, 1.0, store, simulated=False, lend=True, reserve_gpus=0,
                      lent=first.lent_gpus())
    first.lend(build)
    assert build.indexed and build.lendable() == []  # nothing lent before the nodes are seen
    sleep = "import time; print('up', flush=True); time.sleep(60)"
    try:
        await first.adopt([])
        assert build.lendable() == [("bk-build", 0), ("bk-build", 1)]
        assert [n.name for n in build.lent_nodes()] == ["bk-build/lent"]
        # A cordoned build node lends nothing; uncordoned, it lends again.
        kube.api.patch("/api/v1/nodes/bk-build", {"spec": {"unschedulable": True}})
        await until(lambda: build.lendable() == [], what="the cordon to be seen")
        kube.api.patch("/api/v1/nodes/bk-build", {"spec": {"unschedulable": False}})
        await until(lambda: len(build.lendable()) == 2, what="the uncordon to be seen")
        build.lent_nodes()
        # Two starts side by side (as the loop makes them) get a GPU each.
        handle, other = await asyncio.gather(
            first.start(launch("j-lent", sleep, {"bk-build/lent": GPU})),
            first.start(launch("j-next", sleep, {"bk-build/lent": GPU})))
        assert (handle.data["lent"], other.data["lent"]) == ({"bk-build": [0]},
                                                             {"bk-build": [1]})
        await first.stop("j-next", 1, 0)
        await ended(first, timeout=40)
        await log_of(first, "j-lent", "up")
        [pod] = pods_of(account, "j-lent")
        assert pod["spec"]["nodeName"] == "bk-build"
        assert pod["spec"]["containers"][0]["resources"]["limits"] == \
            {"nvidia.com/gpu.shared": "4"}
        assert pod["metadata"]["annotations"][k8s.LENT] == "0"
        assert first.lent_holders() == {("bk-build", 0): "j-lent"}
        assert handle.data["lent"] == {"bk-build": [0]}
        # GPU 1 is wanted back by a notebook: a second job placed there cannot start.
        build.wanted[("alice", "")] = Wanted(("bk-build", 1), time.time(), time.time() + 60, 250)
        with pytest.raises(LentGPUsGone, match="has only 0 GPUs free"):
            await first.start(launch("j-late", sleep, {"bk-build/lent": GPU}))
        assert not pods_of(account, "j-late")
        # Not a train node: the pod on the build node is not taken for one that left the pool.
        assert await first.poll() == []
    finally:
        await first.shutdown()
    second = make_backend(lent_gpu_resources=resources, **watched)  # the service restarted
    build = BuildPool({"bk-build": 2}, 1.0, store, simulated=False, lend=True, reserve_gpus=0,
                      lent=second.lent_gpus())
    second.lend(build)
    try:
        # A record without them: the pod's annotation says which GPUs the job holds.
        bare = Handle(handle.job_id, handle.attempt,
                      {k: v for k, v in handle.data.items() if k != "lent"})
        assert await second.adopt([bare]) == []
        assert second.lent_holders() == {("bk-build", 0): "j-lent"}
        # The build node dies, and nothing deletes its pods: the job is lost (requeued).
        kube.kubelet.remove_node("bk-build", delete_pods=False)
        (exit,) = await ended(second, timeout=40)
        assert (exit.job_id, exit.state) == ("j-lent", "lost")
        assert "its node bk-build left the build pool" in exit.reason
        assert second.lent_holders() == {} and build.lendable() == []
    finally:
        await second.shutdown()


@kube
@pytest.mark.asyncio
async def test_a_job_stopped_before_the_watch_shows_its_pod_is_stopped_all_the_same(
        kube, account, make_backend, proxy, tmp_path):
    """Cancelled or taken back at once after its start, while the watch is behind: its pod is
    deleted once the watch shows it, and the attempt ends (it waited for ever before)."""
    kube.add_node("bk-quick", gpus=1, labels=TRAIN)
    backend = make_backend(kubeconfig=str(proxy.kubeconfig(account.token, tmp_path / "kc")))
    try:
        await backend.adopt([])
        await until(lambda: proxy.open_streams("watch") == 4, what="4 watches")
        proxy.delay(3, path_contains="watch=true")  # the watches come back 3 s late
        proxy.drop_streams("watch")
        await backend.start(launch("j-quick-stop", "import time; time.sleep(60)",
                                   {"bk-quick": GPU}))
        assert "gpushare-j-quick-stop-1-0" not in backend.pods.objects  # not shown yet
        await backend.stop("j-quick-stop", 1, 0)
        (exit,) = await ended(backend, timeout=40)
        assert (exit.job_id, exit.state) == ("j-quick-stop", "failed")
        await until(lambda: not pods_of(account, "j-quick-stop"), what="its pod deleted")
    finally:
        await backend.shutdown()
