"""The node agent against the real control plane: a real JupyterHub with the real proxy, the
pool service on the Kubernetes backend, and ``python -m jupyter_gpushare.agent`` running as
its own process on each simulated GPU node, under the RBAC of hub_config/kubernetes-agent.yaml,
with the token of the JupyterHub service "gpushare-agent" and its pod's own projected token
(asked through the TokenRequest API, as the kubelet does), which the pool reviews to learn
the node a reading may be for.

The kubelet simulator runs the job's pod and a notebook pod as real processes in real pod
cgroups (kubepods/<qos>/pod<uid>/<id>), gives them GPUs by UUID and serves the kubelet's
pod-resources socket; the NVML stand-in plays per-process utilization for those real pids.
So the agent finds pods from /proc/<pid>/cgroup and GPUs from the kubelet exactly as on a
real node, and the pool shows what the stand-in played: the job in api/usage and the pool
map, the notebook's slice too, a process of no pod as outside gpushare; a reading posted with
any other token is refused, and so is one for another node than its agent pod's."""

import json
import secrets
import subprocess
import sys
import time
from pathlib import Path
from urllib.error import HTTPError
from urllib.request import Request, urlopen

import pytest

from hubtest import Hub, need_proxy
from kube.podrun import ANN_RUN_LOCALLY
from kube_account import Account, AgentAccount, pod_token
from jupyter_gpushare.usage.nvml_standin import write_script

pytestmark = pytest.mark.kube

PY = sys.executable
GiB = 2**30
TRAIN, BUILD = "ag-train", "ag-build"
AGENT, SPAWNER = secrets.token_hex(16), secrets.token_hex(16)
INTERVAL = 0.5
POOL_CONFIG = """
c = get_config()
c.PoolService.backend_class = "kubernetes"
c.PoolService.projects = {{"vision": {{"quota": 2, "groups": ["vision"]}}}}
c.PoolService.cycle_interval = 0.2
c.PoolService.grace_period = 2
c.PoolService.build_nodes = {{"{build}": 1}}
c.KubernetesBackend.kubeconfig = {kubeconfig!r}
c.KubernetesBackend.namespace = {namespace!r}
c.KubernetesBackend.train_node_selector = {{"agent-test": {namespace!r}}}
c.KubernetesBackend.home_dir = {home!r}
c.GPUUsage.sample_interval = {interval}
"""
EXTRA = f"""
c.JupyterHub.services += [{{"name": "gpushare-agent", "api_token": "{AGENT}"}},
                          {{"name": "gpushare-spawner", "api_token": "{SPAWNER}"}}]
c.JupyterHub.load_roles += [{{"name": "gpushare-clients", "services": ["gpushare-agent",
                              "gpushare-spawner"], "scopes": ["access:services!service=gpushare"]}}]
"""
SLEEP = "import time; time.sleep(600)"


@pytest.fixture(scope="module")
def hub(kube_cluster, tmp_path_factory):
    need_proxy()
    if not kube_cluster.kubelet.cgroups or not kube_cluster.kubelet.cgroups.available:
        pytest.skip("/sys/fs/cgroup is not writable here: the simulated pods have no cgroups "
                    "for the agent to find")
    pytest.importorskip("grpc")
    account = Account(kube_cluster)
    directory = tmp_path_factory.mktemp("agenthub")
    (directory / "home").mkdir()
    kube_cluster.kubelet.add_node(TRAIN, gpus=2, labels={"agent-test": account.namespace})
    kube_cluster.kubelet.add_node(BUILD, shared_gpus=4,
                                  labels={"agent-test-build": account.namespace})
    hub = Hub(directory, {"vision": ["alice"]}, POOL_CONFIG.format(
        build=BUILD, kubeconfig=str(account.kubeconfig), namespace=account.namespace,
        home=str(directory / "home"), interval=INTERVAL), EXTRA)
    hub.account = account
    hub.agent_account = AgentAccount(kube_cluster, account.namespace)
    # each node's agent pod, and the token the kubelet would project into it
    hub.node_tokens = {}
    for node in (TRAIN, BUILD):
        token = pod_token(kube_cluster, account.namespace, "gpushare-agent",
                          f"gpushare-agent-{node}", node)
        (directory / f"{node}.token").write_text(token)
        hub.node_tokens[node] = token
    hub.agents = []
    try:
        yield hub.start()
    finally:
        for proc, _ in hub.agents:
            proc.terminate()
            proc.wait(10)
        hub.stop()
        account.clear_pods()
        for name in (TRAIN, BUILD):
            if name in kube_cluster.kubelet.nodes:
                kube_cluster.kubelet.remove_node(name)
        account.close()


