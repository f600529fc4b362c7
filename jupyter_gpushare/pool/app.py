"""``python -m jupyter_gpushare.pool``: the pool service, started and managed by JupyterHub.

Configured like JupyterHub itself: ``gpushare_config.py`` (``c.PoolService.projects = ...``)
or command-line options; every option has a help text (``--help-all``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import signal
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlparse

from jupyterhub.services.auth import HubAuth
from tornado import web
from traitlets import Bool, Dict, Float, Integer, TraitError, Type, Unicode, default, validate
from traitlets.config import Application

from .. import __version__
from .. import gpus as gpu_inventory
from ..backends.base import Backend, Launch, private_dir
from ..backends.local import SIMULATED_LABEL, LocalBackend
from ..policy import SliceRefused, place_slice
from ..policy.model import BUILD, DEFAULT_MIN_RUNTIME_S, GPU, TRAIN, Node, PolicyConfig, Slice
from .api import routes
from .directory import HubDirectory, HubTokens
from .loop import Scheduler
from .models import JobRow, ProjectRow
from .store import Store, StoreError
from .sweep import release_stale
from .usage_service import GPUUsage


BACKENDS = {"local": "jupyter_gpushare.backends.local.LocalBackend",
            "kubernetes": "jupyter_gpushare.backends.kube.KubernetesBackend"}


# ``python -c SOURCE`` would put the working directory first on sys.path, where a module
# planted in a shared folder shadows the standard library: the source runs after it is taken
# off (any Python, unlike -P), as __main__, with sys.argv as -c leaves it.
SOURCE_BOOTSTRAP = ("import sys; del sys.path[0]; "
                    "exec(compile(sys.argv.pop(1), '<string>', 'exec'))")


class BackendType(Type):
    """A Backend class, by class, import name or short name (BACKENDS)."""

    def validate(self, obj, value):
        if isinstance(value, str):
            value = BACKENDS.get(value, value)
        return super().validate(obj, value)


class PoolService(Application):
    name = "gpushare-pool"
    version = __version__
    description = "The jupyter-gpushare pool service: a guaranteed-quota train pool in JupyterHub."
    classes = [LocalBackend, GPUUsage]

    config_file = Unicode("gpushare_config.py", help="Python config file to load if it "
                          "exists (relative to the working directory).").tag(config=True)

    projects = Dict(help="""Projects (queues) of the train pool, created in the store the first
        time they appear; afterwards admins change them through ``PUT api/projects/{name}``
        and those changes win. Each is ``{"quota": GPUs, "groups": [JupyterHub groups whose
        members may submit], "over_quota_weight": 1, "limit": GPUs or None, "priority": 0,
        "job_priority_min": -100, "job_priority_max": 0}``; members give their jobs
        priorities within that range, and a job's priority orders it within its project
        only.
        """).tag(config=True)

    state_dir = Unicode(help="Directory of the service's own files: the SQLite database by "
                        "default and the local backend's job files.").tag(config=True)

    db_url = Unicode(help="SQLAlchemy URL of the store. Default: SQLite in state_dir. "
                     "PostgreSQL: postgresql+psycopg://user@host/db").tag(config=True)

    backend_class = BackendType(LocalBackend, klass=Backend, help="Where train jobs run: "
                                "\"local\" (processes on this machine, the default), "
                                "\"kubernetes\" (pods on a Kubernetes train pool), or a "
                                "Backend subclass or its import name.").tag(config=True)

    cycle_interval = Float(1.0, help="Seconds between scheduling cycles; a submit or cancel "
                           "also runs one at once.").tag(config=True)
    grace_period = Float(30.0, help="Seconds a preempted or cancelled job gets between "
                         "SIGTERM and SIGKILL, to write a checkpoint.").tag(config=True)
    min_runtime = Float(DEFAULT_MIN_RUNTIME_S, help="Seconds a job runs before it may be "
                        "preempted, so that a job that borrowed an idle GPU is not stopped "
                        "again and again right after it starts (thrash). A job within quota "
                        "waits at most this long more for its GPUs: the guarantee is one "
                        "cycle plus the grace period plus min_runtime. 0 turns it off."
                        ).tag(config=True)
    reserve_after = Float(1800.0, help="Seconds a job waits before nodes are reserved for it, "
                          "so a stream of small jobs cannot starve a large gang.").tag(config=True)
    preempt_within_project = Bool(False, help="Let a higher-priority job preempt lower-priority "
                                  "jobs of its own project.").tag(config=True)
    reclaim_fair_share = Bool(False, help="Let borrowers below their deserved share preempt "
                              "borrowers above theirs (more preemptions: see 'Fair borrowing' "
                              "in the documentation's scheduling page).").tag(config=True)
    build_nodes = Dict(help="""The build pool, whose GPUs are cut into slices for notebook
        servers: ``{node name: GPUs}``, the first GPUs of each node by index. On one server,
        ``{hostname: N}``: the local backend leaves those N GPUs out of the train pool
        (LocalBackend.share_build_gpus). Empty: no build slices (servers get CPU-only
        profiles).""").tag(config=True)
    build_allowance = Float(0.5, help="GPUs of build slices one user may hold at once, all "
                            "their notebook servers together.").tag(config=True)

    max_body_size = Integer(1024 * 1024, help="Largest request body accepted, in bytes; a "
                            "larger one is refused (413) without being kept.").tag(config=True)
    max_pending_per_user = Integer(200, min=1, help="Jobs one user may have waiting at once; "
                                   "a submit beyond it is refused (429) until some start or "
                                   "are cancelled.").tag(config=True)
    max_job_size = Integer(256 * 1024, min=1024, help="Bytes a job's command, source, env and "
                           "workdir may take together; large code and data belong in "
                           "files.").tag(config=True)
    max_followers_per_user = Integer(10, min=1, help="Logs one user may follow at once "
                                     "(?follow=1, each an open connection).").tag(config=True)
    job_book_size = Integer(20_000, min=100, help="Jobs kept in memory for lists (every "
                            "waiting and running job, and the newest ended ones): lists that "
                            "reach older jobs than it holds are read from the database."
                            ).tag(config=True)
    job_book_megabytes = Integer(64, min=1, help="Megabytes the jobs kept in memory for lists "
                                 "may take (their commands and environments, mostly); the "
                                 "oldest ended jobs are forgotten first.").tag(config=True)
    token_cache_ttl = Float(60.0, help="Seconds the hub's answer for a token (whose it is) is "
                            "kept; a revoked token works for at most this long.").tag(config=True)
    token_cache_size = Integer(10_000, help="Tokens whose owner is kept at most (the least "
                               "recently used are forgotten first).").tag(config=True)
    unknown_token_rate = Float(5.0, help="Tokens the hub does not know that the service asks "
                               "about per second, after a burst of unknown_token_burst; beyond "
                               "that, unknown tokens are refused (429) without asking the hub, "
                               "while known ones keep working.").tag(config=True)
    unknown_token_burst = Integer(50, help="Unknown tokens asked about at once before "
                                  "unknown_token_rate applies.").tag(config=True)
    rights_ttl = Float(30.0, help="Seconds a user's admin flag and groups, asked from the hub, "
                       "are used before they are asked again (in the background).").tag(config=True)
    rights_max_stale = Float(300.0, help="Seconds a user's rights are used at most while the hub "
                             "does not answer; after that their requests are refused (503) "
                             "until it does, so a removed admin does not stay admin.").tag(config=True)
    ip = Unicode(help="Address the service listens on. Default: the host of its url in "
                 "JupyterHub.services ($JUPYTERHUB_SERVICE_URL). Where the proxy reaches the "
                 "service in another pod by a Service name (zero-to-jupyterhub: http://hub:10101)"
                 ", 0.0.0.0.").tag(config=True)
    python = Unicode("python3", help="Python that runs jobs given as source code, as found on "
                     "the user's PATH (the notebook issue sends the kernel's own).").tag(config=True)
    checkpoint_dir_template = Unicode("{home}/.gpushare/checkpoints/{job_id}", help="Checkpoint "
                                      "directory of a job, the same for all its attempts; "
                                      "{home} is the user's home, {user} and {job_id} too.").tag(config=True)

    @default("log_level")
    def _log_level(self):
        return logging.INFO  # as JupyterHub's own: what the service did is worth a line

    @default("state_dir")
    def _state_dir(self):
        return str(Path("gpushare-state").resolve())

    @default("db_url")
    def _db_url(self):
        return f"sqlite:///{Path(self.state_dir) / 'gpushare.sqlite'}"

    @validate("projects")
    def _check_projects(self, proposal):
        out = {}
        for name, spec in proposal["value"].items():
            if not isinstance(spec, dict):
                raise TraitError(f"PoolService.projects[{name!r}] must be a dict like "
                                 f"{{'quota': 2, 'groups': ['{name}']}}")
            extra = set(spec) - {"quota", "groups", "over_quota_weight", "limit", "priority",
                                 "job_priority_min", "job_priority_max"}
            if extra:
                raise TraitError(f"PoolService.projects[{name!r}] has unknown key(s) "
                                 f"{', '.join(sorted(extra))}")
            quota, limit = spec.get("quota", 0), spec.get("limit")
            if not isinstance(quota, (int, float)) or quota < 0:
                raise TraitError(f"PoolService.projects[{name!r}]['quota'] must be 0 or more GPUs")
            if limit is not None and (not isinstance(limit, (int, float)) or limit < quota):
                raise TraitError(f"PoolService.projects[{name!r}]['limit'] must be a number of "
                                 f"GPUs no smaller than its quota, or None")
            groups = spec.get("groups", [name])
            if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
                raise TraitError(f"PoolService.projects[{name!r}]['groups'] must be a list of "
                                 f"JupyterHub group names")
            low, high = spec.get("job_priority_min", -100), spec.get("job_priority_max", 0)
            if not all(isinstance(v, int) and -100 <= v <= 100 for v in (low, high)) \
                    or low > high:
                raise TraitError(f"PoolService.projects[{name!r}]: job_priority_min and "
                                 f"job_priority_max must be whole numbers from -100 to 100, "
                                 f"the min no larger than the max")
            out[name] = {"quota": quota, "groups": groups, "limit": limit,
                         "over_quota_weight": int(spec.get("over_quota_weight", 1)),
                         "priority": int(spec.get("priority", 0)),
                         "job_priority_min": low, "job_priority_max": high}
        return out

    _build_uuids: dict[tuple[str, int], str] | None = None  # found at the first use
    followers: dict[str, int]  # user -> logs they follow now

    # -- set-up -------------------------------------------------------------------------
    def initialize(self, argv=None):
        super().initialize(argv)
        self.followers = {}
        if self.config_file and Path(self.config_file).exists():
            self.load_config_file(self.config_file)
        private_dir(self.state_dir)  # the store holds every job's command and env
        self.submitting: Counter[str] = Counter()  # submits being stored, by user
        try:
            self.store = Store(self.db_url, self.job_book_size,
                               self.job_book_megabytes * 1024 * 1024)
        except StoreError as exc:
            self.log.critical("%s", exc)
            self.exit(2)
        self.backend = self.backend_class(parent=self, **self._backend_kwargs())
        capacity = self.train_capacity()
        configured = sum(round(p["quota"] * GPU) for p in self.projects.values())
        if configured > capacity:
            self.log.critical("The configured quotas add up to %g GPUs but the train pool has "
                              "%g: a guarantee that cannot be honoured is refused. Lower "
                              "PoolService.projects quotas.", configured / GPU, capacity / GPU)
            self.exit(2)
        created = self.store.add_missing_projects(
            ProjectRow(name=name, quota=round(p["quota"] * GPU), groups=p["groups"],
                       over_quota_weight=p["over_quota_weight"], priority=p["priority"],
                       job_priority_min=p["job_priority_min"],
                       job_priority_max=p["job_priority_max"],
                       limit=None if p["limit"] is None else round(p["limit"] * GPU),
                       updated=time.time())
            for name, p in self.projects.items())
        if created:
            self.log.info("created project(s) %s from the configuration", ", ".join(created))
        self.scheduler = Scheduler(self.store, self.backend, PolicyConfig(
            min_runtime_s=self.min_runtime, reserve_after_s=self.reserve_after,
            preempt_within_project=self.preempt_within_project,
            reclaim_fair_share=self.reclaim_fair_share),
            self.grace_period, self.launch_for, self.log)
        self.scheduler.explained.nodes = self.backend.nodes()  # api/pool before the first cycle
        self.usage = GPUUsage(self, parent=self)
        self.scheduler.idle_jobs = self.usage.idle_jobs
        api_url = os.environ.get("JUPYTERHUB_API_URL", "")
        self.directory = HubDirectory(api_url, os.environ.get("JUPYTERHUB_API_TOKEN", ""),
                                      self.rights_ttl, self.rights_max_stale)
        self.tokens = HubTokens(api_url, self.token_cache_ttl, self.token_cache_size,
                                self.unknown_token_rate, self.unknown_token_burst)

    def _backend_kwargs(self) -> dict:
        # A backend's own files go under the service's state_dir unless configured.
        cls = self.backend_class
        if "state_dir" in cls.class_trait_names() and "state_dir" not in \
                self.config.get(cls.__name__, {}):
            where = "local" if issubclass(cls, LocalBackend) else \
                cls.__name__.removesuffix("Backend").lower()
            return {"state_dir": str(Path(self.state_dir) / where)}
        return {}

    def build_pool(self) -> list[Node]:
        return [Node(name, int(gpus), pool=BUILD) for name, gpus in sorted(self.build_nodes.items())]

    def build_gpu_uuid(self, node: str, gpu: int) -> str | None:
        """The UUID of a build-pool GPU where this machine can name it: what a pinned slice puts
        in ``CUDA_VISIBLE_DEVICES``. None for a GPU of another machine (on Kubernetes the
        device plugin picks the device)."""
        if self._build_uuids is None:
            self._build_uuids = self._find_build_uuids()
        return self._build_uuids.get((node, gpu))

    def _find_build_uuids(self) -> dict[tuple[str, int], str]:
        # A simulated train pool means NVML found no GPU here: the build pool is simulated too,
        # and its UUIDs say so (GPU-SIMULATED-<node>-<index>). Otherwise only a build node
        # named like this host has GPUs NVML can name.
        simulated = any(n.labels.get(SIMULATED_LABEL) for n in self.backend.nodes())
        nvml = None if simulated else gpu_inventory.NVMLInventory()
        found = {}
        for name, count in self.build_nodes.items():
            if simulated:
                inventory = gpu_inventory.SimulatedInventory(name, int(count))
            elif name == nvml.node:
                inventory = nvml
            else:
                continue
            try:
                gpus = inventory.gpus()
            except gpu_inventory.InventoryError as exc:
                self.log.warning("The build GPUs of %s cannot be named: %s", name, exc)
                continue
            found.update({(name, g.index): g.uuid for g in gpus if g.index < int(count)})
        return found

    def reserve_slice(self, user: str, milli: int, server: str):
        """Pack a slice on the build pool (policy.place_slice) or say why not."""
        slices = [Slice(r.id, r.user, r.milli, r.node, r.gpu) for r in self.store.slices()]
        where = place_slice(self.build_pool(), slices, user, milli,
                            round(self.build_allowance * GPU))
        if isinstance(where, SliceRefused):
            return where
        return self.store.add_slice(time.time(), user=user, server=server, milli=milli,
                                    node=where.node, gpu=where.gpu)

    def train_capacity(self) -> int:
        return sum(n.milli for n in self.backend.nodes() if n.pool == TRAIN)

    # -- what handlers call ---------------------------------------------------------------
    def command_for(self, spec: dict) -> list[str]:
        """The argv a checked job spec runs: its command, or its source run by ``python``
        (with the working folder kept off ``sys.path``)."""
        return spec["command"] or [self.python, "-c", SOURCE_BOOTSTRAP, spec["source"]]

    async def submit(self, user: str, project: ProjectRow, spec: dict) -> tuple[JobRow, bool]:
        """Store a checked job spec; ``(job, created)``: a spec whose ``request_id`` the user
        already submitted gets that job back, and no second one is made. The commit waits
        for the disk in a worker thread, while the event loop answers other requests."""
        row, created = await self.store.in_thread(
            self.store.add_job_once,
            time.time(), spec.get("request_id"), user=user, project=project.name,
            name=spec["name"], gpus=spec["gpus"], priority=spec["priority"],
            command=self.command_for(spec), env=spec["env"], workdir=spec.get("workdir"),
            per_gpu=spec.get("per_gpu", False), checkpoint_dir="")
        if created:
            self.scheduler.wake()
        return row, created

    def create_project(self, name: str, fields: dict) -> ProjectRow:
        row = ProjectRow(name=name, **{"quota": 0, "groups": [name], "over_quota_weight": 1,
                                       "priority": 0, "limit": None, "job_priority_min": -100,
                                       "job_priority_max": 0, **fields},
                         updated=time.time())
        self.store.add_missing_projects([row])
        return self.store.project(name)

    def launch_for(self, row: JobRow) -> Launch:
        home = self.backend.user_home(row.user)
        try:
            home = home or pwd.getpwnam(row.user).pw_dir
        except KeyError:
            home = str(Path(self.state_dir) / "home" / row.user)
        checkpoint = self.checkpoint_dir_template.format(home=home, user=row.user, job_id=row.id)
        return Launch(row.id, row.attempt, row.user, row.project, tuple(row.command),
                      dict(row.env), dict(row.placement), checkpoint, row.workdir,
                      per_gpu=bool(row.per_gpu))

    def metrics(self) -> str:
        from .metrics import render
        return render(self)

    # -- run ------------------------------------------------------------------------------
    def make_app(self) -> web.Application:
        from . import dashboard
        prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpushare/")
        # The dashboard's login cookie is signed with a secret of this process: after a
        # restart the browser logs in again through the hub, without a question.
        return web.Application(routes(prefix) + dashboard.routes(prefix), pool=self,
                               hub_auth=HubAuth(), dashboard_oauth=dashboard.OAuthSettings(),
                               cookie_secret=os.urandom(32), xsrf_cookies=False)

    def server_limits(self) -> dict:
        """What the HTTP server reads of a request at most: handlers refuse a body beyond
        max_body_size with a sentence (413); beyond four times that, the server stops
        reading and drops the connection."""
        return {"max_body_size": 4 * self.max_body_size,
                "max_buffer_size": 4 * self.max_body_size + 64 * 1024}

    def start(self):
        asyncio.run(self._serve())

    async def _serve(self):
        """Answer the API at once; adopt what still runs in the background (the scheduling
        loop starts with it); stop cleanly on SIGTERM or SIGINT, leaving jobs running."""
        url = urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101"))
        loop = asyncio.get_running_loop()
        stopping: asyncio.Future = loop.create_future()
        for sig in (signal.SIGINT, signal.SIGTERM):  # the hub sends SIGINT, then SIGTERM
            loop.add_signal_handler(sig, lambda s=sig: stopping.done() or
                                    stopping.set_result(signal.Signals(s).name))
        app = self.make_app()
        server = app.listen(url.port, self.ip or url.hostname, **self.server_limits())
        nodes = self.backend.nodes()
        self.log.info("gpushare pool service on %s:%s, train pool of %g GPUs%s", url.hostname,
                      url.port, sum(n.milli for n in nodes if n.pool == TRAIN) / GPU,
                      " (simulated)" if any(n.labels.get(SIMULATED_LABEL) for n in nodes)
                      else "")
        # Slices the spawners of a stopping hub could not release (the hub stops its
        # services first) are released now, in the background (sweep.py).
        sweeping = asyncio.ensure_future(release_stale(
            self.store, os.environ.get("JUPYTERHUB_API_URL", ""),
            os.environ.get("JUPYTERHUB_API_TOKEN", ""), self.log))
        sweeping.add_done_callback(lambda f: f.cancelled() or f.exception() is None or
                                   self.log.error("Releasing stale build slices failed: %s",
                                                  f.exception()))
        # The loop adopts what still runs first (reconcile), while the API already answers.
        running = asyncio.ensure_future(self.scheduler.run(self.cycle_interval))
        beside = [asyncio.ensure_future(c) for c in self.usage.coroutines()]
        try:
            await asyncio.wait([running, stopping], return_when=asyncio.FIRST_COMPLETED)
            if stopping.done():
                self.log.info("Stopping on %s; running jobs go on and are adopted when the "
                              "service starts again", stopping.result())
        finally:
            server.stop()
            for task in (running, sweeping, *beside):
                task.cancel()
            await asyncio.gather(running, sweeping, *beside, return_exceptions=True)
            await self.usage.close()
            await self.backend.shutdown()


def main(argv=None):
    PoolService.launch_instance(argv)
