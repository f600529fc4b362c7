"""The pool service's store: one database in SQLAlchemy 2, and its records by kind.

SQLite (in WAL mode) by default, PostgreSQL by URL. The schema is created and kept up to
date by alembic migrations when the store opens, so a database made by an older version
is upgraded in place and nothing accepted is lost.

``Store`` owns what every kind of record shares: the engine, the sessions and where they
commit (``writing``, ``batch``), and the job book's commit hooks. Each kind of record has a
class of its own, one module each, reached as an attribute of the store:

- ``store.quotas``: projects and departments, the quota tree admins set (``quotas.py``)
- ``store.jobs``: train jobs with their attempts and events (``jobs.py``)
- ``store.slices``: build slices held by notebook servers (``slices.py``)
- ``store.audit``: the audit trail (``audit.py``)
- ``store.drains``: drained train nodes (``drains.py``)
- ``store.past_use``: the fair share's borrowed GPU-time (``past_use.py``)

GPU use (``usage_rollups.py``) and the history read as trace lines (``recorded_jobs.py``) are
read and written the same way, by modules handed the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, event, make_url, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

from ...trainjob import ACTIVE
from .audit import AuditStore
from .drains import DrainStore
from .job_book import JobBook
from .jobs import JobStore
from .models import JobRow
from .past_use import PastUseStore
from .quotas import QuotaStore
from .slices import SliceStore

MIGRATIONS = Path(__file__).with_name("migrations")


class StoreError(Exception):
    """The database cannot be used by this version; the message says what to do."""


def upgrade(engine: Engine) -> None:
    """Bring the database to the newest schema. A database of a newer version (a schema
    revision this version does not know) is refused with ``StoreError``: nothing is changed."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        known = {s.revision for s in ScriptDirectory.from_config(cfg).walk_revisions()}
        current = set(MigrationContext.configure(conn).get_current_heads())
        if current - known:
            raise StoreError(
                "The pool's database was made by a newer version of jupyter-gpushare (schema "
                f"{', '.join(sorted(current - known))}, which this version does not know): "
                "install that version again, or restore the backup made before the upgrade.")
        command.upgrade(cfg, "head")


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        _private_sqlite(url)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
        return engine
    return create_engine(url, pool_pre_ping=True)


def _private_sqlite(url: str) -> None:
    """The database file readable by this account only (SQLite gives its -wal and -shm
    files the database file's mode): it holds every job's command and environment."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    fd = os.open(database, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for extra in ("-wal", "-shm", "-journal"):
        try:
            os.chmod(database + extra, 0o600)
        except FileNotFoundError:
            pass


class Store:
    """The pool's database, opened (and migrated) once; its records are reached by kind:
    ``store.quotas``, ``store.jobs``, ``store.slices``, ``store.audit``, ``store.drains`` and
    ``store.past_use``. Each part writes through ``writing`` and never commits itself, so a
    ``batch`` holds the writes of every part inside it in one transaction."""

    def __init__(self, url: str, book_size: int = 20_000, book_bytes: int = 64 * 1024 * 1024):
        self.engine = make_engine(url)
        upgrade(self.engine)
        self.session = sessionmaker(self.engine, expire_on_commit=False)
        self._local = threading.local()  # .batch: the session ``batch()`` shares, while it runs
        self.book = self._open_book(book_size, book_bytes)
        # Writes may run in worker threads (``in_thread``). The book is
        # the event loop's alone: a worker's commit reaches them through the loop, before
        # the worker's caller resumes.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._home = threading.get_ident()

        # Every session's job rows reach the book when it commits (store/job_book.py): whichever
        # part wrote them, lists read from memory never miss a change.
        @event.listens_for(self.session, "after_flush")
        def _flushed(session, _context):
            rows = session.info.setdefault("jobs", {})
            for row in (*session.new, *session.dirty):
                if isinstance(row, JobRow):
                    rows[row.id] = row

        @event.listens_for(self.session, "after_commit")
        def _written(session):
            rows = session.info.pop("jobs", None)
            copies = [self.book.copy(r) for r in rows.values()] if rows else []
            if self._loop is None or threading.get_ident() == self._home:
                self._committed(copies)
            else:
                self._loop.call_soon_threadsafe(self._committed, copies)

        @event.listens_for(self.session, "after_soft_rollback")
        def _undone(session, _previous):
            session.info.pop("jobs", None)

        self.quotas = QuotaStore(self)
        self.jobs = JobStore(self)
        self.slices = SliceStore(self)
        self.audit = AuditStore(self)
        self.drains = DrainStore(self)
        self.past_use = PastUseStore(self)

    async def in_thread(self, method, *args, **kwargs):
        """``method(*args, **kwargs)`` (a writing method of this store's parts) in a worker
        thread: its commit waits for the disk there, while the event loop goes on answering."""
        self._loop, self._home = asyncio.get_running_loop(), threading.get_ident()
        return await asyncio.to_thread(method, *args, **kwargs)

    def _committed(self, copies: list) -> None:
        if copies:
            self.book.committed(copies)

    @property
    def batched(self):
        """The session ``batch`` shares in this thread (its writes not committed yet), or
        None outside a batch."""
        return getattr(self._local, "batch", None)

    def _open_book(self, size: int, max_bytes: int) -> JobBook:
        book = JobBook([c.key for c in JobRow.__table__.columns], size, max_bytes)
        newest = select(JobRow).order_by(JobRow.submitted.desc(), JobRow.id).limit(size)
        with self.session() as s:
            book.load(list(s.scalars(newest)),
                      s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE))))
        return book

    @contextlib.contextmanager
    def batch(self):
        """The writes inside (of any part: a cycle's exits call ``jobs.finish`` and
        ``jobs.requeue``) share one transaction, committed once at the end: one commit instead
        of one per job, and all or nothing. Only around code that does not await: nothing
        else may write meanwhile."""
        if self.batched is not None:
            yield
            return
        with self.session() as s:
            self._local.batch = s
            try:
                yield
                s.commit()
            finally:
                self._local.batch = None

    @contextlib.contextmanager
    def writing(self):
        """The session every write of the parts goes through: the batch's (flushed here,
        committed by ``batch``), else a new one committed here when the block ends (rolled
        back if it raises)."""
        if self.batched is not None:
            yield self.batched
            self.batched.flush()
            return
        with self.session() as s:
            yield s
            s.commit()
