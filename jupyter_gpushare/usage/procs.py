"""Whose is a process on this machine: a train job's, or a notebook server's (its slice's).

What flows in: the pids NVML lists, the running job attempts by process group (the local
backend starts each attempt in a session of its own whose id is its process group's), and
the notebook servers by pid (the local spawner tells the pool when it starts one).
The steps, for each pid: read ``/proc/<pid>/stat``; a session or process group of a job is that
job's; else walk up its parents until a notebook server (its slice) or a job's group is met.
What flows out: ``{pid: Owner}`` for the pids that belong to someone.

Only this module reads ``/proc``. Answers are kept for ``recheck_s`` seconds per process (a
process does not change hands), and dropped at once when the set of jobs or servers changes,
so a reading of 8 GPUs × 64 processes costs a few dictionary look-ups, not 512 file reads.
"""

from __future__ import annotations

import time
from typing import Iterable, Mapping

from .attribution import Owner

_MAX_DEPTH = 64


def stat(pid: int, proc: str = "/proc") -> tuple[int, int, int, int] | None:
    """``(ppid, pgrp, session, starttime)`` of a process, or None when it is gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2:].split()
    try:
        return int(fields[1]), int(fields[2]), int(fields[3]), int(fields[19])
    except (IndexError, ValueError):
        return None


class LocalOwners:
    """Maps pids on this machine to job attempts and slices (see the module's docstring)."""

    def __init__(self, recheck_s: float = 30.0, proc: str = "/proc", clock=time.monotonic):
        self.recheck_s, self.proc, self.clock = recheck_s, proc, clock
        self._cache: dict[int, tuple[float, int, Owner | None]] = {}
        self._generation: object = None

    def owners(self, pids: Iterable[int], jobs: Mapping[int, Owner],
               servers: Mapping[int, Owner]) -> dict[int, Owner]:
        """``jobs``: process group (= session) id → job attempt; ``servers``: a notebook
        server's pid → its slice."""
        generation = (frozenset(jobs.items()), frozenset(servers.items()))
        if generation != self._generation:
            self._cache.clear()
            self._generation = generation
        now = self.clock()
        out: dict[int, Owner] = {}
        for pid in pids:
            hit = self._cache.get(pid)
            if hit is not None and now - hit[0] < self.recheck_s:
                owner = hit[2]
            else:
                owner = self._find(pid, jobs, servers, now)
            if owner is not None:
                out[pid] = owner
        if len(self._cache) > 4 * max(len(out), 256):
            self._cache = {p: v for p, v in self._cache.items() if now - v[0] < self.recheck_s}
        return out

    def _find(self, pid: int, jobs, servers, now: float) -> Owner | None:
        first = stat(pid, self.proc)
        if first is None:  # gone, or a pid of another namespace: ask again later, not now
            self._cache[pid] = (now, 0, None)
            return None
        owner = None
        current, info = pid, first
        for _ in range(_MAX_DEPTH):
            ppid, pgrp, session, _start = info
            owner = servers.get(current) or jobs.get(session) or jobs.get(pgrp)
            if owner is not None or ppid <= 1:
                break
            current, info = ppid, stat(ppid, self.proc)
            if info is None:
                break
        self._cache[pid] = (now, first[3], owner)
        return owner
