"""The fair share's borrowed GPU-time in the pool's database (``FairShareRow``): milli-GPU-
seconds each project held beyond its quota, in buckets of time (``policy/past_use.py`` decides
what they count for), kept so that a restart does not forget them. Every method blocks on the
database.
"""

from __future__ import annotations

from sqlalchemy import delete, select

from .models import FairShareRow


class PastUseStore:
    def __init__(self, store):
        """``store``: the ``Store`` whose sessions this part reads and writes with."""
        self.session, self.writing = store.session, store.writing

    def buckets(self, step: int, first: int) -> list[tuple[str, int, float]]:
        """The borrowed milli-GPU-seconds kept in buckets of ``step`` s from ``first`` on:
        ``(project, bucket, borrowed)``."""
        q = select(FairShareRow).where(FairShareRow.step == step, FairShareRow.bucket >= first)
        with self.session() as s:
            return [(r.project, r.bucket, r.borrowed) for r in s.scalars(q)]

    def add(self, step: int, amounts: dict[tuple[str, int], float],
            forget_before: int) -> None:
        """Add borrowed milli-GPU-seconds per (project, bucket), and forget the buckets before
        ``forget_before`` (and those of any other step): one transaction."""
        with self.writing() as s:
            for (project, bucket), amount in amounts.items():
                row = s.get(FairShareRow, (project, bucket, step))
                if row is None:
                    s.add(FairShareRow(project=project, bucket=bucket, step=step,
                                       borrowed=amount))
                else:
                    row.borrowed += amount
            s.execute(delete(FairShareRow).where(
                (FairShareRow.step != step) | (FairShareRow.bucket < forget_before)))