def wait(check, timeout=40, what="the condition"):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"{what} did not come true in {timeout} s"
        time.sleep(0.25)
    return result


def start_agent(hub, node: str, script: Path, token: str, name: str):
    log = hub.dir / f"{name}.log"
    sim = hub.account.cluster.kubelet
    proc = subprocess.Popen(
        [PY, "-m", "jupyter_gpushare.agent", f"--NodeAgent.node_name={node}",
         f"--NodeAgent.pool_url={hub.pool_url}",
         f"--NodeAgent.namespace={hub.account.namespace}",
         f"--NodeAgent.kubeconfig={hub.agent_account.kubeconfig}",
         f"--NodeAgent.pod_resources_socket={sim.pod_resources_socket(node)}",
         "--NodeAgent.nvml=standin", f"--NodeAgent.nvml_standin_script={script}",
         f"--NodeAgent.node_token_file={hub.dir / f'{node}.token'}",
         f"--NodeAgent.sample_interval={INTERVAL}", "--NodeAgent.max_backoff=2"],
        env={"PATH": "/usr/bin:/bin", "JUPYTERHUB_API_TOKEN": token},
        stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    hub.agents.append((proc, log))
    return proc, log


def post_samples(hub, reading, token=AGENT, node_token=None):
    """A reading posted by hand, as an agent posts it (its pod's token in a header)."""
    request = Request(hub.pool_url + "api/samples", data=json.dumps(reading).encode(),
                      method="POST", headers={"Authorization": f"token {token}",
                                              "Content-Type": "application/json"})
    if node_token:
        request.add_header("Gpushare-Node-Token", node_token)
    try:
        with urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except HTTPError as e:
        return e.code, json.loads(e.read())


def pool_map(hub):
    status, pool = hub.api("GET", "api/pool", "admin")
    assert status == 200, pool
    return pool


def test_the_agent_attributes_real_pods_gpu_use_to_the_job_and_the_slice(hub, tmp_path):
    sim, api, ns = hub.account.cluster.kubelet, hub.account.cluster.api, hub.account.namespace
    train_gpus, build_gpus = sim.devices[TRAIN].uuids, sim.devices[BUILD].uuids

    # alice's 2-GPU job runs as a pod of the pool's Kubernetes backend
    status, job = hub.api("POST", "api/jobs", "alice",
                          {"project": "vision", "gpus": 2, "command": [PY, "-c", SLEEP]})
    assert status == 201, job
    pod = wait(lambda: next(iter(api.get(f"/api/v1/namespaces/{ns}/pods", labelSelector=(
        f"gpushare.jupyter.org/job={job['id']}"))["items"]), None), what="the job's pod")
    name = pod["metadata"]["name"]
    wait(lambda: (sim.run_of(ns, name) or None) and sim.run_of(ns, name).containers["job"].proc,
         what="the job's process")
    job_pid = sim.run_of(ns, name).containers["job"].proc.pid

    # alice's notebook: a slice reserved by the spawner's service, a pod that names it
    status, reserved = hub.request("POST", hub.pool_url + "api/slices", SPAWNER,
                                   {"user": "alice", "gpus": 0.25, "server": ""})
    assert status == 201, reserved
    assert reserved["node"] == BUILD
    api.post(f"/api/v1/namespaces/{ns}/pods", {
        "metadata": {"name": "jupyter-alice", "annotations": {
            ANN_RUN_LOCALLY: "true", "gpushare.jupyter.org/slices": reserved["id"]}},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": BUILD}, "containers": [{
            "name": "notebook", "image": "x", "command": [PY, "-c", SLEEP],
            "resources": {"limits": {"nvidia.com/gpu.shared": "1"}}}]}})
    wait(lambda: (sim.run_of(ns, "jupyter-alice") or None) and
         sim.run_of(ns, "jupyter-alice").containers["notebook"].proc, what="the notebook")
    notebook_pid = sim.run_of(ns, "jupyter-alice").containers["notebook"].proc.pid

    # a process of no pod on the job's second GPU
    stray = subprocess.Popen([PY, "-c", SLEEP])
    try:
        # the stand-in plays the GPUs' use by these real pids
        train_script, build_script = tmp_path / "train.json", tmp_path / "build.json"
        def standin_gpus(uuids):
            return [{"uuid": u, "name": "H100 (stand-in)", "memory_total": 80 * GiB}
                    for u in uuids]
        write_script(train_script, {"gpus": standin_gpus(train_gpus), "processes": [
            {"pid": job_pid, "gpu": train_gpus[0], "sm": 80, "memory": 20 * GiB},
            {"pid": stray.pid, "gpu": train_gpus[1], "sm": 30, "memory": 3 * GiB}]})
        write_script(build_script, {"gpus": standin_gpus(build_gpus), "processes": [
            {"pid": notebook_pid, "gpu": build_gpus[0], "sm": 10, "memory": 2 * GiB}]})
        start_agent(hub, TRAIN, train_script, AGENT, "agent-train")
        start_agent(hub, BUILD, build_script, AGENT, "agent-build")
        # an agent with a user's token: refused by the pool, says so once, keeps going
        impostor, impostor_log = start_agent(hub, TRAIN, train_script, hub.token("alice"),
                                             "agent-impostor")

        def seen():
            gpus = {g["uuid"]: g for g in pool_map(hub)["gpus"]}
            return len(gpus) == 3 and all(gpus[u]["holders"] for u in gpus) and gpus
        gpus = wait(seen, what="both nodes' GPUs in the pool map")
        first, second, build = gpus[train_gpus[0]], gpus[train_gpus[1]], gpus[build_gpus[0]]
        assert (first["node"], first["index"], first["pool"]) == (TRAIN, 0, "train")
        assert (build["node"], build["pool"]) == (BUILD, "build")
        # the job holds both its GPUs (the kubelet says so), and uses the first
        for gpu, sm in ((first, 0.8), (second, 0.0)):
            (holder,) = gpu["holders"]
            assert (holder["kind"], holder["job"], holder["attempt"], holder["user"]) == \
                ("job", job["id"], 1, "alice")
            assert holder["sm"] == pytest.approx(sm, abs=0.01)
            assert holder["gpus"] == 1
        assert first["holders"][0]["memory_bytes"] == 20 * GiB
        assert first["outside"] == {"processes": 0, "memory_bytes": 0}
        assert second["outside"] == {"processes": 1, "memory_bytes": 3 * GiB}
        (slice_holder,) = build["holders"]
        assert (slice_holder["kind"], slice_holder["slice"], slice_holder["gpus"]) == \
            ("slice", reserved["id"], 0.25)
        assert slice_holder["sm"] == pytest.approx(0.1, abs=0.01)
        notes = pool_map(hub)["usage_notes"]
        assert f"GPU 1 of {TRAIN}: 1 process outside gpushare, 3.0 GiB." in notes

        # the job's and the slice's use now, and in api/usage, as played
        def job_now():
            status, body = hub.api("GET", f"api/jobs/{job['id']}", "alice")
            return (body.get("usage") or {}).get("sm_now") is not None and body["usage"]
        assert job_now() or wait(job_now, what="the job's use")
        assert job_now()["sm_now"] == pytest.approx(0.4, abs=0.01)  # 80 % of one of two GPUs
        time.sleep(3 * INTERVAL)
        status, by_job = hub.api("GET", "api/usage?by=job&since=1h", "alice")
        assert status == 200, by_job
        (row,) = [r for r in by_job["rows"] if r.get("job") == job["id"]]
        assert row["utilization"] == pytest.approx(0.4, abs=0.01)
        assert row["allocated_gpu_seconds"] > 0 and row["memory_peak_bytes"] == 20 * GiB
        status, by_slice = hub.api("GET", "api/usage?by=slice&since=1h", "alice")
        (srow,) = [r for r in by_slice["rows"] if r.get("slice") == reserved["id"]]
        assert srow["utilization"] == pytest.approx(0.4, abs=0.01)  # 10 % of a ¼ slice

        # the impostor's readings never counted, and it said so in one line, still running
        wait(lambda: "refuses" in impostor_log.read_text(), what="the impostor's refusal")
        time.sleep(4 * INTERVAL)
        assert impostor.poll() is None
        refusals = [line for line in impostor_log.read_text().splitlines() if "refuses" in line]
        assert len(refusals) == 1, refusals
        assert "give the agent the token of the JupyterHub service" in refusals[0]
        for proc, log in hub.agents[:2]:
            text = log.read_text()
            assert proc.poll() is None and "Traceback" not in text, text
            assert "The pool took the first reading" in text
        # and a reading posted by hand with a token that is not the agent's is refused too
        reading = {"node": TRAIN, "gpus": [{"uuid": train_gpus[0], "held_by": [
            {"job": job["id"], "attempt": 1}]}]}
        for token in (SPAWNER, hub.token("alice"), hub.token("admin")):
            status, body = hub.request("POST", hub.pool_url + "api/samples", token, reading)
            assert status == 403 and "only by the gpushare node agent" in body["error"]

        # the build node's driver goes away: one sentence in the pool, the agent goes on
        write_script(build_script, {"library": False})
        wait(lambda: any("libnvidia-ml.so.1" in n for n in pool_map(hub)["usage_notes"]),
             what="the missing library's sentence")
        write_script(build_script, {"gpus": standin_gpus(build_gpus), "processes": [
            {"pid": notebook_pid, "gpu": build_gpus[0], "sm": 10, "memory": 2 * GiB}]})
        wait(lambda: not any("libnvidia-ml.so.1" in n for n in pool_map(hub)["usage_notes"]),
             what="the library's return")
        build_log = hub.agents[1][1].read_text()
        assert hub.agents[1][0].poll() is None and "Traceback" not in build_log, build_log

        # a reading that claims the job on more of the node's GPUs than the pool gave it:
        # only as many are believed
        claim = [{"job": job["id"], "attempt": 1}]
        status, body = post_samples(hub, {
            "node": TRAIN, "gpus": [{"uuid": u, "memory_total": GiB, "utilization": 0,
                                     "held_by": claim} for u in (*train_gpus, "GPU-extra")]},
            node_token=hub.node_tokens[TRAIN])
        assert status == 202, body
        extra = next(g for g in pool_map(hub)["gpus"] if g["uuid"] == "GPU-extra")
        assert extra["holders"] == []
    finally:
        stray.kill()
        stray.wait()


