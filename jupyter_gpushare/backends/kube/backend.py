"""Train jobs as pods on a Kubernetes train pool.

The pool service decides admission, quotas, preemption and placement; Kubernetes runs the
pods. An attempt is one pod per node of its placement (a gang: all created, or none left),
pinned to its node by required node affinity, requesting the node's share of whole GPUs
(``nvidia.com/gpu``; the device plugin sets ``CUDA_VISIBLE_DEVICES``), in the image, home
volume, security context and environment of the user's notebook pod.

Four reflectors (reflector.py) keep what the backend reads: our job pods, the train pool's
nodes, the namespace's pod events and the users' notebook pods. ``poll`` judges each attempt
from the cache: every pod Succeeded → succeeded; one Failed → failed with its exit code; a
pod deleted by someone else, or on a node that left the pool → lost (the service requeues).

An attempt's output is rank 0's log, followed from the API into
``state_dir/<job>/<attempt>.log`` while it runs (``logfile.CappedLog``: at most ``log_limit``
bytes, its beginning and its latest output) and read from there; ``<attempt>.exit`` records the
end before the pods are deleted. A follow that breaks (the API server restarts, a watch
timeout) starts again from the beginning of the pod's log, which rewrites the same bytes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import math
import os
import time
from dataclasses import dataclass

from traitlets import Bool, Dict, Enum, Float, Integer, List, Unicode, default, validate

from ...policy.model import GPU, Node, gpus_text
from .. import logfile
from ..base import Backend, BackendError, Exit, Handle, Launch, private_dir
from . import objects as k8s
from .api import KubeAPI, KubeError, default_namespace, make_client
from .reflector import Reflector

NOTEBOOK_USER = "hub.jupyter.org/username"  # KubeSpawner's annotation: the exact name
NOTEBOOK_SERVER = "hub.jupyter.org/servername"
FOLLOW_READ_TIMEOUT_S = 600  # a silent job's log is followed anew after this
DELETE_RETRY_S = 5.0
ARCHIVE_WAIT_S = 2.0


@dataclass
class _Attempt:
    job_id: str
    attempt: int
    pods: tuple[str, ...]
    placement: dict[str, int]
    created_at: float  # time.monotonic() when its pods existed; -inf when adopted
    stopping: bool = False
    archiver: asyncio.Task | None = None

    @property
    def key(self):
        return (self.job_id, self.attempt)


class KubernetesBackend(Backend):
    """Runs each train job as pods on the nodes of a Kubernetes train pool."""

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

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.api: KubeAPI | None = None
        self.pods = self.node_cache = self.events = self.notebooks = None
        self._running: dict[tuple[str, int], _Attempt] = {}
        self._ended: dict[str, k8s.PodState] = {}  # terminal states seen before a poll
        self._seen: set[str] = set()  # pods of running attempts the watch has shown
        self._watched: set[str] = set()  # the pods of running attempts
        self._doomed: dict[str, tuple[int | None, float]] = {}  # pod -> (grace, last try)
        self._tasks: set[asyncio.Task] = set()
        self._winding: dict[tuple[str, int], asyncio.Task] = {}  # ended: log kept, pods deleted
        self._last_nodes: list[Node] = []
        self._ready_lock: asyncio.Lock | None = None

    # --- the connection and the caches ---

    async def _ready(self) -> None:
        """Connect and wait until pods and nodes are listed (once; later calls return)."""
        if self._ready_lock is None:
            self._ready_lock = asyncio.Lock()
        async with self._ready_lock:
            if self.api is None:
                private_dir(self.state_dir)  # kept logs of every user's jobs
                self.api = KubeAPI(await make_client(self.kubeconfig), self.api_retry_timeout,
                                   self.log)
                core, ns = self.api.core, self.namespace
                watch = functools.partial(Reflector, log=self.log, timeout_s=self.watch_timeout)
                self.pods = watch(f"job pods in {ns}", functools.partial(
                    core.list_namespaced_pod, ns, label_selector=k8s.JOB_SELECTOR),
                    on_event=self._pod_event).start()
                self.node_cache = watch("train nodes", functools.partial(
                    core.list_node, label_selector=self._node_selector())).start()
                self.events = watch(f"pod events in {ns}", functools.partial(
                    core.list_namespaced_event, ns,
                    field_selector="involvedObject.kind=Pod")).start()
                self.notebooks = watch(f"notebook pods in {ns}", functools.partial(
                    core.list_namespaced_pod, ns, label_selector=self.notebook_selector)).start()
        for reflector in (self.pods, self.node_cache):
            if not await reflector.wait_synced(self.api_retry_timeout):
                error = reflector.last_error
                if isinstance(error, KubeError) and error.status in (401, 403):
                    said = error.message.split(": ", 1)[-1].rstrip(".")
                    raise BackendError(
                        f"The pool service may not list the {reflector.what} (Kubernetes "
                        f"said: {said}); an administrator must grant it the rules of "
                        f"hub_config/kubernetes-rbac.yaml.")
                detail = f" ({str(error).splitlines()[0]})" if error else ""
                raise BackendError(f"The Kubernetes API did not list the {reflector.what} "
                                   f"within {self.api_retry_timeout:g} s{detail}; the job can "
                                   f"be submitted again when it answers.")

    def _node_selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.train_node_selector.items()))

    def _pod_event(self, kind: str, pod: dict) -> None:
        # A pod may appear, end and be deleted between two polls: remember that it was
        # there, and how it ended.
        name = pod["metadata"]["name"]
        if name not in self._watched:
            return
        self._seen.add(name)
        state = k8s.pod_state(pod)
        if state.phase in ("succeeded", "failed"):
            self._ended[name] = state

    def nodes(self) -> list[Node]:
        if self.node_cache is not None and self.node_cache.synced.is_set():
            held: dict[str, int] = {}
            for a in self._running.values():
                for node, milli in a.placement.items():
                    held[node] = held.get(node, 0) + milli
            self._last_nodes = k8s.train_nodes(self.node_cache.objects.values(),
                                               self.gpu_resource, held)
        elif not self._last_nodes and not _in_event_loop():
            # The service checks quotas against the pool before its event loop runs.
            self._last_nodes = asyncio.run(self._list_nodes_once())
        return list(self._last_nodes)

    async def _list_nodes_once(self) -> list[Node]:
        api = KubeAPI(await make_client(self.kubeconfig), self.api_retry_timeout, self.log)
        try:
            body = await api.json("list train nodes", api.core.list_node,
                                  label_selector=self._node_selector())
        except KubeError as e:
            self.log.error("The train pool's nodes cannot be listed: %s", e)
            return []
        finally:
            await api.close()
        return k8s.train_nodes(body.get("items") or [], self.gpu_resource)

    # --- start ---

    async def start(self, launch: Launch) -> Handle:
        await self._ready()
        key = (launch.job_id, launch.attempt)
        if key in self._running:
            raise BackendError(f"Attempt {launch.attempt} of job {launch.job_id} is already "
                               "running.")
        self._check_placement(launch.placement)
        template = self._template(launch.user)
        if template.source == "configuration":
            template = await self._own_claims(template, launch.user)
        pods = k8s.job_pods(launch, template, self._settings())
        results = await asyncio.gather(*(self._create(p) for p in pods), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            created = [p["metadata"]["name"] for p, r in zip(pods, results)
                       if not isinstance(r, BaseException)]
            await asyncio.gather(*(self._delete(name, 0) for name in created))
            if not isinstance(failed[0], KubeError):
                raise failed[0]
            raise BackendError(self._sentence(failed[0])) from None
        names = tuple(p["metadata"]["name"] for p in pods)
        self._watched.update(names)
        self._running[key] = a = _Attempt(launch.job_id, launch.attempt, names,
                                          dict(launch.placement), time.monotonic())
        a.archiver = self._spawn(self._follow_log(a))
        self.log.info("Started attempt %d of job %s as pod(s) %s (%s from the %s)",
                      launch.attempt, launch.job_id, ", ".join(names), template.image,
                      template.source)
        return Handle(launch.job_id, launch.attempt, {
            "namespace": self.namespace, "pods": list(names), "placement": dict(launch.placement)})

    def _check_placement(self, placement) -> None:
        known = self.node_cache.objects
        if not placement:
            raise BackendError("The job has no placement: it was not given any GPU.")
        for node, milli in placement.items():
            if node not in known:
                raise BackendError(f"Node {node} is not in the Kubernetes train pool.")
            if milli <= 0 or milli % GPU:
                raise BackendError(f"A train job runs on whole GPUs, not on "
                                   f"{gpus_text(milli)} of {node}.")

    def _settings(self) -> k8s.PodSettings:
        return k8s.PodSettings(
            namespace=self.namespace, grace_s=self.grace_period, gpu_resource=self.gpu_resource,
            tolerations=tuple(self.tolerations), labels=dict(self.extra_labels),
            annotations=dict(self.extra_annotations), cpu_per_gpu=self.cpu_per_gpu,
            memory_per_gpu_gib=self.memory_per_gpu, extra_pod_config=dict(self.extra_pod_config))

    def _template(self, user: str) -> k8s.PodTemplate:
        """From the user's running notebook pod (their default server first), else from
        the configuration."""
        if self.use_notebook_pod and self.notebooks is not None:
            mine = [p for p in self.notebooks.objects.values()
                    if (p["metadata"].get("annotations") or {}).get(NOTEBOOK_USER) == user
                    and (p.get("status") or {}).get("phase") == "Running"
                    and not p["metadata"].get("deletionTimestamp")]
            mine.sort(key=lambda p: ((p["metadata"].get("annotations") or {})
                                     .get(NOTEBOOK_SERVER, ""), p["metadata"]["name"]))
            if mine:
                return k8s.notebook_template(mine[0])
        names = user_names(user, self.slug_scheme)
        return k8s.PodTemplate(
            image=self.image, working_dir=self.home_dir,
            volumes=tuple(k8s.expand(self.volumes, **names)),
            volume_mounts=tuple(k8s.expand(self.volume_mounts, **names)),
            pod_security_context=dict(self.pod_security_context),
            security_context=dict(self.security_context))

    async def _own_claims(self, template: k8s.PodTemplate, user: str) -> k8s.PodTemplate:
        """The configured volumes with each per-user claim replaced by the claim KubeSpawner
        made for this user (verify_claims)."""
        per_user = {v.get("name") for v in self.volumes
                    if "{" in str((v.get("persistentVolumeClaim") or {}).get("claimName", ""))}
        if not per_user or not self.verify_claims:
            return template
        try:
            found = await self.api.json("list the home volume claims",
                                        self.api.core.list_namespaced_persistent_volume_claim,
                                        self.namespace, label_selector=k8s.HOME_CLAIMS)
        except KubeError as e:
            raise BackendError(f"The home volume claims cannot be listed ({e}); an "
                               f"administrator must grant the rules of "
                               f"hub_config/kubernetes-rbac.yaml.") from None
        volumes = []
        for volume in template.volumes:
            if volume.get("name") in per_user:
                wanted = volume["persistentVolumeClaim"]["claimName"]
                claim = k8s.claim_of(found.get("items") or [], user, wanted)
                if claim is None:
                    raise BackendError("You have no home volume yet: KubeSpawner makes it when "
                                       "your notebook server first starts; start it once, then "
                                       "submit again.")
                volume = {**volume, "persistentVolumeClaim": {
                    **volume["persistentVolumeClaim"], "claimName": claim}}
            volumes.append(volume)
        return dataclasses.replace(template, volumes=tuple(volumes))

    def user_home(self, user: str) -> str | None:
        return self._template(user).working_dir

    async def _create(self, pod: dict) -> None:
        name = pod["metadata"]["name"]
        try:
            await self.api.json(f"create pod {name}", self.api.core.create_namespaced_pod,
                                self.namespace, pod)
        except KubeError as e:
            if e.status != 409:
                raise
            # Ours already (an answer lost on the way, then the retry): the same attempt.
            existing = await self.api.json(f"read pod {name}", self.api.core.read_namespaced_pod,
                                           name, self.namespace)
            labels = existing["metadata"].get("labels") or {}
            mine = pod["metadata"]["labels"]
            if (labels.get(k8s.JOB), labels.get(k8s.ATTEMPT)) != (mine[k8s.JOB], mine[k8s.ATTEMPT]):
                raise

    def _sentence(self, e: KubeError) -> str:
        said = e.message.split(": ", 1)[-1].rstrip(".")
        if e.status in (401, 403):
            return (f"The pool service may not create pods in namespace {self.namespace} "
                    f"(Kubernetes said: {said}); an administrator must grant it the rules of "
                    f"hub_config/kubernetes-rbac.yaml.")
        if e.status in (400, 422):
            return f"Kubernetes refused the job's pod: {said}."
        if e.status == 409:
            return f"A pod of this job's name already exists and is not the job's: {said}."
        return (f"The Kubernetes API did not accept the job's pods within "
                f"{self.api_retry_timeout:g} s ({said}); the job can be submitted again.")

    # --- stop, poll, adopt ---

    async def stop(self, job_id: str, attempt: int, grace_s: float) -> None:
        a = self._running.get((job_id, attempt))
        if a is None:
            return
        a.stopping = True
        if a.archiver is None:
            a.archiver = self._spawn(self._follow_log(a))
            await asyncio.sleep(0)  # the log stream is asked for before the pods go
        for name in a.pods:
            self._doom(name, max(0, math.ceil(grace_s)))

    def _doom(self, name: str, grace: int | None) -> None:
        """Delete the pod (again on later polls until it is gone)."""
        self._doomed[name] = (grace, time.monotonic())
        self._spawn(self._delete(name, grace))

    async def _delete(self, name: str, grace: int | None) -> None:
        kwargs = {} if grace is None else {"grace_period_seconds": grace}
        try:
            await self.api.json(f"delete pod {name}", self.api.core.delete_namespaced_pod,
                                name, self.namespace, **kwargs)
        except KubeError as e:
            if e.status == 404:
                self._doomed.pop(name, None)
            else:
                self.log.warning("Could not delete pod %s (%s); trying again", name, e)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def poll(self) -> list[Exit]:
        if self.api is None:
            return []
        ended = []
        for a in list(self._running.values()):
            exit = self._judge(a)
            if exit is not None:
                ended.append((a, exit))
                del self._running[a.key]
        for a, exit in ended:
            self._write(a.key, "exit", json.dumps({
                "state": exit.state, "exit_code": exit.exit_code, "reason": exit.reason}).encode())
            for name in a.pods:
                self._ended.pop(name, None)
                self._seen.discard(name)
                self._watched.discard(name)
            # Reported at once; the log is kept and the pods deleted meanwhile.
            self._winding[a.key] = self._spawn(self._wind_up(a))
        self._retry_deletions()
        return [exit for _, exit in ended]

    def _judge(self, a: _Attempt) -> Exit | None:
        """How the attempt ended, from the cache; None while it runs (or starts)."""
        states = [self._pod_state(a, name) for name in a.pods]
        phases = {s.phase for s in states}
        if a.stopping:
            if phases <= {"gone", "succeeded", "failed"}:  # no pod holds GPUs any more
                code = next((s.exit_code for s in states if s.exit_code is not None), None)
                return Exit(a.job_id, a.attempt, "failed", code, "stopped")
            return None
        failed = [s for s in states if s.phase == "failed"]
        if failed:
            return Exit(a.job_id, a.attempt, "failed", failed[0].exit_code, failed[0].reason)
        gone = [s for s in states if s.phase == "gone"]
        if gone:
            return Exit(a.job_id, a.attempt, "lost", reason=gone[0].reason)
        if phases == {"succeeded"}:
            return Exit(a.job_id, a.attempt, "succeeded", 0)
        return None

    def _pod_state(self, a: _Attempt, name: str) -> k8s.PodState:
        pod = self.pods.objects.get(name)
        if pod is None:
            if name in self._ended:
                return self._ended[name]
            if name not in self._seen and a.created_at > self.pods.listed_at:
                return k8s.PodState("pending")  # created; the watch has not shown it yet
            return k8s.PodState("gone", reason=f"its pod {name} was deleted outside the "
                                               "pool service")
        state = k8s.pod_state(pod)
        if state.phase in ("succeeded", "failed"):
            return state
        if self._node_gone(pod):
            return k8s.PodState("gone", reason=f"its node {pod['spec']['nodeName']} left the "
                                               "train pool")
        if pod["metadata"].get("deletionTimestamp") and name not in self._doomed:
            return k8s.PodState("gone", reason=f"its pod {name} is being deleted outside the "
                                               "pool service")
        return state

    def _node_gone(self, pod: dict) -> bool:
        node = (pod.get("spec") or {}).get("nodeName")
        return bool(node) and self.node_cache.synced.is_set() and \
            node not in self.node_cache.objects

    async def _wind_up(self, a: _Attempt) -> None:
        """Keep the log (rank 0's), then delete what is left of the pods."""
        try:
            followed = False
            if a.archiver is not None:  # its last words may be on their way
                try:
                    await asyncio.wait_for(asyncio.shield(a.archiver), ARCHIVE_WAIT_S)
                    followed = a.archiver.result()
                except (asyncio.TimeoutError, Exception):
                    a.archiver.cancel()
            if not followed and a.pods[0] in self.pods.objects:
                await self._archive(a.key, a.pods[0])
            for name in a.pods:
                pod = self.pods.objects.get(name)
                if pod is not None and name not in self._doomed:
                    # No kubelet is left to wait for: on a gone node, or after the end.
                    ended = k8s.pod_state(pod).phase in ("succeeded", "failed")
                    self._doom(name, 0 if ended or self._node_gone(pod) else None)
        finally:
            self._winding.pop(a.key, None)

    async def _archive(self, key, pod_name: str) -> None:
        """The pod's whole log into the attempt's capped file (anew: a follower may have
        left part of it), streamed, never in memory whole."""
        path = self._path(key, "log")
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        log = logfile.CappedLog(path, self.log_limit)
        try:
            response = await self.api.core.read_namespaced_pod_log(
                pod_name, self.namespace, _preload_content=False, _request_timeout=(10, 60))
            try:
                if response.status != 200:
                    raise KubeError(response.status, "", (await response.text())[:300])
                async for chunk in response.content.iter_any():
                    log.write(chunk)
            finally:
                response.release()
        except Exception as e:  # kept as far as it came, and said so
            log.write(f"\n[gpushare: the log could not be read from Kubernetes: "
                      f"{str(e).splitlines()[0] if str(e) else type(e).__name__}]\n".encode())
        finally:
            log.close()

    def _retry_deletions(self) -> None:
        now = time.monotonic()
        for name, (grace, tried) in list(self._doomed.items()):
            pod = self.pods.objects.get(name)
            if pod is None and self.pods.listed_at > tried:
                del self._doomed[name]
            elif pod is not None and not pod["metadata"].get("deletionTimestamp") \
                    and now - tried > DELETE_RETRY_S:
                self._doom(name, grace)

    async def adopt(self, handles: list[Handle]) -> list[Exit]:
        await self._ready()
        exits, named = [], set()
        for h in handles:
            key = (h.job_id, h.attempt)
            named.add(key)
            if key in self._running:
                continue
            recorded = self._read_exit(key)
            pods = [str(p) for p in (h.data.get("pods") or [])]
            if recorded is not None:
                exits.append(recorded)
            elif not pods or h.data.get("namespace", self.namespace) != self.namespace:
                exits.append(Exit(*key, "lost", reason="its record does not name its pods"))
            elif not any(p in self.pods.objects for p in pods):
                exits.append(Exit(*key, "lost", reason="its pods are gone"))
            else:
                placement = {str(n): int(m) for n, m in dict(h.data.get("placement") or {}).items()}
                self._running[key] = a = _Attempt(*key, tuple(pods), placement, float("-inf"))
                self._watched.update(pods)
                a.archiver = self._spawn(self._follow_log(a))
        for name, pod in list(self.pods.objects.items()):
            labels = pod["metadata"].get("labels") or {}
            key = (labels.get(k8s.JOB), _int(labels.get(k8s.ATTEMPT)))
            if key not in named and key not in self._running and name not in self._doomed:
                if k8s.pod_state(pod).phase in ("succeeded", "failed"):
                    # Ended, reported, not yet cleaned up when the service stopped.
                    self._spawn(self._clean_up(key, name, labels.get(k8s.RANK) == "0"))
                    continue
                self.log.warning("Deleting pod %s: no job of the pool service runs in it", name)
                self._doom(name, None)
        return exits

    async def _clean_up(self, key, name: str, keep_log: bool) -> None:
        if keep_log and key[0] and key[1] is not None:
            await self._archive(key, name)
        self._doom(name, 0)

    # --- what the service shows ---

    def reasons(self) -> dict[str, str]:
        if self.pods is None:
            return {}
        events: dict[str, list] = {}
        for e in self.events.objects.values():
            name = (e.get("involvedObject") or {}).get("name", "")
            if name.startswith(k8s.POD_PREFIX):
                events.setdefault(name, []).append(e)
        out = {}
        for a in self._running.values():
            if a.stopping:
                continue
            for name in a.pods:
                pod = self.pods.objects.get(name)
                why = "creating its pods" if pod is None else k8s.waiting_reason(
                    pod, k8s.newest_event(e for e in events.get(name, ())
                                          if _about(e, pod)))
                if why:
                    out[a.job_id] = f"starting on Kubernetes: {why}"
                    break
        return out

    # --- logs ---

    def _path(self, key, kind: str) -> str:
        job_id, attempt = key
        return os.path.join(self.state_dir, k8s.label_value(job_id), f"{int(attempt)}.{kind}")

    def _write(self, key, kind: str, data: bytes) -> None:
        path = self._path(key, kind)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def _read_exit(self, key) -> Exit | None:
        try:
            with open(self._path(key, "exit")) as f:
                record = json.load(f)
            return Exit(*key, record["state"], record.get("exit_code"), record.get("reason", ""))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    async def _follow_log(self, a: _Attempt) -> bool:
        """Rank 0's log into its capped file while the attempt runs; True once its container
        has ended and the log is whole. Until the container starts, and after a broken
        stream, it asks again (from the beginning)."""
        path = self._path(a.key, "log")
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        pause = 0.2
        while True:
            try:
                response = await self.api.core.read_namespaced_pod_log(
                    a.pods[0], self.namespace, follow=True, _preload_content=False,
                    _request_timeout=(10, FOLLOW_READ_TIMEOUT_S))
                try:
                    if response.status == 200:
                        log = logfile.CappedLog(path, self.log_limit)
                        try:
                            async for chunk in response.content.iter_any():
                                log.write(chunk)
                        finally:
                            log.close()
                        pause = 0.2
                finally:
                    response.release()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the log is kept as far as it came; ask again
                self.log.debug("Following the log of %s broke off: %s", a.pods[0], e)
            done = self._container_done(a)
            if done is not None:
                return done and os.path.exists(path)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)

    def _container_done(self, a: _Attempt) -> bool | None:
        """Whether rank 0's container has ended (True), its pod is gone (False), or it is
        still to be followed (None: it runs, or starts, or the watch has not shown it)."""
        name = a.pods[0]
        pod = self.pods.objects.get(name)
        if pod is not None:
            return True if k8s.pod_state(pod).phase in ("succeeded", "failed") else None
        if name in self._ended:
            return True
        if a.key in self._running and name not in self._seen:
            return None  # created; the watch has not shown it yet
        return a.stopping  # deleted: by our stop (its log ran to the end), or by someone else

    async def read_log_from(self, job_id: str, attempt: int, offset: int = 0,
                            size: int = logfile.READ_CHUNK) -> tuple[int, bytes]:
        winding = self._winding.get((job_id, attempt))
        if winding is not None:  # just ended: its log is being kept
            try:
                await asyncio.wait_for(asyncio.shield(winding), 10)
            except (asyncio.TimeoutError, Exception):
                pass
        return logfile.read(self._path((job_id, attempt), "log"), offset, size)

    async def shutdown(self) -> None:
        # Jobs keep running; deletions not done yet are the restarted service's to repeat.
        for reflector in (self.pods, self.node_cache, self.events, self.notebooks):
            if reflector is not None:
                await reflector.stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.api is not None:
            await self.api.close()
            self.api = None


def _about(event: dict, pod: dict) -> bool:
    """The event is about this very pod, and still says something once it is bound."""
    involved = event.get("involvedObject") or {}
    if involved.get("uid") and involved["uid"] != pod["metadata"].get("uid"):
        return False
    return not ((pod.get("spec") or {}).get("nodeName") and event.get("reason") == "FailedScheduling")


def _int(value) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def user_names(user: str, scheme: str = "safe") -> dict[str, str]:
    """The names KubeSpawner's templates know for the user's default server, as its
    ``_expand_user_properties`` makes them under ``scheme``."""
    from kubespawner.slugs import escape_slug, safe_slug  # when needed: it loads KubeSpawner
    safe, escaped = safe_slug(user, max_length=48), escape_slug(user)
    username = safe if scheme == "safe" else escaped
    return {"username": username, "unescaped_username": user, "safe_username": safe,
            "escaped_username": escaped, "servername": "", "user_server": username,
            "safe_user_server": safe, "escaped_user_server": escaped}
