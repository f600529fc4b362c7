"""The node agent's pure parts (jupyter_gpushare/agent/): pod UIDs from real-world
/proc/<pid>/cgroup lines of every layout, the kubelet's pod-resources answer against the
protobuf library itself, pods to owners by their labels, and the body it posts, read back by
the pool's own parser. The agent against the real control plane: test_agent_kube.py."""

import asyncio
import logging

import pytest

from jupyter_gpushare.agent import cgroup, pods, report
from jupyter_gpushare.agent.app import NodeAgent, Problems
from jupyter_gpushare.agent.podresources import PodDevices, PodResourcesError, decode_list
from jupyter_gpushare.client import PoolClient, PoolError, PoolUnreachable
from jupyter_gpushare.pool.web.api_usage import parse_samples
from jupyter_gpushare.usage.sampler import GPUReading, MachineReading, ProcessReading
from kube.podresources import encode_list

UID = "5a7bbd2e-4c4e-4b7f-9a8e-2f3c1d0e9b8a"
UNDERSCORED = UID.replace("-", "_")
CID = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00998877665544332211"


# -- 2. cgroups ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, container", [
    # cgroup v1, cgroupfs driver (hybrid hierarchy: every controller names the pod)
    (f"12:pids:/kubepods/besteffort/pod{UID}/{CID}\n11:memory:/kubepods/besteffort/pod{UID}/"
     f"{CID}\n1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n0::/\n", CID),
    (f"4:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}\n", CID),
    (f"4:cpu,cpuacct:/kubepods/pod{UID}/{CID}\n", CID),  # guaranteed: no QoS level
    (f"9:devices:/kubepods/besteffort/pod{UID}\n", ""),  # the pod's own cgroup
    # cgroup v1, systemd driver, containerd / docker / cri-o
    (f"1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
     f"{UNDERSCORED}.slice/cri-containerd-{CID}.scope\n", CID),
    (f"7:memory:/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
     f"{UNDERSCORED}.slice/docker-{CID}.scope\n", CID),
    (f"5:pids:/kubepods.slice/kubepods-pod{UNDERSCORED}.slice/crio-{CID}.scope\n", CID),
    # cgroup v2, both drivers
    (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDERSCORED}"
     f".slice/cri-containerd-{CID}.scope\n", CID),
    (f"0::/kubepods/burstable/pod{UID}/{CID}\n", CID),
    # kind: a kubelet in a container, under its own prefix
    (f"0::/system.slice/docker-{'ab' * 32}.scope/kubelet.slice/kubelet-kubepods.slice/"
     f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UNDERSCORED}.slice/"
     f"cri-containerd-{CID}.scope\n", CID),
    # the hybrid hierarchy where only some controllers name the pod
    (f"4:memory:/system.slice/kubelet.service\n8:pids:/kubepods/besteffort/pod{UID}/{CID}\n",
     CID),
])
def test_a_process_in_a_pod_names_its_pod(text, container):
    assert cgroup.parse(text) == cgroup.PodCgroup(UID, container)


OTHER = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"


@pytest.mark.parametrize("text", [
    # systemd driver, cgroup v2: the container made a sub-cgroup named like a cgroupfs pod
    f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDERSCORED}.slice/"
    f"cri-containerd-{CID}.scope/kubepods/pod{OTHER}/{'ab' * 32}\n",
    # and the other way round: a cgroupfs node, a sub-cgroup named like a systemd pod
    f"0::/kubepods/besteffort/pod{UID}/{CID}/kubepods-pod{OTHER.replace('-', '_')}.slice/"
    f"cri-containerd-{'ab' * 32}.scope\n",
])
def test_a_sub_cgroup_named_after_another_pod_does_not_move_the_process(text):
    assert cgroup.parse(text) == cgroup.PodCgroup(UID, CID)


