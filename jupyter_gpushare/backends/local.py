"""Train jobs as processes on this machine: the embedded default backend.

Each attempt runs under ``shim.py`` in a session of its own: the shim's pid names the job's
process group, and the shim writes the exit status to a file, so that jobs outlive a restart
of the service and a restarted service learns how they ended. Per attempt, ``state_dir``
holds ``<job>/<attempt>.pid`` (how to find the group again), ``.exit`` (written by the shim)
and ``.log`` (stdout and stderr).

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
import subprocess
import sys
from dataclasses import dataclass, field

from traitlets import Bool, Integer, List, Unicode, default, validate

from .. import gpus as gpu_inventory
from ..policy.model import GPU, Node, gpus_text
from . import shim
from .base import Backend, BackendError, Exit, Handle, Launch, LocalAttempt, private_dir

SIMULATED_LABEL = "gpushare.io/simulated"
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
class _Attempt:
    """A running attempt as this backend watches it."""

    job_id: str
    attempt: int
    pgid: int
    start: int | None  # the shim's start time in clock ticks: guards against pid reuse
    devices: dict[str, list[str]]  # node -> GPU UUIDs
    exit_path: str
    log_path: str
    proc: subprocess.Popen | None = None  # None once adopted: not our child
    stopping: bool = False
    timers: list = field(default_factory=list)

    def handle(self) -> Handle:
        return Handle(self.job_id, self.attempt, {
            "pgid": self.pgid, "start": self.start, "devices": self.devices,
            "exit": self.exit_path, "log": self.log_path})


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

    simulated_nodes = Integer(2, min=1, help="""
        Number of simulated nodes when NVML finds no GPU on this machine (a laptop, a CI
        runner). They are labelled gpushare.io/simulated=true and jobs on them run without
        a GPU.
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

    # --- the machine ---

    def detect_inventories(self) -> list[gpu_inventory.Inventory]:
        """One inventory per node of the train pool (subclasses may choose others)."""
        return gpu_inventory.detect(self.simulated_nodes, self.simulated_gpus_per_node, self.log)

    def _gpus(self) -> dict[str, tuple[str, list[gpu_inventory.GPUInfo]]]:
        # Asked once: the hardware does not change while the service runs.
        if self._inventory is None:
            self._inventory = {inv.node: (inv.source, inv.gpus())
                               for inv in self.detect_inventories()}
        return self._inventory

    def nodes(self) -> list[Node]:
        return [Node(name, len(found),
                     labels={SIMULATED_LABEL: "true"} if source == "simulated" else {})
                for name, (source, found) in self._gpus().items()]

    def local_gpus(self) -> dict[str, list[gpu_inventory.GPUInfo]]:
        return {name: list(found) for name, (_source, found) in self._gpus().items()}

    def local_attempts(self) -> list[LocalAttempt]:
        return [LocalAttempt(a.job_id, a.attempt, a.pgid,
                             {n: tuple(u) for n, u in a.devices.items()})
                for a in self._running.values()]

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
        self._running[key] = attempt = self._spawn(launch, account, devices)
        self.log.info("Started attempt %d of job %s as %s on %s (process group %d)", launch.attempt,
                      launch.job_id, account.name, ", ".join(devices), attempt.pgid)
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

    def _choose(self, placement) -> dict[str, list[str]]:
        """Free devices for the placement: the lowest-numbered GPUs no running attempt uses."""
        inventory = self._gpus()
        used = {uuid for running in self._running.values()
                for uuids in running.devices.values() for uuid in uuids}
        chosen = {}
        for node, milli in sorted(placement.items()):
            if node not in inventory:
                raise BackendError(f"Node {node} is not part of this machine's train pool.")
            if milli <= 0 or milli % GPU:
                raise BackendError(
                    f"A train job runs on whole GPUs, not on {gpus_text(milli)} of {node}.")
            free = [g.uuid for g in inventory[node][1] if g.uuid not in used]
            if len(free) < milli // GPU:
                raise BackendError(f"The job was placed on {gpus_text(milli)} of {node}, "
                                   f"which has only {gpus_text(len(free) * GPU)} free.")
            chosen[node] = free[:milli // GPU]
        if not chosen:
            raise BackendError("The job has no placement: it was not given any GPU.")
        return chosen

    def _paths(self, job_id: str, attempt: int) -> tuple[str, str, str]:
        base = os.path.join(self.state_dir, job_id, str(attempt))
        return base + ".pid", base + ".exit", base + ".log"

    def _spawn(self, launch: Launch, account: _Account, devices: dict[str, list[str]]) -> _Attempt:
        pid_path, exit_path, log_path = self._paths(launch.job_id, launch.attempt)
        spec = {"user": account.name, "uid": account.uid if account.switch else None,
                "gid": account.gid, "cwd": launch.workdir or account.home,
                "checkpoint_dir": launch.checkpoint_dir, "log": log_path,
                "log_limit": self.log_limit, "env": self._job_env(launch, account, devices)}
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
            proc.stdin.write(json.dumps(spec).encode())
            proc.stdin.close()
            stat = shim.proc_stat(proc.pid)
            attempt = _Attempt(launch.job_id, launch.attempt, proc.pid, stat and stat[2], devices,
                               exit_path, log_path, proc)
            _write_json(pid_path, {"job_id": launch.job_id, "attempt": launch.attempt,
                                   "pgid": attempt.pgid, "start": attempt.start})
        except OSError as exc:
            _signal_group(proc.pid, None, signal.SIGKILL)
            proc.wait()
            raise BackendError(f"The job could not be started ({exc.strerror or exc}).") from None
        return attempt

    def _job_env(self, launch: Launch, account: _Account, devices: dict[str, list[str]]) -> dict:
        env = {k: os.environ[k] for k in self.env_keep if k in os.environ}
        env.setdefault("PATH", USER_PATH)
        env.update(HOME=account.home, USER=account.name, LOGNAME=account.name,
                   SHELL=account.shell or "/bin/sh", PYTHONUNBUFFERED="1")  # logs follow the job
        env.update(launch.env)
        env.update(CUDA_DEVICE_ORDER="PCI_BUS_ID",
                   CUDA_VISIBLE_DEVICES=",".join(u for uuids in devices.values() for u in uuids),
                   GPUSHARE_JOB_ID=launch.job_id, GPUSHARE_ATTEMPT=str(launch.attempt),
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
        self._stop_group(running.pgid, running.start, grace_s, running.timers)

    def _stop_group(self, pgid: int, start: int | None, grace_s: float, timers: list) -> None:
        """SIGTERM now to the job (the shim survives it to record the exit), SIGKILL to
        whatever of it still runs after the grace period."""
        _signal_group(pgid, start, signal.SIGTERM)
        timers.append(asyncio.get_running_loop().call_later(
            max(grace_s, 0.0), _signal_group, pgid, start, signal.SIGKILL))

    async def poll(self) -> list[Exit]:
        # Reap the shims this process started: a zombie leader keeps its group alive.
        self._unreaped = [proc for proc in self._unreaped if proc.poll() is None]
        ended = []
        for key, running in list(self._running.items()):
            if running.proc is not None:
                running.proc.poll()
            exit = _ended(running)
            if exit is not None:
                del self._running[key]
                _forget(running)
                for timer in running.timers:
                    timer.cancel()
                if running.proc is not None and running.proc.poll() is None:
                    self._unreaped.append(running.proc)
                ended.append(exit)
        return ended

    async def adopt(self, handles: list[Handle]) -> list[Exit]:
        exits = []
        for handle in handles:
            key = (handle.job_id, handle.attempt)
            if key in self._running:
                continue
            try:
                data = handle.data
                running = _Attempt(handle.job_id, handle.attempt, int(data["pgid"]),
                                   data.get("start"),
                                   {n: list(u) for n, u in dict(data["devices"]).items()},
                                   str(data["exit"]), str(data["log"]))
            except (KeyError, TypeError, ValueError):
                exits.append(Exit(handle.job_id, handle.attempt, "lost",
                                  reason="its record does not say where it ran"))
                continue
            exit = _ended(running)
            if exit is None:
                self._running[key] = running
            else:
                _forget(running)
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

    def _records(self) -> list[dict]:
        """The process records of attempts whose end has not been reported yet."""
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

    def log_path(self, job_id: str, attempt: int):
        if not _SAFE_ID.match(job_id):
            return None
        return self._paths(job_id, attempt)[2]

    async def shutdown(self) -> None:
        # Jobs keep running; a kill still pending after a stop is the restarted service's to repeat.
        for running in self._running.values():
            for timer in running.timers:
                timer.cancel()


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


def _forget(running: _Attempt) -> None:
    """Drop the process record of a reported attempt: its pid may be reused from now on, and
    the record must not make a later restart stop whoever gets it."""
    try:
        os.unlink(running.exit_path[:-len(".exit")] + ".pid")
    except OSError:
        pass


def _read_exit(path: str) -> tuple[int | None, str]:
    """The exit code the shim recorded (None: none yet) and, when the command could not be
    run at all, the shim's sentence on why."""
    try:
        with open(path) as f:
            record = json.load(f)
        reason = record.get("reason")
        return int(record["returncode"]), reason if isinstance(reason, str) else ""
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None, ""


def _ended(running: _Attempt) -> Exit | None:
    """How the attempt ended, or None while it runs. A job killed by a signal gets exit
    code 128 + the signal's number, as a shell (and Kubernetes) would report it."""
    code, said = _read_exit(running.exit_path)
    if code is None:
        if _alive(running.pgid, running.start):
            return None
        code, said = _read_exit(running.exit_path)  # the shim may have written it meanwhile
    job, attempt = running.job_id, running.attempt
    if code is None:
        if running.stopping:
            return Exit(job, attempt, "failed",
                        reason="stopped; it ended without recording an exit status")
        return Exit(job, attempt, "lost",
                    reason="its processes are gone and no exit status was recorded")
    if code == 0:
        return Exit(job, attempt, "succeeded", 0)
    if code > 0:
        return Exit(job, attempt, "failed", code, said or f"exited with code {code}")
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return Exit(job, attempt, "failed", 128 - code,
                f"{'stopped: ' if running.stopping else ''}killed by {name}")
