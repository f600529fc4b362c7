"""The build pool: GPUs cut into fixed slices for notebook servers (``PoolService.build_nodes``).

A slice is packed best fit by the pure policy (``policy.place_slice``) within each user's
allowance, and kept in the store until the spawner releases it. Where this machine can name a
build GPU (a node named like this host, or the simulated GPUs of a machine without any), its
UUID is what a pinned slice puts in ``CUDA_VISIBLE_DEVICES``.

Lending (``PoolService.lend_build_gpus``): whole build GPUs that hold no slice, but for
``build_reserve`` of them, are lent to train jobs as one lent train node per build node
(``lent_node``, ``policy/lending.py``). A slice goes onto a lent GPU that no job holds at
once (unless a cycle is starting jobs); where only a GPU a job holds has room, the slice's
server *wants* it (``wanted``), which ends the lending of that GPU; the scheduler preempts
the job on it (grace period, requeue), and the spawner, told so with a 409, asks again until
the GPU is free. Each take-back is in the audit trail with the user whose server caused it
(``took_back``); the GPU taken back is not lent again for ``lend_again_after_s`` (a server
that gave up or stopped at once would otherwise have it lent and taken back again and
again), and one user's servers take back at most ``take_backs_per_user`` GPUs within
``take_back_window_s``."""

from __future__ import annotations

import logging
import time
from typing import Callable, NamedTuple

from ... import gpus as gpu_inventory
from ...backends.base import LentGPUs
from ...policy import SliceRefused
from ...policy.lending import Want, lendable, lent_node, take_back_wait, take_slice
from ...policy.model import BUILD, GPU, Node, Slice
from ..admin.changes import record
from ..store.database import Store
from ..store.models import SliceRow
from ..train.cycles import CycleSignal


GPUKey = tuple[str, int]  # (build node, GPU index)
UUIDS_RETRY_S = 60.0  # a build node's GPUs that could not be read are read again this often


WANT_FOR_S = 15.0
"""A server that has not asked again for this long (the spawner asks every 2 s) no longer
wants its GPU: its start gave up."""


class Wanted(NamedTuple):
    """A lent GPU that a notebook server's slice waits for."""

    gpu: GPUKey
    since: float  # when it was first wanted: the GPU is back by since + take_back_s
    until: float  # forgotten after this unless asked for again (the spawner gave up)
    milli: int  # the slice's size: its user's allowance and the GPU's room count it meanwhile


