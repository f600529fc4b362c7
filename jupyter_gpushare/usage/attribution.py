"""Who is using each GPU: a reading of a machine's GPUs, attributed to slices and job attempts.

What flows in: a ``MachineReading`` (``sampler.py``), the holdings (which job attempts and build
slices hold how much of each GPU, by UUID: the scheduler's view) and the owners of the processes
NVML lists (by pid: ``procs.py`` on the local backend; the node agent's report on Kubernetes).
The steps, for each GPU:
  1. its holders, from the holdings;
  2. each process to its owner, when that owner holds this GPU; other processes are
     *outside gpushare* (no owner) or *outside their allocation* (an owner holding other GPUs);
  3. each holder's SM utilization: its processes' share of the GPU where NVML gives one per
     process; where it does not, the whole GPU's utilization when every process on it is one
     holder's; otherwise unknown (MIG, a lost GPU), never guessed;
  4. each holder's GPU memory, the sum of its processes'.
What flows out: one ``GPUUse`` per GPU, with sentences for what is unusual. Pure: no I/O.

Percentages are of the whole GPU: a ¼ slice whose processes ran kernels 20 % of the time has
``sm`` 20 (and a utilization of 80 % of its slice, ``rollup.py`` divides by the fraction).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..policy.model import GPU
from .sampler import GPUReading, MachineReading

GiB = 2**30


@dataclass(frozen=True, slots=True)
class Owner:
    """What holds GPUs: a job attempt (``key`` "job/attempt") or a build slice (``key`` its id)."""

    kind: str  # "job" | "slice"
    key: str
    user: str
    project: str = ""  # jobs
    job: str = ""  # jobs: the job's id


@dataclass(frozen=True, slots=True)
class Holding:
    owner: Owner
    milli: int


@dataclass(frozen=True, slots=True)
class HolderUse:
    """A holder on one GPU: ``sm`` percent of the GPU's time its processes ran kernels (None:
    not measurable), ``memory`` bytes its processes hold there."""

    owner: Owner
    milli: int
    sm: float | None
    memory: int
    processes: int


@dataclass(frozen=True, slots=True)
class Stray:
    """Processes on a GPU that no holder of it explains."""

    processes: int = 0
    memory: int = 0
    sm: float = 0.0


@dataclass(frozen=True, slots=True)
class GPUUse:
    node: str
    pool: str  # "train", "build", or "" for a GPU the pool does not schedule
    index: int
    uuid: str
    name: str
    memory_total: int
    memory_used: int | None
    utilization: float | None
    holders: tuple[HolderUse, ...]
    outside: Stray  # processes of nobody in gpushare
    misplaced: Stray  # processes of gpushare jobs or slices that do not hold this GPU
    notes: tuple[str, ...]
    lost: bool = False

    @property
    def held(self) -> int:
        return min(GPU, sum(h.milli for h in self.holders))


def attribute(reading: MachineReading, holdings: Mapping[str, Sequence[Holding]],
              owners: Mapping[int, Owner], pools: Mapping[str, str]) -> tuple[GPUUse, ...]:
    """Every GPU of ``reading`` with its holders' use; ``pools`` names each UUID's pool."""
    return tuple(_one(reading.node, g, tuple(holdings.get(g.uuid, ())), owners,
                      pools.get(g.uuid, "")) for g in reading.gpus)


def _one(node: str, gpu: GPUReading, held: tuple[Holding, ...], owners: Mapping[int, Owner],
         pool: str) -> GPUUse:
    where = f"GPU {gpu.index} of {node}"
    notes = [gpu.note] if gpu.note else []
    holders = {h.owner: h for h in held}
    mine: dict[Owner, list] = {h.owner: [] for h in held}
    outside, misplaced = [], []
    for proc in gpu.all_processes():
        owner = owners.get(proc.pid)
        if owner in mine:
            mine[owner].append(proc)
        elif owner is None:
            outside.append(proc)
        else:
            misplaced.append(proc)
    procs_all = gpu.all_processes()
    per_process = bool(procs_all) and all(p.sm is not None for p in procs_all)
    users = {o for o, procs in mine.items() if procs}
    uses = []
    for owner, h in holders.items():
        procs = mine[owner]
        uses.append(HolderUse(owner, h.milli, _sm(gpu, procs, per_process, owner, users,
                                                  len(holders), bool(outside or misplaced)),
                              sum(p.memory or 0 for p in procs), len(procs)))
    stray_out, stray_mis = _stray(outside), _stray(misplaced)
    if stray_out.processes:
        notes.append(f"{where}: {_count(stray_out.processes)} outside gpushare, "
                     f"{_bytes(stray_out.memory)}.")
    if stray_mis.processes:
        notes.append(f"{where}: {_count(stray_mis.processes)} of gpushare jobs or slices that "
                     f"do not hold this GPU, {_bytes(stray_mis.memory)}.")
    uses.sort(key=lambda u: (u.owner.kind, u.owner.key))
    return GPUUse(node, pool, gpu.index, gpu.uuid, gpu.name, gpu.memory_total, gpu.memory_used,
                  gpu.utilization, tuple(uses), stray_out, stray_mis, tuple(notes), gpu.lost)


def _sm(gpu: GPUReading, procs, per_process: bool, owner: Owner, users: set, holders: int,
        strays: bool) -> float | None:
    """The holder's percent of the GPU (step 3 above)."""
    if gpu.lost:
        return None
    if per_process:
        return min(100.0, sum(p.sm for p in procs))
    if gpu.utilization is None:
        return None  # MIG, or NVML could not say
    if not gpu.all_processes():  # nothing listed: the GPU's use is its only holder's
        return gpu.utilization if holders == 1 else (0.0 if not gpu.utilization else None)
    if not strays and users == {owner}:
        return gpu.utilization  # every process there is this holder's
    if not strays and owner not in users and len(users) <= 1:
        return 0.0
    return None


def _stray(procs) -> Stray:
    known = [p.sm for p in procs if p.sm is not None]
    return Stray(len(procs), sum(p.memory or 0 for p in procs), sum(known))


def _count(n: int) -> str:
    return f"{n} process" if n == 1 else f"{n} processes"


def _bytes(n: int) -> str:
    if n >= GiB:
        return f"{n / GiB:.0f} GiB" if n >= 10 * GiB else f"{n / GiB:.1f} GiB"
    return f"{n / 2**20:.0f} MiB"
