"""The GPUs of a machine, through NVML (nvidia-ml-py), or a labelled stand-in where there are none.

An ``Inventory`` describes one machine: ``gpus()`` lists its whole GPUs (what the scheduler
places on), ``sample()`` reads what they are doing now (memory, utilization, MIG instances and
the memory of each process on them). ``NVMLInventory`` asks the driver; every way that can fail
(no bindings, no driver, no permission, bindings that do not match the driver, a query the GPU
does not support) becomes one sentence, because a GPU-less laptop or CI runner is a normal place
to run the demo, not an error worth a traceback. ``SimulatedInventory`` is the honest stand-in:
fake GPUs whose UUIDs and names say they are simulated, so nothing downstream mistakes them for
devices.

``pynvml`` is imported inside functions so that the package works without it.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass

SIMULATED_NAME = "simulated GPU (no device)"
SIMULATED_UUID = "GPU-SIMULATED-"  # the start of a simulated GPU's UUID


@dataclass(frozen=True)
class GPUInfo:
    """One whole GPU: its NVML index, UUID (what ``CUDA_VISIBLE_DEVICES`` names), model
    name and memory in bytes."""

    index: int
    uuid: str
    name: str
    memory_total: int


@dataclass(frozen=True)
class ProcessMemory:
    """A process using a GPU. ``pid`` is a PID of the host (NVML's view; inside a container
    it is not the container's PID). ``used`` is its GPU memory in bytes, None where the driver
    cannot tell."""

    pid: int
    used: int | None


@dataclass(frozen=True)
class Device:
    """What one GPU, or one MIG instance of it, holds now. ``processes`` is None when they
    could not be read (``problems`` says why)."""

    uuid: str
    name: str
    memory_total: int
    memory_used: int | None
    processes: tuple[ProcessMemory, ...] | None


@dataclass(frozen=True)
class GPUSample:
    """One GPU at one moment. ``utilization`` is the percent of the last sample period in
    which a kernel ran (None where not supported, e.g. with MIG on); ``mig_enabled`` is None
    on GPUs without MIG; ``mig`` lists its MIG instances. ``problems`` are sentences about
    what could not be read; the rest is still good."""

    gpu: GPUInfo
    device: Device
    utilization: int | None = None
    mig_enabled: bool | None = None
    mig: tuple[Device, ...] = ()
    problems: tuple[str, ...] = ()

    def devices(self) -> tuple[Device, ...]:
        """The GPU itself, then its MIG instances: every UUID a slice can be on."""
        return (self.device, *self.mig)


class InventoryError(Exception):
    """The GPUs could not be listed; the message is one sentence saying why."""


class Inventory:
    """The GPUs of one machine, named ``node``. ``source`` says where the list comes from."""

    source = ""

    def __init__(self, node: str):
        self.node = node

    def gpus(self) -> list[GPUInfo]:
        raise NotImplementedError

    def sample(self) -> list[GPUSample]:
        """What each GPU holds now; raises ``InventoryError`` when nothing can be read."""
        raise NotImplementedError

    def problem(self) -> str | None:
        """Why this machine's GPUs cannot be used, in one sentence; None when some are listed."""
        try:
            found = self.gpus()
        except InventoryError as exc:
            return str(exc)
        return None if found else "NVML works but finds no GPU on this machine."


def find_device(samples: list[GPUSample], uuid: str) -> Device | None:
    """The GPU or MIG instance with this UUID, if any."""
    for sample in samples:
        for device in sample.devices():
            if device.uuid == uuid:
                return device
    return None


class SimulatedInventory(Inventory):
    """``count`` fake GPUs for machines without any, so the scheduler and the demo still run.
    By default they have no memory and CUDA sees none of them: a job placed on them runs on
    the CPU.

    Given ``memory_total`` (bytes per GPU), they also report the GPU memory that
    :meth:`set_process_memory` says a process uses, for as long as that process lives, the way
    NVML lists processes; this is how the slice watchdog is exercised without a GPU."""

    source = "simulated"

    def __init__(self, node: str, count: int, memory_total: int = 0):
        super().__init__(node)
        self.count = count
        self.memory_total = memory_total
        self._used: dict[tuple[str, int], int] = {}

    def gpus(self) -> list[GPUInfo]:
        return [GPUInfo(i, f"{SIMULATED_UUID}{self.node}-{i}", SIMULATED_NAME, self.memory_total)
                for i in range(self.count)]

    def set_process_memory(self, uuid: str, pid: int, used: int) -> None:
        """Say that process ``pid`` holds ``used`` bytes on the GPU ``uuid`` (0 forgets it)."""
        if uuid not in {g.uuid for g in self.gpus()}:
            raise InventoryError(f"There is no simulated GPU {uuid} on {self.node}.")
        if used:
            self._used[(uuid, pid)] = used
        else:
            self._used.pop((uuid, pid), None)

    def sample(self) -> list[GPUSample]:
        used = dict(self._used)  # a copy: a test may change it while a watchdog samples
        samples = []
        for gpu in self.gpus():
            procs = tuple(ProcessMemory(pid, n) for (uuid, pid), n in sorted(used.items())
                          if uuid == gpu.uuid and _alive(pid))
            device = Device(gpu.uuid, gpu.name, gpu.memory_total,
                            sum(p.used for p in procs), procs)
            samples.append(GPUSample(gpu, device))
        return samples


class NVMLInventory(Inventory):
    """The real GPUs of this machine, as the NVIDIA driver reports them."""

    source = "nvml"

    def __init__(self, node: str | None = None):
        super().__init__(node or socket.gethostname())

    def gpus(self) -> list[GPUInfo]:
        """The GPUs in NVML index order; raises ``InventoryError`` when NVML cannot list them."""
        return self._with_nvml(self._query)

    def sample(self) -> list[GPUSample]:
        """Memory, utilization, MIG instances and processes of every GPU. A query a GPU does
        not support (utilization with MIG on, say) becomes a sentence in ``problems``."""
        return self._with_nvml(self._sample)

    def _with_nvml(self, query):
        try:
            import pynvml
        except ImportError:
            raise InventoryError(_NO_BINDINGS) from None
        try:
            return query(pynvml)
        except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError, OSError) as exc:
            # NVMLLibraryMismatchError is not an NVMLError: it needs its own entry.
            raise InventoryError(describe(exc)) from None

    def _query(self, pynvml) -> list[GPUInfo]:
        pynvml.nvmlInit()
        try:
            return _list(pynvml)
        finally:
            pynvml.nvmlShutdown()

    def _sample(self, pynvml) -> list[GPUSample]:
        pynvml.nvmlInit()
        try:
            return [_sample_gpu(pynvml, gpu) for gpu in _list(pynvml)]
        finally:
            pynvml.nvmlShutdown()


