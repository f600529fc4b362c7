"""A kubelet simulator: plays any number of nodes against a real API server, in threads of the
calling process.

- ``add_node`` registers a Node (labels, cpu/memory/pods, ``nvidia.com/gpu`` and
  ``nvidia.com/gpu.shared`` capacity), marks it Ready, removes the not-ready taint the API server
  adds to new nodes, and keeps its Lease renewed.
- One list-then-watch of bound pods; each pod on one of our nodes goes Pending → Running (pod IP
  127.0.1.x, every container ready) → Succeeded/Failed when its containers end.
- A container with a ``command`` runs as a local process (``command``+``args``, ``env`` with
  $(VAR) and fieldRef/secretKeyRef/configMapKeyRef, ``workingDir``); its exit code becomes
  ``state.terminated.exitCode`` and its output the pod's log (served to the API server, so
  ``read_namespaced_pod_log`` works). Other containers run until deleted, or for
  ``sim.gpushare.jupyter.org/run-seconds`` and then exit with ``.../exit-code``.
- Deletion honours the grace period: SIGTERM, SIGKILL at the deadline, then the pod object is
  deleted with grace 0 (uid precondition), as a kubelet does. Finalizers are left alone.
- restartPolicy Always/OnFailure restarts exited containers after a 1 s back-off.
- Each pod has a directory ``<workdir>/pods/<ns>_<name>_<uid8>/`` with ``<container>.log`` and
  ``home/`` (HOME and the default working directory); it is kept after the pod is gone.
- Each local container's processes run in real cgroups named as a kubelet names them,
  ``kubepods[/<qos>]/pod<uid>/<container-id>`` (``cgroups.py``; where /sys/fs/cgroup is
  writable), removed with the pod: ``/proc/<pid>/cgroup`` names the pod as on a real node.
- A simulated NVIDIA device plugin gives containers that ask for ``nvidia.com/gpu`` or
  ``nvidia.com/gpu.shared`` GPUs by UUID (``devices.py``; ``NVIDIA_VISIBLE_DEVICES`` in their
  environment), and each node serves the kubelet's pod-resources API on a unix socket of its
  own (``pod_resources_socket(node)``; needs grpcio).
- ``remove_node`` is a node dying: its processes are killed, the Node deleted, and (unless told
  otherwise) its pods force-deleted, which the pod GC controller would do after ~40 s.

Not simulated: images (the host's files are the container's), volumes, securityContext (processes
run as this user), probes, init containers, resource enforcement (the cgroups limit nothing)."""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from .cgroups import PodCgroups
from .devices import NodeDevices, visible_devices
from .logserver import LogServer
from .podrun import (ANN_RUN_LOCALLY, ContainerRun, PodRun, container_argv, container_env,
                     decode_data, default_base_env, new_container_id, now_iso,
                     signal_container, start_process, start_simulated)
from .rest import KubeError, KubeREST

log = logging.getLogger("kubelet-sim")

GPU = "nvidia.com/gpu"
SHARED_GPU = "nvidia.com/gpu.shared"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
RESTART_BACKOFF_S = 1.0


