"""The fit memo: gangs that already failed to fit this cycle, so a larger one asks no more.

Within a cycle free GPUs only shrink and reclaim's victims only go, so a gang at least as
large as one that failed, on as many nodes and with as many nodes kept out of its reach,
fails too. Failures are kept apart by how the gang tried (a ``Way``, or the reclaim rule).
"""

from __future__ import annotations

import enum

NEVER = 1 << 62  # larger than any gang: nothing failed yet


class Way(str, enum.Enum):
    """How a gang tried free GPUs.

    The three ask the same question of the free GPUs, yet keep their failures apart as the
    cycle always has: a borrower passed over on a failure is not visited, and which are
    visited decides the order in which waits are explained.
    """

    WITHIN_QUOTA = "free-within-quota"  # step 4 for a job that keeps its project within quota
    BORROWING = "free-borrowing"  # step 4 for a borrower
    UNRESERVED = "free-unreserved"  # step 6: would it fit were no nodes reserved?
    LENT = "free-lent"  # step 4 for a borrower, on build GPUs lent to train jobs


class FitMemo:
    """The smallest gang that failed, by (way, kept out of reserved nodes, nodes it needs)."""

    __slots__ = ("_smallest",)

    def __init__(self):
        self._smallest: dict[tuple, int] = {}

    def smallest(self, way, excluded: bool, nodes: int) -> int:
        """The smallest gang that failed so, or ``NEVER``."""
        return self._smallest.get((way, excluded, nodes), NEVER)

    def fails(self, way, excluded: bool, nodes: int, gpus: int) -> bool:
        """Whether a gang of ``gpus`` is known to fail so."""
        return gpus >= self._smallest.get((way, excluded, nodes), NEVER)

    def failed(self, way, excluded: bool, nodes: int, gpus: int) -> None:
        self._smallest[(way, excluded, nodes)] = gpus
