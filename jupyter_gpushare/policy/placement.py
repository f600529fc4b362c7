"""Where a gang goes: one node when it fits on one, else the fewest nodes; best fit.

Best fit (the fullest node that still fits) keeps whole nodes free for large gangs;
fragmentation is a main cause of idle GPUs. Ties go to the node name, so the same
state gives the same placement.
"""

from __future__ import annotations

import bisect
from typing import Iterable, Iterator, Mapping


def nodes_needed(gpus: int, node_size: int) -> int:
    """The fewest nodes a gang of ``gpus`` can use when nodes hold ``node_size``."""
    return -(-gpus // node_size)


class FreeMap:
    """Free milli-GPUs per node, indexed by amount so that best fit costs little."""

    __slots__ = ("free", "_buckets", "node_size", "_total")

    def __init__(self, free: Mapping[str, int], node_size: int):
        self.free = dict(free)
        self.node_size = node_size
        self._total = sum(self.free.values())
        self._buckets: dict[int, list[str]] = {}
        for name in sorted(self.free):
            self._buckets.setdefault(self.free[name], []).append(name)

    def total(self, exclude: frozenset[str] | set[str] = frozenset()) -> int:
        if not exclude:
            return self._total
        return self._total - sum(self.free[n] for n in exclude if n in self.free)

    def set(self, name: str, new: int) -> None:
        """Say that ``name`` now has ``new`` milli-GPUs (the node must be in the map)."""
        old = self.free[name]
        if new == old:
            return
        bucket = self._buckets[old]
        del bucket[bisect.bisect_left(bucket, name)]
        if not bucket:
            del self._buckets[old]
        self.free[name] = new
        self._total += new - old
        bisect.insort(self._buckets.setdefault(new, []), name)

    def take(self, placement: Mapping[str, int]) -> None:
        for name, amount in placement.items():
            if amount > self.free[name]:
                raise ValueError(f"over-allocation on {name}: {amount} > {self.free[name]}")
            self.set(name, self.free[name] - amount)

    def give(self, placement: Mapping[str, int]) -> None:
        for name, amount in placement.items():
            if name in self.free:
                self.set(name, self.free[name] + amount)

    def ascending(self, least: int) -> Iterator[tuple[int, str]]:
        """``(amount, node)`` for the nodes with at least ``least``, the smallest amount
        first, ties by name: best fit is the first that suits."""
        for amount in sorted(a for a in self._buckets if a >= least):
            for name in self._buckets[amount]:
                yield amount, name

    def descending(self) -> Iterator[tuple[int, str]]:
        """``(amount, node)`` for the nodes with more than 0, the largest first, ties by name."""
        for amount in sorted(self._buckets, reverse=True):
            if amount <= 0:
                return
            for name in self._buckets[amount]:
                yield amount, name

    def fit(self, gpus: int, exclude: frozenset[str] | set[str] = frozenset()) -> dict[str, int] | None:
        """A placement for a gang of ``gpus``, or None. Nodes in ``exclude`` are skipped."""
        if gpus <= self.node_size:
            for _, name in self.ascending(gpus):
                if name not in exclude:
                    return {name: gpus}
            return None
        return self._fit_gang(gpus, nodes_needed(gpus, self.node_size), exclude)

    def _fit_gang(self, gpus: int, k: int, exclude) -> dict[str, int] | None:
        # The k-1 freest nodes whole, the rest on the best-fitting node after them.
        chosen: list[tuple[str, int]] = []
        for amount, name in self.descending():
            if name not in exclude:
                chosen.append((name, amount))
                if len(chosen) == k:
                    break
        if len(chosen) < k or sum(a for _, a in chosen) < gpus:
            return None
        placement = dict(chosen[: k - 1])
        rest = gpus - sum(placement.values())
        for _, name in self.ascending(rest):
            if name not in exclude and name not in placement:
                placement[name] = rest
                return placement
        return None  # unreachable: the k-th freest node holds at least ``rest``


def fit_anywhere(free: Mapping[str, int], gpus: int, node_size: int,
                 exclude: Iterable[str] = ()) -> dict[str, int] | None:
    """One-off placement on a plain mapping (for what-if questions during reclaim)."""
    return FreeMap(free, node_size).fit(gpus, frozenset(exclude))
