"""Which pod a process of this node belongs to: its pod UID, read from ``/proc/<pid>/cgroup``.

A kubelet puts every container's processes in a cgroup named after the pod's UID, and the
agent (with ``hostPID``) sees the node's processes with their host pids, the pids NVML
lists. The names depend on the cgroup driver and version; all of these are understood:

- cgroup v1, cgroupfs driver: ``4:memory:/kubepods/burstable/pod<uid>/<container-id>``
  (guaranteed pods have no QoS level: ``/kubepods/pod<uid>/...``);
- cgroup v1, systemd driver: ``…:/kubepods.slice/kubepods-besteffort.slice/
  kubepods-besteffort-pod<uid with _ for ->.slice/cri-containerd-<id>.scope``;
- cgroup v2 (one line ``0::/…``), either driver, the same paths;
- the same below a prefix, as in nested setups (kind: ``/system.slice/docker-<id>.scope/
  kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort-pod<uid>.slice/…``).

A container may create sub-cgroups below its own and name them as it likes, so the pod is the
outermost name in the path, whichever layout it has.

Pure functions over the file's text, and one reader; nothing here needs privileges: the file
is readable by everyone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
# cgroupfs: .../kubepods[/qos]/pod<uid>[/<container>]
_CGROUPFS = re.compile(rf"/kubepods(?:/[a-z]+)?/pod(?P<uid>{_UID})(?:/(?P<cid>[^/]+))?")
# systemd: .../[prefix-]kubepods[-qos]-pod<uid_>.slice[/<runtime>-<container>.scope]
_SYSTEMD = re.compile(rf"/(?:[a-z0-9]+-)*kubepods(?:-[a-z]+)?-pod(?P<uid>{_UID})\.slice"
                      rf"(?:/(?:[a-z0-9]+-)*(?P<cid>[0-9a-f]{{16,}})\.scope)?")


@dataclass(frozen=True, slots=True)
class PodCgroup:
    """A process's pod: ``uid`` (as the API spells it, with dashes) and, where the path
    names it, the container's runtime id (``""`` for the pod's own cgroup)."""

    uid: str
    container: str = ""


def parse(text: str) -> PodCgroup | None:
    """The pod of a process from the text of its ``/proc/<pid>/cgroup``; None when it is not
    in a pod (a process of the node itself)."""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        # the outermost name of either layout: below the pod's cgroup, the container may
        # make its own sub-cgroups and name them after another pod (in either layout)
        matches = [m for m in (_CGROUPFS.search(parts[2]), _SYSTEMD.search(parts[2])) if m]
        if matches:
            found = min(matches, key=lambda m: m.start())
            return PodCgroup(found.group("uid").replace("_", "-").lower(),
                             found.group("cid") or "")
    return None


def pod_of(pid: int, proc: str = "/proc") -> PodCgroup | None:
    """``parse`` of a live process; None when it is gone or in no pod."""
    try:
        with open(f"{proc}/{int(pid)}/cgroup", encoding="utf-8", errors="replace") as f:
            return parse(f.read(64 * 1024))
    except OSError:
        return None
