"""The Kubernetes backend's options: traitlets whose help texts are its documentation
(``--help-all``), and the pod settings they make."""

from __future__ import annotations

import math
import os

from traitlets import (Bool, Dict, Enum, Float, Integer, List, TraitError, Unicode, default,
                       validate)

from ..base import Backend
from ..ranks import DEFAULT_PORT
from . import objects as k8s
from .api import default_namespace


class KubernetesOptions(Backend):
    """What an administrator sets about the train pool on Kubernetes."""

    kubeconfig = Unicode("", help="""
        Path of a kubeconfig for the Kubernetes API. Empty: the service account of the pod
        the service runs in (the hub pod of zero-to-jupyterhub), else $KUBECONFIG or
        ~/.kube/config.
        """).tag(config=True)

    namespace = Unicode(help="""
        Namespace of the job pods (and of the notebook pods whose image and volumes jobs
        take). Default: the namespace the service runs in, else "default".
        """).tag(config=True)

    @default("namespace")
    def _default_namespace(self):
        return default_namespace()

    train_node_selector = Dict({"gpushare.jupyter.org/pool": "train"}, help="""
        Labels of the train pool's nodes: every node with all of them is in the pool, with
        its allocatable gpu_resource as its GPUs. Nodes of the build pool must not match.
        """).tag(config=True)

    gpu_resource = Unicode("nvidia.com/gpu", help="""
        Extended resource of one whole GPU on train nodes, as the NVIDIA device plugin
        advertises it (without renaming); job pods request their GPUs as this.
        """).tag(config=True)

    tolerations = List(Dict(), [{"key": "nvidia.com/gpu", "operator": "Exists",
                                 "effect": "NoSchedule"}], help="""
        Tolerations of job pods, for the taints that keep other pods off GPU nodes.
        """).tag(config=True)

    lent_gpu_resources = Dict(help="""
        With PoolService.lend_build_gpus (required then): what a job pod on a build node
        asks the build nodes' device plugin for, per build GPU lent to it (multiplied by
        its GPUs), in the resource the slices use, so that Kubernetes counts lent GPUs and
        slices together and never binds a notebook pod where a job still holds what its
        slice needs: {"nvidia.com/gpu": 1} where build nodes advertise whole GPUs
        (slice_mode "exclusive", or HAMi with lent_device_limits); {"nvidia.com/gpu.shared":
        4} with time-slicing of 4 replicas, only on build nodes of one GPU each (the device
        plugin picks which replicas a pod gets, of any GPU of the node) and with the
        plugin's failRequestsGreaterThanOne off there.
        """).tag(config=True)

    lent_device_limits = Dict(help="""
        With PoolService.lend_build_gpus: limits of a job pod on a build node that hold for
        each of its devices, as they are (not multiplied), e.g. HAMi's
        {"nvidia.com/gpumem-percentage": 100}, which keeps slices off a lent GPU.
        """).tag(config=True)

    @validate("lent_gpu_resources", "lent_device_limits")
    def _check_lent_gpu_resources(self, proposal):
        value, name = proposal.value, f"{type(self).__name__}.{proposal.trait.name}"
        for resource, count in value.items():
            if not isinstance(resource, str) or not k8s.EXTENDED_RESOURCE.match(resource):
                raise TraitError(f"{name} names {str(resource)[:80]!r}, which is not an "
                                 f"extended resource name like 'nvidia.com/gpu.shared'.")
            if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 1000:
                raise TraitError(f"{name}[{resource!r}] must be a whole number from 1 to "
                                 f"1000, not {str(count)[:40]!r}.")
        return value

    build_node_selector = Dict({"gpushare.jupyter.org/pool": "build"}, help="""
        With PoolService.lend_build_gpus: labels of the build pool's nodes (as
        GPUShareKubeSpawner.build_node_selector has them). The backend watches those nodes:
        the GPUs of a build node it does not find, or that is cordoned or not Ready, are
        not lent, and a job on a build node that leaves the cluster is requeued.
        """).tag(config=True)

    lent_tolerations = List(Dict(), help="""
        With PoolService.lend_build_gpus, tolerations added to job pods on build nodes, for
        a taint that keeps other pods off the build pool (as GPUShareKubeSpawner's
        build_tolerations); the tolerations above are kept too.
        """).tag(config=True)

    use_notebook_pod = Bool(True, help="""
        Run a job in the image, home volume, security context and (non-secret) environment
        of its user's running notebook pod (found by KubeSpawner's labels), so that code
        written in the notebook finds its files and packages. Without such a pod (or with
        this off), image, volumes, volume_mounts, pod_security_context and
        security_context below are used. Never copied: secrets, service account tokens,
        the build slice's GPU settings. The home volume must be ReadWriteMany (NFS, ...)
        for a job on a train node to mount it while the notebook has it mounted too.
        """).tag(config=True)

    notebook_selector = Unicode("component=singleuser-server", help="""
        Label selector of notebook pods (KubeSpawner's component label).
        """).tag(config=True)

    image = Unicode("quay.io/jupyter/base-notebook:latest", help="""
        Image of job pods when the user has no notebook pod to take it from.
        """).tag(config=True)

    home_dir = Unicode("/home/jovyan", help="""
        Working directory of job pods (when the job names none) and the {home} of
        PoolService.checkpoint_dir_template, when the user has no notebook pod to take it
        from.
        """).tag(config=True)

    volumes = List(Dict(), help="""
        Volumes of job pods when the user has no notebook pod, as in a pod spec; {username}
        is the user's name as KubeSpawner writes it under slug_scheme ({safe_username},
        {escaped_username} and {unescaped_username} too), so
        [{"name": "home", "persistentVolumeClaim": {"claimName": "claim-{username}"}}]
        names zero-to-jupyterhub's home volume. A claim whose name depends on the user is
        mounted only if KubeSpawner made it for that very user (see verify_claims).
        """).tag(config=True)

    slug_scheme = Enum(["safe", "escape"], "safe", help="""
        How {username} is written in volumes and volume_mounts: as the hub's
        c.KubeSpawner.slug_scheme does ("safe", KubeSpawner 7's default, or "escape", the
        scheme of KubeSpawner < 7). The two can name different users alike, so this must be
        the hub's.
        """).tag(config=True)

    verify_claims = Bool(True, help="""
        Mount a home volume claim whose name depends on the user only if it is KubeSpawner's
        claim for that very user (its annotation hub.jupyter.org/username, on a claim of the
        user's default server), whatever its name: under another slug scheme, or kept from
        KubeSpawner < 7, a name made from a template can be another user's claim. A user
        without one is told to start their notebook server once. Off: trust the names
        volumes expand to.
        """).tag(config=True)

    volume_mounts = List(Dict(), help="""
        Volume mounts of the job container when the user has no notebook pod, e.g.
        [{"name": "home", "mountPath": "/home/jovyan"}]; {username} is expanded.
        """).tag(config=True)

    pod_security_context = Dict({"fsGroup": 100}, help="""
        Pod securityContext of job pods when the user has no notebook pod.
        """).tag(config=True)

    security_context = Dict({"runAsUser": 1000, "runAsGroup": 100, "runAsNonRoot": True,
                             "allowPrivilegeEscalation": False}, help="""
        Container securityContext of job pods when the user has no notebook pod.
        """).tag(config=True)

    cpu_per_gpu = Float(0.0, help="""
        CPU cores a job pod requests per GPU (0: none requested).
        """).tag(config=True)

    memory_per_gpu = Float(0.0, help="""
        Memory in GiB a job pod requests, and is limited to, per GPU (0: none).
        """).tag(config=True)

    extra_labels = Dict(help="Labels added to every job pod.").tag(config=True)
    extra_annotations = Dict(help="Annotations added to every job pod.").tag(config=True)
    extra_pod_config = Dict(help="""
        Fields merged into every job pod's spec (camelCase, as in a manifest), e.g.
        {"runtimeClassName": "nvidia", "priorityClassName": "train"}.
        """).tag(config=True)

    grace_period = Integer(help="""
        terminationGracePeriodSeconds of job pods. Default: PoolService.grace_period.
        """).tag(config=True)

    @default("grace_period")
    def _default_grace(self):
        return math.ceil(getattr(self.parent, "grace_period", 30))

    state_dir = Unicode(help="""
        Directory of the logs of ended attempts (read from the API before their pods are
        deleted) and of their exit records. Default: PoolService.state_dir/kubernetes.
        """).tag(config=True)

    @default("state_dir")
    def _default_state_dir(self):
        return os.path.abspath("gpushare-kubernetes")

    @validate("state_dir")
    def _absolute_state_dir(self, proposal):
        return os.path.abspath(os.path.expanduser(proposal.value))

    api_retry_timeout = Float(30.0, help="""
        Seconds a request to the Kubernetes API is tried again while it fails in a way that
        may pass (no connection, 429, 5xx) before the backend gives up on it.
        """).tag(config=True)

    watch_timeout = Integer(300, help="""
        Seconds after which the API server ends a watch and the backend starts the next one.
        """).tag(config=True)

    rendezvous = Enum(["dns", "pod-ip"], "dns", help="""
        How the ranks of a multi-node job reach rank 0 (MASTER_ADDR). "dns": the name of
        the gang's headless Service, which the cluster's DNS resolves to rank 0's pod IP.
        "pod-ip": rank 0's pod IP itself, for clusters without DNS; then rank 0's pod is
        created first and the other ranks once it has its IP. Either way the gang gets its
        Service and a NetworkPolicy that lets its pods, and only them, reach each other.
        """).tag(config=True)

    rendezvous_port = Integer(DEFAULT_PORT, min=1, max=65535, help="""
        MASTER_PORT of every job: the port rank 0 listens on for the other ranks (each pod
        has its own IP, so every job may use the same).
        """).tag(config=True)

    cluster_domain = Unicode("cluster.local", help="""
        The cluster's DNS domain, for the rendezvous Service's full name.
        """).tag(config=True)

    launcher_python = Unicode("python3", help="""
        The Python of job images that runs the ranks of a per-GPU job's pod (a script of
        the standard library; jupyter-gpushare need not be installed in the image).
        """).tag(config=True)

    def pod_settings(self) -> k8s.PodSettings:
        return k8s.PodSettings(
            namespace=self.namespace, grace_s=self.grace_period, gpu_resource=self.gpu_resource,
            tolerations=tuple(self.tolerations), labels=dict(self.extra_labels),
            annotations=dict(self.extra_annotations), cpu_per_gpu=self.cpu_per_gpu,
            memory_per_gpu_gib=self.memory_per_gpu, extra_pod_config=dict(self.extra_pod_config),
            launcher_python=self.launcher_python)

    def configured_template(self, user: str) -> k8s.PodTemplate:
        """A job pod's template when the user has no notebook pod to take it from."""
        names = user_names(user, self.slug_scheme)
        return k8s.PodTemplate(
            image=self.image, working_dir=self.home_dir,
            volumes=tuple(k8s.expand(self.volumes, **names)),
            volume_mounts=tuple(k8s.expand(self.volume_mounts, **names)),
            pod_security_context=dict(self.pod_security_context),
            security_context=dict(self.security_context))


def user_names(user: str, scheme: str = "safe") -> dict[str, str]:
    """The names KubeSpawner's templates know for the user's default server, as its
    ``_expand_user_properties`` makes them under ``scheme``."""
    from kubespawner.slugs import escape_slug, safe_slug  # when needed: it loads KubeSpawner
    safe, escaped = safe_slug(user, max_length=48), escape_slug(user)
    username = safe if scheme == "safe" else escaped
    return {"username": username, "unescaped_username": user, "safe_username": safe,
            "escaped_username": escaped, "servername": "", "user_server": username,
            "safe_user_server": safe, "escaped_user_server": escaped}
