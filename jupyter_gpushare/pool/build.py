"""The build pool: GPUs cut into fixed slices for notebook servers (``PoolService.build_nodes``).

A slice is packed best fit by the pure policy (``policy.place_slice``) within each user's
allowance, and kept in the store until the spawner releases it. Where this machine can name a
build GPU (a node named like this host, or the simulated GPUs of a machine without any), its
UUID is what a pinned slice puts in ``CUDA_VISIBLE_DEVICES``."""

from __future__ import annotations

import logging
import time

from .. import gpus as gpu_inventory
from ..policy import SliceRefused, place_slice
from ..policy.model import BUILD, GPU, Node, Slice
from .models import SliceRow
from .store import Store


class BuildPool:
    def __init__(self, nodes: dict[str, float], allowance: float, store: Store,
                 simulated: bool, log: logging.Logger | None = None):
        """``nodes``: {node name: GPUs}; ``allowance``: GPUs of slices one user may hold;
        ``simulated``: this machine has no GPU (the train pool is simulated), so the build
        GPUs are simulated too."""
        self.nodes = [Node(name, int(gpus), pool=BUILD) for name, gpus in sorted(nodes.items())]
        self.names = frozenset(n.name for n in self.nodes)
        self.allowance = allowance
        self.store, self.simulated = store, simulated
        self.log = log or logging.getLogger("gpushare.pool")
        self._uuids: dict[tuple[str, int], str] | None = None  # found at the first use

    def reserve(self, user: str, milli: int, server: str) -> SliceRow | SliceRefused:
        """Pack a slice on the build pool or say why not."""
        slices = [Slice(r.id, r.user, r.milli, r.node, r.gpu) for r in self.store.slices()]
        where = place_slice(self.nodes, slices, user, milli, round(self.allowance * GPU))
        if isinstance(where, SliceRefused):
            return where
        return self.store.add_slice(time.time(), user=user, server=server, milli=milli,
                                    node=where.node, gpu=where.gpu)

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
        """``api/pool``'s ``build``."""
        return {"capacity": sum(n.gpus for n in self.nodes),
                "in_use": sum(r.milli for r in self.store.slices()) / GPU,
                "allowance": self.allowance,
                "nodes": [{"name": n.name, "gpus": n.gpus} for n in self.nodes]}

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
