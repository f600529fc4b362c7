"""The one rule for quotas against the pool: every guarantee must be one the pool can honour
(the scheduling contract's guarantee, docs/explanation/scheduling.md#contract-3)."""

from __future__ import annotations

from typing import Iterable

from .model import GPU


def overbooking(quotas: Iterable[int], capacity: int) -> str | None:
    """Why quotas (milli-GPUs) cannot all be guaranteed on a pool of ``capacity`` milli-GPUs,
    in words; None when they can. Callers add what to do about it."""
    total = sum(quotas)
    if total <= capacity:
        return None
    return (f"the quotas add up to {total / GPU:g} GPUs but the train pool has "
            f"{capacity / GPU:g}; a guarantee that cannot be honoured is refused")