@pytest.mark.parametrize("text", [
    "0::/init.scope\n", "0::/system.slice/containerd.service\n",
    "0::/user.slice/user-1000.slice/session-3.scope\n",
    "12:pids:/\n11:memory:/process_api/d5544eec8fd403e30c9656b5d9f8ae8c\n0::/\n",
    "1:name=systemd:/kubepods.slice/kubepods-besteffort.slice\n",  # a QoS slice, no pod
    f"0::/kubepods/besteffort/pod{UID[:-1]}/x\n",  # not a UID
    "", "garbage without colons\n"])
def test_a_process_of_the_node_itself_names_no_pod(text):
    assert cgroup.parse(text) is None


def test_pod_of_reads_the_file_and_a_gone_process_is_none(tmp_path):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"0::/kubepods/besteffort/pod{UID.upper()}/{CID}\n")
    assert cgroup.pod_of(42, str(tmp_path)) == cgroup.PodCgroup(UID, CID)
    assert cgroup.pod_of(43, str(tmp_path)) is None


# -- 3. the kubelet's pod-resources answer --------------------------------------------------

def reference_messages():
    """podresources/v1's messages built by the protobuf library from their descriptors, with
    the fields the agent does not read (cpu_ids, memory, topology) as well."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="podresources_v1_test.proto", package="v1",
                                           syntax="proto3")

    def message(name, *fields):
        m = f.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            field = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = type_name

    one, many = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message("NUMANode", ("ID", 1, F.TYPE_INT64, one, None))
    message("TopologyInfo", ("nodes", 1, F.TYPE_MESSAGE, many, ".v1.NUMANode"))
    message("ContainerMemory", ("memory_type", 1, F.TYPE_STRING, one, None),
            ("size", 2, F.TYPE_UINT64, one, None),
            ("topology", 3, F.TYPE_MESSAGE, one, ".v1.TopologyInfo"))
    message("ContainerDevices", ("resource_name", 1, F.TYPE_STRING, one, None),
            ("device_ids", 2, F.TYPE_STRING, many, None),
            ("topology", 3, F.TYPE_MESSAGE, one, ".v1.TopologyInfo"))
    message("ContainerResources", ("name", 1, F.TYPE_STRING, one, None),
            ("devices", 2, F.TYPE_MESSAGE, many, ".v1.ContainerDevices"),
            ("cpu_ids", 3, F.TYPE_INT64, many, None),
            ("memory", 4, F.TYPE_MESSAGE, many, ".v1.ContainerMemory"))
    message("PodResources", ("name", 1, F.TYPE_STRING, one, None),
            ("namespace", 2, F.TYPE_STRING, one, None),
            ("containers", 3, F.TYPE_MESSAGE, many, ".v1.ContainerResources"))
    message("ListPodResourcesResponse",
            ("pod_resources", 1, F.TYPE_MESSAGE, many, ".v1.PodResources"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(
        "v1.ListPodResourcesResponse"))


def test_the_kubelets_answer_is_read_as_protobuf_writes_it():
    pytest.importorskip("google.protobuf")
    Response = reference_messages()
    answer = Response()
    pod = answer.pod_resources.add(name="gpushare-j-1-1-0", namespace="jhub")
    job = pod.containers.add(name="job")
    job.cpu_ids.extend([2, 3, 70000])  # packed varints the agent skips
    devices = job.devices.add(resource_name="nvidia.com/gpu",
                              device_ids=["GPU-aaaa", "GPU-bbbb"])
    devices.topology.nodes.add(ID=1)
    job.memory.add(memory_type="memory", size=2**40)
    other = answer.pod_resources.add(name="jupyter-alice", namespace="jhub")
    other.containers.add(name="notebook").devices.add(resource_name="nvidia.com/gpu.shared",
                                                      device_ids=["GPU-cccc::3"])
    other.containers.add(name="sidecar")
    answer.pod_resources.add(name="cpu-only", namespace="kube-system")
    assert decode_list(answer.SerializeToString()) == [
        PodDevices("jhub", "gpushare-j-1-1-0", {"nvidia.com/gpu": ("GPU-aaaa", "GPU-bbbb")}),
        PodDevices("jhub", "jupyter-alice", {"nvidia.com/gpu.shared": ("GPU-cccc::3",)}),
        PodDevices("kube-system", "cpu-only", {})]
    # ...and the kubelet simulator's answer is what protobuf reads (the e2e test relies on it)
    simulated = [("jhub", "p", [("c", {"nvidia.com/gpu": ["GPU-x", "GPU-y"]})])]
    parsed = Response.FromString(encode_list(simulated))
    assert [(p.namespace, p.name, [(c.name, {d.resource_name: list(d.device_ids)
                                             for d in c.devices}) for c in p.containers])
            for p in parsed.pod_resources] == simulated


def test_a_cut_or_foreign_answer_is_a_sentence_not_a_crash():
    whole = encode_list([("ns", "pod", [("c", {"nvidia.com/gpu": ["GPU-x"]})])])
    for broken in (whole[:-3], b"\x0a\xff", b"\x0b"):
        with pytest.raises(PodResourcesError, match="pod-resources answer"):
            decode_list(broken)
    assert decode_list(b"") == []


# -- 4. owners ------------------------------------------------------------------------------

def job_pod(uid, job="j-1", attempt="2", rank="1", **extra):
    labels = {"app.kubernetes.io/managed-by": "jupyter-gpushare",
              "app.kubernetes.io/component": "train-job", "gpushare.jupyter.org/job": job,
              "gpushare.jupyter.org/attempt": attempt, "gpushare.jupyter.org/rank": rank,
              **extra}
    return {"metadata": {"uid": uid, "namespace": "jhub", "name": f"gpushare-{job}-{attempt}"
                         f"-{rank}", "labels": labels}}


def notebook_pod(uid, slices):
    return {"metadata": {"uid": uid, "namespace": "jhub", "name": "jupyter-alice",
                         "labels": {"component": "singleuser-server"},
                         "annotations": {"gpushare.jupyter.org/slices": slices}}}


def test_pods_are_owned_by_their_labels():
    assert pods.owner(job_pod("U1")) == pods.PodOwner(
        "u1", "jhub", "gpushare-j-1-2-1", ({"job": "j-1", "attempt": 2},), rank=1)
    assert pods.owner(notebook_pod("U2", "s-1a, s-2b")).claims == ({"slice": "s-1a"},
                                                                    {"slice": "s-2b"})
    for nobody in (job_pod("U3", attempt="0"), job_pod("U4", attempt="x"),
                   job_pod("U5", job="bad/id"),
                   job_pod("U6", **{"app.kubernetes.io/managed-by": "someone-else"}),
                   notebook_pod("U7", ""), notebook_pod("U8", "no/slashes"),
                   {"metadata": {"uid": "U9", "name": "squatter", "namespace": "jhub"}}):
        assert pods.owner(nobody).claims == (), nobody
    assert pods.owner({"metadata": {"name": "no-uid"}}) is None
    assert len(pods.owner(notebook_pod("U10", ",".join(f"s-{i}" for i in range(20)))).claims) \
        == pods.MAX_SLICES


# -- 5. the body ----------------------------------------------------------------------------

def reading():
    return MachineReading("gpu-1", 1000.0, (
        GPUReading(0, "GPU-aaaa", "H100", 80 * 2**30, 30 * 2**30, 70.0, (
            ProcessReading(101, 20 * 2**30, 60.0), ProcessReading(300, 10 * 2**30, 10.0))),
        GPUReading(1, "GPU-bbbb", "H100", 80 * 2**30, 0, 0.0),
        GPUReading(2, "GPU-cccc", "H100", 80 * 2**30, 4 * 2**30, 20.0, (
            ProcessReading(201, 4 * 2**30, 20.0),)),
        GPUReading(3, "GPU-dddd", "H100", 80 * 2**30, 2**30, None, (), mig=(
            GPUReading(0, "MIG-eeee", "1g.10gb", 10 * 2**30, 2**30, None,
                       (ProcessReading(202, 2**30, None),)),),
            note="GPU 3 of gpu-1 has MIG on: utilization not available on MIG; memory is "
                 "reported.")))


OWNERS = {"job": pods.owner(job_pod("job-uid", rank="0")),
          "nb": pods.owner(notebook_pod("nb-uid", "s-1,s-2")),
          "other": pods.owner({"metadata": {"uid": "other", "name": "x", "namespace": "jhub"}})}
BY_UID = {o.uid: o for o in OWNERS.values()}
PIDS = {101: "job-uid", 201: "nb-uid", 202: "nb-uid", 300: "other"}
JOB, S1, S2 = {"job": "j-1", "attempt": 2}, {"slice": "s-1"}, {"slice": "s-2"}


def test_the_body_says_who_holds_each_gpu_and_whose_each_process_is():
    devices = {"job-uid": {"nvidia.com/gpu": ("GPU-aaaa", "GPU-bbbb"), "cpu": ("0",)},
               "nb-uid": {"nvidia.com/gpu.shared": ("GPU-cccc::2",),
                          "nvidia.com/mig-1g.10gb": ("MIG-eeee",)},
               "other": {"nvidia.com/gpu": ("GPU-unknown",)}}
    body = report.samples_body(reading(), PIDS, BY_UID, devices, ["a problem."])
    by_uuid = {g["uuid"]: g for g in body["gpus"]}
    # the idle GPU of the job is held all the same; the notebook's two slices pair up
    assert {u: g["held_by"] for u, g in by_uuid.items()} == {
        "GPU-aaaa": [JOB], "GPU-bbbb": [JOB], "GPU-cccc": [S1], "GPU-dddd": [S2]}
    assert by_uuid["GPU-aaaa"]["processes"] == [
        {"pid": 101, "memory": 20 * 2**30, "sm": 60.0, "owner": JOB},
        {"pid": 300, "memory": 10 * 2**30, "sm": 10.0, "owner": None}]
    assert by_uuid["GPU-dddd"]["mig"][0]["processes"] == [
        {"pid": 202, "memory": 2**30, "sm": None, "owner": S2}]
    assert body["problem"] == "a problem."

    # the pool's own parser takes it, with the claims as the agent made them
    parsed, proc_claims, gpu_claims = parse_samples(body, 1000.0)
    assert [g.uuid for g in parsed.gpus] == ["GPU-aaaa", "GPU-bbbb", "GPU-cccc", "GPU-dddd"]
    assert proc_claims == {101: ("job", "j-1", 2), 201: ("slice", "s-1"),
                           202: ("slice", "s-2")}
    assert gpu_claims["GPU-bbbb"] == [("job", "j-1", 2)]
    assert parsed.gpus[3].mig[0].processes[0].pid == 202


def test_without_the_kubelet_a_pod_holds_the_gpus_its_processes_run_on():
    body = report.samples_body(reading(), PIDS, BY_UID, None)
    assert {g["uuid"]: g["held_by"] for g in body["gpus"]} == {
        "GPU-aaaa": [JOB], "GPU-bbbb": [], "GPU-cccc": [S1], "GPU-dddd": [S2]}


def test_the_body_is_bounded():
    many = MachineReading("gpu-1", 1.0, tuple(
        GPUReading(i, f"GPU-{i}", "x" * 400, 1, 0, 0.0, tuple(
            ProcessReading(p, p, 1.0) for p in range(600 if i == 0 else 1)),
            note="n" * 300) for i in range(70)))
    body = report.samples_body(many, {}, {}, {})
    assert len(body["gpus"]) == report.MAX_GPUS
    first = body["gpus"][0]
    assert len(first["processes"]) == report.MAX_PROCESSES
    assert min(p["pid"] for p in first["processes"]) == 600 - report.MAX_PROCESSES  # largest
    assert len(first["note"]) == 255 and len(first["name"]) == 255
    assert "Only the first 64 GPUs are reported." in body["problem"]
    parse_samples(body, 1.0)  # still what the pool takes


# -- the app's options and its log ----------------------------------------------------------

def test_each_problem_is_one_log_line(caplog):
    log = logging.getLogger("test-agent-problems")
    problems = Problems(log)
    with caplog.at_level(logging.INFO, logger=log.name):
        for _ in range(5):
            problems.say("pool", "The pool cannot be reached.")
        problems.say("pool", "The pool refused the reading.")
        problems.over("pool", "Readings reach the pool again.")
        problems.over("pool", "Readings reach the pool again.")
    assert [r.getMessage() for r in caplog.records] == [
        "The pool cannot be reached.", "The pool refused the reading.",
        "Readings reach the pool again."]


def test_the_options_are_documented_and_checked(monkeypatch):
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    monkeypatch.setenv("GPUSHARE_URL", "http://proxy-public/services/gpushare/")
    agent = NodeAgent()
    agent.initialize([])
    assert agent.node_name == "gpu-7"
    assert agent.pool_url == "http://proxy-public/services/gpushare/"
    for name in NodeAgent.class_trait_names(config=True):
        assert NodeAgent.class_traits()[name].help.strip(), name
    with pytest.raises(Exception, match="sample_interval must be more than 0"):
        NodeAgent(sample_interval=0)


class DownPool(PoolClient):
    """The pool service cannot be reached (it restarts)."""

    def post_samples(self, reading, node_token=""):
        raise PoolUnreachable("the pool service at http://hub/ cannot be reached (connection "
                              "refused)")


class RefusingPool(PoolClient):
    def post_samples(self, reading, node_token=""):
        raise PoolError(403, "GPU readings are posted only by the gpushare node agent")


class TakingPool(PoolClient):
    """The pool takes every reading; what came with each is kept."""

    def post_samples(self, reading, node_token=""):
        self.taken = [*getattr(self, "taken", []), (reading["node"], node_token)]
        return {}


def test_each_reading_carries_the_pods_token_as_the_kubelet_last_renewed_it(tmp_path):
    token = tmp_path / "token"
    agent = NodeAgent(sample_interval=1, node_token_file=str(token))
    agent.initialize([])
    agent.problems = Problems(logging.getLogger("test-agent-token"))
    pool = TakingPool("http://hub/", "t")
    body = report.samples_body(reading(), {}, {}, {})
    asyncio.run(agent.post(pool, body, 0))  # no projected token: an agent per node
    token.write_text("first\n")
    asyncio.run(agent.post(pool, body, 0))
    token.write_text("renewed")
    asyncio.run(agent.post(pool, body, 0))
    assert [t for _, t in pool.taken] == ["", "first", "renewed"]


def test_a_pool_that_is_away_or_refuses_is_retried_with_backoff(caplog):
    agent = NodeAgent(sample_interval=1, max_backoff=8)
    agent.initialize([])
    # the app's own log does not propagate to caplog
    agent.problems = Problems(logging.getLogger("test-agent-post"))
    body = report.samples_body(reading(), {}, {}, {})
    with caplog.at_level(logging.INFO, logger="test-agent-post"):
        waits = []
        backoff = 0.0
        for _ in range(6):
            backoff = asyncio.run(agent.post(DownPool("http://hub/", "t"), body, backoff))
            waits.append(backoff)
        assert waits == [1, 2, 4, 8, 8, 8]
        assert asyncio.run(agent.post(RefusingPool("http://hub/", "t"), body, 8)) == 8
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "Readings are not reaching the pool: the pool service at http://hub/ cannot be "
        "reached (connection refused). Trying again, waiting up to 8 s between tries.",
        "The pool refuses this agent's readings (GPU readings are posted only by the gpushare "
        "node agent); give the agent the token of the JupyterHub service that the pool's "
        "c.GPUUsage.agent_service names (with its pod's token in "
        "/var/run/secrets/gpushare/token), or this node's in c.GPUUsage.agent_nodes. Trying "
        "again, waiting up to 8 s between tries."]


def test_a_kubelet_socket_that_is_not_there_is_a_sentence(tmp_path):
    pytest.importorskip("grpc")
    from jupyter_gpushare.agent.podresources import PodResources
    kubelet = PodResources(str(tmp_path / "kubelet.sock"), timeout=1)
    with pytest.raises(PodResourcesError, match=r"^The kubelet's pod-resources socket .* did not "
                       r"answer \(UNAVAILABLE.*mount /var/lib/kubelet/pod-resources"):
        kubelet.list()
    kubelet.close()