class WorkQueue:
    """client-go's work queue in small: a key is never processed by two workers at once, a key
    added while it is processed is processed again afterwards, and ``add_after`` delays an add
    (one timer thread for all of them). A new key wakes one idle worker, not all of them (with
    dozens of workers, waking every one for each key costs more than the work)."""

    def __init__(self):
        lock = threading.RLock()
        self.cond = threading.Condition(lock)        # workers wait on this one
        self.timer_cond = threading.Condition(lock)  # the timer thread on this one
        self.queue: collections.deque = collections.deque()
        self.dirty: set = set()
        self.processing: set = set()
        self.later: list = []                 # heap of (due, seq, key)
        self.seq = itertools.count()
        self.closed = False
        threading.Thread(target=self._timer, name="kubelet-sim-timer", daemon=True).start()

    def add(self, key):
        with self.cond:
            self._add(key)

    def _add(self, key):
        if key in self.dirty or self.closed:
            return
        self.dirty.add(key)
        if key not in self.processing:
            self.queue.append(key)
            self.cond.notify()

    def add_after(self, key, delay: float):
        with self.cond:
            heapq.heappush(self.later, (time.monotonic() + max(delay, 0.0), next(self.seq), key))
            self.timer_cond.notify()

    def _timer(self):
        with self.cond:
            while not self.closed:
                now = time.monotonic()
                while self.later and self.later[0][0] <= now:
                    self._add(heapq.heappop(self.later)[2])
                self.timer_cond.wait(self.later[0][0] - now if self.later else None)

    def get(self):
        with self.cond:
            while not self.queue and not self.closed:
                self.cond.wait()
            if self.closed:
                return None
            key = self.queue.popleft()
            self.dirty.discard(key)
            self.processing.add(key)
            return key

    def done(self, key):
        with self.cond:
            self.processing.discard(key)
            if key in self.dirty:
                self.queue.append(key)
                self.cond.notify()

    def close(self):
        with self.cond:
            self.closed = True
            self.cond.notify_all()
            self.timer_cond.notify_all()


