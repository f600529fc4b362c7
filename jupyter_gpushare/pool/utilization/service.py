"""GPU utilization in the pool service: options, and the wiring of ``usage/`` to the store, the
backend and the build pool.

``c.GPUUsage.*`` in ``gpushare_config.py``. Where the train pool runs on the service's own
machine (the local backend), the service reads the GPUs itself every ``sample_interval``:
through NVML, or through the NVML stand-in over the labelled simulated GPUs where the machine
has none. Elsewhere (Kubernetes), node agents post their readings (``api/samples``): only the
services named ``agent_service`` and in ``agent_nodes`` may, each for the node it proves it is
on (``utilization/node_agents.py``).
"""

from __future__ import annotations

from pathlib import Path

from traitlets import Bool, CaselessStrEnum, Dict, Float, TraitError, Unicode, default, validate
from traitlets.config import LoggingConfigurable

from ...backends.base import SIMULATED_LABEL, Backend
from ...gpus import SIMULATED_NAME
from ...policy.model import GPU
from ...trainjob import RUNNING
from ...usage.attribution import Holding, Owner
from ...usage.cull import CullSettings
from ...usage.meter import LocalContext, UsageMeter, UsageSettings
from ...usage.rollup import DAY
from ...usage.sampler import NVMLSampler
from ..build.build_pool import BuildPool
from ..build.culler import SliceCuller
from ..hub import HubAPI
from ..store.database import Store
from ..store.usage_rollups import UsageStore
from ..web.log_follows import Follows
from .node_agents import AgentNodes, PodTokens



def job_owner(job_id: str, attempt: int, user: str, project: str) -> Owner:
    return Owner("job", f"{job_id}/{attempt}", user, project, job_id)


def slice_owner(slice_id: str, user: str) -> Owner:
    return Owner("slice", slice_id, user)


