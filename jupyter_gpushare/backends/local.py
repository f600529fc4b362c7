"""Train jobs as processes on this machine: the embedded default backend.

Each node of an attempt's placement runs its ranks under ``shim.py`` in a session of its
own: the shim's pid names that node's process group, and the shim writes the exit status to
a file, so that jobs outlive a restart of the service and a restarted service learns how they
ended. A gang placed on two (simulated) nodes is two process groups on this machine, whose
ranks meet at rank 0's address on loopback. Per attempt, ``state_dir`` holds
``<job>/<attempt>[.node<N>].pid`` (how to find each group again), ``.exit`` (written by the
shim) and one log per rank (``ranks.log_name``: ``<attempt>.log`` is rank 0's).

The ranks of a gang meet on a loopback of their own (``gang_network``, ``netns.py``): the
machine's loopback is every local account's, and rendezvous protocols trust whoever connects.

GPUs are chosen here, not by the policy: the policy places milli-GPUs on nodes, this backend
picks which devices of those nodes and names them by UUID in ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import pwd
import re
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field

from traitlets import Bool, Enum, Float, Integer, List, Unicode, default, validate

from .. import gpus as gpu_inventory
from ..policy.lending import build_node_of
from ..policy.model import GPU, Node, gpus_text
from ..trainjob import CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, FAILED, SUCCEEDED
from . import ranks, shim
from .base import (LOST, SIMULATED_LABEL, Backend, BackendError, Exit, Handle, Launch,
                   LentGPUsGone, LocalAttempt, private_dir)

ORPHAN_GRACE_S = 10.0
"""Grace period of a job found running that no handle names (after a restart)."""

USER_PATH = "/usr/local/bin:/usr/bin:/bin"
"""A job's PATH when ``env_keep`` does not pass the service's."""

_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


@dataclass(frozen=True)
class _Account:
    """Whom a job runs as; ``switch`` is False when it runs as the service's own user."""

    name: str
    uid: int
    gid: int
    home: str
    shell: str
    switch: bool


@dataclass
class _Group:
    """The ranks of one node of an attempt: one shim, one process group."""

    node: str
    pgid: int
    start: int | None  # the shim's start time in clock ticks: guards against pid reuse
    exit_path: str
    ranks: tuple[int, ...]
    proc: subprocess.Popen | None = None  # None once adopted: not our child
    ended: Exit | None = None

    def record(self) -> dict:
        return {"node": self.node, "pgid": self.pgid, "start": self.start,
                "exit": self.exit_path, "ranks": list(self.ranks)}


@dataclass
class _Attempt:
    """A running attempt as this backend watches it: a gang of process groups."""

    job_id: str
    attempt: int
    devices: dict[str, list[str]]  # node -> GPU UUIDs
    groups: list[_Group]
    master: str = ""  # rank 0's rendezvous address, host:port
    stopping: bool = False
    failure: Exit | None = None  # the first rank that ended badly; the others are stopping
    timers: list = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return sum(len(g.ranks) for g in self.groups)

    def handle(self) -> Handle:
        return Handle(self.job_id, self.attempt, {
            "devices": self.devices, "master": self.master,
            "groups": [g.record() for g in self.groups]})


