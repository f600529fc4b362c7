"""Drained train nodes in the pool's database (``DrainRow``): no new job starts on them, and
a restart of the service keeps them so. Every method blocks on the database.
"""

from __future__ import annotations

from sqlalchemy import select

from .models import DrainRow


class DrainStore:
    def __init__(self, store):
        """``store``: the ``Store`` whose sessions this part reads and writes with."""
        self.session, self.writing = store.session, store.writing

    def all(self) -> dict[str, DrainRow]:
        """The drained nodes by name."""
        with self.session() as s:
            return {r.node: r for r in s.scalars(select(DrainRow))}

    def add(self, node: str, by: str, since: float) -> DrainRow:
        """Mark ``node`` drained (kept as it was if it already is)."""
        with self.writing() as s:
            row = s.get(DrainRow, node)
            if row is None:
                row = DrainRow(node=node, by=by, since=since)
                s.add(row)
        return row

    def remove(self, node: str) -> DrainRow | None:
        """Undrain ``node``; the drain it had, or None."""
        with self.writing() as s:
            row = s.get(DrainRow, node)
            if row is not None:
                s.delete(row)
        return row
