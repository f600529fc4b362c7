"""Kubernetes objects of the train pool as pure functions over plain dicts (the API's JSON):
the pods of a job attempt with each rank's environment, the rendezvous Service and the
NetworkPolicy of a multi-node gang, what a job pod takes from the user's notebook pod, the
train pool's nodes, and how a pod's status reads as a job's state. No I/O; tested by
comparing whole manifests (like KubeSpawner's ``objects.py``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from dataclasses import dataclass, field
from typing import Mapping

from ...policy.model import GPU, Node
from ...trainjob import (CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, FAILED, MASTER_ADDR,
                         NVIDIA_VISIBLE_DEVICES, PENDING, RUNNING, SUCCEEDED)
from .. import launcher, ranks
from ..base import Launch

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "jupyter-gpushare"
COMPONENT = "app.kubernetes.io/component"
JOB = "gpushare.jupyter.org/job"
ATTEMPT = "gpushare.jupyter.org/attempt"
RANK = "gpushare.jupyter.org/rank"  # the pod's node rank
RANKS = "gpushare.jupyter.org/ranks"  # "first-last": the ranks a per-GPU pod runs
USER = "gpushare.jupyter.org/user"
PROJECT = "gpushare.jupyter.org/project"
SLICES = "gpushare.jupyter.org/slices"  # a notebook pod's build slices ("s-1,s-2"): the node agent reads it
LENT = "gpushare.jupyter.org/lent-gpus"  # a job pod on a build node: the GPUs lent to it ("0,1")
POD_PREFIX = "gpushare-"
JOB_SELECTOR = f"{MANAGED_BY}={MANAGER},{COMPONENT}=train-job"
NODE_NAME_FIELD = "metadata.name"
SA_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"

# What a job must not inherit from a notebook pod: the hub's and the server's credentials,
# and the build slice's GPU settings (a job gets whole GPUs from the device plugin).
SECRET_ENV = ("JUPYTERHUB_*", "JPY_*", "*TOKEN*", "*SECRET*", "*PASSWORD*", "*_KEY")
SLICE_ENV = ("GPUSHARE_SLICE_*", NVIDIA_VISIBLE_DEVICES, CUDA_VISIBLE_DEVICES,
             CUDA_DEVICE_ORDER, "TF_FORCE_GPU_ALLOW_GROWTH", "XLA_*", "CUPY_GPU_MEMORY_LIMIT",
             "PYTORCH_CUDA_ALLOC_CONF", "PYTHONSTARTUP", "MEM_*", "CPU_*")

# KubeSpawner's home volume claims: labelled as storage, annotated with the exact user name
# (and the server's name, for a named server's own claim).
HOME_CLAIMS = "component=singleuser-storage"
CLAIM_USER = "hub.jupyter.org/username"
CLAIM_SERVER = "hub.jupyter.org/servername"

EXTENDED_RESOURCE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]"
                               r"([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")  # domain/name
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?\Z")


def label_value(text: str) -> str:
    """``text`` as a label value: itself when valid, else its safe characters and a short
    hash (the exact text goes into an annotation of the same name)."""
    if _LABEL_VALUE.match(text):
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("._-")[:50].strip("._-")
    return f"{safe}-{digest}" if safe else digest


def pod_name(job_id: str, attempt: int, rank: int) -> str:
    return f"{POD_PREFIX}{job_id}-{attempt}-{rank}".lower()


@dataclass(frozen=True)
class PodTemplate:
    """What a job pod takes from the user's notebook: image, home volume, security context,
    environment. ``source`` says where it came from, for the log."""

    image: str
    working_dir: str
    env: tuple[Mapping, ...] = ()
    volumes: tuple[Mapping, ...] = ()
    volume_mounts: tuple[Mapping, ...] = ()
    pod_security_context: Mapping = field(default_factory=dict)
    security_context: Mapping = field(default_factory=dict)
    image_pull_secrets: tuple[Mapping, ...] = ()
    image_pull_policy: str = ""
    source: str = "configuration"


@dataclass(frozen=True)
class PodSettings:
    """The backend's configuration as the manifests need it."""

    namespace: str
    grace_s: int
    gpu_resource: str = "nvidia.com/gpu"
    tolerations: tuple[Mapping, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    cpu_per_gpu: float = 0.0
    memory_per_gpu_gib: float = 0.0
    extra_pod_config: Mapping = field(default_factory=dict)
    launcher_python: str = "python3"  # runs a per-GPU pod's ranks (launcher.py)


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks meet rank 0: ``address`` as the other ranks reach it, or "" for rank
    0's own pod IP (``status.podIP``, known to the pod itself before anyone else)."""

    address: str
    port: int = ranks.DEFAULT_PORT


LOCAL = Rendezvous("127.0.0.1")
"""A gang on one node: its ranks share the pod's network."""


def rendezvous_name(job_id: str, attempt: int) -> str:
    """The name of a gang's Service and NetworkPolicy."""
    return f"{POD_PREFIX}{job_id}-{attempt}".lower()


def service_address(job_id: str, attempt: int, namespace: str,
                    cluster_domain: str = "cluster.local") -> str:
    """The DNS name of the gang's headless Service: rank 0's pod IP."""
    return f"{rendezvous_name(job_id, attempt)}.{namespace}.svc.{cluster_domain}"


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def notebook_template(pod: Mapping, *, drop_env=SECRET_ENV + SLICE_ENV,
                      drop_volumes=("gpushare-startup",)) -> PodTemplate:
    """The template of a KubeSpawner notebook pod (its first container is the server).
    Nothing secret passes: no secret or service-account volume, no variable from a secret,
    none named like a credential; nor the build slice's GPU settings."""
    spec = pod.get("spec") or {}
    container = (spec.get("containers") or [{}])[0]
    dropped = set(drop_volumes)
    volumes = []
    for v in spec.get("volumes") or []:
        sources = (v.get("projected") or {}).get("sources") or []
        if ("secret" in v or v.get("name") in dropped
                or any("serviceAccountToken" in s for s in sources)):
            dropped.add(v.get("name"))
        else:
            volumes.append(v)
    mounts = [m for m in container.get("volumeMounts") or []
              if m.get("name") not in dropped
              and not m.get("mountPath", "").startswith(SA_TOKEN_PATH)]
    env = [e for e in container.get("env") or []
           if not _matches(e.get("name", ""), drop_env)
           and "secretKeyRef" not in (e.get("valueFrom") or {})]
    home = container.get("workingDir") or _home_mount(mounts) or "/home/jovyan"
    return PodTemplate(
        image=container.get("image", ""), working_dir=home, env=tuple(env),
        volumes=tuple(volumes), volume_mounts=tuple(mounts),
        pod_security_context=dict(spec.get("securityContext") or {}),
        security_context=dict(container.get("securityContext") or {}),
        image_pull_secrets=tuple(spec.get("imagePullSecrets") or ()),
        image_pull_policy=container.get("imagePullPolicy", ""),
        source=f"notebook pod {pod.get('metadata', {}).get('name', '?')}")


def _home_mount(mounts) -> str | None:
    for m in mounts:
        if m.get("mountPath", "").startswith("/home/"):
            return m["mountPath"]
    return None


def claim_of(claims, user: str, wanted: str) -> str | None:
    """The name of the claim KubeSpawner made for ``user``'s default server, among
    ``claims`` (PVC objects); ``wanted`` (the configured name) decides among several, and
    None when there is none of theirs. A claim is theirs by its annotation, never by its
    name: a name made from a template can be another user's."""
    mine = sorted(c["metadata"]["name"] for c in claims
                  if (c["metadata"].get("annotations") or {}).get(CLAIM_USER) == user
                  and not (c["metadata"].get("annotations") or {}).get(CLAIM_SERVER))
    if len(mine) == 1:
        return mine[0]
    return wanted if wanted in mine else None


def expand(value, **names):
    """``{username}``-style templates in every string of a JSON-like value."""
    if isinstance(value, str):
        return value.format(**names)
    if isinstance(value, list):
        return [expand(v, **names) for v in value]
    if isinstance(value, dict):
        return {k: expand(v, **names) for k, v in value.items()}
    return value


def job_pods(launch: Launch, template: PodTemplate, settings: PodSettings,
             rendezvous: Rendezvous = LOCAL) -> list[dict]:
    """One pod per node of the attempt's placement (node rank 0 on the first node by name),
    each pinned to its node by required node affinity, so the real scheduler still checks
    that the GPUs are free there. A pod runs its node's rank, or with ``per_gpu`` all its
    node's ranks under ``launcher.py``; each rank gets ``ranks.rank_env``."""
    lay = ranks.layout(launch.placement, launch.per_gpu)
    return [_pod(launch, template, settings, lay, node_rank, rendezvous)
            for node_rank in range(len(lay.nodes))]


def _pod(launch: Launch, template: PodTemplate, settings: PodSettings, lay: ranks.Layout,
         node_rank: int, rendezvous: Rendezvous) -> dict:
    node, gpus = lay.nodes[node_rank]
    mine = lay.on_node(node_rank)
    labels = {**settings.labels, MANAGED_BY: MANAGER, COMPONENT: "train-job",
              JOB: launch.job_id, ATTEMPT: str(launch.attempt), RANK: str(node_rank),
              USER: label_value(launch.user), PROJECT: label_value(launch.project)}
    annotations = {**settings.annotations, USER: launch.user, PROJECT: launch.project}
    command = list(launch.command)
    if lay.per_gpu:
        annotations[RANKS] = f"{mine[0].rank}-{mine[-1].rank}"
        command = [settings.launcher_python, "-c", launcher_source(), "--grace",
                   str(settings.grace_s), "--", *command]
    limits = {settings.gpu_resource: str(gpus)}
    requests = {}
    if settings.cpu_per_gpu:
        requests["cpu"] = f"{round(settings.cpu_per_gpu * gpus * 1000)}m"
    if settings.memory_per_gpu_gib:
        requests["memory"] = limits["memory"] = \
            f"{round(settings.memory_per_gpu_gib * gpus * 1024)}Mi"
    resources = {"limits": limits, **({"requests": requests} if requests else {})}
    container = {
        "name": "job",
        "image": template.image,
        # The checkpoint directory exists before the job starts, as on the local backend.
        "command": ["/bin/sh", "-c", 'mkdir -p "$GPUSHARE_CHECKPOINT_DIR" && exec "$@"',
                    "gpushare-job", *command],
        "workingDir": launch.workdir or template.working_dir,
        "env": _env(launch, template, lay, mine[0], rendezvous),
        "resources": resources,
    }
    if template.image_pull_policy:
        container["imagePullPolicy"] = template.image_pull_policy
    if template.volume_mounts:
        container["volumeMounts"] = [dict(m) for m in template.volume_mounts]
    if template.security_context:
        container["securityContext"] = dict(template.security_context)
    spec = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": settings.grace_s,
        # A job never holds the hub's (or any) service account token.
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [
                {"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}]}]}}},
        "containers": [container],
    }
    if settings.tolerations:
        spec["tolerations"] = [dict(t) for t in settings.tolerations]
    if template.volumes:
        spec["volumes"] = [dict(v) for v in template.volumes]
    if template.pod_security_context:
        spec["securityContext"] = dict(template.pod_security_context)
    if template.image_pull_secrets:
        spec["imagePullSecrets"] = [dict(s) for s in template.image_pull_secrets]
    spec.update(settings.extra_pod_config)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name(launch.job_id, launch.attempt, node_rank),
                         "namespace": settings.namespace, "labels": labels,
                         "annotations": annotations},
            "spec": spec}