class LocalBackend(Backend):
    """Runs each train job as a process group on this host, on the GPUs NVML finds, or on
    simulated nodes where there are none."""

    state_dir = Unicode(help="""
        Directory for the local backend's per-attempt files: process records, exit statuses
        and logs. Keep it on a local disk, readable by the service only (it holds every
        user's logs); created with mode 0700. A relative path is taken from the directory
        the service starts in.
        """).tag(config=True)

    @default("state_dir")
    def _default_state_dir(self):
        return os.path.abspath("gpushare-jobs")

    @validate("state_dir")
    def _absolute_state_dir(self, proposal):
        return os.path.abspath(os.path.expanduser(proposal.value))

    simulate_gpus = Bool(False, help="""
        When NVML finds no GPU on this machine, play a labelled simulated train pool of
        simulated_nodes nodes of simulated_gpus_per_node GPUs each (jobs there run without a
        GPU): for the demo, a laptop or CI. Off by default: a server whose NVIDIA driver or
        NVML is missing refuses to start, saying why, instead of running jobs without GPUs.
        """).tag(config=True)

    simulated_nodes = Integer(2, min=1, help="""
        Number of simulated nodes when NVML finds no GPU on this machine and simulate_gpus
        is on (a laptop, a CI runner). They are labelled gpushare.io/simulated=true and jobs
        on them run without a GPU.
        """).tag(config=True)

    simulated_gpus_per_node = Integer(4, min=1, help="""
        GPUs on each simulated node, when NVML finds no GPU on this machine.
        """).tag(config=True)

    run_as_service_user = Bool(False, help="""
        Run jobs as the service's own user when the service is not root: a single-user or
        development setup. Off by default, so that a non-root service refuses jobs rather
        than running every user's job under one account. A root service always runs a job
        as its submitting user and never as root, whatever this says.
        """).tag(config=True)

    grace_period = Float(help="""
        Seconds the other ranks of a gang get between SIGTERM and SIGKILL when one rank
        has failed. Default: PoolService.grace_period.
        """).tag(config=True)

    @default("grace_period")
    def _default_grace(self):
        return float(getattr(self.parent, "grace_period", 30))

    share_build_gpus = Bool(False, help="""
        Let train jobs run on this machine's build-pool GPUs too. By default a GPU that
        PoolService.build_nodes gives to the build pool (the first N GPUs of a node of that
        name: on one server, {hostname: N}) is left out of the train pool, so that no train
        job lands on a GPU that notebooks' slices share. Turn it on where a machine has too
        few GPUs to split (the demo does, on a machine with one GPU).
        """).tag(config=True)

    gang_network = Enum(["private", "host"], "private", help="""
        Where the ranks of a job of several ranks (several nodes, or one rank per GPU) meet.

        "private": each such attempt runs in a network namespace of its own with only a
        loopback; MASTER_ADDR is 127.0.0.1 there. Other local accounts can neither take the
        rendezvous port first nor connect to rank 0, and the ranks have no other network
        (no downloads: fetch data and packages before). Needs a root service; where the
        machine does not let it make a namespace (a container without CAP_SYS_ADMIN), such
        jobs fail with a sentence saying so, and one-rank jobs run as ever.

        "host": the ranks meet on the machine's loopback, at a port that was free when the
        attempt started. Every local account can take that port first or connect to rank 0's
        rendezvous (torch.distributed's store, NCCL's bootstrap, JAX's coordinator trust
        whoever connects) and so read or alter the job's exchanges: only for a machine whose
        users trust each other, or a service that is not root (single-user).
        """).tag(config=True)

    env_keep = List(Unicode(), [
        "PATH", "PYTHONPATH", "CONDA_ROOT", "CONDA_DEFAULT_ENV", "VIRTUAL_ENV", "LANG", "LC_ALL",
    ], help="""
        Variables passed from the service's environment to jobs (like Spawner.env_keep).
        Everything else a job sees comes from its spec and from the backend; a variable
        whose name contains TOKEN is never passed.
        """).tag(config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._inventory: dict[str, tuple[str, list[gpu_inventory.GPUInfo]]] | None = None
        self._running: dict[tuple[str, int], _Attempt] = {}
        self._unreaped: list[subprocess.Popen] = []  # shims that recorded the exit, still exiting
        self._build = None  # the build pool whose GPUs are lent (``lend``)

    # --- lent build GPUs ---

    lends_build_gpus = True

    def lending_refused(self) -> str | None:
        if self.share_build_gpus:
            return ("PoolService.lend_build_gpus and LocalBackend.share_build_gpus both give "
                    "build GPUs to train jobs; set one of them.")
        return None

    def lend(self, build) -> None:
        self._build = build

    def lent_holders(self) -> dict[tuple[str, int], str]:
        if self._build is None:
            return {}
        index = {uuid: key for key, uuid in self._build.uuids().items()}
        return {index[uuid]: a.job_id for a in self._running.values()
                for node, uuids in a.devices.items() if build_node_of(node) is not None
                for uuid in uuids if uuid in index}

    # --- the machine ---

    def detect_inventories(self) -> list[gpu_inventory.Inventory]:
        """One inventory per node of the train pool (subclasses may choose others)."""
        try:
            return gpu_inventory.detect(self.simulated_nodes, self.simulated_gpus_per_node,
                                        self.log, simulate=self.simulate_gpus)
        except gpu_inventory.InventoryError as e:
            raise BackendError(str(e)) from None

    def _gpus(self) -> dict[str, tuple[str, list[gpu_inventory.GPUInfo]]]:
        # Asked once: the hardware does not change while the service runs.
        if self._inventory is None:
            self._inventory = {}
            for inv in self.detect_inventories():
                found = self._without_build_gpus(inv.node, inv.gpus())
                if found:
                    self._inventory[inv.node] = (inv.source, found)
        return self._inventory

    def _without_build_gpus(self, node: str, found: list[gpu_inventory.GPUInfo]):
        """The GPUs of ``node`` that the build pool does not have (see share_build_gpus)."""
        # The build pool is the service's setting; a backend made without one has none.
        build = int((getattr(self.parent, "build_nodes", None) or {}).get(node, 0))
        if not build or self.share_build_gpus:
            return found
        kept = [g for g in found if g.index >= build]
        if not kept:
            self.log.warning(
                "All %d GPUs of %s are in the build pool (PoolService.build_nodes), so the train "
                "pool has none there; give the build pool fewer, or set "
                "LocalBackend.share_build_gpus = True to let train jobs share them.",
                len(found), node)
        else:
            self.log.info("GPUs %s of %s serve build slices and are left out of the train pool.",
                          ", ".join(str(g.index) for g in found if g.index < build), node)
        return kept

    def nodes(self) -> list[Node]:
        return [Node(name, len(found),
                     labels={SIMULATED_LABEL: "true"} if source == "simulated" else {})
                for name, (source, found) in self._gpus().items()]

    def local_gpus(self) -> dict[str, list[gpu_inventory.GPUInfo]]:
        return {name: list(found) for name, (_source, found) in self._gpus().items()}

    def local_attempts(self) -> list[LocalAttempt]:
        # One per node's process group: the processes of a group use that node's GPUs.
        return [LocalAttempt(a.job_id, a.attempt, g.pgid, {g.node: tuple(a.devices[g.node])})
                for a in self._running.values() for g in a.groups if g.node in a.devices]

    def _service_is_root(self) -> bool:
        return os.geteuid() == 0

    # --- start ---

    async def start(self, launch: Launch) -> Handle:
        key = (launch.job_id, launch.attempt)
        if not _SAFE_ID.match(launch.job_id):
            raise BackendError(f"Job id {launch.job_id!r} may hold only letters, digits, "
                               "'.', '_' and '-'.")
        if not launch.command:
            raise BackendError("The job has no command to run.")
        if key in self._running:
            raise BackendError(
                f"Attempt {launch.attempt} of job {launch.job_id} is already running.")
        account = self._account(launch.user)
        # No await from choosing devices to registering them: two starts cannot interleave.
        devices = self._choose(launch.placement)
        lay = ranks.layout(launch.placement, launch.per_gpu)
        private = lay.world_size > 1 and self.gang_network == "private"
        if private and not self._service_is_root():
            raise BackendError(
                "A job of several ranks meets on a network of its own, which only a root pool "
                "service can make; run it as one rank, or an administrator may set "
                "LocalBackend.gang_network = \"host\" where local accounts trust each other")
        # In a namespace of its own nothing else listens: torch's usual port is free there.
        master = ("127.0.0.1", ranks.DEFAULT_PORT if private else _free_port())
        groups: list[_Group] = []
        try:
            for node_rank, (node, _) in enumerate(lay.nodes):
                network = None if not private else {"new": True} if not groups else \
                    {"join": groups[0].pgid, "start": groups[0].start}
                groups.append(self._spawn(launch, account, devices[node], lay, node_rank,
                                          master, network))
        except BackendError:
            for group in groups:  # a gang starts whole or not at all
                _signal_group(group.pgid, group.start, signal.SIGKILL)
                group.proc.wait()
                _forget(group)
            raise
        self._running[key] = attempt = _Attempt(launch.job_id, launch.attempt, devices, groups,
                                                f"{master[0]}:{master[1]}")
        self.log.info("Started attempt %d of job %s as %s: %d rank(s) on %s (process group%s %s)",
                      launch.attempt, launch.job_id, account.name, lay.world_size,
                      ", ".join(devices), "s" if len(groups) > 1 else "",
                      ", ".join(str(g.pgid) for g in groups))
        return attempt.handle()

    def _account(self, user: str) -> _Account:
        if self._service_is_root():
            try:
                pw = pwd.getpwnam(user)
            except KeyError:
                raise BackendError(f"User {user!r} has no account on this machine, so their "
                                   "job cannot run here.") from None
            if pw.pw_uid == 0:
                raise BackendError("Jobs never run as root; submit them as a regular user.")
            return _Account(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir, pw.pw_shell, True)
        if not self.run_as_service_user:
            raise BackendError("The pool service is not root, so it cannot run jobs as their "
                               "users; an administrator may set "
                               "LocalBackend.run_as_service_user = True for a single-user setup.")
        pw = pwd.getpwuid(os.getuid())
        return _Account(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir, pw.pw_shell, False)

    def user_home(self, user: str) -> str | None:
        """A job that runs as the service's user (``run_as_service_user``) keeps its
        checkpoints in that user's home, which it may write, not in the home of an account
        of the same name; a root service's jobs use their users' own homes."""
        if self.run_as_service_user and not self._service_is_root():
            return pwd.getpwuid(os.getuid()).pw_dir
        return None

    def _choose(self, placement) -> dict[str, list[str]]:
        """Free devices for the placement: the lowest-numbered GPUs no running attempt uses."""
        inventory = self._gpus()
        used = {uuid for running in self._running.values()
                for uuids in running.devices.values() for uuid in uuids}
        chosen = {}
        for node, milli in sorted(placement.items()):
            lent = self._lent_uuids(node)
            if node not in inventory and lent is None:
                raise BackendError(f"Node {node} is not part of this machine's train pool.")
            if milli <= 0 or milli % GPU:
                raise BackendError(
                    f"A train job runs on whole GPUs, not on {gpus_text(milli)} of {node}.")
            free = [u for u in (lent if lent is not None else
                                [g.uuid for g in inventory[node][1]]) if u not in used]
            if len(free) < milli // GPU:
                error = LentGPUsGone if lent is not None else BackendError
                raise error(f"The job was placed on {gpus_text(milli)} of {node}, "
                            f"which has only {gpus_text(len(free) * GPU)} free.")
            chosen[node] = free[:milli // GPU]
        if not chosen:
            raise BackendError("The job has no placement: it was not given any GPU.")
        return chosen

    def _lent_uuids(self, node: str) -> list[str] | None:
        """The UUIDs of the build GPUs that the cycle lent as ``node`` and that no notebook
        server wants back since; None when ``node`` is not a lent node of this build pool."""
        build = build_node_of(node)
        free = None if build is None or self._build is None else self._build.free_lent(build)
        if free is None:
            return None
        uuids = self._build.uuids()
        return [uuids[key] for key in free if key in uuids]

    def _paths(self, job_id: str, attempt: int, node_rank: int = 0) -> tuple[str, str]:
        """The process record and exit file of one node's group."""
        base = os.path.join(self.state_dir, job_id, str(attempt))
        if node_rank:
            base += f".node{node_rank}"
        return base + ".pid", base + ".exit"

    def _spawn(self, launch: Launch, account: _Account, uuids: list[str], lay: ranks.Layout,
               node_rank: int, master: tuple[str, int], network: dict | None) -> _Group:
        pid_path, exit_path = self._paths(launch.job_id, launch.attempt, node_rank)
        mine = lay.on_node(node_rank)
        log_path = self.log_path(launch.job_id, launch.attempt, mine[0].rank)
        spec = {"user": account.name, "uid": account.uid if account.switch else None,
                "gid": account.gid, "cwd": launch.workdir or account.home,
                "checkpoint_dir": launch.checkpoint_dir, "log_limit": self.log_limit,
                "env": self._job_env(launch, account, uuids), "grace_s": self.grace_period,
                "ranks": [{"rank": r.rank, "env": ranks.rank_env(lay, r, *master),
                           "log": self.log_path(launch.job_id, launch.attempt, r.rank)}
                          for r in mine], "network": network}
        try:
            private_dir(self.state_dir)
            os.makedirs(os.path.dirname(pid_path), mode=0o700, exist_ok=True)
            for stale in (pid_path, exit_path):  # left by an earlier try of this very attempt
                if os.path.lexists(stale):
                    os.unlink(stale)
            log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise BackendError(f"The local backend cannot write to its state directory "
                               f"{self.state_dir} ({exc.strerror}).") from None
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", shim.__file__, exit_path, "--", *launch.command],
                stdin=subprocess.PIPE, stdout=log, stderr=log, cwd="/", env={"PATH": os.defpath},
                start_new_session=True)
        except OSError as exc:
            raise BackendError(f"The job could not be started ({exc.strerror}).") from None
        finally:
            os.close(log)
        try:
            stat = shim.proc_stat(proc.pid)
            group = _Group(lay.nodes[node_rank][0], proc.pid, stat and stat[2], exit_path,
                           tuple(r.rank for r in mine), proc)
            # The record first, then the job: a service that dies in between leaves a shim
            # that runs nothing (its job never came whole) and a record of it, so the attempt
            # is found and requeued, never left running unwatched.
            _write_json(pid_path, {"job_id": launch.job_id, "attempt": launch.attempt,
                                   "node_rank": node_rank, "node": group.node,
                                   "ranks": list(group.ranks), "world": lay.world_size,
                                   "pgid": group.pgid,
                                   "start": group.start, "devices": {group.node: uuids}})
            self._hand_over(proc, spec)
        except OSError as exc:
            _signal_group(proc.pid, None, signal.SIGKILL)
            proc.wait()
            raise BackendError(f"The job could not be started ({exc.strerror or exc}).") from None
        return group

    @staticmethod
    def _hand_over(proc: subprocess.Popen, spec: dict) -> None:
        """Give the shim its job, whole: the description and a final newline."""
        proc.stdin.write(json.dumps(spec).encode() + b"\n")
        proc.stdin.close()

    def _job_env(self, launch: Launch, account: _Account, uuids: list[str]) -> dict:
        env = {k: os.environ[k] for k in self.env_keep if k in os.environ}
        env.setdefault("PATH", USER_PATH)
        env.update(HOME=account.home, USER=account.name, LOGNAME=account.name,
                   SHELL=account.shell or "/bin/sh", PYTHONUNBUFFERED="1")  # logs follow the job
        env.update(launch.env)
        env.update({CUDA_DEVICE_ORDER: "PCI_BUS_ID", CUDA_VISIBLE_DEVICES: ",".join(uuids)})
        env.update(GPUSHARE_JOB_ID=launch.job_id, GPUSHARE_ATTEMPT=str(launch.attempt),
                   GPUSHARE_CHECKPOINT_DIR=launch.checkpoint_dir)
        secret = os.environ.get("JUPYTERHUB_API_TOKEN")
        dropped = sorted(k for k, v in env.items()
                         if "TOKEN" in k.upper() or (secret and secret in v))
        if dropped:
            self.log.warning("Not passing %s to job %s: tokens never reach jobs",
                             ", ".join(dropped), launch.job_id)
        return {k: v for k, v in env.items() if k not in dropped}

    # --- stop, poll, adopt ---

    async def stop(self, job_id: str, attempt: int, grace_s: float) -> None:
        running = self._running.get((job_id, attempt))
        if running is None:
            return
        running.stopping = True
        for group in running.groups:
            if group.ended is None:
                self._stop_group(group.pgid, group.start, grace_s, running.timers)

    def _stop_group(self, pgid: int, start: int | None, grace_s: float, timers: list) -> None:
        """SIGTERM now to the group (the shim survives it to record the exit), SIGKILL to
        whatever of it still runs after the grace period."""
        _signal_group(pgid, start, signal.SIGTERM)
        timers.append(asyncio.get_running_loop().call_later(
            max(grace_s, 0.0), _signal_group, pgid, start, signal.SIGKILL))

    async def poll(self) -> list[Exit]:
        # Reap the shims this process started: a zombie leader keeps its group alive.
        self._unreaped = [proc for proc in self._unreaped if proc.poll() is None]
        ended = []
        for key, running in list(self._running.items()):
            for group in running.groups:
                if group.proc is not None:
                    group.proc.poll()
            exit = self._judge(running)
            if exit is not None:
                del self._running[key]
                self._done(running)
                ended.append(exit)
        return ended

    def _judge(self, running: _Attempt) -> Exit | None:
        """How the gang ended, or None while any rank runs. The first rank that ends badly
        ends the gang: the others are stopped, and the attempt ends when they are gone."""
        for group in running.groups:
            if group.ended is None:
                group.ended = _ended(running, group)
        alive = [g for g in running.groups if g.ended is None]
        if not alive:
            bad = [g.ended for g in running.groups if g.ended.state != SUCCEEDED]
            return running.failure or (bad[0] if bad else running.groups[0].ended)
        if running.failure is None and not running.stopping:
            bad = [g.ended for g in running.groups if g.ended and g.ended.state != SUCCEEDED]
            if bad:
                running.failure = bad[0]
                self.log.info("Attempt %d of job %s: %s; stopping its other ranks",
                              running.attempt, running.job_id, bad[0].reason)
                for group in alive:
                    self._stop_group(group.pgid, group.start, self.grace_period, running.timers)
        return None

    def _done(self, running: _Attempt) -> None:
        for group in running.groups:
            _forget(group)
            if group.proc is not None and group.proc.poll() is None:
                self._unreaped.append(group.proc)
        for timer in running.timers:
            timer.cancel()

    async def adopt(self, handles: list[Handle]) -> list[Exit]:
        exits = []
        for handle in handles:
            key = (handle.job_id, handle.attempt)
            if key in self._running:
                continue
            if "pgid" not in handle.data and "groups" not in handle.data:
                # The service died before it stored the handle: what was written at start.
                handle = Handle(*key, self._record_of(*key) or handle.data)
            try:
                running = _from_handle(handle)
            except (KeyError, TypeError, ValueError):
                exits.append(Exit(handle.job_id, handle.attempt, LOST,
                                  reason="its record does not say where it ran"))
                continue
            if handle.data.get("partial"):  # some of its ranks were never started: it ends
                running.failure = Exit(*key, LOST, reason="the service stopped while "
                                                            "starting its ranks")
                for group in running.groups:
                    self._stop_group(group.pgid, group.start, ORPHAN_GRACE_S, running.timers)
            exit = self._judge(running)
            if exit is None:
                self._running[key] = running
            else:
                self._done(running)
                exits.append(exit)
        named = {(h.job_id, h.attempt) for h in handles} | set(self._running)
        for record in self._records():
            key = (record.get("job_id"), record.get("attempt"))
            if (key not in named and not os.path.exists(record["exit"])
                    and _alive(record["pgid"], record.get("start"))):
                self.log.warning("Stopping attempt %s of job %s: it runs without a record",
                                 key[1], key[0])
                self._stop_group(record["pgid"], record.get("start"), ORPHAN_GRACE_S, [])
        return exits

    def _record_of(self, job_id: str, attempt: int) -> dict | None:
        """What this backend wrote when it started the attempt's groups, as a handle's data;
        None when nothing was (never started, or its end already reported and forgotten)."""
        if not _SAFE_ID.match(job_id):
            return None
        groups, devices, world = [], {}, 0
        for record in self._records():
            if (record.get("job_id"), record.get("attempt")) != (job_id, attempt):
                continue
            try:
                world = int(record.get("world", 1))
                node_rank = int(record.get("node_rank", 0))
                node = str(record["node"])
                groups.append((node_rank, {"node": node, "pgid": int(record["pgid"]),
                                           "start": record.get("start"),
                                           "exit": record["exit"],
                                           "ranks": [int(r) for r in record["ranks"]]}))
                devices.update(record.get("devices") or {})
            except (KeyError, TypeError, ValueError):
                return None
        if not groups:
            return None
        return {"devices": devices, "groups": [g for _, g in sorted(groups, key=lambda x: x[0])],
                "partial": sum(len(g["ranks"]) for _, g in groups) < world}

    def _records(self) -> list[dict]:
        """The process records of groups whose end has not been reported yet."""
        records = []
        for path in glob.glob(os.path.join(glob.escape(self.state_dir), "*", "*.pid")):
            try:
                with open(path) as f:
                    record = json.load(f)
                int(record["pgid"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            record["exit"] = path[:-len(".pid")] + ".exit"
            records.append(record)
        return records

    def log_path(self, job_id: str, attempt: int, rank: int = 0):
        if not _SAFE_ID.match(job_id):
            return None
        return os.path.join(self.state_dir, job_id, ranks.log_name(attempt, rank))

    async def shutdown(self) -> None:
        # Jobs keep running; a kill still pending after a stop is the restarted service's to repeat.
        for running in self._running.values():
            for timer in running.timers:
                timer.cancel()


def _free_port() -> int:
    """A TCP port nothing listens on now, for rank 0's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _from_handle(handle: Handle) -> _Attempt:
    """The attempt a handle describes (an older service's handle is one group)."""
    data = handle.data
    devices = {str(n): [str(u) for u in uuids] for n, uuids in dict(data["devices"]).items()}
    records = data.get("groups")
    if records is None:
        records = [{"node": next(iter(devices), ""), "pgid": data["pgid"],
                    "start": data.get("start"), "exit": data["exit"], "ranks": [0]}]
    groups = [_Group(str(r["node"]), int(r["pgid"]), r.get("start"), str(r["exit"]),
                     tuple(int(x) for x in r["ranks"])) for r in records]
    if not groups:
        raise ValueError("no groups")
    return _Attempt(handle.job_id, handle.attempt, devices, groups, str(data.get("master", "")))


def _write_json(path: str, value) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f)
    os.replace(tmp, path)


def _alive(pgid: int, start: int | None) -> bool:
    """Whether the job's process group still exists. A live group keeps its number, so a
    leader with another start time means the group is gone and its pid was reused."""
    stat = shim.proc_stat(pgid)
    if stat is not None and start is not None and stat[2] != start:
        return False
    if stat is not None and stat[0] != "Z":
        return True
    found = shim.members(pgid)  # the shim is gone: does anything of the job still run?
    if found is not None:
        return bool(found)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, start: int | None, sig: int) -> None:
    """``SIGTERM`` goes to the whole group (the shim ignores it); any other signal to every
    member but the shim, which must live to record the exit."""
    if not _alive(pgid, start):
        return
    if sig != signal.SIGTERM and shim.signal_members(pgid, sig, spare=pgid):
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _forget(group: _Group) -> None:
    """Drop the process record of a reported group: its pid may be reused from now on, and
    the record must not make a later restart stop whoever gets it."""
    try:
        os.unlink(group.exit_path[:-len(".exit")] + ".pid")
    except OSError:
        pass


def _read_exit(path: str) -> tuple[int, int | None, str] | None:
    """The shim's record: (return code, the rank that failed, if it says, and, when the
    command could not be run at all, the shim's sentence on why); None before it is written."""
    try:
        with open(path) as f:
            record = json.load(f)
        rank, reason = record.get("rank"), record.get("reason")
        return (int(record["returncode"]), None if rank is None else int(rank),
                reason if isinstance(reason, str) else "")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _ended(running: _Attempt, group: _Group) -> Exit | None:
    """How one node's group ended, or None while it runs. A rank killed by a signal gets exit
    code 128 + the signal's number, as a shell (and Kubernetes) would report it. In a gang of
    several ranks the reason names the rank."""
    record = _read_exit(group.exit_path)
    if record is None:
        if _alive(group.pgid, group.start):
            return None
        record = _read_exit(group.exit_path)  # the shim may have written it meanwhile
    job, attempt = running.job_id, running.attempt
    code, rank, said = record if record is not None else (None, None, "")
    rank = group.ranks[0] if rank is None else rank
    named = f"rank {rank}: " if running.world_size > 1 else ""
    if code is None:
        if running.stopping or running.failure is not None:
            return Exit(job, attempt, FAILED,
                        reason=f"{named}stopped; it ended without recording an exit status")
        return Exit(job, attempt, LOST,
                    reason=f"{named}its processes are gone and no exit status was recorded")
    if code == 0:
        return Exit(job, attempt, SUCCEEDED, 0)
    if code > 0:
        return Exit(job, attempt, FAILED, code, f"{named}{said or f'exited with code {code}'}")
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    stopped = "stopped: " if running.stopping or running.failure is not None else ""
    return Exit(job, attempt, FAILED, 128 - code, f"{named}{stopped}killed by {name}")
