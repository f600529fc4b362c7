"""The GPUs of a machine, through NVML (nvidia-ml-py), or a labelled stand-in where there are none.

An ``Inventory`` describes one machine. ``NVMLInventory`` asks the driver; every way that can
fail (no bindings, no driver, no permission, bindings that do not match the driver) becomes
one sentence, because a GPU-less laptop or CI runner is a normal place to run the demo, not
an error worth a traceback. ``SimulatedInventory`` is the honest stand-in: fake GPUs whose
UUIDs and names say they are simulated, so nothing downstream mistakes them for devices.

``pynvml`` is imported inside functions so that the package works without it.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass

SIMULATED_NAME = "simulated GPU (no device)"


@dataclass(frozen=True)
class GPUInfo:
    """One whole GPU: its NVML index, UUID (what ``CUDA_VISIBLE_DEVICES`` names), model
    name and memory in bytes."""

    index: int
    uuid: str
    name: str
    memory_total: int


class InventoryError(Exception):
    """The GPUs could not be listed; the message is one sentence saying why."""


class Inventory:
    """The GPUs of one machine, named ``node``. ``source`` says where the list comes from."""

    source = ""

    def __init__(self, node: str):
        self.node = node

    def gpus(self) -> list[GPUInfo]:
        raise NotImplementedError


class SimulatedInventory(Inventory):
    """``count`` fake GPUs for machines without any, so the scheduler and the demo still run.
    They have no memory and CUDA sees none of them: a job placed on them runs on the CPU."""

    source = "simulated"

    def __init__(self, node: str, count: int):
        super().__init__(node)
        self.count = count

    def gpus(self) -> list[GPUInfo]:
        return [GPUInfo(i, f"GPU-SIMULATED-{self.node}-{i}", SIMULATED_NAME, 0)
                for i in range(self.count)]


class NVMLInventory(Inventory):
    """The real GPUs of this machine, as the NVIDIA driver reports them."""

    source = "nvml"

    def __init__(self, node: str | None = None):
        super().__init__(node or socket.gethostname())

    def gpus(self) -> list[GPUInfo]:
        """The GPUs in NVML index order; raises ``InventoryError`` when NVML cannot list them."""
        try:
            import pynvml
        except ImportError:
            raise InventoryError(_NO_BINDINGS) from None
        try:
            return self._query(pynvml)
        except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError, OSError) as exc:
            # NVMLLibraryMismatchError is not an NVMLError: it needs its own entry.
            raise InventoryError(describe(exc)) from None

    def _query(self, pynvml) -> list[GPUInfo]:
        pynvml.nvmlInit()
        try:
            found = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                found.append(GPUInfo(i, _text(pynvml.nvmlDeviceGetUUID(handle)),
                                     _text(pynvml.nvmlDeviceGetName(handle)),
                                     int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)))
            return found
        finally:
            pynvml.nvmlShutdown()

    def problem(self) -> str | None:
        """Why this machine's GPUs cannot be used, in one sentence; None when NVML lists some."""
        try:
            found = self.gpus()
        except InventoryError as exc:
            return str(exc)
        return None if found else "NVML works but finds no GPU on this machine."


def detect(simulated_nodes: int, simulated_gpus_per_node: int,
           log: logging.Logger | None = None) -> list[Inventory]:
    """The inventories of the train pool on this host: the NVML one when it finds GPUs, else
    ``simulated_nodes`` simulated machines ``sim-node-0``, ``sim-node-1``, … (logged, with
    the reason, so nobody believes jobs run on GPUs they do not have)."""
    log = log or logging.getLogger(__name__)
    nvml = NVMLInventory()
    problem = nvml.problem()
    if problem is None:
        log.info("GPU inventory from NVML on %s", nvml.node)
        return [nvml]
    log.warning("No usable GPU on this machine, so simulating %d nodes with %d GPUs each (jobs "
                "there run without a GPU). %s", simulated_nodes, simulated_gpus_per_node, problem)
    return [SimulatedInventory(f"sim-node-{i}", simulated_gpus_per_node)
            for i in range(simulated_nodes)]


_NO_BINDINGS = ("The nvidia-ml-py package is not installed, so real GPUs cannot be listed: "
                "pip install nvidia-ml-py.")

# By exception class name, so that describing an error needs no pynvml import.
_SENTENCES = {
    "NVMLError_LibraryNotFound": "The NVIDIA driver's NVML library (libnvidia-ml.so.1) was not "
                                 "found: this machine has no NVIDIA driver installed.",
    "NVMLError_DriverNotLoaded": "The NVIDIA driver is not loaded on this machine: it has no "
                                 "GPU, or the kernel module failed to load.",
    "NVMLError_NoPermission": "This process may not query the NVIDIA driver: run the service as "
                              "a user with access to /dev/nvidia*.",
    "NVMLError_LibRmVersionMismatch": "The NVIDIA driver's library and kernel module have "
                                      "different versions: reload the driver or reboot.",
    "NVMLLibraryMismatchError": "The nvidia-ml-py package does not match the installed NVIDIA "
                                "driver: install the nvidia-ml-py version that matches it.",
    "NVMLError_GpuIsLost": "NVML reports a GPU lost (fallen off the bus): the machine needs "
                           "an administrator.",
}


def describe(exc: BaseException) -> str:
    """One sentence for an NVML failure."""
    for cls in type(exc).__mro__:
        if cls.__name__ in _SENTENCES:
            return _SENTENCES[cls.__name__]
    if isinstance(exc, ImportError):
        return _NO_BINDINGS
    detail = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return f"NVML could not list the GPUs ({detail})."


def _text(value) -> str:
    # Older bindings return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else str(value)
