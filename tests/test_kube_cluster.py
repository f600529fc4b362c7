"""The test control plane itself: real etcd, kube-apiserver, controller-manager and scheduler,
with our kubelet simulator playing the nodes. Objects are read back through the official
`kubernetes` client, which proves the statuses the simulator writes are valid for clients."""

from __future__ import annotations

import os
import sys
import time

import pytest
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from kube.kubeletproc import KubeletProcess

pytestmark = pytest.mark.kube

PY = sys.executable


@pytest.fixture(scope="module")
def core(kube_cluster):
    return k8s.CoreV1Api(k8s_config.new_client_from_config(str(kube_cluster.kubeconfig)))


def pod(name, command=None, *, gpus=0, node_selector=None, restart="Never", grace=None,
        annotations=None, **container):
    c = {"name": "main", "image": "python:3.11", **container}
    if command:
        c["command"] = command
    if gpus:
        c["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    spec = {"restartPolicy": restart, "containers": [c], "nodeSelector": node_selector or {}}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"metadata": {"name": name, "annotations": annotations or {}}, "spec": spec}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


def test_nodes_are_ready_with_gpu_capacity(kube, core):
    kube.add_node("train-a", gpus=8, labels={"gpushare/pool": "train"})
    kube.add_node("build-a", shared_gpus=16, labels={"gpushare/pool": "build"})
    nodes = {n.metadata.name: n for n in core.list_node(
        label_selector=f"sim.gpushare.jupyter.org/test={kube.namespace}").items}
    assert set(nodes) == {"train-a", "build-a"}
    for n in nodes.values():
        ready = next(c for c in n.status.conditions if c.type == "Ready")
        assert ready.status == "True"
        assert not [t for t in n.spec.taints or [] if "not-ready" in t.key]
        assert n.status.daemon_endpoints.kubelet_endpoint.port == kube.kubelet.logs.port
    assert nodes["train-a"].status.allocatable["nvidia.com/gpu"] == "8"
    assert nodes["train-a"].metadata.labels["gpushare/pool"] == "train"
    assert nodes["build-a"].status.allocatable["nvidia.com/gpu.shared"] == "16"
    assert "nvidia.com/gpu" not in nodes["build-a"].status.allocatable
    lease = kube.api.get("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/train-a")
    assert lease["spec"]["holderIdentity"] == "train-a"


def test_scheduler_binds_a_gpu_pod_which_runs_its_command(kube, core):
    kube.add_node("gpu-one", gpus=1)
    kube.add_node("gpu-four", gpus=4)
    script = ("import os; print('job', os.environ['JOB'], 'on', os.environ['NODE'], "
              "'in', os.getcwd()); raise SystemExit(3)")
    kube.create_pod(pod("job", [PY, "-c", script], gpus=2, node_selector=kube.node_selector,
                        workingDir="/tmp",
                        env=[{"name": "JOB", "value": "$(NS)-7"},
                             {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]))
    # Env order matters for $(VAR): NS is defined after JOB, so JOB keeps the literal.
    kube.wait_pod("job", "Failed")
    p = core.read_namespaced_pod("job", kube.namespace)
    assert p.spec.node_name == "gpu-four"           # the real scheduler counted GPUs
    (cs,) = p.status.container_statuses
    assert cs.state.terminated.exit_code == 3 and cs.state.terminated.reason == "Error"
    assert cs.name == "main" and cs.image == "python:3.11" and cs.image_id and cs.restart_count == 0
    assert p.status.pod_ip.startswith("127.0.")
    log = core.read_namespaced_pod_log("job", kube.namespace)
    assert log == "job $(NS)-7 on gpu-four in /tmp\n"
    assert kube.logs("job", tailLines=1) == log

    # exit 0 → Succeeded; and while it runs every container is ready with a pod IP.
    kube.create_pod(pod("ok", [PY, "-c", "import time; time.sleep(1.5); print('done')"],
                        gpus=1, node_selector=kube.node_selector))
    running = kube.wait_pod("ok", "Running")
    assert all(c["ready"] and c["started"] for c in running["status"]["containerStatuses"])
    assert running["status"]["podIP"] and running["status"]["podIP"] != p.status.pod_ip
    # follow=true streams until the container ends
    assert kube.logs("ok", follow="true") == "done\n"
    kube.wait_pod("ok", "Succeeded")


def test_containers_run_in_their_pods_cgroups_with_the_gpus_the_kubelet_reports(kube):
    """What a node agent reads on a real node: /proc/<pid>/cgroup names the pod (cgroupfs
    layout), NVIDIA_VISIBLE_DEVICES the GPUs, and the pod-resources socket which they are."""
    from jupyter_gpushare.agent import cgroup
    from jupyter_gpushare.agent.podresources import PodResources
    pytest.importorskip("grpc")  # the simulated kubelet's pod-resources API
    sim = kube.kubelet
    if sim.cgroups is None or not sim.cgroups.available:
        pytest.skip("/sys/fs/cgroup is not writable here: containers run in no cgroup")
    kube.add_node("cg-node", gpus=2, shared_gpus=4)
    uuids = sim.devices["cg-node"].uuids
    script = ("import os, subprocess, sys, time; print(os.environ['NVIDIA_VISIBLE_DEVICES'], "
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']).pid, "
              "flush=True); time.sleep(60)")
    kube.create_pod(pod("gpu-job", [PY, "-c", script], gpus=1, node_selector={
        "kubernetes.io/hostname": "cg-node"}))
    notebook = pod("notebook", [PY, "-c", "import time; time.sleep(60)"],
                   node_selector={"kubernetes.io/hostname": "cg-node"})
    notebook["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu.shared": "1", "cpu": "1", "memory": "1Gi"},
        "requests": {"cpu": "500m", "memory": "1Gi"}}
    kube.create_pod(notebook)
    job = kube.wait_pod("gpu-job", "Running")
    kube.wait_pod("notebook", "Running")
    deadline = time.monotonic() + 10
    while not kube.logs("gpu-job") and time.monotonic() < deadline:
        time.sleep(0.1)
    visible, child = kube.logs("gpu-job").split()
    assert visible == uuids[0]
    run = sim.run_of(kube.namespace, "gpu-job")
    main = run.containers["main"]
    cid = main.container_id.split("://")[1]
    uid = job["metadata"]["uid"]
    for pid in (main.proc.pid, int(child)):  # the process and what it started
        assert cgroup.pod_of(pid) == cgroup.PodCgroup(uid, cid)
        text = open(f"/proc/{pid}/cgroup").read()
        assert f":/kubepods/besteffort/pod{uid}/{cid}\n" in text  # cgroupfs layout, v1 and v2
    nb = sim.run_of(kube.namespace, "notebook")
    assert f"/kubepods/burstable/pod{nb.uid}/" in open(
        f"/proc/{nb.containers['main'].proc.pid}/cgroup").read()
    answer = {(p.namespace, p.name): p.devices
              for p in PodResources(str(sim.pod_resources_socket("cg-node"))).list()}
    assert answer[(kube.namespace, "gpu-job")] == {"nvidia.com/gpu": (uuids[0],)}
    assert answer[(kube.namespace, "notebook")] == {"nvidia.com/gpu.shared": (f"{uuids[2]}::0",)}
    directories = [base / f"kubepods/besteffort/pod{uid}" for base in sim.cgroups.bases]
    assert all(d.is_dir() for d in directories)
    kube.delete_pod("gpu-job", grace=0)
    kube.wait_pod("gpu-job", None)
    deadline = time.monotonic() + 10
    while any(d.exists() for d in directories) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(d.exists() for d in directories)  # removed with the pod
    assert (kube.namespace, "gpu-job") not in {
        (p.namespace, p.name) for p in PodResources(str(sim.pod_resources_socket("cg-node"))).list()}


def test_simulated_containers_and_restarts(kube):
    kube.add_node("sim-node", gpus=8)
    sel = kube.node_selector
    # No command: a simulated container, here told to end after 0.3 s with exit code 2.
    kube.create_pod(pod("sim", gpus=8, node_selector=sel, annotations={
        "sim.gpushare.jupyter.org/run-seconds": "0.3", "sim.gpushare.jupyter.org/exit-code": "2"}))
    done = kube.wait_pod("sim", "Failed")
    assert done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 2
    # OnFailure: fails once, then succeeds on the restart (a marker file in its workingDir).
    work = kube.kubelet.workdir / kube.namespace
    work.mkdir()
    script = ("import os,sys; first = not os.path.exists('m'); open('m','w').close(); "
              "print('first' if first else 'again'); sys.exit(1 if first else 0)")
    kube.create_pod(pod("flaky", [PY, "-c", script], restart="OnFailure", node_selector=sel,
                        workingDir=str(work)))
    p = kube.wait_pod("flaky", "Succeeded")
    (cs,) = p["status"]["containerStatuses"]
    assert cs["restartCount"] == 1 and cs["lastState"]["terminated"]["exitCode"] == 1
    assert kube.logs("flaky") == "again\n" and kube.logs("flaky", previous="true") == "first\n"


def test_run_locally_annotation_and_env_sources(kube):
    kube.add_node("env-node", gpus=1)
    sel = kube.node_selector
    kube.api.post(f"/api/v1/namespaces/{kube.namespace}/secrets",
                  {"metadata": {"name": "s"}, "stringData": {"k": "from-secret"}})
    # args only (as KubeSpawner writes a notebook pod): runs locally when the pod asks for it.
    script = "import os; print(os.environ['S'], os.environ['IP'] == os.environ['MINE'])"
    kube.create_pod(pod("args-only", node_selector=sel, args=[PY, "-c", script],
                        annotations={"sim.gpushare.jupyter.org/run-locally": "true"},
                        env=[{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                             {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                             {"name": "MINE", "value": "$(IP)"}]))
    kube.wait_pod("args-only", "Succeeded")
    assert kube.logs("args-only") == "from-secret True\n"
    # A command, but the pod says not to run it: simulated, for the seconds it says.
    kube.create_pod(pod("not-run", [PY, "-c", "print('never')"], node_selector=sel,
                        annotations={"sim.gpushare.jupyter.org/run-locally": "false",
                                     "sim.gpushare.jupyter.org/run-seconds": "0.2"}))
    kube.wait_pod("not-run", "Succeeded")
    assert kube.logs("not-run") == ""


def test_a_pod_that_cannot_fit_says_insufficient_gpu(kube, core):
    kube.add_node("small", gpus=2)
    kube.create_pod(pod("huge", gpus=3, node_selector=kube.node_selector))
    p = kube.wait_pod("huge", lambda p: any(c["type"] == "PodScheduled" and c["status"] == "False"
                                            for c in p["status"].get("conditions", [])))
    cond = next(c for c in p["status"]["conditions"] if c["type"] == "PodScheduled")
    assert cond["reason"] == "Unschedulable"
    assert "1 Insufficient nvidia.com/gpu" in cond["message"]
    deadline = time.monotonic() + 10
    while not (events := kube.events("huge")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert events[-1]["reason"] == "FailedScheduling"
    assert "Insufficient nvidia.com/gpu" in events[-1]["message"]
    assert core.read_namespaced_pod("huge", kube.namespace).spec.node_name is None


def test_deletion_sends_sigterm_then_sigkill_after_grace(kube):
    kube.add_node("del-node", gpus=2)
    polite = ("import signal,sys,time\n"
              "def term(*a): print('got SIGTERM', flush=True); sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, term); print('up', flush=True); time.sleep(60)")
    stubborn = ("import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('up', flush=True); time.sleep(60)")
    kube.create_pod(pod("polite", [PY, "-c", polite], node_selector=kube.node_selector, grace=30))
    kube.create_pod(pod("stubborn", [PY, "-c", stubborn], node_selector=kube.node_selector,
                        grace=1))
    for name in ("polite", "stubborn"):
        kube.wait_pod(name, lambda p: "up" in (kube.logs(p["metadata"]["name"]) if p and
                                                p["status"].get("phase") == "Running" else ""))
    runs = {n: kube.kubelet.run_of(kube.namespace, n) for n in ("polite", "stubborn")}
    pids = {n: r.containers["main"].proc.pid for n, r in runs.items()}
    log = runs["polite"].log_path("main")

    t0 = time.monotonic()
    deleting = kube.delete_pod("polite")          # the pod's own grace: 30 s
    assert deleting["metadata"]["deletionGracePeriodSeconds"] == 30
    kube.wait_pod("polite", None, timeout=10)     # gone long before 30 s: it exited on SIGTERM
    assert "got SIGTERM" in log.read_text()
    assert not alive(pids["polite"])

    t1 = time.monotonic()
    kube.delete_pod("stubborn")
    kube.wait_pod("stubborn", None, timeout=10)
    assert 0.9 < time.monotonic() - t1 < 5         # SIGKILL after the 1 s grace
    assert not alive(pids["stubborn"])
    assert time.monotonic() - t0 < 15


def test_a_removed_node_takes_its_pods(kube, core):
    kube.add_node("doomed", gpus=4)
    kube.create_pod(pod("victim", [PY, "-c", "import time; time.sleep(60)"], gpus=4,
                        node_selector=kube.node_selector))
    kube.wait_pod("victim", "Running")
    pid = kube.kubelet.run_of(kube.namespace, "victim").containers["main"].proc.pid
    kube.kubelet.remove_node("doomed")
    assert "doomed" not in [n.metadata.name for n in core.list_node().items]
    kube.wait_pod("victim", None, timeout=10)
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(pid)


def test_the_simulator_recovers_from_an_apiserver_restart(kube, kube_cluster):
    kube.add_node("steady", gpus=2)
    kube.create_pod(pod("before", [PY, "-c", "import time; time.sleep(60)"],
                        node_selector=kube.node_selector, grace=5))
    kube.wait_pod("before", "Running")
    relists = kube.kubelet.relists
    took = kube_cluster.control_plane.restart_apiserver(down_s=1.0)
    assert took < 30
    # The simulator noticed the broken watch and listed again; new work still flows.
    kube.create_pod(pod("after", [PY, "-c", "print('after restart')"],
                        node_selector=kube.node_selector))
    kube.wait_pod("after", "Succeeded", timeout=30)
    assert kube.kubelet.relists > relists
    assert kube.logs("after") == "after restart\n"
    kube.delete_pod("before")
    kube.wait_pod("before", None, timeout=15)


def test_a_simulator_in_a_process_of_its_own_runs_pods_and_serves_their_logs(kube, tmp_path):
    # What the benchmarks use, so that the simulator shares no interpreter lock with them.
    cp = kube.cluster.control_plane
    with KubeletProcess(cp.api, tmp_path / "kubelet", cert=cp.pki["kubelet.crt"],
                        key=cp.pki["kubelet.key"]) as kubelet:
        assert kubelet.pid not in (None, os.getpid())
        kubelet.add_node("proc-node", gpus=2, labels=kube.node_selector)
        with pytest.raises(RuntimeError, match="409"):
            kubelet.add_node("proc-node", gpus=2)  # the API server's refusal comes back
        kube.create_pod(pod("in-proc", [PY, "-c", "print('hello')"], gpus=1,
                            node_selector={"kubernetes.io/hostname": "proc-node"}))
        done = kube.wait_pod("in-proc", "Succeeded")
        assert done["spec"]["nodeName"] == "proc-node"
        assert kube.logs("in-proc") == "hello\n"
        kube.delete_pod("in-proc", grace=0)
    kube.api.delete("/api/v1/nodes/proc-node")