class BuildPool:
    def __init__(self, nodes: dict[str, float], allowance: float, store: Store,
                 simulated: bool, log: logging.Logger | None = None, lend: bool = False,
                 reserve_gpus: int = 1, take_back_s: float = 31.0,
                 lend_again_after_s: float = 300.0, take_backs_per_user: int = 2,
                 take_back_window_s: float = 600.0, lent: LentGPUs = LentGPUs(),
                 cycles: CycleSignal | None = None, adopted: bool = True):
        """``nodes``: {node name: GPUs}; ``allowance``: GPUs of slices one user may hold;
        ``simulated``: this machine has no GPU (the train pool is simulated), so the build
        GPUs are simulated too; ``lend``: lend whole GPUs without slices to train jobs, but
        for ``reserve_gpus`` of them; ``take_back_s``: the longest a lent GPU takes to come
        back (the grace period and a cycle), said to the spawner; ``lend_again_after_s``: a
        GPU taken back is not lent again for this long; ``take_backs_per_user``: the most
        GPUs one user's servers take back within ``take_back_window_s`` (a window of 0: no
        limit); ``lent``: what the backend says of the jobs on lent GPUs; ``cycles``: the
        scheduling loop's (wake it, whether it decides now); ``adopted``: whether the jobs
        that run on build GPUs are known (False after a restart with such jobs: no slice
        until the loop has adopted them, ``jobs_adopted``)."""
        self.nodes = [Node(name, int(gpus), pool=BUILD) for name, gpus in sorted(nodes.items())]
        self.names = frozenset(n.name for n in self.nodes)
        self.allowance = allowance
        self.store, self.simulated = store, simulated
        self.log = log or logging.getLogger("gpushare.pool")
        self._uuids: dict[tuple[str, int], str] | None = None  # found at the first use
        self._partial: tuple[float, dict] | None = None  # (when, what) of a read that failed
        self.lend, self.reserve_gpus, self.take_back_s = lend, reserve_gpus, take_back_s
        self.wanted: dict[tuple[str, str], Wanted] = {}  # (user, server) → its lent GPU
        self.lend_again_after_s = lend_again_after_s
        self.take_backs_per_user, self.take_back_window_s = take_backs_per_user, \
            take_back_window_s
        self.resting: dict[GPUKey, float] = {}  # a GPU taken back → when it may be lent again
        self.took: dict[str, list[float]] = {}  # user → when their servers took GPUs back
        self.holders, self.indexed, self.usable = lent.holders, lent.by_index, lent.usable
        cycles = cycles or CycleSignal()
        self.wake, self.deciding = cycles.wake, cycles.deciding
        self.adopted = adopted
        self._lent_now: dict[str, list[int]] = {}  # the lent GPUs the last cycle saw, by node

    def jobs_adopted(self) -> None:
        """The loop knows the jobs that run on build GPUs now: slices may be given."""
        self.adopted = True

    def reserve(self, user: str, milli: int, server: str) -> SliceRow | SliceRefused:
        """Pack a slice on the build pool or say why not. Never on a GPU a train job holds:
        where only such a lent GPU has room, the server wants it back (one at a time per
        user, counted against their allowance) and is told to ask again."""
        if not self.adopted:
            return SliceRefused("the pool service is starting and has not yet found the train "
                                "jobs that run on build GPUs; ask again in a moment")
        slices = [Slice(r.id, r.user, r.milli, r.node, r.gpu) for r in self.store.slices.all()]
        allowance = round(self.allowance * GPU)
        now = time.time()
        self._forget_wanted(now)
        holders = self.holders()
        mine = self.wanted.get((user, server))
        # What other servers wait for counts against their users' allowances and takes its
        # room on its GPU (room beside it stays usable)
        others = [Slice("", key[0], w.milli, *w.gpu) for key, w in self.wanted.items()
                  if key != (user, server)]
        waiting = [Slice("", user, w.milli, "", -1) for key, w in self.wanted.items()
                   if key[0] == user and key != (user, server)]  # its allowance alone
        # A lent GPU no job holds takes a slice at once, unless a cycle is between deciding
        # and starting its jobs (one may be on its way there, or the reserve may move)
        busy = [(node, g) for node, gs in self._lent_now.items() for g in gs] \
            if self.deciding() else []
        # One GPU taken back at a time per user
        not_now = SliceRefused(f"another server of {user} is taking back a GPU lent to train "
                               f"jobs; start this one once that one has started") \
            if any(key[0] == user and key != (user, server) for key in self.wanted) else None
        where = take_slice(self.nodes, slices, user, milli, allowance, others=others,
                           held=holders, busy=busy, own_waiting=waiting, may_want=self.lend,
                           not_now=not_now)
        if not isinstance(where, (SliceRefused, Want)):
            self.wanted.pop((user, server), None)
            return self._add(user, server, milli, where)
        if isinstance(where, SliceRefused):
            return where  # full, beyond the allowance, or another server takes one back
        if mine is None and tuple(where) in holders:  # a take-back: within the user's limit?
            wait = take_back_wait(self.took.get(user, ()), now, self.take_backs_per_user,
                                  self.take_back_window_s)
            if wait > 0:
                most = self.take_backs_per_user
                return SliceRefused(
                    f"{user}'s servers have taken back {most} build GPU{'s' * (most != 1)} "
                    f"from train jobs within {self.take_back_window_s:.0f} s, the most one "
                    f"user may: this one can start when a build GPU is free, or take one back "
                    f"in {max(1.0, wait):.0f} s")
        if mine is None:  # only a lent GPU has room: want the one packing picks
            job = holders.get(tuple(where))
            self.log.info("Taking back GPU %d of %s%s for %s's server %r", where.gpu,
                          where.node, f" from job {job}" if job else "", user, server)
            self.wake()
        gpu, since = ((where.node, where.gpu), now) if mine is None else (mine.gpu, mine.since)
        self.wanted[(user, server)] = Wanted(gpu, since, now + WANT_FOR_S, milli)
        left = max(1.0, since + self.take_back_s - now)
        return SliceRefused(f"taking back GPU {gpu[1]} of {gpu[0]}, which is lent to train "
                            f"jobs: it is free for this server within {left:.0f} s", left)

    def _add(self, user: str, server: str, milli: int, where) -> SliceRow:
        return self.store.slices.add(time.time(), user=user, server=server, milli=milli,
                                     node=where.node, gpu=where.gpu)

    def _forget_wanted(self, now: float) -> None:
        """A server that stopped asking (its start gave up) no longer wants its GPU; a GPU
        taken back rests no more after its while, nor counts a take-back after the window."""
        for key in [k for k, w in self.wanted.items() if w.until < now]:
            del self.wanted[key]
        for gpu in [g for g, until in self.resting.items() if until <= now]:
            del self.resting[gpu]
        for user in list(self.took):
            self.took[user] = [t for t in self.took[user] if t > now - self.take_back_window_s]
            if not self.took[user]:
                del self.took[user]

    def took_back(self, gpu: GPUKey, job: str, project: str, now: float) -> str | None:
        """The loop preempted ``job`` (of ``project``) on lent GPU ``gpu`` because a server
        wants it: counted against the user whose server asked first, noted in the audit
        trail, and the GPU rests, unlent, for ``lend_again_after_s``. Returns that user (None
        where no server wants the GPU: lending was turned off)."""
        wanting = sorted((w.since, key) for key, w in self.wanted.items() if w.gpu == gpu)
        if not wanting:
            return None
        user, server = wanting[0][1]
        self.took.setdefault(user, []).append(now)
        if self.lend_again_after_s > 0:
            self.resting[gpu] = now + self.lend_again_after_s
        record(self.store, user, "take back GPU", f"GPU {gpu[1]} of {gpu[0]}",
               {"job": job, "project": project},
               {"job": None, "server": f"{user}/{server}" if server else user}, "lending")
        return user

    # -- lending -----------------------------------------------------------------------------
    def lendable(self, slices: list[Slice] | None = None,
                 holders: dict[GPUKey, str] | None = None) -> list[GPUKey]:
        """The build GPUs to lend now: those this machine can name, without a slice, that no
        server wants and that do not rest after a take-back, but for the last
        ``reserve_gpus`` of those that no job holds either. None unless lending."""
        if not self.lend:
            return []
        if slices is None:
            slices = [Slice(r.id, r.user, r.milli, r.node, r.gpu) for r in self.store.slices.all()]
        holders = self.holders() if holders is None else holders
        self._forget_wanted(time.time())
        return lendable(self.nodes, {(s.node, s.gpu) for s in slices},
                        {w.gpu for w in self.wanted.values()}, holders, self.reserve_gpus,
                        self.lendable_gpus(), self.resting)

    def lendable_gpus(self) -> set[GPUKey]:
        """The build GPUs a train job can be given: those this machine can name, or every
        one where the backend gives them by index (``indexed``)."""
        if self.indexed:
            return {(n.name, i) for n in self.nodes if self.usable(n.name)
                    for i in range(n.gpus)}
        return {key for key in self.uuids() if self.usable(key[0])}

    def lent_nodes(self) -> list[Node]:
        """One lent train node per build node with GPUs lent now or jobs still on them
        (``policy.Node.lent``); what it lends is kept for the cycle (``lent_now``)."""
        self._lent_now = {}
        for node, gpu in self.lendable():
            self._lent_now.setdefault(node, []).append(gpu)
        held = {node for node, _ in self.holders()}
        return [Node(lent_node(n.name), len(self._lent_now.get(n.name, ())), lent=True)
                for n in self.nodes if n.name in self._lent_now or n.name in held]

    def lent_now(self, node: str) -> list[GPUKey]:
        """The GPUs of build node ``node`` that the last cycle lent: where its jobs start."""
        return [(node, g) for g in self._lent_now.get(node, ())]

    def taken_back(self) -> dict[GPUKey, str]:
        """Lent GPUs a server wants back, with the job still running there; without lending
        (turned off since they started), every job on a build GPU."""
        holders = self.holders()
        if not self.lend:
            return holders
        wanted = {w.gpu for w in self.wanted.values()}
        return {gpu: job for gpu, job in holders.items() if gpu in wanted}

    def summary_lent(self, may_see: Callable[[str], bool]) -> list[dict]:
        """``api/pool``'s ``build.lent``: each GPU lent now and the job there, named only to
        callers who ``may_see`` it."""
        holders, wanted = self.holders(), {w.gpu for w in self.wanted.values()}
        out = []
        for n, g in sorted({*self.lendable(), *holders, *wanted}):
            job = holders.get((n, g))
            out.append({"node": n, "gpu": g, "job": job if job and may_see(job) else None,
                        "held": job is not None, "taking_back": (n, g) in wanted})
        return out

    def free_lent(self, node: str) -> list[GPUKey] | None:
        """The GPUs of build node ``node`` that the last cycle lent and that no notebook
        server wants back since (where a job placed on its lent node starts); None when
        ``node`` is not a build node."""
        if node not in self.names:
            return None
        wanted = {w.gpu for w in self.wanted.values()}
        return [key for key in self.lent_now(node) if key not in wanted]

    def uuid(self, node: str, gpu: int) -> str | None:
        """The UUID of a build GPU where this machine can name it; None for a GPU of another
        machine (on Kubernetes the device plugin picks the device)."""
        return self.uuids().get((node, gpu))

    def uuids(self) -> dict[tuple[str, int], str]:
        """(node, index) → UUID of every build GPU this machine can name; asked again while
        a node's GPUs could not be read (the jobs on lent GPUs are known by them)."""
        if self._uuids is None:
            now = time.monotonic()
            if self._partial is not None and now - self._partial[0] < UUIDS_RETRY_S:
                return self._partial[1]
            found, complete = self._find_uuids()
            if not complete:
                self._partial = (now, found)
                return found
            self._uuids = found
        return self._uuids

    def summary(self, may_see: Callable[[str], bool] = lambda job: True) -> dict:
        """``api/pool``'s ``build``: with lending, each build GPU lent to train jobs now,
        whether a job holds it (its id where the caller ``may_see`` it) and whether a
        notebook server is taking it back."""
        out = {"capacity": sum(n.gpus for n in self.nodes),
               "in_use": sum(r.milli for r in self.store.slices.all()) / GPU,
               "allowance": self.allowance,
               "nodes": [{"name": n.name, "gpus": n.gpus} for n in self.nodes],
               "lending": self.lend}
        if self.lend:
            out["reserve"] = self.reserve_gpus
            out["lent"] = self.summary_lent(may_see)
        return out

    def _find_uuids(self) -> tuple[dict[tuple[str, int], str], bool]:
        # Simulated GPUs say so in their UUIDs (GPU-SIMULATED-<node>-<index>); otherwise only
        # a build node named like this host has GPUs NVML can name.
        nvml = None if self.simulated else gpu_inventory.NVMLInventory()
        found, complete = {}, True
        for node in self.nodes:
            if self.simulated:
                inventory = gpu_inventory.SimulatedInventory(node.name, node.gpus)
            elif node.name == nvml.node:
                inventory = nvml
            else:
                continue
            try:
                gpus = inventory.gpus()
            except gpu_inventory.InventoryError as exc:
                self.log.warning("The build GPUs of %s cannot be named: %s", node.name, exc)
                complete = False
                continue
            found.update({(node.name, g.index): g.uuid for g in gpus if g.index < node.gpus})
        return found, complete