def on_lent_gpus(pod: dict, gpus: tuple[int, ...], settings: PodSettings,
                 resources: Mapping[str, int], per_device: Mapping[str, int] | None = None,
                 tolerations: tuple[Mapping, ...] = ()) -> dict:
    """``pod`` made for a build node whose ``gpus`` (indexes in the pool's count) are lent to
    its job: it requests them as the build node's device plugin advertises GPUs
    (``resources`` per GPU, ``per_device`` limits as they are) instead of train GPUs,
    tolerates the build pool's taints, and names them in an annotation (the service knows
    them again after a restart)."""
    container = pod["spec"]["containers"][0]
    limits = {k: v for k, v in container["resources"]["limits"].items()
              if k != settings.gpu_resource}
    limits.update({name: str(count * len(gpus)) for name, count in resources.items()})
    limits.update({name: str(count) for name, count in (per_device or {}).items()})
    container["resources"]["limits"] = limits
    if tolerations:
        pod["spec"]["tolerations"] = list(pod["spec"].get("tolerations") or []) + \
            [dict(t) for t in tolerations]
    pod["metadata"]["annotations"][LENT] = ",".join(str(g) for g in gpus)
    return pod


def _env(launch: Launch, template: PodTemplate, lay: ranks.Layout, first: ranks.Rank,
         rendezvous: Rendezvous) -> list[dict]:
    # The rank's variables refer to MASTER_ADDR by Kubernetes' $(VAR), so that rank 0 may
    # take its own pod IP from the downward API before anyone knows it.
    rank = ranks.rank_env(lay, first, f"$({MASTER_ADDR})", rendezvous.port)
    del rank[MASTER_ADDR]
    ours = {**{k: v for k, v in launch.env.items() if not _matches(k.upper(), ("*TOKEN*",))},
            "PYTHONUNBUFFERED": "1",  # the log follows the job
            "GPUSHARE_JOB_ID": launch.job_id, "GPUSHARE_ATTEMPT": str(launch.attempt),
            "GPUSHARE_CHECKPOINT_DIR": launch.checkpoint_dir}
    master = ({"name": MASTER_ADDR, "value": rendezvous.address} if rendezvous.address else
              {"name": MASTER_ADDR, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    inherited = [dict(e) for e in template.env
                 if e.get("name") not in ours and e.get("name") not in rank
                 and e.get("name") != MASTER_ADDR]
    return (inherited + [{"name": k, "value": v} for k, v in ours.items()] + [master]
            + [{"name": k, "value": v} for k, v in rank.items()])


def launcher_source() -> str:
    """launcher.py's text, which a per-GPU pod runs as ``python3 -c``."""
    with open(launcher.__file__, encoding="utf-8") as f:
        return f.read()


def _meta(launch: Launch, settings: PodSettings, owner: Mapping) -> dict:
    """Metadata of a gang's rendezvous objects: deleted with rank 0's pod, which owns them."""
    return {"name": rendezvous_name(launch.job_id, launch.attempt),
            "namespace": settings.namespace,
            "labels": {**settings.labels, MANAGED_BY: MANAGER, COMPONENT: "train-job",
                       JOB: launch.job_id, ATTEMPT: str(launch.attempt),
                       USER: label_value(launch.user), PROJECT: label_value(launch.project)},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                 "name": owner["metadata"]["name"],
                                 "uid": owner["metadata"]["uid"]}]}


