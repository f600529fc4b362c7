"""The build slice of this notebook server, and a watchdog that says when it is overrun.

The spawner tells the server its slice through the environment (``GPUSHARE_SLICE_GPUS``, the
fraction of one GPU; ``GPUSHARE_SLICE_UUID``, the GPU where the spawner knows it;
``GPUSHARE_SLICE_MODE``, the slicing mode). With time-slicing and the local spawner's pinned
mode nothing in the GPU stops a process from using more memory than its slice: the framework
caps are per process and per framework, and a kernel can ignore them. So the watchdog samples the GPU memory of this server's own processes (the server
and its descendants: the kernels and what they start) and says so, once, when they use more
than ``fraction × GPU memory`` — it warns, it does not kill.

NVML lists host PIDs. Inside a container they are not this server's PIDs, so there the
watchdog cannot tell whose memory it sees; its report says so instead of guessing.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..gpus import Device, Inventory, InventoryError, find_device

SLICE_GPUS = "GPUSHARE_SLICE_GPUS"
SLICE_UUID = "GPUSHARE_SLICE_UUID"
SLICE_MODE = "GPUSHARE_SLICE_MODE"

_FRACTIONS = {0.125: "⅛", 0.25: "¼", 0.5: "½", 0.75: "¾"}


@dataclass(frozen=True)
class BuildSlice:
    """``gpus`` of GPU held by this server: a fraction of one, or whole GPUs (the exclusive
    mode). ``uuid`` names the GPU (or several, comma-separated) where the spawner knows it;
    ``mode`` is the slicing mode (``spawner/modes.py``)."""

    gpus: float
    uuid: str | None = None
    mode: str | None = None

    @classmethod
    def from_environment(cls, env=None) -> "BuildSlice | None":
        """The slice the spawner gave this server (``spawner/modes.py:slice_env``); None
        without one (a CPU-only profile, or a server not started by our spawners). A value
        that is not a number of GPUs raises ``ValueError`` with one sentence."""
        env = os.environ if env is None else env
        text = (env.get(SLICE_GPUS) or "").strip()
        mode = (env.get(SLICE_MODE) or "").strip() or None
        if not text or mode == "cpu":
            return None
        try:
            gpus = float(text)
        except ValueError:
            gpus = math.nan
        if not 0 <= gpus < math.inf:
            raise ValueError(f"{SLICE_GPUS} must be a number of GPUs like 0.25, not {text!r}; "
                             f"the spawner sets it")
        if gpus == 0:
            return None
        return cls(gpus, (env.get(SLICE_UUID) or "").strip() or None, mode)

    @property
    def label(self) -> str:
        """``¼ GPU``, ``0.3 GPU``, ``1 GPU``, ``2 GPUs``."""
        if self.gpus > 1:
            return f"{self.gpus:g} GPUs"
        return f"{_FRACTIONS.get(self.gpus, f'{self.gpus:g}')} GPU"

    def unwatched(self) -> str | None:
        """Why the watchdog has nothing to do for this slice, or None."""
        if self.gpus >= 1:
            return f"This server holds {self.label} whole, so there is no slice to overrun."
        if self.mode == "mig":
            return "MIG enforces this slice's memory in hardware, so the watchdog is not needed."
        if self.mode == "hami":
            return "HAMi enforces this slice's memory and shows it as the whole GPU, so the " \
                   "watchdog is not needed."
        return None

    def json(self) -> dict:
        return {"gpus": self.gpus, "uuid": self.uuid, "mode": self.mode, "label": self.label}


def process_tree(root: int) -> dict[int, str]:
    """``root`` and its descendants that live now, by PID, with their command names (Linux
    ``/proc``; NVML lists processes only on Linux anyway)."""
    children: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended while we looked
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:]
        pid, ppid = int(entry.name), int(rest.split()[1])
        names[pid] = name
        children.setdefault(ppid, []).append(pid)
    if root not in names:
        return {}
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        found[pid] = names[pid]
        todo.extend(children.get(pid, ()))
    return found


def gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


class SliceWatchdog:
    """Samples the GPU memory of process ``root_pid`` and its descendants on the slice's GPU.

    :meth:`check` returns a JSON-ready report and keeps it as ``latest``; crossing the limit is
    logged once as a warning, going back under it once as information."""

    def __init__(self, inventory: Inventory, build_slice: BuildSlice, root_pid: int,
                 log: logging.Logger | None = None, clock=time.time):
        self.inventory = inventory
        self.slice = build_slice
        self.root_pid = root_pid
        self.log = log or logging.getLogger(__name__)
        self.clock = clock
        self.over = False
        self.latest: dict | None = None

    def check(self) -> dict:
        report = self._measure()
        if report["over"] and not self.over:
            self.log.warning("%s", report["message"])
        elif self.over and not report["over"] and report["problem"] is None:
            self.log.info("%s", report["message"])
        if report["problem"] is None:
            self.over = report["over"]
        self.latest = report
        return report

    def _measure(self) -> dict:
        report = {"at": self.clock(), "slice": self.slice.json(), "device": None, "limit": None,
                  "used": 0, "others": 0, "unattributed": 0, "processes": [], "over": False,
                  "problem": None, "message": ""}
        try:
            device = self._device(self.inventory.sample())
        except InventoryError as e:
            return self._problem(report, str(e))
        if isinstance(device, str):
            return self._problem(report, device)
        mig = device.uuid.startswith("MIG-")
        limit = device.memory_total if mig else int(self.slice.gpus * device.memory_total)
        report.update(device={"uuid": device.uuid, "name": device.name,
                              "memory_total": device.memory_total, "mig": mig}, limit=limit)
        if not limit:
            return self._problem(report, f"The slice's GPU ({device.name}) reports no memory, so "
                                         f"there is nothing to compare with.")
        if device.processes is None:
            return self._problem(report, "NVML could not list the processes on the slice's GPU.")
        ours = process_tree(self.root_pid)
        for proc in device.processes:
            if proc.pid in ours:
                report["processes"].append({"pid": proc.pid, "name": ours[proc.pid],
                                            "used": proc.used})
                report["used"] += proc.used or 0
            elif _visible(proc.pid):
                report["others"] += proc.used or 0
            else:
                report["unattributed"] += 1
        report["over"] = report["used"] > limit
        report["message"] = self._sentence(report, device, limit)
        return report

    def _device(self, samples) -> Device | str:
        if self.slice.uuid:
            device = find_device(samples, self.slice.uuid)
            return device or (f"The slice's GPU {self.slice.uuid} is not among the "
                              f"{len(samples)} GPUs NVML lists here.")
        # The spawner could not name the GPU (a device plugin chose it): in a container that
        # sees only its own GPU, that one is it.
        devices = [d for s in samples for d in (s.mig or (s.device,))]
        if len(devices) == 1:
            return devices[0]
        return (f"The slice's GPU is not named ({SLICE_UUID} is not set) and NVML lists "
                f"{len(devices)} GPUs here, so the watchdog cannot tell which is the slice's.")

    def _sentence(self, report, device: Device, limit: int) -> str:
        share = "its MIG instance" if report["device"]["mig"] else \
            f"the slice's {gib(limit)} ({self.slice.label} of {device.name})"
        used = gib(report["used"])
        if report["over"]:
            text = (f"This server's processes use {used} of GPU memory, more than {share}: free "
                    f"memory (restart a kernel, delete tensors) or send the work to the train "
                    f"pool with %%train.")
        else:
            text = f"This server's processes use {used} of {share}."
        if report["unattributed"] and not report["processes"]:
            text += (f" NVML lists {report['unattributed']} processes whose PIDs are not "
                     f"visible here (host PIDs in a container), so their memory is not counted.")
        return text

    def _problem(self, report, sentence: str) -> dict:
        report["problem"] = sentence
        if sentence[1:2].islower():  # "The GPU …" reads on after a colon; "NVML …" stays
            sentence = sentence[:1].lower() + sentence[1:]
        report["message"] = f"The slice watchdog cannot check this server's GPU memory: {sentence}"
        return report


def _visible(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")
