"""Where train jobs run. A backend only runs what it is told; the pool service owns job
states, decisions and the store. This class's docstrings are the contract a backend keeps
(like JupyterHub's ``Spawner.start/stop/poll``).

An attempt is a gang of ranks (``ranks.layout``): one per node of its placement, or one per
GPU with ``Launch.per_gpu``. Every rank gets ``ranks.rank_env`` with a rendezvous address that
the backend provides (``MASTER_ADDR``/``MASTER_PORT``: where rank 0 can listen and every other
rank can reach it), and its own log. The gang has one life: it starts whole, and when one rank
fails or vanishes the backend stops the others and the attempt ends."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Mapping

from traitlets import Integer
from traitlets.config import LoggingConfigurable

from ..policy.model import Node
from . import logfile

SIMULATED_LABEL = "gpushare.io/simulated"
"""The label of a node a backend plays where the machine has no GPU (a labelled stand-in)."""
LOST = "lost"  # an Exit's state when the attempt vanished without an exit status


def private_dir(path: str) -> None:
    """Make ``path`` (and its parents) if missing, and readable by this account only: it
    holds every user's logs, commands or records."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    if os.stat(path).st_mode & 0o077:
        os.chmod(path, 0o700)


class BackendError(Exception):
    """A job could not be started or stopped, said in one sentence for its user."""


@dataclass(frozen=True)
class Launch:
    """Everything needed to run one attempt of a train job."""

    job_id: str
    attempt: int
    user: str
    project: str
    command: tuple[str, ...]  # argv; the service turns ``source`` into a python command
    env: Mapping[str, str]  # the user's variables, already checked by the service
    placement: Mapping[str, int]  # node name -> milli-GPUs, as the policy placed the gang
    checkpoint_dir: str  # the same directory for every attempt of the job
    workdir: str | None = None  # None: the user's home directory
    per_gpu: bool = False  # one rank per GPU instead of one per node


@dataclass(frozen=True)
class Handle:
    """What the service stores to find a running attempt again after a restart."""

    job_id: str
    attempt: int
    data: Mapping[str, object] = field(default_factory=dict)  # backend-specific, JSON-able


@dataclass(frozen=True)
class Exit:
    """An attempt that has ended. ``state`` is ``SUCCEEDED`` (exit code 0), ``FAILED``
    (any other exit, or killed after a stop), the job's words in ``trainjob.py``, or ``LOST``
    (gone without a trace: the service requeues it)."""

    job_id: str
    attempt: int
    state: str
    exit_code: int | None = None  # 128 + the signal number when a signal ended it
    reason: str = ""


@dataclass(frozen=True)
class LocalAttempt:
    """An attempt running on the service's own machine: its process group (also its session)
    and the GPU UUIDs it was given, by node. How the pool tells whose the processes NVML
    lists are, where it reads this machine's GPUs itself."""

    job_id: str
    attempt: int
    pgid: int
    devices: Mapping[str, tuple[str, ...]]


class LentGPUsGone(BackendError):
    """Build GPUs lent to a job went back to notebooks between the cycle and its start: the
    job is requeued, not failed."""


@dataclass(frozen=True)
class LentGPUs:
    """What a backend tells the build pool (``pool/build/build_pool.py``) about build GPUs lent
    to train jobs: ``holders``, (build node, GPU index) → the job on that GPU now (also after
    lending was turned off: those jobs are taken back); ``by_index``, whether the backend runs
    a lent job by a GPU's index on its node rather than its UUID (Kubernetes: the node's
    device plugin picks the device), so that every build GPU is lendable; ``usable``,
    whether a build node may lend its GPUs now."""

    holders: Callable[[], dict[tuple[str, int], str]] = dict
    by_index: bool = False
    usable: Callable[[str], bool] = lambda node: True


