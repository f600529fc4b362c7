"""Build slices: fixed fractions of single build-pool GPUs, packed best fit.

A slice is held while its notebook runs and is never preempted, so packing is the only
decision: the fullest GPU that still has room, which keeps whole GPUs free for larger
slices. Each user's slices together stay within their build allowance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .model import BUILD, GPU, Node, Slice, gpus_text


@dataclass(frozen=True, slots=True)
class SlicePlacement:
    node: str
    gpu: int


@dataclass(frozen=True, slots=True)
class SliceRefused:
    reason: str
    retry_s: float | None = None  # room comes within this many seconds (a GPU taken back)

    def __str__(self):
        return self.reason


def build_usage(nodes: Iterable[Node], slices: Iterable[Slice]) -> dict[tuple[str, int], int]:
    """Milli-GPUs used on each build-pool GPU, keyed by (node, GPU index)."""
    used = {(n.name, i): 0 for n in nodes if n.pool == BUILD for i in range(n.gpus)}
    for s in slices:
        if (s.node, s.gpu) in used:
            used[(s.node, s.gpu)] += s.milli
    return used


def place_slice(nodes: Iterable[Node], slices: Iterable[Slice], user: str, milli: int,
                allowance: int | None = None) -> SlicePlacement | SliceRefused:
    """Where a new slice of ``milli`` for ``user`` goes, or why it cannot be given."""
    slices = list(slices)
    if not 0 < milli <= GPU:
        return SliceRefused(f"a build slice is a fraction of one GPU (more than 0, at most 1), "
                            f"not {gpus_text(milli)}")
    held = sum(s.milli for s in slices if s.user == user)
    if allowance is not None and held + milli > allowance:
        return SliceRefused(
            f"{user} already holds {gpus_text(held)} of a build allowance of "
            f"{gpus_text(allowance)}; stop another notebook server or pick a smaller slice")
    used = build_usage(nodes, slices)
    best = None
    for (node, gpu), amount in used.items():
        room = GPU - amount
        if room >= milli and (best is None or (room, node, gpu) < best):
            best = (room, node, gpu)
    if best is None:
        return SliceRefused(f"the build pool is full: no GPU has {gpus_text(milli)} free; "
                            f"try a smaller slice or a CPU-only server, or try again later")
    return SlicePlacement(best[1], best[2])