def _gang_selector(launch: Launch) -> dict:
    return {MANAGED_BY: MANAGER, COMPONENT: "train-job", JOB: launch.job_id,
            ATTEMPT: str(launch.attempt)}


def rendezvous_service(launch: Launch, settings: PodSettings, owner: Mapping,
                       port: int = ranks.DEFAULT_PORT) -> dict:
    """The headless Service of a multi-node gang: its DNS name (``service_address``) is rank
    0's pod IP, published before the pod is ready (ranks start at once)."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(launch, settings, owner),
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": {**_gang_selector(launch), RANK: "0"},
                     "ports": [{"name": "rendezvous", "port": port, "targetPort": port,
                                "protocol": "TCP"}]}}


def gang_network_policy(launch: Launch, settings: PodSettings, owner: Mapping) -> dict:
    """Lets the pods of one gang, and only them, reach each other (all ports: NCCL and
    Gloo open their own). hub_config/kubernetes-netpol.yaml lets nothing else in."""
    gang = {"matchLabels": _gang_selector(launch)}
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": _meta(launch, settings, owner),
            "spec": {"podSelector": gang, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": gang}]}]}}


# -- reading objects ----------------------------------------------------------------------

def train_nodes(nodes, gpu_resource: str, held: Mapping[str, int] | None = None,
                keep_labels=("nvidia.com/gpu.product",)) -> list[Node]:
    """The train pool from Node objects: allocatable whole GPUs. A node that is cordoned or
    not Ready keeps only the GPUs its running jobs hold (``held``, milli-GPUs), so nothing
    new is placed there while those jobs still count."""
    out = []
    for n in nodes:
        name = n["metadata"]["name"]
        gpus = _quantity_int((n.get("status") or {}).get("allocatable", {}).get(gpu_resource))
        if not usable(n):
            gpus = min(gpus, -(-(held or {}).get(name, 0) // GPU))
        labels = n["metadata"].get("labels") or {}
        out.append(Node(name, gpus, labels={k: v for k, v in labels.items() if k in keep_labels}))
    return sorted(out, key=lambda node: node.name)


def usable(node: Mapping) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _quantity_int(value) -> int:
    try:
        return max(0, int(str(value)))
    except (TypeError, ValueError):
        return 0


GONE = "gone"  # a pod's phase when it was never made, was deleted, or its node left
ENDED = (SUCCEEDED, FAILED)  # phases a pod never leaves


@dataclass(frozen=True)
class PodState:
    """A job pod as the backend reads it: ``phase`` is Kubernetes' in the job's words
    (``PENDING``, ``RUNNING``, ``SUCCEEDED`` or ``FAILED``), or ``GONE``."""

    phase: str
    exit_code: int | None = None
    reason: str = ""


def pod_state(pod: Mapping) -> PodState:
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    if phase == "Succeeded":
        return PodState(SUCCEEDED, 0)
    if phase == "Failed":
        term = _terminated(status)
        code = term.get("exitCode") if term else None
        why = (term or {}).get("reason") or status.get("reason") or ""
        message = status.get("message") or ""
        if code is not None:
            text = f"exited with code {code}" + (f" ({why})" if why not in ("", "Error") else "")
        else:
            text = FAILED + (f": {message or why}" if message or why else "")
        return PodState(FAILED, code, text)
    if phase == "Running":
        return PodState(RUNNING)
    return PodState(PENDING)


def has_log(pod: Mapping) -> bool:
    """Whether a container of the pod has started, so that its log can be read (before that
    the API server refuses: "container ... is waiting to start")."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending"):
        return True
    started = {"running", "terminated"}  # not a job state: a container's, in Kubernetes' words
    return any(started & set(cs.get("state") or {})
               or "terminated" in (cs.get("lastState") or {})
               for cs in status.get("containerStatuses") or [])


def _terminated(status: Mapping) -> Mapping | None:
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return term
    return None


def waiting_reason(pod: Mapping, event: Mapping | None) -> str:
    """Why a pod does not run yet, in Kubernetes' words: its latest event (the scheduler's
    "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."), else its conditions and
    container states; "" when it runs."""
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "Pending"):
        return ""
    if event and event.get("message"):
        return event["message"]
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("message"):
            return c["message"]
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return ": ".join(x for x in (waiting["reason"], waiting.get("message")) if x)
    return "the pod is pending" if (pod.get("spec") or {}).get("nodeName") else \
        "waiting for the Kubernetes scheduler"


def newest_event(events) -> Mapping | None:
    """The most recent of a pod's events (warnings win a tie)."""
    def when(e):
        return (e.get("lastTimestamp") or e.get("eventTime") or
                (e.get("metadata") or {}).get("creationTimestamp") or "",
                e.get("type") == "Warning")
    return max(events, key=when, default=None)