class KubeletSimulator:
    """``KubeletSimulator(api, workdir, cert=..., key=...)``; ``start()``, ``add_node(...)``,
    ``remove_node(name)``, ``stop()``. ``api`` is a KubeREST with rights over nodes, leases and
    pods (the control plane's admin). ``cert``/``key``: the serving certificate the API server
    trusts for kubelets (ControlPlane.pki["kubelet.crt"/"kubelet.key"]).

    Which containers run as local processes: with the pod annotation
    ``sim.gpushare.jupyter.org/run-locally: "true"`` every container that has a ``command`` or
    ``args`` (args alone run as the argv: images are not simulated); with ``"false"`` none;
    without it, containers with a ``command`` when ``run_commands`` is true.
    ``base_env`` replaces the environment every process starts from (default: PATH with this
    Python's bin directory first, HOME = the pod's own directory, LANG, KUBERNETES_SERVICE_*).
    ``prepare(pod, container, argv, env) -> (argv, env)`` may rewrite a process just before it
    starts (a test seam, e.g. to make a notebook server bind its pod IP).
    ``start_delay_s`` keeps bound pods Pending that long (an image pull)."""

    def __init__(self, api: KubeREST, workdir: Path, *, cert: Path, key: Path,
                 run_commands: bool = True, start_delay_s: float = 0.0,
                 heartbeat_s: float = 10.0, base_env: dict[str, str] | None = None,
                 prepare=None, workers: int = 4, cgroups: bool = True):
        self.api = api
        self.prepare = prepare
        self.workdir = Path(workdir)
        self.run_commands = run_commands
        self.start_delay_s = start_delay_s
        self.heartbeat_s = heartbeat_s
        server = urlsplit(api.server)
        self._base_env = base_env
        self._api_host, self._api_port = server.hostname, server.port or 443
        self.nodes: dict[str, dict] = {}             # name -> the Node we registered
        self.pods: dict[tuple[str, str], dict] = {}  # (ns, name) -> latest object seen
        self.runs: dict[tuple[str, str], PodRun] = {}
        self.lock = threading.RLock()
        self.queue = WorkQueue()
        self.logs = LogServer(cert, key, self._find_log)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._workers = workers
        self._ips: set[str] = set()
        self._first_seen: dict[str, float] = {}
        self.synced = threading.Event()              # set after each successful (re-)list
        self.relists = 0                             # how many times the pod watch re-listed
        self.cgroups = PodCgroups() if cgroups else None
        self.devices: dict[str, NodeDevices] = {}    # node -> its device plugin
        self._podres: dict[str, object] = {}         # node -> its pod-resources server
        self._sockets = Path(tempfile.mkdtemp(prefix="kubelet-sim-"))  # short unix paths

    # -- lifecycle --------------------------------------------------------------------------
    def start(self):
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.logs.start()
        targets = [("pod-watch", self._reflect), ("heartbeat", self._heartbeat)]
        targets += [(f"pod-worker-{i}", self._work) for i in range(self._workers)]
        for name, target in targets:
            t = threading.Thread(target=target, name=f"kubelet-sim-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        if not self.synced.wait(30):
            raise TimeoutError("the kubelet simulator could not list pods within 30 s")
        return self

    def stop(self):
        """Kills every local container process; nodes stay registered (the cluster is usually
        going away too)."""
        self._stopping.set()
        self.queue.close()
        with self.lock:
            runs = list(self.runs.values())
        for run in runs:
            for c in run.containers.values():
                signal_container(c, signal.SIGKILL)
        self.logs.stop()
        for server in self._podres.values():
            server.stop()
        self._podres.clear()
        if self.cgroups is not None:
            self.cgroups.remove_all()
        shutil.rmtree(self._sockets, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # -- nodes ------------------------------------------------------------------------------
    def add_node(self, name: str, *, gpus: int = 0, shared_gpus: int = 0, cpu: str = "64",
                 memory: str = "512Gi", pods: int = 110, labels: dict[str, str] | None = None,
                 taints: list[dict] | None = None, gpu_uuids: list[str] | None = None) -> dict:
        """Registers a Ready node and returns it as the API server has it. ``gpus`` whole GPUs
        (``nvidia.com/gpu``, the train pool), ``shared_gpus`` replicas of time-sliced GPUs
        (``nvidia.com/gpu.shared``, the build pool; 4 per GPU); ``labels`` are added to the
        usual kubernetes.io/hostname, os and arch labels; ``taints`` are kept; ``gpu_uuids``
        name the GPUs (``devices.NodeDevices``)."""
        resources = {"cpu": cpu, "memory": memory, "pods": str(pods),
                     "ephemeral-storage": "1Ti"}
        if gpus:
            resources[GPU] = str(gpus)
        if shared_gpus:
            resources[SHARED_GPU] = str(shared_gpus)
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {
                    "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64", **(labels or {})}},
                "spec": {"taints": list(taints or [])},
                "status": self._node_status(resources)}
        with self.lock:
            self.nodes[name] = body
            self.devices[name] = NodeDevices(name, gpus, shared_gpus, gpu_uuids)
        self._serve_pod_resources(name)
        node = self.api.post("/api/v1/nodes", body)
        # Status is accepted on create, but write it again to be sure; then drop the taint the
        # TaintNodesByCondition admission plugin put on (no nodelifecycle controller will).
        self.api.patch(f"/api/v1/nodes/{name}/status", {"status": body["status"]})
        kept = [t for t in node["spec"].get("taints", []) if t["key"] != NOT_READY_TAINT]
        node = self.api.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": kept or None}},
                              strategic=False)
        self._renew_lease(name)
        return node

    def remove_node(self, name: str, *, delete_pods: bool = True):
        """The node dies: its container processes are killed, its Node object and Lease
        deleted, and with ``delete_pods`` its pods force-deleted (the pod GC controller would do
        that too, after a ~40 s quarantine)."""
        with self.lock:
            self.nodes.pop(name, None)
            keys = [k for k, p in self.pods.items() if p["spec"].get("nodeName") == name]
            server = self._podres.pop(name, None)
        if server is not None:
            server.stop()
        for key in keys:
            self.queue.add(key)               # not ours any more: the worker kills its processes
        for path in (f"/api/v1/nodes/{name}",
                     f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"):
            try:
                self.api.delete(path)
            except KubeError as e:
                if e.status != 404:
                    raise
        if delete_pods:
            for ns, pod in keys:
                try:
                    self.api.delete(f"/api/v1/namespaces/{ns}/pods/{pod}",
                                    {"gracePeriodSeconds": 0})
                except KubeError as e:
                    if e.status != 404:
                        raise

    def pod_resources_socket(self, node: str) -> Path:
        """Where ``node``'s kubelet serves its pod-resources API (like
        /var/lib/kubelet/pod-resources/kubelet.sock on a real node)."""
        return self._sockets / node / "kubelet.sock"

    def _serve_pod_resources(self, node: str):
        try:
            from .podresources import PodResourcesServer
            server = PodResourcesServer(self.pod_resources_socket(node),
                                        lambda: self._pod_devices(node))
        except ImportError:
            return                            # no grpcio: no pod-resources API
        with self.lock:
            old = self._podres.pop(node, None)
            self._podres[node] = server
        if old is not None:
            old.stop()

    def _pod_devices(self, node: str):
        with self.lock:
            runs = [r for r in self.runs.values() if r.node == node]
        return [(r.namespace, r.name, [(c, r.devices.get(c, {})) for c in r.containers])
                for r in runs]

    def _node_status(self, resources: dict) -> dict:
        now = now_iso()
        conditions = [{"type": t, "status": "False", "reason": f"KubeletHas{r}",
                       "lastHeartbeatTime": now, "lastTransitionTime": now}
                      for t, r in (("MemoryPressure", "SufficientMemory"),
                                   ("DiskPressure", "NoDiskPressure"),
                                   ("PIDPressure", "SufficientPID"))]
        conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                           "message": "kubelet simulator is posting ready status",
                           "lastHeartbeatTime": now, "lastTransitionTime": now})
        return {"capacity": resources, "allocatable": resources, "conditions": conditions,
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.logs.port}},
                "nodeInfo": {"machineID": "sim", "systemUUID": "sim", "bootID": "sim",
                             "kernelVersion": "sim", "osImage": "kubelet simulator",
                             "containerRuntimeVersion": "sim://1", "kubeletVersion": "v1.20.2",
                             "kubeProxyVersion": "v1.20.2", "operatingSystem": "linux",
                             "architecture": "amd64"}}

    def _renew_lease(self, name: str):
        path = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
        spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now}
        try:
            self.api.patch(f"{path}/{name}", {"spec": spec}, strategic=False)
        except KubeError as e:
            if e.status != 404:
                raise
            if name in self.nodes:            # not for a node removed meanwhile
                try:
                    self.api.post(path, {"metadata": {"name": name}, "spec": spec})
                except KubeError as e:
                    if e.status != 409:  # the heartbeat thread made it just now: renewed
                        raise

    def _heartbeat(self):
        beats = 0
        while not self._stopping.wait(self.heartbeat_s):
            beats += 1
            with self.lock:
                names = list(self.nodes)
            for name in names:
                try:
                    self._renew_lease(name)
                    if beats % 6 == 0:        # node status less often, as a kubelet does
                        now = now_iso()
                        conds = [{"type": t, "lastHeartbeatTime": now} for t in
                                 ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")]
                        self.api.patch(f"/api/v1/nodes/{name}/status",
                                       {"status": {"conditions": conds}})
                except Exception as e:        # the API server may be restarting: next beat
                    log.debug("heartbeat of %s failed: %s", name, e)

    # -- pods: list then watch -------------------------------------------------------------
    def _reflect(self):
        backoff = 0.2
        while not self._stopping.is_set():
            try:
                listing = self.api.get("/api/v1/pods", fieldSelector="spec.nodeName!=")
                rv = listing["metadata"]["resourceVersion"]
                fresh = {(p["metadata"]["namespace"], p["metadata"]["name"]): p
                         for p in listing["items"]}
                with self.lock:
                    gone = set(self.pods) - set(fresh)
                    self.pods = fresh
                for key in gone | set(fresh):
                    self.queue.add(key)
                self.relists += 1
                self.synced.set()
                backoff = 0.2
                while not self._stopping.is_set():
                    for event in self.api.watch("/api/v1/pods", rv, timeout_seconds=240,
                                                fieldSelector="spec.nodeName!="):
                        obj = event["object"]
                        rv = obj["metadata"]["resourceVersion"]
                        if event["type"] == "BOOKMARK":
                            continue
                        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
                        with self.lock:
                            if event["type"] == "DELETED":
                                self.pods.pop(key, None)
                            else:
                                self.pods[key] = obj
                        self.queue.add(key)
            except Exception as e:
                # 410 Gone, a dropped stream, the API server restarting: list again.
                if self._stopping.is_set():
                    return
                log.info("pod watch ended (%s); listing again in %.1f s", e, backoff)
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 2.0)       # tests want a quick recovery

    def _work(self):
        while True:
            key = self.queue.get()
            if key is None:
                return
            try:
                self._sync(key)
            except Exception as e:
                if not self._stopping.is_set():
                    log.info("syncing pod %s/%s failed (%s); retrying", *key, e)
                    self.queue.add_after(key, 1.0)
            finally:
                self.queue.done(key)

    # -- pods: one reconcile ----------------------------------------------------------------
    def _sync(self, key):
        with self.lock:
            pod = self.pods.get(key)
            run = self.runs.get(key)
            ours = pod is not None and pod["spec"].get("nodeName") in self.nodes
        if run and (not ours or pod["metadata"]["uid"] != run.uid):
            self._forget(key, run)            # deleted, recreated, or its node is gone
            run = None
        if not ours:
            return
        meta, phase = pod["metadata"], pod.get("status", {}).get("phase", "Pending")
        if meta.get("deletionTimestamp"):
            return self._terminate(key, pod, run)
        if run is None:
            if phase in ("Succeeded", "Failed"):
                return                        # finished before we (re)started; nothing runs
            return self._start(key, pod)
        for c in run.containers.values():
            if c.restart_at is not None and time.monotonic() >= c.restart_at:
                self._restart(run, c, pod)
            elif c.poll():
                policy = run.restart_policy
                if policy == "Always" or (policy == "OnFailure" and c.exit_code != 0):
                    c.last_state = c.terminated_state()
                    c.exit_code = None
                    c.restart_at = time.monotonic() + RESTART_BACKOFF_S
                    self.queue.add_after(key, RESTART_BACKOFF_S)
        self._report(run, pod)
        self._schedule_fake_exits(key, run)

    def _start(self, key, pod):
        if self.start_delay_s:                # "pulling the image": counted from first sight
            first = self._first_seen.setdefault(pod["metadata"]["uid"], time.monotonic())
            wait = first + self.start_delay_s - time.monotonic()
            if wait > 0:
                self.queue.add_after(key, wait)
                return
            self._first_seen.pop(pod["metadata"]["uid"], None)
        meta, spec = pod["metadata"], pod["spec"]
        directory = self.workdir / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        (directory / "home").mkdir(parents=True, exist_ok=True)
        run = PodRun(uid=meta["uid"], namespace=meta["namespace"], name=meta["name"],
                     node=spec["nodeName"], ip=self._allocate_ip(), directory=directory,
                     restart_policy=spec.get("restartPolicy", "Always"))
        pod.setdefault("status", {}).update(podIP=run.ip, hostIP="127.0.0.1")
        annotations = meta.get("annotations") or {}
        wanted = annotations.get(ANN_RUN_LOCALLY)
        devices = self.devices.get(spec["nodeName"])
        for cspec in spec["containers"]:
            if devices is not None:
                got = devices.allocate(meta["uid"], (cspec.get("resources") or {}).get(
                    "limits") or {})
                if got:
                    run.devices[cspec["name"]] = got
            if wanted == "true":
                local = bool(cspec.get("command") or cspec.get("args"))
            else:
                local = wanted is None and self.run_commands and bool(cspec.get("command"))
            c = ContainerRun(name=cspec["name"], image=cspec.get("image", ""), local=local)
            run.containers[c.name] = c
            self._launch(run, c, cspec, pod)
        with self.lock:
            self.runs[key] = run
        self._report(run, pod)
        self._schedule_fake_exits(key, run)

    def _launch(self, run: PodRun, c: ContainerRun, cspec: dict, pod: dict):
        if not c.local:
            start_simulated(run, c, pod["metadata"].get("annotations") or {})
            return
        base = self._base_env or default_base_env(run.directory / "home", self._api_host,
                                                  self._api_port)
        env = container_env(pod, cspec, {**base, "HOSTNAME": run.name}, self._read_data)
        if run.devices.get(c.name):
            env["NVIDIA_VISIBLE_DEVICES"] = visible_devices(run.devices[c.name])
        argv, cwd = container_argv(cspec, env), cspec.get("workingDir")
        if self.prepare is not None:
            argv, env = self.prepare(pod, cspec, argv, env)
        container_id = new_container_id()
        join = self.cgroups.enter(pod, container_id) if self.cgroups is not None else None
        start_process(run, c, argv, cwd, env, container_id, join)
        if c.proc is not None:
            key = (run.namespace, run.name)
            threading.Thread(target=self._wait_exit, args=(key, c.proc), daemon=True,
                             name=f"kubelet-sim-wait-{run.name}").start()

    def _restart(self, run: PodRun, c: ContainerRun, pod: dict):
        c.restart_at = None
        c.restart_count += 1
        c.exit_code, c.reason, c.message, c.fake_end = None, "", "", None
        cspec = next(s for s in pod["spec"]["containers"] if s["name"] == c.name)
        self._launch(run, c, cspec, pod)

    def _wait_exit(self, key, proc):
        proc.wait()
        self.queue.add(key)

    def _schedule_fake_exits(self, key, run: PodRun):
        for c in run.containers.values():
            if c.fake_end is not None and c.exit_code is None and c.restart_at is None:
                self.queue.add_after(key, c.fake_end - time.monotonic() + 0.01)

    def _terminate(self, key, pod, run: PodRun | None):
        meta = pod["metadata"]
        if run is not None:
            if not run.terminating:
                run.terminating = True
                grace = meta.get("deletionGracePeriodSeconds") or 0
                run.kill_at = time.monotonic() + grace
                for c in run.containers.values():
                    signal_container(c, signal.SIGTERM if grace else signal.SIGKILL)
                if grace:
                    self.queue.add_after(key, grace)
            elif time.monotonic() >= run.kill_at:
                for c in run.containers.values():
                    signal_container(c, signal.SIGKILL)
            for c in run.containers.values():
                c.poll()
            if run.alive():
                return                        # _wait_exit or the SIGKILL timer comes back
            try:
                self._report(run, pod)
            except KubeError:
                pass                          # best effort: the object goes away next
        try:
            self.api.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                            {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})
        except KubeError as e:
            if e.status not in (404, 409):
                raise

    def _report(self, run: PodRun, pod: dict):
        status = run.status("127.0.0.1")
        if status == run.reported:
            return
        try:
            # The uid in the patch makes it fail on a recreated pod of the same name.
            self.api.patch(f"/api/v1/namespaces/{run.namespace}/pods/{run.name}/status",
                           {"metadata": {"uid": run.uid}, "status": status})
        except KubeError as e:
            if e.status in (404, 409, 422):
                return                        # gone or replaced: the watch tells us
            raise
        run.reported = status

    def _forget(self, key, run: PodRun):
        for c in run.containers.values():
            signal_container(c, signal.SIGKILL)
        with self.lock:
            if self.runs.get(key) is run:
                del self.runs[key]
            self._ips.discard(run.ip)
            devices = self.devices.get(run.node)
        if devices is not None:
            devices.release(run.uid)
        if self.cgroups is not None:
            self.cgroups.remove(run.uid)
        # The pod's directory (its logs) stays for post-mortems; the API no longer serves it.

    # -- helpers -----------------------------------------------------------------------------
    def _allocate_ip(self) -> str:
        with self.lock:
            for n in range(1, 250 * 254):
                ip = f"127.0.{1 + n // 254}.{1 + n % 254}"
                if ip not in self._ips:
                    self._ips.add(ip)
                    return ip
        raise RuntimeError("the kubelet simulator ran out of loopback pod IPs")

    def _read_data(self, kind: str, namespace: str, name: str) -> dict | None:
        try:
            return decode_data(kind, self.api.get(f"/api/v1/namespaces/{namespace}/{kind}/{name}"))
        except KubeError:
            return None

    def _find_log(self, namespace: str, pod: str, container: str, previous: bool):
        with self.lock:
            run = self.runs.get((namespace, pod))
        if run is None or container not in run.containers:
            return None
        path = run.log_path(container, previous)
        if previous and not path.exists():
            return None
        return path, run.containers[container].running

    def run_of(self, namespace: str, name: str) -> PodRun | None:
        """What the simulator runs for a pod (its containers' processes, IP, log files)."""
        with self.lock:
            return self.runs.get((namespace, name))