class Backend(LoggingConfigurable):
    """Runs train jobs where the policy placed them."""

    log_limit = Integer(100 * 1024 * 1024, min=4 * logfile.MIN_SEGMENT, help="""
        Bytes of output kept per job attempt. Beyond it, the log keeps its first quarter
        and its latest output, and says where output was dropped, so that a job printing
        without end cannot fill the service's disk.
        """).tag(config=True)

    def nodes(self) -> list[Node]:
        """The train pool: one ``policy.Node`` per machine, with its whole GPUs. Called at
        start and on every cycle; a node that disappears loses its jobs (they come back
        from ``poll`` as ``lost``)."""
        raise NotImplementedError

    lends_build_gpus = False
    """Whether train jobs may run on build GPUs lent to the train pool (``lend``)."""

    build_nodes_apart = False
    """Whether a build node lends its GPUs as a node of its own, never also a train node (a
    local machine's build and train GPUs may share one node)."""

    def lending_refused(self) -> str | None:
        """Why this backend's settings cannot lend build GPUs (one sentence), or None."""
        return None

    def lend(self, build) -> None:
        """Run jobs placed on lent nodes (``pool.build.lent_node``) on the GPUs ``build``
        (``pool.build.BuildPool``) lends; only backends with ``lends_build_gpus``."""
        raise BackendError(f"{type(self).__name__} cannot run train jobs on lent build GPUs")

    def lent_holders(self) -> dict[tuple[str, int], str]:
        """(build node, GPU index) → the job that runs on that lent build GPU now."""
        return {}

    def lent_gpus(self) -> "LentGPUs":
        """What the build pool must know of the jobs this backend runs on lent build GPUs,
        given to it when it is made."""
        return LentGPUs(self.lent_holders)

    async def start(self, launch: Launch) -> Handle:
        """Start one attempt, all of its ranks at once or nothing, and return at once with a
        handle (do not wait for the job). Each rank runs on its node with that node's GPUs
        and ``ranks.rank_env``. Raise ``BackendError`` when it cannot start; then nothing of
        it may keep running."""
        raise NotImplementedError

    async def stop(self, job_id: str, attempt: int, grace_s: float) -> None:
        """Ask every rank of the attempt to stop (SIGTERM or the platform's equivalent) and
        kill what still runs after ``grace_s`` seconds. Return at once; the end is reported
        by ``poll``. Stopping an attempt that already ended does nothing."""
        raise NotImplementedError

    async def poll(self) -> list[Exit]:
        """The attempts that ended since the last call, each reported exactly once. An
        attempt ends when none of its ranks runs any more: ``succeeded`` when every rank
        exited with 0. When one rank fails (or vanishes: ``lost``), the backend stops the
        others with the grace period and reports the attempt, with that first rank's exit
        code and a reason that names the rank, once they are gone; the GPUs are held until
        then."""
        raise NotImplementedError

    async def adopt(self, handles: list[Handle]) -> list[Exit]:
        """After a restart of the service: take back the attempts that still run, every
        rank of them (they are then watched as if started by this process), and return an
        ``Exit`` for each one that ended meanwhile or cannot be found (``lost``); an attempt
        some of whose ranks ended badly meanwhile is handled as in ``poll``. Anything the
        backend runs that no handle names is stopped: a job without a record must not hold
        GPUs. Stops asked for before the restart are not remembered: the service asks
        again."""
        raise NotImplementedError

    def reasons(self) -> dict[str, str]:
        """Why started attempts do not run yet, by job id, in the platform's words (on
        Kubernetes: "starting on Kubernetes: 0/4 nodes are available: 4 Insufficient
        nvidia.com/gpu."). Read on every cycle, from what the backend already knows (no
        I/O); jobs that run are left out. The default knows of no such wait."""
        return {}

    def user_home(self, user: str) -> str | None:
        """The home directory a job of ``user`` runs in, where the backend decides it (a
        pod's home volume); None: the user's account on the service's machine."""
        return None

    def log_path(self, job_id: str, attempt: int, rank: int = 0):
        """The first file of the log of one rank of the attempt (stdout and stderr together,
        capped at ``log_limit`` as ``logfile.py`` keeps it), or None when this backend keeps
        logs elsewhere (then ``read_log_from`` is overridden)."""
        return None

    async def read_log_from(self, job_id: str, attempt: int, offset: int = 0,
                            size: int = logfile.READ_CHUNK, rank: int = 0) -> tuple[int, bytes]:
        """At most ``size`` bytes of the output of rank ``rank`` of the attempt (the service
        checks that it has one) from byte ``offset`` on, as ``(start, data)``: ``start`` is
        later than ``offset`` where the output there was dropped (the log outgrew
        ``log_limit``); ``data`` is ``b""`` when there is no more yet."""
        path = self.log_path(job_id, attempt, rank)
        if path is None:
            return offset, b""
        return logfile.read(path, offset, size)

    async def read_log(self, job_id: str, attempt: int, offset: int = 0,
                       rank: int = 0) -> bytes:
        """All the kept output of one rank of the attempt from byte ``offset`` on (at most
        ``log_limit`` bytes), with a line where output was dropped."""
        parts = []
        while True:
            start, data = await self.read_log_from(job_id, attempt, offset, rank=rank)
            if start > offset:
                parts.append(logfile.dropped_note(start - offset))
            if not data:
                return b"".join(parts)
            parts.append(data)
            offset = start + len(data)

    def local_attempts(self) -> list[LocalAttempt]:
        """The attempts running as process groups on this machine (no I/O). Backends whose
        jobs run elsewhere return [] (on Kubernetes, node agents report GPU use)."""
        return []

    def local_gpus(self) -> dict[str, list]:
        """This machine's train GPUs by node (``gpus.GPUInfo``, simulated ones included), for
        reading their use here; {} where the train pool is elsewhere."""
        return {}

    def kubernetes(self) -> tuple[str, str] | None:
        """``(kubeconfig, namespace)`` of the Kubernetes API this backend uses ("" for the
        kubeconfig: the pod's service account, else the default kubeconfig), or None where
        it uses none. The pool asks it there which node a node agent's pod is on."""
        return None

    async def shutdown(self) -> None:
        """The service is stopping: release resources, but leave running jobs running."""