def test_an_agent_speaks_only_for_the_node_its_pod_is_on(hub):
    """The agent service's one token is in the root, hostPID pod on every GPU node. With it,
    the train node's agent (or whoever is root there) reports the build node's GPU idle, so
    that its notebooks are culled: refused, whatever pod token comes with it."""
    ns, cluster = hub.account.namespace, hub.account.cluster
    build_gpu = cluster.kubelet.devices[BUILD].uuids[0]
    idle = {"node": BUILD, "gpus": [{"uuid": build_gpu, "memory_total": GiB, "utilization": 0,
                                     "processes": []}]}

    def refused(node_token, *words):
        status, body = post_samples(hub, idle, node_token=node_token)
        assert status == 403, body
        assert any(w in body["error"] for w in words), body
        return body["error"]

    # the train node's own pod token: Kubernetes says which node that pod is on
    assert refused(hub.node_tokens[TRAIN], "runs on node") == \
        f"this agent's pod runs on node {TRAIN}, not on {BUILD}"
    # no pod token at all
    assert "must carry its pod's service-account token" in refused(None, "must carry")
    # the agent account's old-style secret token (not bound to a pod, not for the pool)
    refused(hub.agent_account.token, "does not accept", "not bound to a pod")
    # a token bound to a pod on the build node, but of another account (any pod's there)
    other = pod_token(cluster, ns, "default", "someone-on-build", BUILD)
    assert "not the agent's service account" in refused(other, "service account")
    # a token for another audience (the API server's own)
    api_audience = pod_token(cluster, ns, "gpushare-agent", "agent-api-audience", BUILD,
                             audience="https://kubernetes.default.svc.cluster.local")
    refused(api_audience, "does not accept")
    # a token whose agent pod is gone (deleted before the pool ever saw it)
    gone = pod_token(cluster, ns, "gpushare-agent", "agent-gone", BUILD)
    cluster.api.delete(f"/api/v1/namespaces/{ns}/pods/agent-gone", {"gracePeriodSeconds": 0})
    refused(gone, "no longer exists", "does not accept")
    # a forged token, and one not even shaped like a token (not asked about)
    refused("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJmb3JnZWQifQ.Zm9yZ2Vk", "does not accept")
    refused("not-a-token", "is not a service-account token")
    # the build node's own agent may report it
    status, body = post_samples(hub, idle, node_token=hub.node_tokens[BUILD])
    assert status == 202, body