def _list(pynvml) -> list[GPUInfo]:
    found = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        found.append(GPUInfo(i, _text(pynvml.nvmlDeviceGetUUID(handle)),
                             _text(pynvml.nvmlDeviceGetName(handle)),
                             int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)))
    return found


def _sample_gpu(pynvml, gpu: GPUInfo) -> GPUSample:
    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu.index)
    problems: list[str] = []
    where = f"GPU {gpu.index}"
    utilization = _optional(pynvml, problems, f"utilization of {where}",
                            lambda: int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
    # GPUs without MIG answer NotSupported: that is not a problem worth saying.
    mig_enabled = _optional(pynvml, [], "", lambda: bool(
        pynvml.nvmlDeviceGetMigMode(handle)[0] == pynvml.NVML_DEVICE_MIG_ENABLE))
    device = _device(pynvml, handle, gpu.uuid, gpu.name, problems, where)
    mig = _mig_devices(pynvml, handle, problems, where) if mig_enabled else ()
    return GPUSample(gpu, device, utilization, mig_enabled, mig, tuple(problems))


def _device(pynvml, handle, uuid, name, problems, where) -> Device:
    memory = _optional(pynvml, problems, f"memory of {where}",
                       lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
    processes = _optional(pynvml, problems, f"processes on {where}",
                          lambda: _processes(pynvml, handle))
    return Device(uuid, name, int(memory.total) if memory else 0,
                  int(memory.used) if memory else None, processes)


def _mig_devices(pynvml, handle, problems, where) -> tuple[Device, ...]:
    found = []
    count = _optional(pynvml, problems, f"MIG instances of {where}",
                      lambda: pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)) or 0
    for i in range(count):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except (pynvml.NVMLError_NotFound, pynvml.NVMLError_InvalidArgument):
            continue  # an empty slot: MIG instances need not be numbered contiguously
        except pynvml.NVMLError as exc:
            problems.append(f"MIG instance {i} of {where}: {describe(exc)}")
            continue
        uuid = _optional(pynvml, problems, f"MIG instance {i} of {where}",
                         lambda: _text(pynvml.nvmlDeviceGetUUID(mig)))
        if uuid is None:
            continue
        name = _optional(pynvml, [], "", lambda: _text(pynvml.nvmlDeviceGetName(mig))) or "MIG"
        found.append(_device(pynvml, mig, uuid, name, problems, f"MIG instance {i} of {where}"))
    return tuple(found)


def _processes(pynvml, handle) -> tuple[ProcessMemory, ...]:
    """Compute, MPS-client and graphics processes, once each. A process in several lists
    reports its memory on the device in each, so the largest is kept, not the sum. The
    compute list must be readable; the others are not there on every GPU."""
    listed: dict[int, int | None] = {}
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses",
                 "nvmlDeviceGetGraphicsRunningProcesses"):
        try:
            found = _versioned(pynvml, name, handle)
        except pynvml.NVMLError_NotSupported:
            if name == "nvmlDeviceGetComputeRunningProcesses":
                raise
            continue
        for proc in found:
            used, known = proc.usedGpuMemory, listed.get(proc.pid)
            listed[proc.pid] = used if known is None else max(known, used or 0)
    return tuple(ProcessMemory(pid, used) for pid, used in sorted(listed.items()))