class GPUUsage(LoggingConfigurable):
    """How the pool measures what its GPUs do (docs/explanation/utilization.md)."""

    sample_interval = Float(UsageSettings.sample_interval, help="""
        Seconds between two readings of the GPUs (SM utilization, memory and processes of
        each, through NVML). Each reading costs a few NVML calls per GPU, in a worker thread.
        """).tag(config=True)

    idle_threshold = Float(UsageSettings.idle_threshold, help="""
        SM utilization, in percent of what a job or slice holds, below which its GPU time
        counts as idle-allocated (a ¼ slice is idle below 1.25 % of its GPU).
        """).tag(config=True)

    idle_job_after = Float(UsageSettings.idle_job_after, help="""
        Seconds a train job's GPUs must stay below idle_threshold before the job is flagged
        idle (in api/jobs, gpushare jobs, the metrics) and, with reclaim_idle_first, taken
        first when GPUs are reclaimed.
        """).tag(config=True)

    reclaim_idle_first = Bool(True, help="""
        When GPUs are reclaimed from projects over their quota, take their idle jobs before
        their busy ones. Only over-quota projects' jobs are ever taken, idle or not.
        """).tag(config=True)

    usage_rollup_after_days = Float(UsageSettings.rollup_after / DAY, help="""
        Days the 1-minute usage rows are kept; older ones remain as hourly rows.
        """).tag(config=True)

    usage_retention_days = Float(UsageSettings.retention / DAY, help="""
        Days hourly usage rows are kept; older ones are dropped.
        """).tag(config=True)

    nvml = CaselessStrEnum(["auto", "nvml", "standin", "off"], "auto", help="""
        Where this service reads GPUs: "nvml" (this machine's, through nvidia-ml-py), "standin"
        (the NVML stand-in playing nvml_standin_script over the simulated GPUs: for demos
        and tests on machines without a GPU), "off" (only node agents report, through
        api/samples). "auto": on the local backend, "nvml" where it found GPUs and "standin"
        where it simulates them; on other backends "off".
        """).tag(config=True)

    nvml_standin_script = Unicode(help="""
        The NVML stand-in's script (JSON; see jupyter_gpushare/usage/nvml_standin.py), read
        again whenever it changes. Default: nvml-standin.json in the service's state_dir.
        Without it, the stand-in plays the simulated GPUs with nothing running on them.
        """).tag(config=True)

    agent_service = Unicode("gpushare-agent", help="""
        Name of the JupyterHub service whose one token the node agents of the DaemonSet
        (hub_config/kubernetes-agent.yaml) post readings with (api/samples). That token is
        on every GPU node, so each reading must also carry the agent pod's own
        service-account token (projected, audience "gpushare"): the pool asks Kubernetes
        (a TokenReview) which pod it is bound to and takes that pod's node, and refuses a
        reading for any other node. Only with the Kubernetes backend; elsewhere use
        agent_nodes. No other user or service may post readings.
        """).tag(config=True)

    agent_nodes = Dict(key_trait=Unicode(), value_trait=Unicode(), help="""
        Node agents with a JupyterHub service each: {service name: node name}. Such a
        service's token proves its node by itself, and its readings are taken for that node
        only. For agents on machines without Kubernetes; each needs its own service and token
        (c.JupyterHub.services) with access to the pool.
        """).tag(config=True)

    agent_service_account = Unicode("gpushare-agent", help="""
        The Kubernetes service account of the agent_service's pods: "name" in the Kubernetes
        backend's namespace, or "namespace/name". A pod token of any other account is refused.
        """).tag(config=True)

    cull_idle_slices_after = Float(0.0, help="""
        Stop notebook servers whose build slice showed no GPU use and that the hub saw no
        activity from (busy kernels count as activity) for this many seconds, e.g. 7200;
        never while a kernel is busy or a train job's output is being followed. A server is
        warned first (logged, and in api/slices) and stopped cull_warning seconds later
        through the hub's API. 0 (the default) turns culling off. The service's role then
        needs the scopes read:users, read:servers and servers.
        """).tag(config=True)

    cull_warning = Float(600.0, help="""
        Seconds between the warning to an idle build session and its stop.
        """).tag(config=True)

    @validate("sample_interval")
    def _check_interval(self, proposal):
        if not 0 < proposal.value <= 600:
            raise TraitError("GPUUsage.sample_interval must be more than 0 and at most 600 "
                             "seconds")
        return proposal.value

    @validate("usage_retention_days")
    def _check_retention(self, proposal):
        if proposal.value < self.usage_rollup_after_days:
            raise TraitError("GPUUsage.usage_retention_days must be at least "
                             "usage_rollup_after_days")
        return proposal.value

    def __init__(self, store: Store, backend: Backend, build: BuildPool, state_dir: str,
                 follows: Follows, hub: HubAPI, **kwargs):
        """``state_dir``: the service's (the stand-in's script lives there by default);
        ``follows`` and ``hub``: what culling asks (who follows a job's output now; the
        servers' activity, and stopping them)."""
        self.store, self.backend, self.build, self.state_dir = store, backend, build, state_dir
        super().__init__(**kwargs)
        self.meter = UsageMeter(UsageStore(store), UsageSettings(
            self.sample_interval, self.idle_threshold, self.idle_job_after,
            self.usage_rollup_after_days * DAY, self.usage_retention_days * DAY), self.log)
        self.source = self._source()
        self.culler = SliceCuller(store, self.meter, hub, follows.following, CullSettings(
            self.cull_idle_slices_after, self.cull_warning), self.log) \
            if self.cull_idle_slices_after > 0 else None
        self._kube = None
        self.agents = AgentNodes(self.agent_service, self.agent_nodes, self._pod_tokens())

    def _pod_tokens(self) -> PodTokens | None:
        """Where the backend uses Kubernetes, the shared agent's pod tokens are checked there,
        with a client of their own (made at the first reading)."""
        where = self.backend.kubernetes()
        if where is None:
            return None
        kubeconfig, namespace = where
        account_namespace, _, account = self.agent_service_account.rpartition("/")

        async def kube():
            if self._kube is None:
                from ...backends.kube.api import KubeAPI, make_client
                self._kube = KubeAPI(await make_client(kubeconfig, connections=4), retry_s=2.0,
                                     log=self.log, timeout_s=10.0)
            return self._kube
        return PodTokens(kube, account_namespace or namespace, account)

    @default("nvml_standin_script")
    def _default_script(self):
        return str(Path(self.state_dir) / "nvml-standin.json")

    def _source(self) -> str:
        if self.nvml != "auto":
            return self.nvml
        found = self.backend.local_gpus()
        if not found:
            return "off"
        simulated = any(n.labels.get(SIMULATED_LABEL) for n in self.backend.nodes())
        return "standin" if simulated else "nvml"

    # -- local readings -------------------------------------------------------------------
    def samplers(self) -> list[NVMLSampler]:
        """One per machine read here: this one, or each simulated node."""
        if self.source == "off":
            return []
        if self.source == "nvml":
            import socket
            return [NVMLSampler(socket.gethostname())]
        from ...usage.nvml_standin import NVMLStandIn, gpus_script
        machines = {node: [g.uuid for g in found]
                    for node, found in self.backend.local_gpus().items()}
        for uuid, (node, _index) in sorted(self._build_uuids().items()):
            if not any(uuid in found for found in machines.values()):
                machines.setdefault(node, []).append(uuid)
        self.log.info("GPU use is played by the NVML stand-in (no GPU here; script %s)",
                      self.nvml_standin_script)
        return [NVMLSampler(node, NVMLStandIn(
            self.nvml_standin_script,
            default_gpus=[dict(g, name=SIMULATED_NAME) for g in gpus_script(uuids)]))
            for node, uuids in sorted(machines.items())]

    def _build_uuids(self) -> dict[str, tuple[str, int]]:
        return {uuid: where for where, uuid in self.build.uuids().items()}

    def context(self) -> LocalContext:
        """Who holds what on this machine now (store and backend; no I/O beyond them)."""
        holdings: dict[str, list[Holding]] = {}
        groups: dict = {}
        pools = {g.uuid: "train" for found in self.backend.local_gpus().values()
                 for g in found}
        rows = {r.id: r for r in self.store.jobs.active() if r.state == RUNNING}
        for a in self.backend.local_attempts():
            row = rows.get(a.job_id)
            if row is None or row.attempt != a.attempt:
                continue
            owner = job_owner(a.job_id, a.attempt, row.user, row.project)
            groups[a.pgid] = owner
            for uuids in a.devices.values():
                for uuid in uuids:
                    holdings.setdefault(uuid, []).append(Holding(owner, GPU))
        servers: dict = {}
        for s in self.store.slices.all():
            uuid = self.build.uuid(s.node, s.gpu)
            if uuid is None:
                continue
            pools.setdefault(uuid, "build")
            owner = slice_owner(s.id, s.user)
            holdings.setdefault(uuid, []).append(Holding(owner, s.milli))
            if s.pid:
                servers[s.pid] = owner
        for uuid in self._build_uuids():
            pools.setdefault(uuid, "build")
        return LocalContext(holdings, groups, servers, pools)

    def coroutines(self) -> list:
        """What runs beside the scheduling loop."""
        out = [self.meter.run_writer()]
        samplers = self.samplers()
        if samplers:
            out.append(self.meter.run_local(samplers, self.context))
        if self.culler is not None:
            out.append(self.culler.run())
        return out

    async def close(self) -> None:
        try:
            await self.meter.write(force=True)
        except Exception:  # noqa: BLE001 - stopping: say so, lose one minute at most
            self.log.exception("writing the last minute of GPU usage failed")
        if self._kube is not None:
            await self._kube.close()

    def idle_jobs(self) -> set[str]:
        return self.meter.idle_jobs() if self.reclaim_idle_first else set()

