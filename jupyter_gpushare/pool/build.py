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
the GPU is free."""

from __future__ import annotations

import logging
import time
from typing import Callable

from .. import gpus as gpu_inventory
from ..policy import SliceRefused, place_slice
from ..policy.lending import lent_node
from ..policy.model import BUILD, GPU, Node, Slice
from .models import SliceRow
from .store import Store


GPUKey = tuple[str, int]  # (build node, GPU index)


class BuildPool:
    def __init__(self, nodes: dict[str, float], allowance: float, store: Store,
                 simulated: bool, log: logging.Logger | None = None, lend: bool = False,
                 reserve_gpus: int = 1, take_back_s: float = 31.0):
        """``nodes``: {node name: GPUs}; ``allowance``: GPUs of slices one user may hold;
        ``simulated``: this machine has no GPU (the train pool is simulated), so the build
        GPUs are simulated too; ``lend``: lend whole GPUs without slices to train jobs, but
        for ``reserve_gpus`` of them; ``take_back_s``: the longest a lent GPU takes to come
        back (the grace period and a cycle), said to the spawner."""
        self.nodes = [Node(name, int(gpus), pool=BUILD) for name, gpus in sorted(nodes.items())]
        self.names = frozenset(n.name for n in self.nodes)
        self.allowance = allowance
        self.store, self.simulated = store, simulated
        self.log = log or logging.getLogger("gpushare.pool")
        self._uuids: dict[tuple[str, int], str] | None = None  # found at the first use
        self.lend, self.reserve_gpus, self.take_back_s = lend, reserve_gpus, take_back_s
        # (user, server) → the lent GPU its slice waits for and until when it is wanted
        self.wanted: dict[tuple[str, str], tuple[GPUKey, float]] = {}
        # (node, index) → the job that runs on a lent GPU: the backend's, set by the
        # scheduler (``holders``)
        self.holders: Callable[[], dict[GPUKey, str]] = dict
        self.wake: Callable[[], None] = lambda: None  # run a scheduling cycle soon
        self.deciding: Callable[[], bool] = lambda: False  # a cycle runs (the scheduler's)

    def reserve(self, user: str, milli: int, server: str) -> SliceRow | SliceRefused:
        """Pack a slice on the build pool or say why not."""
        slices = [Slice(r.id, r.user, r.milli, r.node, r.gpu) for r in self.store.slices()]
        allowance = round(self.allowance * GPU)
        where = place_slice(self.nodes, slices, user, milli, allowance)
        if isinstance(where, SliceRefused) or not self.lend:
            return where if isinstance(where, SliceRefused) else self._add(user, server, milli,
                                                                          where)
        now = time.time()
        self._forget_wanted(now)
        mine = self.wanted.get((user, server))
        others = {gpu for key, (gpu, _) in self.wanted.items() if key != (user, server)}
        holders = self.holders()
        # A lent GPU no job holds takes a slice at once, unless a cycle is between deciding
        # and starting its jobs (one may be on its way there)
        lent = self.lendable(slices, holders) if self.deciding() else []
        kept_off = [Slice("", "", GPU, n, g) for n, g in {*lent, *others, *holders}]
        where = place_slice(self.nodes, slices + kept_off, user, milli, allowance)
        if not isinstance(where, SliceRefused):
            self.wanted.pop((user, server), None)
            return self._add(user, server, milli, where)
        if mine is None:  # only a lent GPU has room: want the one packing picks
            where = place_slice(self.nodes, slices + [Slice("", "", GPU, n, g) for n, g in others],
                                user, milli, allowance)
            if isinstance(where, SliceRefused):
                return where
            mine = ((where.node, where.gpu), now + 2 * self.take_back_s)
            self.wanted[(user, server)] = mine
            self.log.info("Taking back GPU %d of %s, lent to train jobs, for %s's server %r",
                          where.gpu, where.node, user, server)
            self.wake()
        (node, gpu), _ = mine
        return SliceRefused(f"taking back GPU {gpu} of {node}, which is lent to train jobs: it "
                            f"is free for this server within {self.take_back_s:.0f} s")

    def _add(self, user: str, server: str, milli: int, where) -> SliceRow:
        return self.store.add_slice(time.time(), user=user, server=server, milli=milli,
                                    node=where.node, gpu=where.gpu)

    def _forget_wanted(self, now: float) -> None:
        """A server that stopped asking (its start gave up) no longer wants its GPU."""
        for key in [k for k, (_, until) in self.wanted.items() if until < now]:
            del self.wanted[key]

    # -- lending -----------------------------------------------------------------------------
    def lendable(self, slices: list[Slice] | None = None,
                 holders: dict[GPUKey, str] | None = None, wanted: bool = False) -> list[GPUKey]:
        """The build GPUs lent now: those without a slice that no server wants (with
        ``wanted``, those too: a job may still run there until it is taken back), but for
        the last ``reserve_gpus`` of those that no job holds either. None unless lending."""
        if not self.lend:
            return []
        if slices is None:
            slices = [Slice(r.id, r.user, r.milli, r.node, r.gpu) for r in self.store.slices()]
        holders = self.holders() if holders is None else holders
        sliced = {(s.node, s.gpu) for s in slices}
        self._forget_wanted(time.time())
        taken_back = {gpu for gpu, _ in self.wanted.values()}
        bare = [(n.name, i) for n in self.nodes for i in range(n.gpus)
                if (n.name, i) not in sliced and (n.name, i) not in taken_back]
        spare = [g for g in bare if g not in holders]
        reserve = set(spare[len(spare) - min(self.reserve_gpus, len(spare)):])
        out = [g for g in bare if g not in reserve]
        if wanted:
            out += sorted(g for g in taken_back if g not in sliced)
        return out

    def lent_nodes(self) -> list[Node]:
        """One lent train node per build node with GPUs lent now (``policy.Node.lent``)."""
        count: dict[str, int] = {}
        for node, _ in self.lendable():
            count[node] = count.get(node, 0) + 1
        return [Node(lent_node(n.name), count.get(n.name, 0), lent=True) for n in self.nodes
                if count.get(n.name) or any(k[0] == n.name for k in self.holders())]

    def taken_back(self) -> dict[GPUKey, str]:
        """Lent GPUs a server wants back, with the job still running there."""
        wanted = {gpu for gpu, _ in self.wanted.values()}
        return {gpu: job for gpu, job in self.holders().items() if gpu in wanted}

    def uuid(self, node: str, gpu: int) -> str | None:
        """The UUID of a build GPU where this machine can name it; None for a GPU of another
        machine (on Kubernetes the device plugin picks the device)."""
        return self.uuids().get((node, gpu))

    def uuids(self) -> dict[tuple[str, int], str]:
        """(node, index) → UUID of every build GPU this machine can name."""
        if self._uuids is None:
            self._uuids = self._find_uuids()
        return self._uuids

    def summary(self) -> dict:
        """``api/pool``'s ``build``: with lending, each build GPU lent to train jobs now, the
        job on it (None: free to lend) and whether a notebook server is taking it back."""
        out = {"capacity": sum(n.gpus for n in self.nodes),
               "in_use": sum(r.milli for r in self.store.slices()) / GPU,
               "allowance": self.allowance,
               "nodes": [{"name": n.name, "gpus": n.gpus} for n in self.nodes],
               "lending": self.lend}
        if self.lend:
            holders, wanted = self.holders(), {gpu for gpu, _ in self.wanted.values()}
            out["reserve"] = self.reserve_gpus
            out["lent"] = [{"node": n, "gpu": g, "job": holders.get((n, g)),
                            "taking_back": (n, g) in wanted}
                           for n, g in sorted({*self.lendable(wanted=True), *holders})]
        return out

    def _find_uuids(self) -> dict[tuple[str, int], str]:
        # Simulated GPUs say so in their UUIDs (GPU-SIMULATED-<node>-<index>); otherwise only
        # a build node named like this host has GPUs NVML can name.
        nvml = None if self.simulated else gpu_inventory.NVMLInventory()
        found = {}
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
                continue
            found.update({(node.name, g.index): g.uuid for g in gpus if g.index < node.gpus})
        return found
