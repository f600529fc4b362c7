"""``python -m jupyter_gpushare.agent``: the node agent, one per GPU node (a DaemonSet).

Configured like the pool service: ``--NodeAgent.option=value`` on the command line or a
config file (``--NodeAgent.config_file``); every option has a help text (``--help-all``).
The I/O around the pure steps of ``agent/__init__.py``: NVML and the kubelet's socket in
worker threads, the Kubernetes API and the pool over HTTP, and one log line per problem
(when it starts, and when it is over), never a crash.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

from traitlets import CaselessStrEnum, Float, TraitError, Unicode, default, validate
from traitlets.config import Application

from .. import __version__
from ..client import ClientError, NoCredentials, PoolClient, PoolError, PoolUnreachable
from ..usage.sampler import MachineReading, NVMLSampler
from . import cgroup, pods, report
from .podresources import DEFAULT_SOCKET, PodResources, PodResourcesError

NODE_TOKEN_FILE = "/var/run/secrets/gpushare/token"


class Problems:
    """One log line when a problem starts or changes, one when it is over: a node agent
    that repeats the same sentence every five seconds buries it."""

    def __init__(self, log: logging.Logger):
        self.log = log
        self.now: dict[str, str] = {}

    def say(self, key: str, sentence: str) -> None:
        if self.now.get(key) != sentence:
            self.now[key] = sentence
            self.log.warning("%s", sentence)

    def over(self, key: str, sentence: str) -> None:
        if self.now.pop(key, None) is not None:
            self.log.info("%s", sentence)

    def sentences(self, *keys: str) -> list[str]:
        return [self.now[k] for k in keys if k in self.now]


class NodePods:
    """This node's pods in ``namespace`` (all namespaces when empty), listed from the API with
    the field selector ``spec.nodeName=<node>``: listed again when a pod it does not know
    shows up (at most once per ``min_relist`` seconds) and every ``resync`` seconds."""

    def __init__(self, api, node: str, namespace: str, min_relist: float, resync: float):
        self.api, self.node, self.namespace = api, node, namespace
        self.min_relist, self.resync = min_relist, resync
        self.by_uid: dict[str, pods.PodOwner] = {}
        self.by_name: dict[tuple[str, str], str] = {}
        self.listed_at = float("-inf")

    def knows(self, uid: str) -> bool:
        return uid in self.by_uid

    async def refresh(self, uids=(), names=(), now: float | None = None) -> bool:
        """List again if needed; True when it did."""
        now = time.monotonic() if now is None else now
        unknown = any(u not in self.by_uid for u in uids) or \
            any(n not in self.by_name for n in names)
        if now - self.listed_at < (self.min_relist if unknown else self.resync):
            return False
        self.listed_at = now  # also on failure: the next try waits as long
        selector = f"spec.nodeName={self.node}"
        core = self.api.core
        if self.namespace:
            listing = await self.api.json("list this node's pods", core.list_namespaced_pod,
                                          self.namespace, field_selector=selector)
        else:
            listing = await self.api.json("list this node's pods",
                                          core.list_pod_for_all_namespaces,
                                          field_selector=selector)
        self.by_uid = pods.owners(listing.get("items") or [])
        self.by_name = {(o.namespace, o.name): o.uid for o in self.by_uid.values()}
        return True


class NodeAgent(Application):
    name = "gpushare-agent"
    version = __version__
    description = ("The jupyter-gpushare node agent: reads this node's GPUs, attributes their "
                   "processes to train jobs and build slices by their pods, and posts the "
                   "readings to the pool service.")

    config_file = Unicode("", help="Python config file to load (c.NodeAgent.… = …), if "
                          "given.").tag(config=True)

    node_name = Unicode(help="""
        Name of this node as Kubernetes knows it (the DaemonSet passes spec.nodeName in
        NODE_NAME). The pool believes a reading's claims only for jobs and slices it placed
        on this node. Default: $NODE_NAME, else the host name.
        """).tag(config=True)

    pool_url = Unicode(help="""
        The pool service's address, e.g. http://proxy-public/services/gpushare/ (through the
        hub's proxy) or the service's own URL inside the cluster. Default: $GPUSHARE_URL.
        """).tag(config=True)

    api_token = Unicode(help="""
        The JupyterHub API token of the agent's service (c.GPUUsage.agent_service,
        "gpushare-agent", or this node's service in c.GPUUsage.agent_nodes): only they may
        post readings. Default: $JUPYTERHUB_API_TOKEN. Never logged.
        """).tag(config=True)

    node_token_file = Unicode(NODE_TOKEN_FILE, help="""
        The agent pod's own service-account token, projected by the kubelet for the audience
        "gpushare" (hub_config/kubernetes-agent.yaml): sent with every reading, it proves to
        the pool which node the reading is from, since the agent service's one token is on
        every node. Read again for each reading (the kubelet renews it). Where the file does
        not exist (an agent with a service of its own per node), nothing is sent. Never logged.
        """).tag(config=True)

    namespace = Unicode(help="""
        Namespace of the pods to attribute: where the pool's job pods and the hub's notebook
        pods run. Default: the agent's own namespace (its service account's). Empty string:
        all namespaces (then its RBAC must be a ClusterRole).
        """).tag(config=True)

    kubeconfig = Unicode("", help="""
        Path of a kubeconfig for the Kubernetes API. Empty: the pod's service account.
        """).tag(config=True)

    sample_interval = Float(5.0, help="""
        Seconds between two readings; the same as the pool's c.GPUUsage.sample_interval.
        """).tag(config=True)

    pod_resources_socket = Unicode(DEFAULT_SOCKET, help="""
        The kubelet's pod-resources socket: which GPUs each container was given. Without
        it, a pod counts as holding only the GPUs its processes run on (idle pods then hold
        nothing).
        """).tag(config=True)

    proc = Unicode("/proc", help="""
        Where the node's processes are (/proc with hostPID: true); each GPU process's pod
        comes from <proc>/<pid>/cgroup.
        """).tag(config=True)

    nvml = CaselessStrEnum(["nvml", "standin"], "nvml", help="""
        "nvml": this node's GPUs through nvidia-ml-py. "standin": the NVML stand-in playing
        nvml_standin_script (machines without a GPU: tests and demos only).
        """).tag(config=True)

    nvml_standin_script = Unicode("", help="""
        The NVML stand-in's script (JSON; jupyter_gpushare/usage/nvml_standin.py), read
        again whenever it changes. Only with nvml = "standin".
        """).tag(config=True)

    max_backoff = Float(60.0, help="""
        Longest wait, in seconds, before trying the pool again after it failed or refused;
        the wait doubles from sample_interval. The next try sends the newest reading.
        """).tag(config=True)

    pod_resync_interval = Float(60.0, help="""
        Seconds between two listings of this node's pods when nothing new shows up (a pod
        that is not known yet is looked up at once).
        """).tag(config=True)

    request_timeout = Float(10.0, help="""
        Seconds one request to the pool, the Kubernetes API or the kubelet may take.
        """).tag(config=True)

    aliases = {"node": "NodeAgent.node_name", "url": "NodeAgent.pool_url",
               "interval": "NodeAgent.sample_interval", "config": "NodeAgent.config_file"}

    @default("log_level")
    def _log_level(self):
        return logging.INFO

    @default("node_name")
    def _default_node(self):
        return os.environ.get("NODE_NAME") or socket.gethostname()

    @default("pool_url")
    def _default_url(self):
        return os.environ.get("GPUSHARE_URL", "")

    @default("api_token")
    def _default_token(self):
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    @default("namespace")
    def _default_namespace(self):
        from ..backends.kube.api import default_namespace
        return default_namespace()

    @validate("sample_interval")
    def _check_interval(self, proposal):
        if not 0 < proposal.value <= 600:
            raise TraitError("NodeAgent.sample_interval must be more than 0 and at most 600 "
                             "seconds")
        return proposal.value

    def initialize(self, argv=None):
        super().initialize(argv)
        if self.config_file:
            self.load_config_file(self.config_file)  # the command line still wins
        self.problems = Problems(self.log)
        self.sent = 0  # readings the pool took, for the log and tests

    # -- the parts --------------------------------------------------------------------------
    def make_sampler(self) -> NVMLSampler:
        if self.nvml == "standin":
            from ..usage.nvml_standin import NVMLStandIn
            return NVMLSampler(self.node_name, NVMLStandIn(self.nvml_standin_script or {}))
        return NVMLSampler(self.node_name)

    def start(self):
        try:
            asyncio.run(self.run())
        except KeyboardInterrupt:
            pass

    async def run(self) -> None:
        from ..backends.kube.api import KubeAPI, make_client
        self.log.info("gpushare node agent on %s: readings every %g s to %s", self.node_name,
                      self.sample_interval, self.pool_url or "(no pool URL)")
        sampler = self.make_sampler()
        kubelet = PodResources(self.pod_resources_socket, self.request_timeout)
        client = PoolClient(self.pool_url, self.api_token, timeout=self.request_timeout,
                            retry_s=0)
        api = None
        node_pods = None
        loop = asyncio.get_running_loop()
        pending, started = None, 0.0
        backoff = 0.0
        try:
            while True:
                wait = self.sample_interval
                try:
                    if api is None:
                        api = KubeAPI(await make_client(self.kubeconfig),
                                      retry_s=min(5.0, self.request_timeout), log=self.log,
                                      timeout_s=self.request_timeout)
                        node_pods = NodePods(api, self.node_name, self.namespace,
                                             min_relist=min(2.0, self.sample_interval),
                                             resync=self.pod_resync_interval)
                        self.problems.over("kube", "The Kubernetes API can be used again.")
                    if pending is None:
                        pending = asyncio.ensure_future(asyncio.to_thread(sampler.read))
                        started = loop.time()
                    done, _ = await asyncio.wait({pending}, timeout=self.sample_interval)
                    if not done:
                        self.problems.say("nvml", f"NVML has not answered for "
                                          f"{loop.time() - started:.0f} s (a hung driver?); "
                                          f"no readings until it does.")
                        continue
                    future, pending = pending, None
                    reading = future.result()
                    self.problems.over("nvml", "NVML answers again.")
                    body = await self.body(reading, kubelet, node_pods)
                    backoff = await self.post(client, body, backoff)
                    wait = max(self.sample_interval, backoff)
                except Exception as exc:  # noqa: BLE001 - the agent keeps going whatever fails
                    pending = None
                    if api is None:
                        self.problems.say("kube", f"The Kubernetes API client cannot be set "
                                          f"up ({exc}); trying again.")
                    else:
                        self.problems.say("loop", f"A reading failed ({type(exc).__name__}: "
                                          f"{exc}); trying again.")
                    wait = max(self.sample_interval, 5.0)
                await asyncio.sleep(wait)
        finally:
            sampler.close()
            kubelet.close()
            if api is not None:
                await api.close()

    async def body(self, reading: MachineReading, kubelet: PodResources,
                   node_pods: NodePods) -> dict:
        """Steps 2–5: pods of the processes, devices of the pods, owners, the body."""
        pids = {p.pid for g in reading.gpus for p in g.all_processes()}
        pod_of_pid = {}
        for pid in pids:
            found = cgroup.pod_of(pid, self.proc)
            if found is not None:
                pod_of_pid[pid] = found.uid
        listed = None
        try:
            listed = await asyncio.to_thread(kubelet.list)
            self.problems.over("kubelet", "The kubelet's pod-resources socket answers again.")
        except PodResourcesError as exc:
            self.problems.say("kubelet", f"{exc}; GPUs count as held only where a pod's "
                              f"processes run.")
        wanted = [p for p in listed or () if not self.namespace or p.namespace == self.namespace]
        try:
            await node_pods.refresh(uids=set(pod_of_pid.values()),
                                    names={(p.namespace, p.name) for p in wanted})
            self.problems.over("pods", "This node's pods can be listed again.")
        except Exception as exc:  # noqa: BLE001 - KubeError, or a connection that broke
            self.problems.say("pods", f"This node's pods cannot be listed ({exc}); their "
                              f"processes show as outside gpushare until they can.")
        devices = None
        if listed is not None:
            devices = {node_pods.by_name[(p.namespace, p.name)]: p.devices for p in wanted
                       if (p.namespace, p.name) in node_pods.by_name}
        problems = self.problems.sentences("kubelet", "pods")
        return report.samples_body(reading, pod_of_pid, node_pods.by_uid, devices, problems)

    def node_token(self) -> str:
        """The pod's projected token, as the kubelet last renewed it ("" where there is none)."""
        try:
            with open(self.node_token_file) as f:
                return f.read().strip()
        except OSError:
            return ""

    async def post(self, client: PoolClient, body: dict, backoff: float) -> float:
        """Step 6: the reading to the pool. Returns the back-off before the next try (0 when
        the pool took it)."""
        try:
            await asyncio.to_thread(client.post_samples, body, self.node_token())
        except (PoolUnreachable, PoolError, NoCredentials, ClientError) as exc:
            backoff = min(self.max_backoff, max(self.sample_interval, backoff * 2))
            if isinstance(exc, PoolError) and exc.status == 403:
                why = (f"The pool refuses this agent's readings ({exc}); give the agent the "
                       f"token of the JupyterHub service that the pool's "
                       f"c.GPUUsage.agent_service names (with its pod's token in "
                       f"{self.node_token_file}), or this node's in c.GPUUsage.agent_nodes.")
            elif isinstance(exc, PoolError):
                why = f"The pool refused a reading (HTTP {exc.status}: {exc})."
            else:
                why = f"Readings are not reaching the pool: {exc}."
            self.problems.say("pool", f"{why} Trying again, waiting up to "
                              f"{self.max_backoff:g} s between tries.")
            return backoff
        self.sent += 1
        if self.sent == 1:
            self.log.info("The pool took the first reading of %s (%d GPUs).", body["node"],
                          len(body["gpus"]))
        self.problems.over("pool", "Readings reach the pool again.")
        return 0.0


main = NodeAgent.launch_instance
