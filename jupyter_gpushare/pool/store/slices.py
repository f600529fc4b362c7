"""Build slices in the pool's database (``SliceRow``): milli-GPUs of a build GPU reserved for
a notebook server, kept so that a restart of the service knows them. Every method blocks on
the database.
"""

from __future__ import annotations

import secrets

from sqlalchemy import select

from .models import SliceRow


class SliceStore:
    def __init__(self, store):
        """``store``: the ``Store`` whose sessions this part reads and writes with."""
        self.session, self.writing = store.session, store.writing

    def all(self, user: str | None = None) -> list[SliceRow]:
        """Oldest first; only ``user``'s when given."""
        q = select(SliceRow).order_by(SliceRow.created, SliceRow.id)
        if user is not None:
            q = q.where(SliceRow.user == user)
        with self.session() as s:
            return list(s.scalars(q))

    def holds(self, user: str, server: str) -> bool:
        """Whether the user's server (``""``: the default one) holds a build slice."""
        q = select(SliceRow.id).where(SliceRow.user == user, SliceRow.server == server)
        with self.session() as s:
            return s.scalars(q.limit(1)).first() is not None

    def add(self, now: float, **fields) -> SliceRow:
        with self.writing() as s:
            row = SliceRow(id="s-" + secrets.token_hex(4), created=now, **fields)
            s.add(row)
        return row

    def set_pid(self, slice_id: str, pid: int) -> SliceRow | None:
        with self.writing() as s:
            row = s.get(SliceRow, slice_id)
            if row is not None:
                row.pid = pid
        return row

    def remove(self, slice_id: str) -> SliceRow | None:
        with self.writing() as s:
            row = s.get(SliceRow, slice_id)
            if row is not None:
                s.delete(row)
        return row
