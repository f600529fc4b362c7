"""Train jobs as pods on a Kubernetes train pool.

The pool service decides admission, quotas, preemption and placement; Kubernetes runs the
pods. An attempt is one pod per node of its placement (a gang: all created, or none left),
pinned to its node by required node affinity, requesting the node's share of whole GPUs
(``nvidia.com/gpu``; the device plugin sets ``CUDA_VISIBLE_DEVICES``), in the image, home
volume, security context and environment of the user's notebook pod. A pod runs its node's
rank, or all of them under ``launcher.py`` in a per-GPU job.

A job on build GPUs lent to the train pool (``PoolService.lend_build_gpus``) runs as a pod
on the build node itself (only a watched, schedulable, Ready one lends), pinned likewise,
asking its device plugin for ``lent_gpu_resources`` per GPU (the resource slices use, so
Kubernetes counts both) and ``lent_device_limits``, with ``lent_tolerations``; which of the
node's GPUs (by the pool's index) it holds is in the pod's annotation and the handle, so
``lent_holders`` knows them after a restart.

A multi-node gang gets a headless Service (its DNS name is ``MASTER_ADDR``) and a
NetworkPolicy that lets its pods, and only them, reach each other; both are owned by rank 0's
pod, so they go with it. Where the cluster has no DNS (``rendezvous = "pod-ip"``) rank 0 is
created first and the other ranks get its pod IP once it has one.

Four reflectors (reflector.py) keep what the backend reads: our job pods, the train pool's
nodes, the namespace's pod events and the users' notebook pods (and a fifth the build nodes,
with lending). ``poll`` judges each gang
from the cache (gang.py): every pod Succeeded → succeeded; the first pod Failed, deleted by
someone else or on a node that left the pool ends the gang: the others are deleted with the
grace period, and the attempt is reported failed (or lost: the service requeues) once no pod
runs. Each pod's log is followed into its ranks' capped logs while it runs and read from
there (logs.py), so it outlives the pods.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import time

from ...policy.lending import build_node_of
from ...policy.model import GPU, Node, gpus_text
from ...trainjob import FAILED, PENDING
from .. import logfile
from ..base import BackendError, Exit, Handle, Launch, LentGPUs, LentGPUsGone, private_dir
from . import adoption
from . import objects as k8s
from .api import STREAM_CONNECTIONS, KubeAPI, KubeError, make_client
from .gang import Gang, PodRanks, judge
from .logs import PodLogs
from .options import KubernetesOptions, user_names  # noqa: F401  (user_names: as before)
from .podops import PodOps
from .reflector import Reflector

NOTEBOOK_USER = "hub.jupyter.org/username"  # KubeSpawner's annotation: the exact name
NOTEBOOK_SERVER = "hub.jupyter.org/servername"
ARCHIVE_WAIT_S = 5.0
"""How long an ended pod's follower may take to bring the log's end before it is read again
whole. The end comes once the kubelet sees the container's; a silent container's stream is
answered only then, and on a busy node or API server that takes seconds: reading every such
log a second time costs the API server and the kubelet more than the wait (a user's read of
the log waits for it, at most ``WIND_UP_WAIT_S``)."""
WIND_UP_WAIT_S = 30.0
"""How long a read of a just-ended attempt's log waits for the log to be kept whole: the
follower's ``ARCHIVE_WAIT_S``, then a read of the whole log, which right after an API server
restart can take seconds more (with 10 s, a full test run once read an empty log, right after
such a restart, for a job that had printed). Past it, what is kept so far is read."""


class KubernetesBackend(KubernetesOptions):
    """Runs each train job as pods on the nodes of a Kubernetes train pool."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.api: KubeAPI | None = None
        self.pods = self.node_cache = self.events = self.notebooks = None
        self.build_cache = None  # the build nodes, with lending (``lend``)
        self._logs: PodLogs | None = None
        self._running: dict[tuple[str, int], Gang] = {}
        self._ended: dict[str, k8s.PodState] = {}  # terminal states seen before a poll
        self._seen: set[str] = set()  # pods of running attempts the watch has shown
        self._watched: set[str] = set()  # the pods of running attempts
        self._started: dict[str, asyncio.Event] = {}  # followed pods: a container started
        self.ops: PodOps | None = None  # creating and deleting, once connected
        self._winding: dict[tuple[str, int], asyncio.Task] = {}  # ended: logs kept, pods deleted
        self._last_nodes: list[Node] = []
        self._ready_lock: asyncio.Lock | None = None
        self._build = None  # the build pool whose GPUs are lent (``lend``)
        # Attempts being started: the lent GPUs each chose, held from the choice on (starts
        # run side by side, and creating the pods awaits the API).
        self._claims: dict[tuple[str, int], dict[str, tuple[int, ...]]] = {}

    # --- lent build GPUs ---

    lends_build_gpus = True
    build_nodes_apart = True

    def lending_refused(self) -> str | None:
        if not self.lent_gpu_resources:
            return ("PoolService.lend_build_gpus on Kubernetes needs "
                    "KubernetesBackend.lent_gpu_resources: what a pod asks the build nodes' "
                    "device plugin for one whole GPU, e.g. {'nvidia.com/gpu': 1} (see "
                    "'Lend idle build GPUs' in the docs).")
        return None

    def lend(self, build) -> None:
        self._build = build

    def lent_gpus(self) -> LentGPUs:
        # The build node's device plugin picks the device: lent by index
        return LentGPUs(self.lent_holders, by_index=True, usable=self._build_node_usable)

    def _build_node_usable(self, name: str) -> bool:
        """Whether build node ``name`` may lend its GPUs: watched, schedulable and Ready."""
        cache = self.build_cache
        if cache is None or not cache.synced.is_set():
            return False
        node = cache.objects.get(name)
        return node is not None and k8s.usable(node)

    def lent_holders(self) -> dict[tuple[str, int], str]:
        held = {(node, g): job_id for (job_id, _), lent in self._claims.items()
                for node, gpus in lent.items() for g in gpus}
        held.update({(node, g): gang.job_id for gang in self._running.values()
                     for node, gpus in gang.lent.items() for g in gpus})
        return held

    def _on_build_nodes(self, placement) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
        """The placement with each lent node as its build node, and the build GPUs a job
        placed there gets: those the cycle lent, that no notebook server wants back and no
        other job holds since."""
        out, lent = {}, {}
        held = self.lent_holders()
        for node, milli in placement.items():
            build = build_node_of(node)
            if build is None:
                out[node] = milli
                continue
            free = None if self._build is None else self._build.free_lent(build)
            if free is None:
                raise BackendError(f"Node {node} is not a build node whose GPUs are lent.")
            if milli <= 0 or milli % GPU:
                raise BackendError(f"A train job runs on whole GPUs, not on "
                                   f"{gpus_text(milli)} of {node}.")
            free = [g for n, g in free if (n, g) not in held]
            if len(free) < milli // GPU:
                raise LentGPUsGone(f"The job was placed on {gpus_text(milli)} of {node}, "
                                   f"which has only {gpus_text(len(free) * GPU)} free.")
            out[build], lent[build] = milli, tuple(free[:milli // GPU])
        return out, lent

    def _job_pods(self, launch: Launch, template: k8s.PodTemplate, settings: k8s.PodSettings,
                  lent: dict[str, tuple[int, ...]], rendezvous: k8s.Rendezvous) -> list[dict]:
        pods = k8s.job_pods(launch, template, settings, rendezvous)
        for pod, node in zip(pods, sorted(launch.placement)):  # node-rank order
            if node in lent:
                k8s.on_lent_gpus(pod, lent[node], settings, self.lent_gpu_resources,
                                 self.lent_device_limits, tuple(self.lent_tolerations))
        return pods

    @property
    def logs(self) -> PodLogs:
        if self._logs is None:
            self._logs = PodLogs(self.state_dir, self.namespace, self.log_limit, self.log)
        self._logs.api = self.api
        return self._logs

    # --- the connection and the caches ---

    async def _ready(self) -> None:
        """Connect and wait until pods and nodes are listed (once; later calls return)."""
        if self._ready_lock is None:
            self._ready_lock = asyncio.Lock()
        async with self._ready_lock:
            if self.api is None:
                private_dir(self.state_dir)  # kept logs of every user's jobs
                self.api = KubeAPI(await make_client(self.kubeconfig), self.api_retry_timeout,
                                   self.log, stream_client=await make_client(
                                       self.kubeconfig, connections=STREAM_CONNECTIONS))
                self.ops = PodOps(self.api, self.namespace, self.api_retry_timeout, self.log)
                core, ns = self.api.streams, self.namespace
                watch = functools.partial(Reflector, log=self.log, timeout_s=self.watch_timeout)
                self.pods = watch(f"job pods in {ns}", functools.partial(
                    core.list_namespaced_pod, ns, label_selector=k8s.JOB_SELECTOR),
                    on_event=self._pod_event).start()
                self.node_cache = watch("train nodes", functools.partial(
                    core.list_node, label_selector=self._node_selector())).start()
                self.events = watch(f"pod events in {ns}", functools.partial(
                    core.list_namespaced_event, ns,
                    field_selector="involvedObject.kind=Pod"), index=_involved).start()
                self.notebooks = watch(f"notebook pods in {ns}", functools.partial(
                    core.list_namespaced_pod, ns, label_selector=self.notebook_selector)).start()
                if self._build is not None:
                    self.build_cache = watch("build nodes", functools.partial(
                        core.list_node, label_selector=_selector(self.build_node_selector))
                    ).start()
        # the build nodes too, with lending: until listed, none may lend (a slice or a lent
        # job asked right after adopt found no lendable GPU)
        for reflector in (self.pods, self.node_cache, *filter(None, [self.build_cache])):
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
        return _selector(self.train_node_selector)

    def _pod_event(self, kind: str, pod: dict) -> None:
        # A pod may appear, end and be deleted between two polls: remember that it was
        # there, and how it ended.
        name = pod["metadata"]["name"]
        if name not in self._watched:
            return
        self._seen.add(name)
        started = self._started.get(name)
        if started is not None and (kind == "DELETED" or k8s.has_log(pod)):
            started.set()
        state = k8s.pod_state(pod)
        if state.phase in k8s.ENDED:
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

    def kubernetes(self) -> tuple[str, str]:
        return self.kubeconfig, self.namespace

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
        if key in self._running or key in self._claims:
            raise BackendError(f"Attempt {launch.attempt} of job {launch.job_id} is already "
                               "running.")
        placement, lent = self._on_build_nodes(launch.placement)
        self._check_placement(placement, lent)
        self._claims[key] = lent  # no await between choosing the lent GPUs and this
        try:
            return await self._start(launch, placement, lent)
        finally:
            self._claims.pop(key, None)  # the gang holds them now, or it did not start

    async def _start(self, launch: Launch, placement: dict[str, int],
                     lent: dict[str, tuple[int, ...]]) -> Handle:
        key = (launch.job_id, launch.attempt)
        launch = dataclasses.replace(launch, placement=placement)
        template, settings = self._template(launch.user), self.pod_settings()
        if template.source == "configuration":
            template = await self._own_claims(template, launch.user)
        build = functools.partial(self._job_pods, launch, template, settings, lent)
        port = self.rendezvous_port
        if len(launch.placement) == 1:
            pods = build(k8s.Rendezvous("127.0.0.1", port))
            gang = self._gang(launch, pods, lent=lent)
            await self.ops.create_all(pods)
        elif self.rendezvous == "dns":
            pods = build(k8s.Rendezvous(k8s.service_address(
                launch.job_id, launch.attempt, self.namespace, self.cluster_domain), port))
            gang = self._gang(launch, pods, k8s.rendezvous_name(launch.job_id, launch.attempt),
                              lent)
            await self.ops.create_gang(launch, settings, port, pods[0], pods[1:])
        else:  # rank 0 first; the others once its pod has an IP
            first = build(k8s.Rendezvous("", port))
            gang = self._gang(launch, first, k8s.rendezvous_name(launch.job_id, launch.attempt),
                              lent)
            gang.waiting = frozenset(gang.names[1:])
            gang.later = lambda ip: build(k8s.Rendezvous(ip, port))[1:]
            await self.ops.create_gang(launch, settings, port, first[0], [])
        gang.created_at = time.monotonic()
        self._watched.update(gang.names)
        self._running[key] = gang
        self._follow(gang)
        self.log.info("Started attempt %d of job %s: %d rank(s) in pod(s) %s (%s from the %s)",
                      launch.attempt, launch.job_id, gang.world_size, ", ".join(gang.names),
                      template.image, template.source)
        return Handle(launch.job_id, launch.attempt, gang.handle_data(self.namespace))

    def _gang(self, launch: Launch, pods: list[dict], rendezvous: str | None = None,
              lent: dict[str, tuple[int, ...]] | None = None) -> Gang:
        return Gang(launch.job_id, launch.attempt,
                    tuple(PodRanks.of_pod(p, i) for i, p in enumerate(pods)),
                    dict(launch.placement), time.monotonic(), rendezvous, lent=dict(lent or {}))

    def _check_placement(self, placement, lent) -> None:
        known = self.node_cache.objects
        if not placement:
            raise BackendError("The job has no placement: it was not given any GPU.")
        for node, milli in placement.items():
            if node in lent:
                continue  # checked by _on_build_nodes
            if node not in known:
                raise BackendError(f"Node {node} is not in the Kubernetes train pool.")
            if milli <= 0 or milli % GPU:
                raise BackendError(f"A train job runs on whole GPUs, not on "
                                   f"{gpus_text(milli)} of {node}.")

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
        return self.configured_template(user)

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

    def _create_waiting(self, gang: Gang) -> None:
        """"pod-ip": once rank 0's pod has its IP, create the other ranks with it."""
        if gang.later is None or gang.stopping or gang.failure is not None:
            return
        ip = ((self.pods.objects.get(gang.names[0]) or {}).get("status") or {}).get("podIP")
        if ip:
            manifests, gang.later = gang.later(ip), None
            self.ops.spawn(self._create_late(gang, manifests))

    async def _create_late(self, gang: Gang, manifests: list[dict]) -> None:
        try:
            await self.ops.create_all(manifests)
        except BackendError as e:
            if not gang.stopping and gang.failure is None:
                gang.failure = Exit(gang.job_id, gang.attempt, FAILED,
                                    reason=f"its other ranks could not be started: {e}")
                self._halt(gang, 0)
            return
        gang.created_at, gang.waiting = time.monotonic(), frozenset()
        self._follow(gang)
        if gang.stopping or gang.failure is not None:  # stopped meanwhile: these too
            self._halt(gang, self.grace_period)

    # --- stop, poll, adopt ---

    async def stop(self, job_id: str, attempt: int, grace_s: float) -> None:
        gang = self._running.get((job_id, attempt))
        if gang is None:
            return
        gang.stopping, gang.grace = True, max(0, math.ceil(grace_s))
        self._halt(gang, gang.grace)  # their logs are followed to the end

    def _halt(self, gang: Gang, grace: int) -> None:
        """Delete every pod of the gang: those that run with ``grace`` (their logs are
        followed to the end), those that ended once their logs are kept."""
        for i, (name, node) in enumerate(zip(gang.names, sorted(gang.placement))):
            pod = self.pods.objects.get(name)
            if name in gang.waiting or pod is None or name in self.ops.doomed:
                continue
            if self._node_gone(pod, node):  # no kubelet is left to wait for, nor a log
                self.ops.doom(name, 0)
            elif k8s.pod_state(pod).phase in k8s.ENDED:
                gang.keepers.setdefault(i, self.ops.spawn(self._keep_and_delete(gang, i)))
            else:
                self.ops.doom(name, grace)

    def _follow(self, gang: Gang) -> None:
        """Follow every pod's log into its ranks' logs while the gang lives."""
        for i, pod in enumerate(gang.pods):
            if i not in gang.followers and pod.name not in gang.waiting:
                gang.followers[i] = self.ops.spawn(self.logs.follow(
                    gang.key, pod, functools.partial(self._container_done, gang, i),
                    self._log_started(pod.name)))

    def _log_started(self, name: str) -> asyncio.Event:
        """Set once the watch shows one of the pod's containers started, or the pod ended or
        gone (``_pod_event``; already now when the cache says so)."""
        started = self._started.setdefault(name, asyncio.Event())
        pod = self.pods.objects.get(name)
        if name in self._ended or (pod is not None and k8s.has_log(pod)) or \
                (pod is None and name in self._seen):
            started.set()
        return started

    def _container_done(self, gang: Gang, index: int) -> bool | None:
        """Whether a pod's container has ended (True), the pod is gone (False), or it is
        still to be followed (None: it runs, or starts, or the watch has not shown it)."""
        name = gang.names[index]
        if name in gang.waiting:  # not created yet
            return False if gang.stopping or gang.failure is not None else None
        pod = self.pods.objects.get(name)
        if pod is not None:
            return True if k8s.pod_state(pod).phase in k8s.ENDED else None
        if name in self._ended:
            return True
        if gang.key in self._running and name not in self._seen:
            return None  # created; the watch has not shown it yet
        # deleted: by our stop (its log ran to the end), or by someone else
        return gang.stopping or gang.failure is not None

    async def _kept(self, gang: Gang, index: int) -> None:
        """The pod's log whole in its ranks' logs: followed to its end, else read again."""
        followed = False
        task = gang.followers.get(index)
        if task is not None:  # its last words may be on their way
            try:
                await asyncio.wait_for(asyncio.shield(task), ARCHIVE_WAIT_S)
                followed = task.result()
            except (asyncio.TimeoutError, Exception):
                task.cancel()
        if not followed and gang.names[index] in self.pods.objects:
            await self.logs.archive(gang.key, gang.pods[index])

    async def _keep_and_delete(self, gang: Gang, index: int) -> None:
        """An ended pod of a gang that stops: its log first, then the pod."""
        name = gang.names[index]
        self.ops.doomed[name] = (0, time.monotonic())  # not deleted twice meanwhile
        await self._kept(gang, index)
        self.ops.doom(name, 0)

    async def poll(self) -> list[Exit]:
        if self.api is None:
            return []
        ended = []
        for gang in list(self._running.values()):
            self._create_waiting(gang)
            if gang.stopping:  # a pod the watch had not shown when it was stopped
                self._halt(gang, gang.grace)
            failing = gang.failure
            nodes = sorted(gang.placement)  # node rank order, as the pods were made
            exit = judge(gang, [self._pod_state(gang, name, node)
                                for name, node in zip(gang.names, nodes)])
            if exit is not None:
                ended.append((gang, exit))
                del self._running[gang.key]
            elif failing is None and gang.failure is not None:  # one life: stop the others
                self.log.info("Attempt %d of job %s: %s; stopping its other ranks",
                              gang.attempt, gang.job_id, gang.failure.reason)
                self._halt(gang, self.grace_period)
        for gang, exit in ended:
            self.logs.record_exit(gang.key, exit)
            for name in gang.names:
                self._ended.pop(name, None)
                self._seen.discard(name)
                self._watched.discard(name)
                started = self._started.pop(name, None)
                if started is not None:
                    started.set()  # a follower still waiting: it looks once more, then ends
            # Reported at once; the logs are kept and the pods deleted meanwhile.
            self._winding[gang.key] = self.ops.spawn(self._wind_up(gang))
        self.ops.retry_deletions(self.pods)
        return [exit for _, exit in ended]

    def _pod_state(self, gang: Gang, name: str, node: str) -> k8s.PodState:
        if name in gang.waiting:  # never created: nothing to wait for once the gang stops
            if gang.stopping or gang.failure is not None:
                return k8s.PodState(k8s.GONE, reason=f"its pod {name} was never created")
            return k8s.PodState(PENDING)
        pod = self.pods.objects.get(name)
        if pod is None:
            if name in self._ended:
                return self._ended[name]
            if name not in self._seen and gang.created_at > self.pods.listed_at:
                return k8s.PodState(PENDING)  # created; the watch has not shown it yet
            return k8s.PodState(k8s.GONE, reason=f"its pod {name} was deleted outside the "
                                               "pool service")
        state = k8s.pod_state(pod)
        if state.phase in k8s.ENDED:
            return state
        if self._node_gone(pod, node):  # bound to it, or pinned to it and still waiting
            pool = "build" if self._build is not None and node in self._build.names else "train"
            return k8s.PodState(k8s.GONE, reason=f"its node {node} left the {pool} pool")
        if pod["metadata"].get("deletionTimestamp") and name not in self.ops.doomed:
            return k8s.PodState(k8s.GONE, reason=f"its pod {name} is being deleted outside the "
                                               "pool service")
        return state

    def _node_gone(self, pod: dict, node: str | None = None) -> bool:
        """Whether the pod's node has left the train pool (a build node, whose GPUs may be
        lent, is not watched: a pod there that its node's end takes away is gone)."""
        node = (pod.get("spec") or {}).get("nodeName") or node
        if node and self._build is not None and node in self._build.names:
            cache = self.build_cache
            return cache is not None and cache.synced.is_set() and node not in cache.objects
        return bool(node) and self.node_cache.synced.is_set() and \
            node not in self.node_cache.objects

    async def _wind_up(self, gang: Gang) -> None:
        """Keep every pod's log, then delete what is left of the pods and the rendezvous."""
        try:
            async def keep(i):
                keeper = gang.keepers.get(i)
                if keeper is not None:
                    await asyncio.wait_for(asyncio.shield(keeper), ARCHIVE_WAIT_S + 60)
                else:
                    await self._kept(gang, i)
            await asyncio.gather(*(keep(i) for i in range(len(gang.pods))),
                                 return_exceptions=True)
            for name in gang.names:
                pod = self.pods.objects.get(name)
                if pod is not None and name not in self.ops.doomed:
                    # No kubelet is left to wait for: on a gone node, or after the end.
                    ended = k8s.pod_state(pod).phase in k8s.ENDED
                    self.ops.doom(name, 0 if ended or self._node_gone(pod) else None)
            if gang.rendezvous:
                await self.ops.delete_rendezvous(gang.rendezvous)
        finally:
            self._winding.pop(gang.key, None)

    async def adopt(self, handles: list[Handle]) -> list[Exit]:
        await self._ready()
        plan = adoption.plan(handles, self.pods.objects, self.logs.read_exit, self.namespace,
                             set(self._running), self.ops.doomed)
        for gang in plan.gangs:
            self._running[gang.key] = gang
            self._watched.update(gang.names)
            self._follow(gang)
        for key, name, index in plan.clean:
            self.ops.spawn(self._clean_up(key, name, index))
        for name in plan.orphans:
            self.log.warning("Deleting pod %s: no job of the pool service runs in it", name)
            self.ops.doom(name, None)
        return plan.exits

    async def _clean_up(self, key, name: str, index: int | None) -> None:
        pod = self.pods.objects.get(name)
        if index is not None and pod is not None:
            await self.logs.archive(key, PodRanks.of_pod(pod, index))
        self.ops.doom(name, 0)

    # --- what the service shows ---

    def reasons(self) -> dict[str, str]:
        if self.pods is None:
            return {}
        out = {}
        for gang in self._running.values():
            if gang.stopping or gang.failure is not None:
                continue
            for name in gang.names:
                pod = self.pods.objects.get(name)
                if name in gang.waiting:
                    why = "creating its other ranks once rank 0 has its address"
                elif pod is None:
                    why = "creating its pods"
                else:
                    why = k8s.waiting_reason(pod, k8s.newest_event(
                        e for e in self.events.by(name) if _about(e, pod)))
                if why:
                    out[gang.job_id] = f"starting on Kubernetes: {why}"
                    break
        return out

    # --- logs ---

    async def read_log_from(self, job_id: str, attempt: int, offset: int = 0,
                            size: int = logfile.READ_CHUNK, rank: int = 0) -> tuple[int, bytes]:
        winding = self._winding.get((job_id, attempt))
        if winding is not None:  # just ended: its logs are being kept
            try:
                await asyncio.wait_for(asyncio.shield(winding), WIND_UP_WAIT_S)
            except (asyncio.TimeoutError, Exception):
                pass
        return self.logs.read((job_id, attempt), rank, offset, size)

    async def shutdown(self) -> None:
        # Jobs keep running; deletions not done yet are the restarted service's to repeat.
        for reflector in (self.pods, self.node_cache, self.events, self.notebooks,
                          self.build_cache):
            if reflector is not None:
                await reflector.stop()
        if self.ops is not None:
            await self.ops.shutdown()
        if self.api is not None:
            await self.api.close()
            self.api = None


def _selector(labels: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _involved(event: dict) -> str:
    """The name of the pod an event is about (events are looked up by it)."""
    return (event.get("involvedObject") or {}).get("name", "")


def _about(event: dict, pod: dict) -> bool:
    """The event is about this very pod, and still says something once it is bound."""
    involved = event.get("involvedObject") or {}
    if involved.get("uid") and involved["uid"] != pod["metadata"].get("uid"):
        return False
    return not ((pod.get("spec") or {}).get("nodeName") and event.get("reason") == "FailedScheduling")


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False
