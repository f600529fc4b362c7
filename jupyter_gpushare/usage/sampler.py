"""One reading of every GPU of a machine through NVML: utilization, memory and processes.

What flows in: NVML bindings (nvidia-ml-py's ``pynvml`` module, or ``nvml_standin.NVMLStandIn``
on machines without a GPU: the same calls either way).
The steps, for each GPU on each ``read()``:
  1. its handle, UUID and name (kept once read);
  2. memory used and total;
  3. SM utilization of the whole GPU (NotSupported with MIG on);
  4. its compute processes, with their memory (on MIG instances, the instances' processes);
  5. each process's SM utilization since the previous reading (NotFound: none ran kernels).
What flows out: a ``MachineReading``; whatever could not be read is one sentence in it (``note``
of a GPU, ``problem`` of the machine), never an exception. A GPU that fell off the bus, MIG,
missing samples, a missing library or driver: each becomes a sentence and the rest goes on.

``read()`` blocks on the driver: the pool calls it in a worker thread, never on its event loop.
NVML is initialised once and kept (an init costs more than a reading); after a failure it is
initialised again at the next reading.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..gpus import _NO_BINDINGS, _text, describe


@dataclass(frozen=True, slots=True)
class ProcessReading:
    """A process on a GPU: host ``pid``, GPU ``memory`` in bytes (None: the driver cannot
    tell), ``sm`` percent of the GPU's time it ran kernels (None: not known per process)."""

    pid: int
    memory: int | None
    sm: float | None


@dataclass(frozen=True, slots=True)
class GPUReading:
    """One GPU now. ``utilization`` is the SM utilization of the whole GPU in percent (None
    where NVML cannot say: MIG, a lost GPU); ``mig`` its MIG instances (memory and processes
    only); ``note`` one sentence about what could not be read."""

    index: int
    uuid: str
    name: str = ""
    memory_total: int = 0
    memory_used: int | None = None
    utilization: float | None = None
    processes: tuple[ProcessReading, ...] = ()
    mig: tuple["GPUReading", ...] = ()
    note: str = ""
    lost: bool = False

    def all_processes(self) -> tuple[ProcessReading, ...]:
        """Its processes and its MIG instances' processes."""
        return self.processes + tuple(p for m in self.mig for p in m.processes)


@dataclass(frozen=True, slots=True)
class MachineReading:
    """Every GPU of ``node`` at ``at`` (seconds); ``problem`` says why none could be read."""

    node: str
    at: float
    gpus: tuple[GPUReading, ...] = ()
    problem: str = ""


@dataclass
class _Known:
    """What is kept about a GPU between readings."""

    uuid: str
    name: str
    last_seen_us: int = 0  # newest per-process sample read, in the driver's clock
    sampled: bool = False  # a reading of its utilization has succeeded once


