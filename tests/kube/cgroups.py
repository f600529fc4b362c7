"""Real cgroups for the kubelet simulator's containers, named as a kubelet with the cgroupfs
driver names them: ``kubepods[/<qos>]/pod<uid>/<container-id>`` in each cgroup v1 hierarchy
used here and in the v2 one (``/sys/fs/cgroup/unified`` on a hybrid host), so that
``/proc/<pid>/cgroup`` of a container's processes names its pod exactly as on a real node.

A container's process enters its cgroups before it runs anything (in the child, between fork
and exec), so everything it starts is in the pod too. The memory and cpuset hierarchies are
left alone: moving a process out of the memory cgroup it was given would take it out of a
limit someone set, and a new cpuset cgroup has no CPUs until told. Directories are removed
when their pod goes; one whose processes have not all exited yet is tried again briefly."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
HIERARCHIES = ("pids", "cpu", "cpuacct", "systemd", "unified")


def qos_class(pod: dict) -> str:
    """The pod's QoS class as the kubelet reckons it from cpu and memory (extended resources
    such as GPUs do not count): "guaranteed", "burstable" or "besteffort"."""
    containers = (pod["spec"].get("containers") or []) + (pod["spec"].get("initContainers") or [])
    any_set, all_equal = False, True
    for c in containers:
        res = c.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        for kind in ("cpu", "memory"):
            limit, request = limits.get(kind), requests.get(kind, limits.get(kind))
            any_set = any_set or limit is not None or request is not None
            if limit is None or str(limit) != str(request):
                all_equal = False
    if not any_set:
        return "besteffort"
    return "guaranteed" if all_equal else "burstable"


def pod_path(pod: dict) -> str:
    uid = pod["metadata"]["uid"]
    qos = qos_class(pod)
    return f"kubepods/pod{uid}" if qos == "guaranteed" else f"kubepods/{qos}/pod{uid}"


class PodCgroups:
    """``enter(pod, container_id)`` makes the container's cgroups and returns what the child
    runs to join them (a ``preexec_fn``); ``remove(pod_uid)`` takes a pod's away."""

    def __init__(self, root: Path = ROOT, hierarchies=HIERARCHIES):
        self.bases = [root / h for h in hierarchies
                      if (root / h / "cgroup.procs").exists() and os.access(root / h, os.W_OK)]
        self._made: dict[str, list[Path]] = {}  # pod uid -> directories, deepest first
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return bool(self.bases)

    def enter(self, pod: dict, container_id: str):
        if not self.bases:
            return None
        relative = f"{pod_path(pod)}/{container_id}"
        files = []
        for base in self.bases:
            path = base / relative
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError:
                continue
            files.append(str(path / "cgroup.procs"))
            with self._lock:
                made = self._made.setdefault(pod["metadata"]["uid"], [])
                made[:0] = [path, path.parent]
        encoded = [os.fsencode(f) for f in files]

        def join():  # in the child, before exec: system calls only
            for name in encoded:
                try:
                    fd = os.open(name, os.O_WRONLY)
                    try:
                        os.write(fd, b"0")
                    finally:
                        os.close(fd)
                except OSError:
                    pass
        return join

    def remove(self, uid: str, wait_s: float = 5.0) -> None:
        """Removes the pod's directories in a background thread (its processes were just
        killed; the kernel lets a cgroup go once they have exited)."""
        with self._lock:
            paths = self._made.pop(uid, [])
        if paths:
            threading.Thread(target=_rmdirs, args=(paths, wait_s), daemon=True,
                             name=f"kubelet-sim-cgroups-{uid[:8]}").start()

    def remove_all(self, wait_s: float = 5.0) -> None:
        with self._lock:
            paths = [p for made in self._made.values() for p in made]
            self._made.clear()
        _rmdirs(paths, wait_s)


def _rmdirs(paths: list[Path], wait_s: float) -> None:
    # Deepest first; the QoS and kubepods levels too once nobody else uses them.
    ordered = sorted(set(paths), key=lambda p: -len(p.parts))
    shared = {a for p in ordered for a in p.parents
              if a.name in ("besteffort", "burstable", "kubepods")}
    deadline = time.monotonic() + wait_s
    for path in ordered:
        while True:
            try:
                path.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:  # busy: processes still exiting
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
    for path in sorted(shared, key=lambda p: -len(p.parts)):
        try:
            path.rmdir()  # shared with other simulators: only when empty
        except OSError:
            pass