def _versioned(pynvml, name, handle):
    try:
        return getattr(pynvml, name)(handle)
    except pynvml.NVMLLibraryMismatchError:
        # Drivers older than the bindings lack the _v3 call; _v2 reads the same fields.
        older = getattr(pynvml, name + "_v2", None)
        if older is None:
            raise
        return older(handle)


def _optional(pynvml, problems: list[str], what: str, read):
    """``read()``, or None with a sentence in ``problems`` when NVML cannot answer it."""
    try:
        return read()
    except (pynvml.NVMLError, pynvml.NVMLLibraryMismatchError) as exc:
        if what:
            problems.append(f"{what[:1].upper()}{what[1:]}: {describe(exc)}")
        return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie has released its GPU memory, so it does not count."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    return stat[stat.rindex(")") + 2:][:1] not in ("Z", "X")


def detect(simulated_nodes: int, simulated_gpus_per_node: int,
           log: logging.Logger | None = None, simulate: bool = True) -> list[Inventory]:
    """The inventories of the train pool on this host: the NVML one when it finds GPUs, else
    ``simulated_nodes`` simulated machines ``sim-node-0``, ``sim-node-1``, … (logged, with
    the reason, so nobody believes jobs run on GPUs they do not have). Without ``simulate``,
    finding no GPU is an ``InventoryError`` instead: a GPU server whose driver is missing
    must not quietly run jobs without GPUs."""
    log = log or logging.getLogger(__name__)
    nvml = NVMLInventory()
    problem = nvml.problem()
    if problem is None:
        log.info("GPU inventory from NVML on %s", nvml.node)
        return [nvml]
    if not simulate:
        raise InventoryError(f"NVML finds no GPU on this machine ({problem.rstrip('.')}): fix "
                             f"the NVIDIA driver, or set c.LocalBackend.simulate_gpus = True "
                             f"for a labelled simulated pool (a demo, a laptop, CI).")
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
    "NVMLError_NotSupported": "This GPU or its driver does not support that query.",
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
