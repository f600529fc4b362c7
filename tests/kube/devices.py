"""The simulated node's NVIDIA device plugin: which GPU each container gets.

Whole GPUs (``nvidia.com/gpu``) are named by their UUIDs, time-sliced replicas
(``nvidia.com/gpu.shared``, ``replicas`` per GPU) by the GPU's UUID and the replica number,
``GPU-…::2``, as NVIDIA's device plugin names them. A container that asks for them gets free
ones, in order, and ``NVIDIA_VISIBLE_DEVICES`` with their GPUs' UUIDs (the plugin's
``envvar`` strategy); the kubelet's pod-resources API reports them (``podresources.py``)."""

from __future__ import annotations

import threading
import uuid as uuidlib

GPU = "nvidia.com/gpu"
SHARED_GPU = "nvidia.com/gpu.shared"
REPLICAS = 4


def gpu_uuid(node: str, index: int) -> str:
    """A stable, UUID-shaped name for a simulated GPU."""
    return f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'kubelet-sim/{node}/{index}')}"


class NodeDevices:
    """``gpus`` whole GPUs and ``shared`` time-sliced replicas (``replicas`` per GPU, on GPUs
    of their own) of one node. ``uuids`` are the GPUs' UUIDs in order: the whole ones first,
    then those behind the replicas (default: ``gpu_uuid``)."""

    def __init__(self, node: str, gpus: int = 0, shared: int = 0, uuids=None,
                 replicas: int = REPLICAS):
        behind = -(-shared // replicas) if shared else 0
        names = list(uuids or [gpu_uuid(node, i) for i in range(gpus + behind)])
        if len(names) != gpus + behind:
            raise ValueError(f"{node}: {gpus + behind} GPU UUIDs are needed, not {len(names)}")
        self.uuids = names
        self.ids = {GPU: names[:gpus],
                    SHARED_GPU: [f"{names[gpus + i // replicas]}::{i % replicas}"
                                 for i in range(shared)]}
        self.used: dict[str, str] = {}  # device id -> pod uid
        self.lock = threading.Lock()

    def allocate(self, pod_uid: str, limits: dict) -> dict[str, list[str]]:
        """Devices for a container's ``limits`` (as many as are free)."""
        out = {}
        with self.lock:
            for resource, free in self.ids.items():
                wanted = _count(limits.get(resource))
                if not wanted:
                    continue
                got = [d for d in free if d not in self.used][:wanted]
                for d in got:
                    self.used[d] = pod_uid
                out[resource] = got
        return out

    def release(self, pod_uid: str) -> None:
        with self.lock:
            self.used = {d: u for d, u in self.used.items() if u != pod_uid}


def visible_devices(devices: dict[str, list[str]]) -> str:
    """``NVIDIA_VISIBLE_DEVICES`` for a container's devices: their GPUs' UUIDs."""
    seen = []
    for ids in devices.values():
        for d in ids:
            gpu = d.split("::", 1)[0]
            if gpu not in seen:
                seen.append(gpu)
    return ",".join(seen)


def _count(value) -> int:
    try:
        return max(0, int(str(value)))
    except (TypeError, ValueError):
        return 0
