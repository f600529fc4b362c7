"""Slicing modes: how a notebook server gets its build slice, as pure functions.

Each mode turns a slice size (integer milli-GPUs, 1000 = one GPU) into a ``Fragment``: the
environment variables of the server, and on Kubernetes what the notebook container asks
for (extended resources), where it may run (node selector, tolerations) and pod annotations.
No I/O and no spawner here: the spawners add fragments to what they build, and the tests
compare fragments whole.

What each mode enforces, and what it does not:

=============  ===================================  ==========================================
mode           enforced by                          not enforced
=============  ===================================  ==========================================
timeslice      the device plugin gives the pod a    memory (only the framework caps below,
               time-sliced share of a GPU           which are per process and per framework),
                                                    fault isolation
mig            the GPU's hardware partition:        nothing beyond the partition sizes the
               memory, compute and faults           GPU offers (see ``mig_profiles``)
hami           HAMi's in-container library caps     a process that bypasses the library
               memory and (roughly) compute         (static binaries, ``LD_PRELOAD`` games)
exclusive      whole GPUs, nothing shared           --
pinned         ``CUDA_VISIBLE_DEVICES``: which GPU  memory beyond the framework caps; anything
  (local)      CUDA shows the server                that resets the variable
cpu            no GPU: ``NVIDIA_VISIBLE_DEVICES``   a process that ignores both variables
               void and no CUDA device              outside a container
=============  ===================================  ==========================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ..policy.model import GPU
from ..trainjob import CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES
from .kernel import TORCH_FRACTION_VARIABLE

TIMESLICE, MIG, HAMI, EXCLUSIVE, PINNED, CPU = "timeslice", "mig", "hami", "exclusive", \
    "pinned", "cpu"

@dataclass(frozen=True)
class Fragment:
    """What a slicing mode adds to a notebook server. ``limits`` are the notebook container's
    extended resources (Kubernetes takes their requests to be equal); the local spawner uses
    ``env`` only."""

    env: dict[str, str] = field(default_factory=dict)
    limits: dict[str, int] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict, ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)

    def __add__(self, other: "Fragment") -> "Fragment":
        """Both fragments; where both set a key, ``other`` wins."""
        return Fragment({**self.env, **other.env}, {**self.limits, **other.limits},
                        {**self.node_selector, **other.node_selector},
                        self.tolerations + tuple(t for t in other.tolerations
                                                 if t not in self.tolerations),
                        {**self.annotations, **other.annotations})


def fraction_text(milli: int) -> str:
    """``250`` → ``"0.25"``, ``1000`` → ``"1"``: GPUs as the environment shows them."""
    return f"{milli / GPU:g}"


def slice_env(mode: str, milli: int, uuid: str = "") -> dict[str, str]:
    """The variables every server gets, whatever the mode: the panel and the watchdog read
    them. ``uuid`` is the GPU's UUID where the spawner knows it (the local spawner), else
    empty (on Kubernetes the device plugin picks the GPU)."""
    return {"GPUSHARE_SLICE_MODE": mode, "GPUSHARE_SLICE_GPUS": fraction_text(milli),
            "GPUSHARE_SLICE_UUID": uuid}


def framework_caps(milli: int) -> dict[str, str]:
    """Soft memory caps for a slice of ``milli`` of one GPU, per process and per framework.

    PyTorch: ``set_per_process_memory_fraction`` when torch is imported in a kernel
    (``kernel.py``; the caching allocator only). TensorFlow: allocate on demand instead of
    taking the whole GPU (no cap: one needs ``set_logical_device_configuration`` in code).
    JAX: no preallocation, and at most the fraction (both variable names, old and new).
    CuPy: its memory pool limit. Nothing for a whole GPU or more.
    """
    if milli >= GPU:
        return {}
    fraction = fraction_text(milli)
    return {
        TORCH_FRACTION_VARIABLE: fraction,
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": fraction,
        "XLA_CLIENT_MEM_FRACTION": fraction,
        "CUPY_GPU_MEMORY_LIMIT": f"{milli / 10:g}%",
    }


def cpu_only() -> Fragment:
    """No GPU. CUDA images bake in ``NVIDIA_VISIBLE_DEVICES=all``, which makes the container
    runtime mount every GPU of the node: ``void`` mounts none. An empty
    ``CUDA_VISIBLE_DEVICES`` hides any GPU outside a container too."""
    return Fragment(env={NVIDIA_VISIBLE_DEVICES: "void", CUDA_VISIBLE_DEVICES: "",
                         **slice_env(CPU, 0)})


def timeslice(milli: int, *, resource: str = "nvidia.com/gpu.shared",
              node_selector: Mapping[str, str] | None = None,
              tolerations: Iterable[dict] = ()) -> Fragment:
    """One time-sliced replica of a GPU (the NVIDIA device plugin with time-slicing and
    ``renameByDefault``, which names the replicas ``nvidia.com/gpu.shared``), plus the
    framework caps: time-slicing itself shares compute but caps no memory."""
    return Fragment(env={**slice_env(TIMESLICE, milli), **framework_caps(milli)},
                    limits={resource: 1}, node_selector=dict(node_selector or {}),
                    tolerations=tuple(tolerations))


def mig(milli: int, *, profiles: Mapping[int, str],
        node_selector: Mapping[str, str] | None = None,
        tolerations: Iterable[dict] = ()) -> Fragment:
    """The MIG instance ``profiles`` maps the slice size to (the device plugin's mixed
    strategy: ``nvidia.com/mig-2g.20gb: 1``). The instance is a device of its own, with its
    own memory: no framework caps, which would cut it again."""
    if milli not in profiles:
        known = ", ".join(fraction_text(m) for m in sorted(profiles)) or "none"
        raise ValueError(f"no MIG profile is configured for {fraction_text(milli)} GPU "
                         f"(configured: {known}); add one to mig_profiles")
    return Fragment(env=slice_env(MIG, milli), limits={profiles[milli]: 1},
                    node_selector=dict(node_selector or {}), tolerations=tuple(tolerations))


def hami(milli: int, *, cores: bool = True, node_selector: Mapping[str, str] | None = None,
         tolerations: Iterable[dict] = ()) -> Fragment:
    """One GPU through HAMi, with ``gpumem-percentage`` (and ``gpucores``) the slice's share.
    HAMi's library shows the container its share as the whole GPU: no framework caps."""
    percent = max(1, round(milli / 10))
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": percent}
    if cores:
        limits["nvidia.com/gpucores"] = percent
    return Fragment(env=slice_env(HAMI, milli), limits=limits,
                    node_selector=dict(node_selector or {}), tolerations=tuple(tolerations))


