"""A stand-in for NVML behind nvidia-ml-py's own interface, for machines without a GPU.

It is not a driver and measures nothing: it *plays a script*. Tests and the demo hand it to the
real sampler (``sampler.py``) in place of the ``pynvml`` module, so the sampler runs the same
code here as on a GPU machine.

What flows in: a script (a dict, or a JSON file read again whenever it changes) and a clock.
  - ``gpus`` (given ``default_gpus``, those, changed by the script's entries with their
    UUIDs): each ``{"uuid", "name", "memory_total"
    (bytes), "utilization" (optional, else the sum of its processes' SM utilization, at most
    100), "mig": [{"uuid", "name", "memory_total"}] (MIG on: utilization is NotSupported, as
    on real MIG GPUs), "lost_at" (script seconds; from then on every call on it raises
    GpuIsLost)}``;
  - ``processes``: each ``{"pid", "gpu" (a GPU or MIG UUID), "sm" (percent of the GPU),
    "memory" (bytes), "from", "until" (script seconds)}``; only live pids are listed unless
    ``"live_only": false``;
  - ``"library": false``: nvidia-ml-py finds no NVML library (nvmlInit raises LibraryNotFound);
  - ``time_scale`` (script seconds per clock second, default 1) and ``start`` (clock time of
    script second 0; default: when the script was first read), so that a scripted 10 minutes
    can play in 10 seconds.
A value that changes over time is a list of steps ``[[t, value], ...]``: ``value`` from script
second ``t`` until the next step (0 before the first).

What flows out: what nvidia-ml-py's functions return (the same attribute names), and its own
exception classes (``NVMLError_NotFound`` ...), so ``except pynvml.NVMLError_GpuIsLost`` works
the same on both. ``nvmlDeviceGetUtilizationRates`` averages over the time since the previous
call on that device (NVML: over its last sample period); ``nvmlDeviceGetProcessUtilization``
returns one sample per process that ran kernels since ``lastSeenTimeStamp`` (microseconds),
averaged over that time, and raises NotFound when none did, as NVML does.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

import pynvml as _real  # the bindings themselves load without a driver; only their errors are used

GiB = 2**30
NAME = "simulated GPU (NVML stand-in)"


class _Steps:
    """A value over script time: piecewise constant steps."""

    __slots__ = ("steps",)

    def __init__(self, spec):
        if isinstance(spec, (int, float)):
            self.steps = [(float("-inf"), float(spec))]
        else:
            self.steps = sorted((float(t), float(v)) for t, v in spec or ())

    def at(self, t: float) -> float:
        value = 0.0
        for start, v in self.steps:
            if start > t:
                break
            value = v
        return value

    def mean(self, a: float, b: float) -> float:
        """The time-weighted mean over [a, b] (the value at ``b`` when the span is empty)."""
        if b <= a:
            return self.at(b)
        total, t = 0.0, a
        value = self.at(a)
        for start, v in self.steps:
            if start <= a:
                continue
            if start >= b:
                break
            total += value * (start - t)
            t, value = start, v
        total += value * (b - t)
        return total / (b - a)


@dataclass
class _Device:
    uuid: str
    name: str
    memory_total: int
    utilization: _Steps | None
    lost_at: float | None
    mig: list["_Device"]
    parent: "_Device | None" = None


@dataclass
class _Process:
    pid: int
    gpu: str
    sm: _Steps
    memory: _Steps
    start: float
    end: float


class _Handle:
    __slots__ = ("device",)

    def __init__(self, device: _Device):
        self.device = device


class NVMLStandIn:
    """The stand-in: an object with nvidia-ml-py's function names. ``script`` is a dict or
    the path of a JSON file; ``clock`` gives seconds (``time.time`` by default)."""

    def __init__(self, script: dict | str, clock: Callable[[], float] = time.time,
                 default_gpus: list[dict] = ()):
        self._clock = clock
        self._default_gpus = list(default_gpus)  # this machine's GPUs, if given
        self._path = script if isinstance(script, (str, os.PathLike)) else None
        self._mtime = None
        self._lock = threading.Lock()
        self._last_query: dict[str, float] = {}
        self._initialized = False
        # nvidia-ml-py's own errors and constants, so callers catch the same classes.
        for name in dir(_real):
            if name.startswith(("NVMLError", "NVML_")) or name == "NVMLLibraryMismatchError":
                setattr(self, name, getattr(_real, name))
        self._load(script if self._path is None else None)

    # -- the script ------------------------------------------------------------------------
    def _load(self, script: dict | None) -> None:
        if script is None:
            try:
                mtime = os.stat(self._path).st_mtime_ns
            except FileNotFoundError:
                script, mtime = {"gpus": []}, None
            else:
                if mtime == self._mtime:
                    return
                with open(self._path) as f:
                    script = json.load(f)
            self._mtime = mtime
        self.script = script
        self._scale = float(script.get("time_scale", 1.0))
        self._start = float(script["start"]) if "start" in script else \
            getattr(self, "_start", self._clock())
        self._library = bool(script.get("library", True))
        self._live_only = bool(script.get("live_only", True))
        played = script.get("gpus", [])
        if self._default_gpus:  # this machine's GPUs, as the script may change them
            override = {g.get("uuid"): g for g in played}
            played = [dict(g, **override.get(g["uuid"], {})) for g in self._default_gpus]
        self._devices = [self._device(g) for g in played]
        self._by_uuid = {d.uuid: d for g in self._devices for d in (g, *g.mig)}
        self._processes: dict[str, list[_Process]] = {}
        for p in script.get("processes", ()):
            proc = _Process(int(p["pid"]), str(p["gpu"]), _Steps(p.get("sm", 0)),
                            _Steps(p.get("memory", 0)), float(p.get("from", float("-inf"))),
                            float(p.get("until", float("inf"))))
            self._processes.setdefault(proc.gpu, []).append(proc)

    def _device(self, spec: dict, parent: _Device | None = None) -> _Device:
        util = spec.get("utilization")
        device = _Device(str(spec["uuid"]), str(spec.get("name", NAME)),
                         int(spec.get("memory_total", 80 * GiB)),
                         None if util is None else _Steps(util),
                         None if spec.get("lost_at") is None else float(spec["lost_at"]), [],
                         parent)
        device.mig = [self._device(m, device) for m in spec.get("mig", ())]
        return device

    def now(self) -> float:
        """Script seconds now."""
        return (self._clock() - self._start) * self._scale

    def _refresh(self) -> None:
        if self._path is not None:
            self._load(None)

    # -- errors ----------------------------------------------------------------------------
    def _error(self, code: int):
        return _real.NVMLError(code)

    def _check(self, handle: _Handle) -> _Device:
        if not self._initialized:
            raise self._error(_real.NVML_ERROR_UNINITIALIZED)
        device = handle.device
        top = device.parent or device
        if top.lost_at is not None and self.now() >= top.lost_at:
            raise self._error(_real.NVML_ERROR_GPU_IS_LOST)
        return device

    # -- nvidia-ml-py's functions -------------------------------------------------------------
    def nvmlInit(self):
        with self._lock:
            self._refresh()
            if not self._library:
                raise self._error(_real.NVML_ERROR_LIBRARY_NOT_FOUND)
            self._initialized = True

    def nvmlShutdown(self):
        self._initialized = False

    def nvmlDeviceGetCount(self):
        if not self._initialized:
            raise self._error(_real.NVML_ERROR_UNINITIALIZED)
        with self._lock:
            self._refresh()
        if not self._library:  # the script took the library away: as after a driver unload
            self._initialized = False
            raise self._error(_real.NVML_ERROR_UNINITIALIZED)
        return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, index):
        if not 0 <= index < len(self._devices):
            raise self._error(_real.NVML_ERROR_INVALID_ARGUMENT)
        handle = _Handle(self._devices[index])
        self._check(handle)
        return handle

    def nvmlDeviceGetUUID(self, handle):
        return self._check(handle).uuid

    def nvmlDeviceGetName(self, handle):
        return self._check(handle).name

    def nvmlDeviceGetMemoryInfo(self, handle):
        device = self._check(handle)
        t = self.now()
        if device.mig:
            used = sum(self._used(m, t) for m in device.mig)
        else:
            used = self._used(device, t)
        used = min(used, device.memory_total)
        return SimpleNamespace(total=device.memory_total, used=used,
                               free=device.memory_total - used)

    def nvmlDeviceGetUtilizationRates(self, handle):
        device = self._check(handle)
        if device.mig or device.parent is not None:
            raise self._error(_real.NVML_ERROR_NOT_SUPPORTED)  # as with MIG on
        t = self.now()
        since = self._last_query.get(device.uuid, t - self._scale)
        self._last_query[device.uuid] = t
        if device.utilization is not None:
            gpu = device.utilization.mean(since, t)
        else:
            gpu = min(100.0, sum(_share(p, since, t) for p in self._listed(device, t)))
        return SimpleNamespace(gpu=int(round(gpu)), memory=0)

    def nvmlDeviceGetMigMode(self, handle):
        device = self._check(handle)
        if not device.mig:
            raise self._error(_real.NVML_ERROR_NOT_SUPPORTED)
        return [_real.NVML_DEVICE_MIG_ENABLE, _real.NVML_DEVICE_MIG_ENABLE]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle):
        return len(self._check(handle).mig)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle, index):
        device = self._check(handle)
        if not 0 <= index < len(device.mig):
            raise self._error(_real.NVML_ERROR_NOT_FOUND)
        return _Handle(device.mig[index])

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        device = self._check(handle)
        t = self.now()
        return [SimpleNamespace(pid=p.pid, usedGpuMemory=int(p.memory.at(t)),
                                gpuInstanceId=None, computeInstanceId=None)
                for p in self._listed(device, t)]

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle):
        self._check(handle)
        raise self._error(_real.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        self._check(handle)
        return []

    def nvmlDeviceGetProcessUtilization(self, handle, timeStamp):
        device = self._check(handle)
        if device.mig or device.parent is not None:
            raise self._error(_real.NVML_ERROR_NOT_SUPPORTED)
        t = self.now()
        clock_us = int(self._clock() * 1e6)
        # lastSeenTimeStamp is in the clock's microseconds; 0 asks for the last second.
        since = t - self._scale if not timeStamp else \
            (timeStamp / 1e6 - self._start) * self._scale
        samples = []
        for p in self._listed(device, t):
            sm = _share(p, since, t)
            if sm > 0:
                samples.append(SimpleNamespace(pid=p.pid, timeStamp=clock_us,
                                               smUtil=int(round(sm)), memUtil=0, encUtil=0,
                                               decUtil=0))
        if not samples:
            raise self._error(_real.NVML_ERROR_NOT_FOUND)
        return samples

    # -- helpers ----------------------------------------------------------------------------
    def _listed(self, device: _Device, t: float) -> list[_Process]:
        return [p for p in self._processes.get(device.uuid, ())
                if p.start <= t < p.end and (not self._live_only or _alive(p.pid))]

    def _used(self, device: _Device, t: float) -> int:
        return sum(int(p.memory.at(t)) for p in self._listed(device, t))


def _share(p: _Process, a: float, b: float) -> float:
    """A process's mean SM utilization over [a, b], counting the time it did not run as 0."""
    if b <= a:
        return p.sm.at(b)
    lo, hi = max(a, p.start), min(b, p.end)
    return p.sm.mean(lo, hi) * (hi - lo) / (b - a) if hi > lo else 0.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def gpus_script(uuids, memory_total: int = 80 * GiB) -> list[dict]:
    """Script entries for whole GPUs named ``uuids`` (e.g. a simulated inventory's)."""
    return [{"uuid": u, "name": NAME, "memory_total": memory_total} for u in uuids]


def write_script(path, script: dict) -> None:
    """Replace the script file at once (a reader never sees half of it)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(script, f)
    os.replace(tmp, path)