class NVMLSampler:
    """Reads the GPUs of this machine (``node``) through ``nvml``: nvidia-ml-py's module by
    default, or a stand-in with the same functions."""

    def __init__(self, node: str, nvml=None, clock=time.time):
        self.node = node
        self._nvml = nvml
        self._clock = clock
        self._ready = False
        self._known: dict[int, _Known] = {}

    def _bindings(self):
        if self._nvml is None:
            import pynvml  # here, so the package works without it
            self._nvml = pynvml
        return self._nvml

    def read(self) -> MachineReading:
        now = self._clock()
        try:
            nvml = self._bindings()
        except ImportError:
            return MachineReading(self.node, now, problem=_NO_BINDINGS)
        try:
            if not self._ready:
                nvml.nvmlInit()
                self._ready = True
            count = nvml.nvmlDeviceGetCount()
        except (nvml.NVMLError, nvml.NVMLLibraryMismatchError, OSError) as exc:
            self._ready = False  # initialise again next time: the driver may come back
            return MachineReading(self.node, now, problem=describe(exc))
        return MachineReading(self.node, now, tuple(self._gpu(nvml, i) for i in range(count)))

    def close(self) -> None:
        if self._ready:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down: nothing left to tell
                pass
            self._ready = False

    # -- one GPU ------------------------------------------------------------------------
    def _gpu(self, nvml, index: int) -> GPUReading:
        known = self._known.get(index)
        where = f"GPU {index} of {self.node}"
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            if known is None:
                known = self._known[index] = _Known(_text(nvml.nvmlDeviceGetUUID(handle)),
                                                    _text(nvml.nvmlDeviceGetName(handle)))
        except nvml.NVMLError_GpuIsLost:
            return GPUReading(index, known.uuid if known else f"lost-{self.node}-{index}",
                              known.name if known else "", lost=True, note=_lost(where))
        except (nvml.NVMLError, nvml.NVMLLibraryMismatchError) as exc:
            return GPUReading(index, known.uuid if known else f"unknown-{self.node}-{index}",
                              note=f"{where} cannot be read: {describe(exc)}")
        notes: list[str] = []
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            mig_on = _mig_enabled(nvml, handle)
            utilization = None
            if mig_on:
                notes.append(f"{where} has MIG on: utilization not available on MIG; memory "
                             f"is reported.")
            else:
                utilization = self._utilization(nvml, handle, known, notes, where)
            processes = _processes(nvml, handle, notes, where)
            mig = _mig_instances(nvml, handle, notes, where) if mig_on else ()
            if not mig_on:
                processes = self._with_sm(nvml, handle, known, processes)
        except nvml.NVMLError_GpuIsLost:
            return GPUReading(index, known.uuid, known.name, lost=True, note=_lost(where))
        return GPUReading(index, known.uuid, known.name, int(memory.total), int(memory.used),
                          utilization, processes, mig, " ".join(notes))

    def _utilization(self, nvml, handle, known: _Known, notes, where) -> float | None:
        try:
            value = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except nvml.NVMLError_NotFound:
            if not known.sampled:
                notes.append(f"{where}: NVML has no utilization samples yet.")
            return None
        except nvml.NVMLError_GpuIsLost:
            raise
        except (nvml.NVMLError, nvml.NVMLLibraryMismatchError) as exc:
            notes.append(f"Utilization of {where}: {describe(exc)}")
            return None
        known.sampled = True
        return value

    def _with_sm(self, nvml, handle, known: _Known, processes):
        """The processes with their SM utilization since the last reading: NotFound means
        none ran kernels (0 each); NotSupported leaves it unknown (None)."""
        if not processes:
            return processes
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(handle, known.last_seen_us)
        except nvml.NVMLError_NotFound:
            return tuple(ProcessReading(p.pid, p.memory, 0.0) for p in processes)
        except nvml.NVMLError_GpuIsLost:
            raise
        except (nvml.NVMLError, nvml.NVMLLibraryMismatchError):
            return processes
        total: dict[int, list[float]] = {}
        for s in samples:
            total.setdefault(int(s.pid), []).append(float(s.smUtil))
            known.last_seen_us = max(known.last_seen_us, int(s.timeStamp))
        return tuple(ProcessReading(p.pid, p.memory, sum(total[p.pid]) / len(total[p.pid])
                                    if p.pid in total else 0.0) for p in processes)


def _lost(where: str) -> str:
    return (f"{where} has fallen off the bus (NVML: GPU is lost); nothing on it can be "
            f"measured until an administrator resets it.")


def _mig_enabled(nvml, handle) -> bool:
    try:
        return nvml.nvmlDeviceGetMigMode(handle)[0] == nvml.NVML_DEVICE_MIG_ENABLE
    except nvml.NVMLError_GpuIsLost:
        raise
    except (nvml.NVMLError, nvml.NVMLLibraryMismatchError):
        return False  # GPUs without MIG answer NotSupported


def _processes(nvml, handle, notes, where) -> tuple[ProcessReading, ...]:
    """Compute and MPS-client processes, once each (the larger memory where listed twice)."""
    listed: dict[int, int | None] = {}
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
        try:
            found = _versioned(nvml, name, handle)
        except nvml.NVMLError_GpuIsLost:
            raise
        except nvml.NVMLError_NotSupported:
            continue
        except (nvml.NVMLError, nvml.NVMLLibraryMismatchError) as exc:
            if name == "nvmlDeviceGetComputeRunningProcesses":
                notes.append(f"Processes on {where}: {describe(exc)}")
            continue
        for proc in found:
            used, known = proc.usedGpuMemory, listed.get(proc.pid)
            listed[int(proc.pid)] = used if known is None else max(known, used or 0)
    return tuple(ProcessReading(pid, used, None) for pid, used in sorted(listed.items()))


def _versioned(nvml, name, handle):
    try:
        return getattr(nvml, name)(handle)
    except nvml.NVMLLibraryMismatchError:
        older = getattr(nvml, name + "_v2", None)  # drivers older than the bindings
        if older is None:
            raise
        return older(handle)


def _mig_instances(nvml, handle, notes, where) -> tuple[GPUReading, ...]:
    found = []
    try:
        count = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    except (nvml.NVMLError, nvml.NVMLLibraryMismatchError) as exc:
        notes.append(f"MIG instances of {where}: {describe(exc)}")
        return ()
    for i in range(count):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
            continue  # an empty slot
        except (nvml.NVMLError, nvml.NVMLLibraryMismatchError) as exc:
            notes.append(f"MIG instance {i} of {where}: {describe(exc)}")
            continue
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(mig)
            found.append(GPUReading(i, _text(nvml.nvmlDeviceGetUUID(mig)),
                                    _text(nvml.nvmlDeviceGetName(mig)), int(memory.total),
                                    int(memory.used), None,
                                    _processes(nvml, mig, notes, f"MIG instance {i} of {where}")))
        except (nvml.NVMLError, nvml.NVMLLibraryMismatchError) as exc:
            notes.append(f"MIG instance {i} of {where}: {describe(exc)}")
    return tuple(found)
