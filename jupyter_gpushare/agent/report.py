"""The body of ``POST api/samples`` from one reading of a node: pure, no I/O.

What flows in: the sampler's ``MachineReading`` of the node's GPUs; each listed pid's pod
(``cgroup.py``); the pods' owners (``pods.py``); each pod's devices from the kubelet
(``podresources.py``; None when the kubelet could not be asked).
The steps, for each GPU:
  1. who holds it: the pods the kubelet gave it to (a time-sliced replica ``GPU-…::n`` or a
     MIG instance counts for its GPU); a pod of several slices and several GPUs holds them
     pairwise, in order; without the kubelet's answer, the pods whose processes run on it;
  2. each process with its owner's claim (none: outside gpushare);
  3. bounded: at most ``MAX_GPUS`` GPUs and ``MAX_PROCESSES`` processes per GPU (the largest
     by memory; the rest are counted in the GPU's note), sentences cut to 255 characters.
What flows out: a JSON-ready dict that ``pool/api_usage.parse_samples`` accepts.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..usage.sampler import MachineReading, ProcessReading
from .pods import PodOwner

MAX_GPUS, MAX_PROCESSES, MAX_MIG, MAX_HOLDERS = 64, 512, 16, 64
MAX_TEXT = 255
GPU_RESOURCES = ("nvidia.com/",)  # device plugins whose device IDs are GPU or MIG UUIDs


def gpu_of_device(device_id: str, gpus: Mapping[str, str]) -> str | None:
    """The UUID of the GPU a device ID names: itself, a time-sliced replica of it
    (``GPU-…::2``), or one of its MIG instances. ``gpus`` maps GPU and MIG UUIDs to their
    GPU's UUID."""
    return gpus.get(device_id.split("::", 1)[0])


def holders(reading: MachineReading, pod_of_pid: Mapping[int, str],
            pods: Mapping[str, PodOwner],
            devices: Mapping[str, Mapping[str, Sequence[str]]] | None) -> dict[str, list[dict]]:
    """``{GPU UUID: [claim, ...]}``: step 1 above. ``devices`` is keyed by pod UID."""
    parent = {g.uuid: g.uuid for g in reading.gpus}
    parent.update({m.uuid: g.uuid for g in reading.gpus for m in g.mig})
    order = {g.uuid: i for i, g in enumerate(reading.gpus)}
    held: dict[str, list[str]] = {}  # pod UID -> its GPUs, in the node's order
    if devices is not None:
        for uid, by_resource in devices.items():
            found = {gpu_of_device(d, parent) for resource, ids in by_resource.items()
                     if resource.startswith(GPU_RESOURCES) for d in ids}
            held[uid] = sorted(found - {None}, key=order.__getitem__)
    else:
        for g in reading.gpus:
            for p in g.all_processes():
                uid = pod_of_pid.get(p.pid)
                if uid and g.uuid not in held.setdefault(uid, []):
                    held[uid].append(g.uuid)
    out: dict[str, list[dict]] = {}
    for uid, uuids in sorted(held.items()):
        pod = pods.get(uid)
        if pod is None or not pod.claims:
            continue
        for uuid, claim in _pairs(pod.claims, uuids):
            out.setdefault(uuid, []).append(claim)
    return out


def _pairs(claims: Sequence[dict], uuids: Sequence[str]):
    """A job holds all its GPUs; a notebook pod's slices (one per GPU) pair up in order."""
    if len(claims) == 1:
        return [(u, claims[0]) for u in uuids]
    return list(zip(uuids, claims))


def samples_body(reading: MachineReading, pod_of_pid: Mapping[int, str],
                 pods: Mapping[str, PodOwner],
                 devices: Mapping[str, Mapping[str, Sequence[str]]] | None,
                 problems: Sequence[str] = ()) -> dict:
    held = holders(reading, pod_of_pid, pods, devices)
    # A process's claim: for a pod of several slices, the slice that holds this GPU.
    def claim(pid: int, uuid: str):
        pod = pods.get(pod_of_pid.get(pid, ""))
        if pod is None or not pod.claims:
            return None
        if len(pod.claims) > 1:
            for c in held.get(uuid, ()):
                if c in pod.claims:
                    return c
        return pod.claims[0]

    gpus = []
    for g in reading.gpus[:MAX_GPUS]:
        processes, dropped = _processes(g.processes, g.uuid, claim)
        mig = []
        for m in g.mig[:MAX_MIG]:
            mprocs, mdropped = _processes(m.processes, g.uuid, claim)
            dropped += mdropped
            mig.append({"uuid": m.uuid, "name": _cut(m.name), "memory_total": m.memory_total,
                        "memory_used": m.memory_used, "processes": mprocs})
        note = g.note
        if dropped:
            note = f"{note} {dropped} more processes were not sent.".strip()
        gpus.append({"index": g.index, "uuid": g.uuid, "name": _cut(g.name),
                     "memory_total": g.memory_total, "memory_used": g.memory_used,
                     "utilization": _percent(g.utilization), "processes": processes,
                     "mig": mig, "note": _cut(note), "lost": g.lost,
                     "held_by": held.get(g.uuid, [])[:MAX_HOLDERS]})
    problem = " ".join(p for p in (reading.problem, *problems) if p)
    if len(reading.gpus) > MAX_GPUS:
        problem = f"{problem} Only the first {MAX_GPUS} GPUs are reported.".strip()
    return {"node": reading.node, "at": reading.at, "gpus": gpus, "problem": _cut(problem)}


def _processes(procs: Sequence[ProcessReading], uuid: str, claim) -> tuple[list[dict], int]:
    kept = sorted(procs, key=lambda p: -(p.memory or 0))[:MAX_PROCESSES]
    kept.sort(key=lambda p: p.pid)
    return ([{"pid": p.pid, "memory": p.memory, "sm": _percent(p.sm),
              "owner": claim(p.pid, uuid)} for p in kept], len(procs) - len(kept))


def _percent(value):
    return None if value is None else min(100.0, max(0.0, float(value)))


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 1] + "…"

