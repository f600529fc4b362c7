"""``python -m jupyter_gpushare.pool``: the pool service, started and managed by JupyterHub.

Configured like JupyterHub itself: ``gpushare_config.py`` (``c.PoolService.projects = ...``)
or command-line options; every option has a help text (``--help-all``).

This module is the wiring, in the way of JupyterHub's ``init_*`` steps: it reads the
configuration, builds each part of the service with the parts it needs passed in, gives the
HTTP handlers each part by name, and runs them. What the parts do is theirs: the store
(``store/database.py``), the backend (``backends/``), the build pool (``build/build_pool.py``),
projects (``admin/project_specs.py``), the scheduling loop (``train/scheduler.py``), submits
(``train/submits.py``) and launches (``train/launch.py``), GPU use (``utilization/service.py``),
the hub (``hub.py``, ``web/identity.py``), the API (``web/api_jobs.py``, ``web/api_usage.py``,
``web/api_admin.py``, ``web/job_lists.py``), what admins change and its audit trail
(``admin/changes.py``) and the dashboard (``web/dashboard_pages.py``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
from pathlib import Path
from urllib.parse import urlparse

from jupyterhub.services.auth import HubAuth
from tornado import web
from traitlets import Bool, Dict, Float, Integer, TraitError, Type, Unicode, default, validate
from traitlets.config import Application

from .. import __version__
from ..backends.base import SIMULATED_LABEL, Backend, BackendError, LentGPUs, private_dir
from ..backends.local import LocalBackend
from ..policy.lending import build_node_of
from ..policy.model import DEFAULT_MIN_RUNTIME_S, GPU, TRAIN, PolicyConfig, Project
from ..policy.past_use import LONGEST_S, FairShareTime
from ..policy.settings import (DEFAULT_CYCLE_S, DEFAULT_FAIR_SHARE_WINDOW_S, DEFAULT_GRACE_S,
                               PoolSettings)
from ..trainjob import RUNNING
from ..validate import MAX_JOB_SIZE, Invalid
from .admin.changes import configured_departments, configured_projects, levels_problem
from .admin.department_specs import DepartmentSpec, configured as configured_departments_spec
from .admin.project_specs import configured
from .build.build_pool import BuildPool
from .housekeeping import prune_audit, release_stale
from .hub import HubAPI
from .store.database import Store, StoreError
from .train.cycles import CycleSignal
from .train.launch import Launcher
from .train.scheduler import Scheduler
from .train.submits import JobIntake
from .utilization.service import GPUUsage
from .web import dashboard_pages as dashboard, dashboard_forms, routes as rest
from .web.identity import HubDirectory, HubTokens
from .web.job_lists import JobLists
from .web.log_follows import Follows
from .whatif.runner import WhatIfRunner

BACKENDS = {"local": "jupyter_gpushare.backends.local.LocalBackend",
            "kubernetes": "jupyter_gpushare.backends.kube.KubernetesBackend"}


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

    departments = Dict(help="""Departments over the projects (a second level of quotas, as
        Run:ai's departments and KAI-Scheduler's parent queues): ``{"research": {"quota":
        GPUs, "limit": GPUs or None, "over_quota_weight": 1, "projects": ["vision",
        "nlp"]}}``. A department's quota holds its projects' quotas (each guaranteed) and
        is their first claim on idle GPUs; its limit caps what they hold together; a
        project's idle quota goes to its siblings before other departments. A project
        belongs to at most one department; projects in none are scheduled as before.
        Created in the store the first time they appear, with their projects; afterwards
        admins change them through ``PUT api/departments/{name}`` and those changes win.
        """).tag(config=True)

    state_dir = Unicode(help="Directory of the service's own files: the SQLite database by "
                        "default and the local backend's job files.").tag(config=True)

    db_url = Unicode(help="SQLAlchemy URL of the store. Default: SQLite in state_dir. "
                     "PostgreSQL: postgresql+psycopg://user@host/db").tag(config=True)

    backend_class = BackendType(LocalBackend, klass=Backend, help="Where train jobs run: "
                                "\"local\" (processes on this machine, the default), "
                                "\"kubernetes\" (pods on a Kubernetes train pool), or a "
                                "Backend subclass or its import name.").tag(config=True)

    cycle_interval = Float(DEFAULT_CYCLE_S, help="Seconds between scheduling cycles; a submit or cancel "
                           "also runs one at once.").tag(config=True)
    grace_period = Float(DEFAULT_GRACE_S, help="Seconds a preempted or cancelled job gets between "
                         "SIGTERM and SIGKILL, to write a checkpoint.").tag(config=True)
    min_runtime = Float(DEFAULT_MIN_RUNTIME_S, help="Seconds a job runs before it may be "
                        "preempted, so that a job that borrowed an idle GPU is not stopped "
                        "again and again right after it starts (thrash). A job within quota "
                        "waits at most this long more for its GPUs: the guarantee is one "
                        "cycle plus the grace period plus min_runtime. 0 turns it off."
                        ).tag(config=True)
    reserve_after = Float(PolicyConfig().reserve_after_s, help="Seconds a job waits before nodes are reserved for it, "
                          "so a stream of small jobs cannot starve a large gang.").tag(config=True)
    preempt_within_project = Bool(False, help="Let a higher-priority job preempt lower-priority "
                                  "jobs of its own project.").tag(config=True)
    reclaim_fair_share = Bool(False, help="Let borrowers below their deserved share preempt "
                              "borrowers above theirs (more preemptions: see 'Fair borrowing' "
                              "in the documentation's scheduling page).").tag(config=True)
    consolidate = Bool(True, help="""Let a gang within its project's quota that finds GPUs,
        but not on few enough nodes, and no borrower to take back, move jobs within their
        projects' quotas to other GPUs (as KAI-Scheduler's consolidation), one gang a cycle:
        each moved job is stopped, requeued and started again on other GPUs, and loses the
        work since its last checkpoint; its project keeps its GPUs. False: such a gang waits
        until those jobs end, beyond the guarantee's bound (see 'Gangs and moves' in the
        documentation's scheduling page).""").tag(config=True)
    fair_share_half_life = Float(0.0, help="""Fair share over time, off at 0 (the default), as
        in KAI-Scheduler: seconds after which a project's borrowed GPU-time (GPUs held beyond
        its quota) counts half when idle GPUs are divided. A project that borrowed more than
        its weight's share lately then gets a smaller share of the idle GPUs, one that
        borrowed less a larger one; quotas are guaranteed as ever. 86400 (a day) suits most
        teams. The borrowed GPU-time is kept in the store and survives a restart. Alone it
        only orders who gets idle GPUs, which a gang may not fit; with reclaim_fair_share
        too, borrowers above their share give GPUs back (on the Philly trace the two halved
        the weekly gap between borrowing and weights, at 3x the preemptions).""").tag(config=True)
    fair_share_window = Float(DEFAULT_FAIR_SHARE_WINDOW_S, help="""Seconds of borrowed GPU-time that fair share
        over time looks back on; older borrowing does not count at all. Used only when
        fair_share_half_life is set.""").tag(config=True)
    build_nodes = Dict(help="""The build pool, whose GPUs are cut into slices for notebook
        servers: ``{node name: GPUs}``, the first GPUs of each node by index. On one server,
        ``{hostname: N}``: the local backend leaves those N GPUs out of the train pool
        (LocalBackend.share_build_gpus). Empty: no build slices (servers get CPU-only
        profiles).""").tag(config=True)
    build_allowance = Float(0.5, help="GPUs of build slices one user may hold at once, all "
                            "their notebook servers together.").tag(config=True)
    lend_build_gpus = Bool(False, help="""Lend whole build GPUs that hold no slice to train
        jobs beyond their project's quota: one virtual pool. Lent GPUs count toward no
        quota, so every guarantee is unchanged. A notebook server whose slice needs a lent
        GPU takes it back: the job there is preempted (grace_period, then requeued to resume
        from its checkpoint) and the spawn page says so while it waits, at most grace_period
        and a cycle; set the spawner's slice_wait_timeout above that. With the Kubernetes
        backend, KubernetesBackend.lent_gpu_resources is required too.""").tag(config=True)
    build_reserve = Integer(1, min=0, help="""Whole build GPUs without slices that are never
        lent (with lend_build_gpus), so that most notebook servers find room at once. Jobs
        already on lent GPUs are not preempted to keep it.""").tag(config=True)
    lend_again_after = Float(300.0, min=0, help="""Seconds a build GPU that a notebook server
        took back from a train job stays unlent after the take-back (with lend_build_gpus),
        even where the server gave up waiting for it or stopped again meanwhile: a user who
        starts servers only to stop them preempts the jobs on a lent GPU once, and their next
        start finds that GPU free. Meanwhile such a GPU counts toward build_reserve once no
        job holds it. 0: lent again as soon as no server holds or wants it.""").tag(config=True)
    take_backs_per_user = Integer(2, min=1, help="""Build GPUs lent to train jobs that one
        user's notebook servers may take back within take_back_window seconds (with
        lend_build_gpus). Beyond it their servers get only build GPUs no job holds: a start
        that needs a lent one waits the spawner's slice_wait_timeout for a free one, then
        fails saying when the user may take one back again. Every take-back is in the audit
        trail, with the user and the job preempted.""").tag(config=True)
    take_back_window = Float(600.0, min=0, help="""Seconds within which a user's notebook
        servers take back at most take_backs_per_user lent build GPUs. 0: no limit.
        """).tag(config=True)
    spawner_service = Unicode("gpushare-spawner", help="""Name of the JupyterHub service
        whose token the hub's spawner reserves, changes and releases build slices with (the
        same name as the spawner's own spawner_service). No other service may, nor list every
        user's slices; admins may, users list their own.""").tag(config=True)

    max_body_size = Integer(1024 * 1024, help="Largest request body accepted, in bytes; a "
                            "larger one is refused (413) without being kept.").tag(config=True)
    max_pending_per_user = Integer(200, min=1, help="Jobs one user may have waiting at once; "
                                   "a submit beyond it is refused (429) until some start or "
                                   "are cancelled.").tag(config=True)
    max_job_size = Integer(MAX_JOB_SIZE, min=1024, help="Bytes a job's command, source, env and "
                           "workdir may take together; large code and data belong in "
                           "files.").tag(config=True)
    whatif_timeout = Float(600.0, min=1.0, help="""Seconds of wall-clock time a what-if
        (``POST api/whatif``, the dashboard's What-if page) may run: one still replaying then
        is stopped, its worker process killed, and its state says it timed out; the next may
        start. Admins can cancel one sooner with ``DELETE api/whatif/{id}``.""").tag(config=True)
    max_followers_per_user = Integer(10, min=1, help="Logs one user may follow at once "
                                     "(?follow=1, each an open connection).").tag(config=True)
    job_book_size = Integer(20_000, min=100, help="Jobs kept in memory for lists (every "
                            "waiting and running job, and the newest ended ones): lists that "
                            "reach older jobs than it holds are read from the database."
                            ).tag(config=True)
    job_book_megabytes = Integer(64, min=1, help="Megabytes the jobs kept in memory for lists "
                                 "may take (their commands and environments, mostly); the "
                                 "oldest ended jobs are forgotten first.").tag(config=True)
    token_cache_ttl = Float(60.0, min=1.0, help="Seconds the hub's answer for a token (whose "
                            "it is) is used before the hub is asked again, so a revoked token "
                            "works for at most this long; while the hub does not answer "
                            "within a second, the old answer is used for as long again. A "
                            "token the hub did not know is refused for this long without "
                            "asking again. The dashboard keeps a login's answer (or a "
                            "token's in its requests) as long, rounded up to a whole second."
                            ).tag(config=True)
    token_cache_size = Integer(10_000, min=1, help="Tokens whose owner is kept at most (the "
                               "least recently used are forgotten first; one user or service "
                               "keeps 64 at most, so one who makes many tokens pushes out only "
                               "their own), and as many that the hub did not know."
                               ).tag(config=True)
    unknown_token_waiting = Integer(256, min=4, help="Requests with tokens the hub has not "
                                    "confirmed yet (new or unknown ones) that may wait for its "
                                    "answer at once, a quarter of them at most from one address "
                                    "(the one the proxy saw); beyond that they are refused "
                                    "(429). Tokens the hub confirmed before never wait behind "
                                    "these and are never refused for their number."
                                    ).tag(config=True)
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

    audit_retention_days = Integer(365, min=1, help="""Days the audit trail keeps each entry
        (who changed a project, cancelled someone else's job, drained a node, or which idle
        server culling stopped, and when): older entries are forgotten by the service's periodic
        sweep (every audit_sweep_interval seconds).
        Read them with ``gpushare audit`` or ``GET api/audit`` (admins).""").tag(config=True)
    audit_sweep_interval = Float(3600.0, min=1.0, help="Seconds between sweeps that forget "
                                 "audit entries older than audit_retention_days."
                                 ).tag(config=True)

    @default("log_level")
    def _log_level(self):
        return logging.INFO  # as JupyterHub's own: what the service did is worth a line

    @default("state_dir")
    def _state_dir(self):
        return str(Path("gpushare-state").resolve())

    @default("db_url")
    def _db_url(self):
        return f"sqlite:///{Path(self.state_dir) / 'gpushare.sqlite'}"

    hub_api_url = Unicode(help="JupyterHub's REST API, which the service asks who a token "
                          "is and what a user may do. Default: $JUPYTERHUB_API_URL, which the "
                          "hub gives the services it starts.").tag(config=True)
    hub_api_token = Unicode(help="The service's own token for JupyterHub's API (never logged). "
                            "Default: $JUPYTERHUB_API_TOKEN, which the hub gives the services "
                            "it starts.").tag(config=True)
    service_url = Unicode(help="Where the service listens, as JupyterHub.services gives it. "
                          "Default: $JUPYTERHUB_SERVICE_URL, else http://127.0.0.1:10101."
                          ).tag(config=True)
    service_prefix = Unicode(help="The path the hub's proxy routes to the service. Default: "
                             "$JUPYTERHUB_SERVICE_PREFIX, else /services/gpushare/."
                             ).tag(config=True)

    @default("hub_api_url")
    def _hub_api_url(self):
        return os.environ.get("JUPYTERHUB_API_URL", "")

    @default("hub_api_token")
    def _hub_api_token(self):
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    @default("service_url")
    def _service_url(self):
        return os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101")

    @default("service_prefix")
    def _service_prefix(self):
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpushare/")

    @validate("fair_share_half_life", "fair_share_window")
    def _check_fair_share(self, proposal):
        value, name = proposal["value"], proposal["trait"].name
        least = 0 if name == "fair_share_half_life" else 60
        if not least <= value <= LONGEST_S:  # NaN fails too
            raise TraitError(f"PoolService.{name} is {value!r}: give a number of seconds from "
                             f"{least} to {LONGEST_S:.0f} (a year)" +
                             (", 0 to turn fair share over time off." if least == 0 else "."))
        return value

    @validate("departments")
    def _check_departments(self, proposal):
        try:
            configured_departments_spec(proposal["value"])
        except Invalid as e:
            raise TraitError(str(e)) from None
        return proposal["value"]

    @validate("projects")
    def _check_projects(self, proposal):
        try:
            return configured(proposal["value"])
        except Invalid as e:
            raise TraitError(str(e)) from None

    # -- set-up: one step each, in order ------------------------------------------------
    def initialize(self, argv=None):
        super().initialize(argv)
        if self.config_file and Path(self.config_file).exists():
            # A value the options refuse stops the service here with their sentence
            # (traitlets' "Bad config encountered during initialization: ...").
            self.load_config_file(self.config_file)
        self.init_hub()
        self.init_store()
        self.init_backend()
        self.init_projects()
        self.init_usage()
        self.init_scheduler()

    def _refuse(self, sentence: str) -> None:
        """Stop at start with one sentence that says what to change."""
        self.log.critical("%s", sentence)
        self.exit(2)

    def init_hub(self):
        self.hub = HubAPI(self.hub_api_url, self.hub_api_token)
        self.directory = HubDirectory(self.hub, self.rights_ttl, self.rights_max_stale)
        self.tokens = HubTokens(self.hub, self.token_cache_ttl, self.token_cache_size,
                                self.unknown_token_waiting)

    def init_store(self):
        private_dir(self.state_dir)  # the store holds every job's command and env
        try:
            self.store = Store(self.db_url, self.job_book_size,
                               self.job_book_megabytes * 1024 * 1024)
        except StoreError as e:
            self._refuse(str(e))

    def init_backend(self):
        try:
            self.backend = self.backend_class(parent=self, **self._backend_kwargs())
        except TraitError as e:  # a bad value of one of the backend's own settings
            self.log.debug("The backend's settings were refused", exc_info=True)
            self._refuse(str(e))
        if self.lend_build_gpus:
            if not self.backend.lends_build_gpus:
                self._refuse(f"PoolService.lend_build_gpus needs a backend that runs train "
                             f"jobs on build GPUs (local or kubernetes); "
                             f"{self.backend_class.__name__} cannot: turn lending off.")
            why = self.backend.lending_refused()
            if why:
                self._refuse(why)
        try:
            nodes = self.backend.nodes()
        except BackendError as e:  # no GPU where GPUs are expected, in one sentence
            self._refuse(str(e))
        both = sorted(set(self.build_nodes) & {n.name for n in nodes})
        if self.lend_build_gpus and self.backend.build_nodes_apart and both:
            self._refuse(f"PoolService.build_nodes names {both[0][:100]!r}, which is also a "
                         f"node of the train pool: label each node for one pool only, or "
                         f"turn lending off.")
        odd = sorted(name for name in self.build_nodes if "/" in name)
        if odd:
            self._refuse(f"PoolService.build_nodes names {odd[0][:100]!r}: a node's name has no "
                         f"'/'; give the node's name as Kubernetes or this machine knows it.")
        lends = self.backend.lends_build_gpus  # also without lending: jobs on build GPUs
        self.cycles = CycleSignal()
        self.build = BuildPool(self.build_nodes, self.build_allowance, self.store,
                               any(n.labels.get(SIMULATED_LABEL) for n in nodes), self.log,
                               lend=self.lend_build_gpus, reserve_gpus=self.build_reserve,
                               take_back_s=self.grace_period + self.cycle_interval,
                               lend_again_after_s=self.lend_again_after,
                               take_backs_per_user=self.take_backs_per_user,
                               take_back_window_s=self.take_back_window,
                               lent=self.backend.lent_gpus() if lends else LentGPUs(),
                               cycles=self.cycles,
                               # no slice until the loop has adopted the jobs on build GPUs
                               adopted=not lends or not any(
                                   build_node_of(n) for r in self.store.jobs.active()
                                   if r.state == RUNNING for n in r.placement or {}))
        if lends:
            self.backend.lend(self.build)
        if self.lend_build_gpus and not self.build.indexed:  # this machine's own GPUs
            lendable = self.build.lendable_gpus()
            unnamed = sorted(n.name for n in self.build.nodes
                             if not any(key[0] == n.name for key in lendable))
            if unnamed:
                self.log.warning("Build GPUs of %s are not lent: this machine cannot name "
                                 "them (only its own GPUs, or simulated ones, can run train "
                                 "jobs here)", ", ".join(unnamed))

    def _backend_kwargs(self) -> dict:
        # A backend's own files go under the service's state_dir unless configured.
        cls = self.backend_class
        if "state_dir" in cls.class_trait_names() and "state_dir" not in \
                self.config.get(cls.__name__, {}):
            where = "local" if issubclass(cls, LocalBackend) else \
                cls.__name__.removesuffix("Backend").lower()
            return {"state_dir": str(Path(self.state_dir) / where)}
        return {}

    def init_projects(self):
        capacity = sum(n.milli for n in self.backend.nodes() if n.pool == TRAIN)
        departments = configured_departments_spec(self.departments).values()
        home = {p: d.name for d in departments for p in d.projects}
        projects = [Project(p.name, p.quota, department=home.get(p.name, ""))
                    for p in self.projects.values()]
        found = levels_problem(projects, [d.policy() for d in departments], capacity)
        if found:
            problem, overbooked = found
            self._refuse(f"{problem[:1].upper()}{problem[1:]}: lower PoolService.projects' "
                         f"or PoolService.departments' quotas." if overbooked else
                         f"PoolService.departments: {problem}.")
        created = configured_projects(self.store, self.projects.values())
        if created:
            self.log.info("created project(s) %s from the configuration", ", ".join(created))
        # What the store will hold, checked as the API checks it: its own departments and
        # projects (admins' changes win) and the configured departments it has not yet.
        stored = {d.name: d for d in self.store.quotas.departments()}
        new = [d for d in departments if d.name not in stored]
        known = {p.name: p for p in self.store.quotas.projects()}
        for d in new:
            missing = [p for p in d.projects if p not in known]
            if missing:
                self._refuse(f"PoolService.departments[{d.name!r}] names project(s) "
                             f"{', '.join(missing)}, which do not exist: add them to "
                             f"PoolService.projects.")
            for p in d.projects:
                held = known[p].department
                if held and held in stored:
                    self._refuse(f"PoolService.departments[{d.name!r}] names project {p}, "
                                 f"which belongs to department {held} (set through the API): "
                                 f"take it out of {held} first, or leave it out here.")
        joins = {p: d.name for d in new for p in d.projects}
        try:
            levels = [DepartmentSpec.of(r, ()).policy() for r in stored.values()] + \
                [d.policy() for d in new]
        except ValueError as e:
            self._refuse(f"The store holds a department that is not valid ({e}): fix it with "
                         f"PUT api/departments/{{name}}.")
        projects = [Project(p.name, p.quota, department=joins.get(
            p.name, p.department if p.department in stored else "")) for p in known.values()]
        found = levels_problem(projects, levels, capacity)
        if found:
            problem, overbooked = found
            self._refuse(f"{problem[:1].upper()}{problem[1:]}: lower PoolService.projects' "
                         f"or PoolService.departments' quotas, or those set through the API."
                         if overbooked else f"PoolService.departments: {problem}.")
        created = configured_departments(self.store, new)
        if created:
            self.log.info("created department(s) %s from the configuration", ", ".join(created))

    def init_usage(self):
        self.follows = Follows(self.max_followers_per_user)
        self.usage = GPUUsage(self.store, self.backend, self.build, self.state_dir,
                              self.follows, self.hub, parent=self)

    def pool_settings(self) -> PoolSettings:
        """What decides, from the options: built once; the loop decides by it, and
        api/history sends it whole so that a replay decides as this pool does."""
        return PoolSettings(
            cycle_interval_s=self.cycle_interval, grace_period_s=self.grace_period,
            policy=PolicyConfig(
                min_runtime_s=self.min_runtime, reserve_after_s=self.reserve_after,
                preempt_within_project=self.preempt_within_project,
                reclaim_fair_share=self.reclaim_fair_share, consolidate=self.consolidate),
            fair_share=FairShareTime(self.fair_share_half_life, self.fair_share_window)
            if self.fair_share_half_life else None,
            lend_build_gpus=self.lend_build_gpus)

    def init_scheduler(self):
        self.decides = decides = self.pool_settings()
        self.scheduler = Scheduler(
            self.store, self.backend, decides.policy, decides.grace_period_s,
            Launcher(self.backend, self.checkpoint_dir_template, self.state_dir),
            self.log, idle_jobs=self.usage.idle_jobs, fair_share=decides.fair_share,
            build=self.build if self.backend.lends_build_gpus else None, cycles=self.cycles)
        self.intake = JobIntake(self.store, self.scheduler, self.python,
                                self.max_pending_per_user, self.max_job_size)
        self.whatif = WhatIfRunner(log=self.log, timeout=self.whatif_timeout)

    # -- run ------------------------------------------------------------------------------
    def make_app(self) -> web.Application:
        prefix = self.service_prefix
        return web.Application(
            rest.routes(prefix) + dashboard.routes(prefix) + dashboard_forms.routes(prefix),
            # the parts handlers use, each by name (handlers.ServiceHandler)
            store=self.store, scheduler=self.scheduler, backend=self.backend,
            build=self.build, intake=self.intake, usage=self.usage,
            directory=self.directory, tokens=self.tokens, follows=self.follows,
            job_lists=JobLists(self.scheduler, self.usage.meter),
            max_body_size=self.max_body_size, spawner_service=self.spawner_service,
            # what a replay of the history needs to decide as this pool does (api/history)
            whatif=self.whatif,
            replay_knobs=self.decides.to_json(),
            hub_auth=HubAuth(),
            dashboard_oauth=dashboard.OAuthSettings(math.ceil(self.token_cache_ttl)),
            # The dashboard's login cookie is signed with a secret of this process: after a
            # restart the browser logs in again through the hub, without a question.
            cookie_secret=os.urandom(32), xsrf_cookies=False)

    def server_limits(self) -> dict:
        """What the HTTP server reads of a request at most: handlers refuse a body beyond
        max_body_size with a sentence (413). The API's handlers read a larger body to its
        end without keeping it (64 MiB at most, handlers.DRAIN_BYTES), so that the 413
        reaches the client through the proxy; the dashboard's forms are read whole, up to
        four times max_body_size. Beyond those, the server stops reading and drops the
        connection."""
        return {"max_body_size": 4 * self.max_body_size,
                "max_buffer_size": 4 * self.max_body_size + 64 * 1024}

    def start(self):
        asyncio.run(self._serve())

    async def _serve(self):
        """Answer the API at once; adopt what still runs in the background (the scheduling
        loop starts with it); stop cleanly on SIGTERM or SIGINT, leaving jobs running."""
        url = urlparse(self.service_url)
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
        # services first) are released now, in the background (housekeeping.py).
        sweeping = asyncio.ensure_future(release_stale(self.store, self.hub, self.log))
        sweeping.add_done_callback(lambda f: f.cancelled() or f.exception() is None or
                                   self.log.error("Releasing stale build slices failed: %s",
                                                  f.exception()))
        # The loop adopts what still runs first (reconcile), while the API already answers.
        running = asyncio.ensure_future(self.scheduler.run(self.decides.cycle_interval_s))
        beside = [asyncio.ensure_future(c) for c in (
            *self.usage.coroutines(),
            prune_audit(self.store, self.audit_retention_days, self.log,
                        self.audit_sweep_interval))]
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