def exclusive(milli: int, *, resource: str = "nvidia.com/gpu",
              node_selector: Mapping[str, str] | None = None,
              tolerations: Iterable[dict] = ()) -> Fragment:
    """Whole GPUs, shared with nobody."""
    if milli <= 0 or milli % GPU:
        raise ValueError(f"exclusive mode gives whole GPUs, not {fraction_text(milli)}")
    return Fragment(env=slice_env(EXCLUSIVE, milli), limits={resource: milli // GPU},
                    node_selector=dict(node_selector or {}), tolerations=tuple(tolerations))


def pinned(milli: int, uuids: Iterable[str]) -> Fragment:
    """The local spawner's mode: CUDA sees only the slice's GPU(s), named by UUID (indices
    change with ``CUDA_VISIBLE_DEVICES`` and device order; UUIDs do not), plus the framework
    caps for a fraction."""
    uuids = list(uuids)
    if not uuids or (milli > GPU and milli != len(uuids) * GPU):
        raise ValueError(f"a pinned slice of {fraction_text(milli)} GPU needs "
                         f"{max(1, milli // GPU)} GPU UUID(s), not {len(uuids)}")
    names = ",".join(uuids)
    return Fragment(env={CUDA_VISIBLE_DEVICES: names, CUDA_DEVICE_ORDER: "PCI_BUS_ID",
                         **slice_env(PINNED, milli, names), **framework_caps(milli)})


def on_node(node: str) -> Fragment:
    """Keep the pod on the node the pool packed its slice on, so that the pool's accounting
    and the cluster agree (the pool's build node names are Kubernetes node names)."""
    return Fragment(node_selector={"kubernetes.io/hostname": node})
