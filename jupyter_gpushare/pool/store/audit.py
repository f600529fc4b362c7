"""The audit trail in the pool's database (``AuditRow``): who changed what, when, through which
door, before and after (``admin/changes.py`` says what is noted). Every method blocks on the
database.
"""

from __future__ import annotations

from sqlalchemy import delete, select

from .models import AuditRow


class AuditStore:
    def __init__(self, store):
        """``store``: the ``Store`` whose sessions this part reads and writes with."""
        self.session, self.writing = store.session, store.writing

    def add(self, at: float, who: str, action: str, target: str, before: dict | None,
            after: dict | None, via: str, address: str = "") -> AuditRow:
        """Note one change: ``who`` did ``action`` to ``target`` through ``via``."""
        with self.writing() as s:
            row = AuditRow(at=at, who=who[:255], action=action, target=target[:255],
                           before=before, after=after, via=via, address=(address or "")[:64])
            s.add(row)
        return row

    def newest(self, since: float | None = None, before_id: int | None = None,
               limit: int = 100) -> list[AuditRow]:
        """Entries newest first: from ``since`` on, older than entry ``before_id``."""
        q = select(AuditRow)
        if since is not None:
            q = q.where(AuditRow.at >= since)
        if before_id is not None:
            q = q.where(AuditRow.id < before_id)
        with self.session() as s:
            return list(s.scalars(q.order_by(AuditRow.id.desc()).limit(limit)))

    def prune(self, older_than: float) -> int:
        """Forget the entries made before ``older_than``; returns how many."""
        with self.writing() as s:
            gone = s.execute(delete(AuditRow).where(AuditRow.at < older_than)).rowcount
        return gone
