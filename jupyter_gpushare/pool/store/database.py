"""The pool service's store: projects, jobs, attempts and events in SQLAlchemy 2.

SQLite (in WAL mode) by default, PostgreSQL by URL. The schema is created and kept up to
date by alembic migrations when the store opens, so a database made by an older version
is upgraded in place and nothing accepted is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Iterable

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, delete, event, func, make_url, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from ...trainjob import ACTIVE, PENDING, RUNNING
from .job_book import JobBook
from .models import (AttemptRow, AuditRow, DepartmentRow, DrainRow, EventRow, FairShareRow,
                     JobRow, ProjectRow, SliceRow)

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
        # method wrote them, lists read from memory never miss a change.
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

    async def in_thread(self, method, *args, **kwargs):
        """``method(*args, **kwargs)`` (a writing method of this store) in a worker thread:
        its commit waits for the disk there, while the event loop goes on answering."""
        self._loop, self._home = asyncio.get_running_loop(), threading.get_ident()
        return await asyncio.to_thread(method, *args, **kwargs)

    def _committed(self, copies: list) -> None:
        if copies:
            self.book.committed(copies)

    @property
    def _batch(self):
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
        """``job``, ``finish`` and ``requeue`` inside share one transaction, committed once
        at the end (a cycle's exits: one commit instead of one per job). Only around code
        that does not await: nothing else may write meanwhile."""
        if self._batch is not None:
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
    def _writing(self):
        """The batch's session (committed by ``batch``), else a new one committed here."""
        if self._batch is not None:
            yield self._batch
            self._batch.flush()
            return
        with self.session() as s:
            yield s
            s.commit()

    # -- projects -------------------------------------------------------------------------
    def projects(self) -> list[ProjectRow]:
        with self.session() as s:
            return list(s.scalars(select(ProjectRow).order_by(ProjectRow.name)))

    def project(self, name: str) -> ProjectRow | None:
        with self.session() as s:
            return s.get(ProjectRow, name)

    def add_missing_projects(self, projects: Iterable[ProjectRow]) -> list[str]:
        """Create the configured projects that the store does not have yet; the ones it has
        keep what admins set through the API. Returns the names created."""
        created = []
        with self.session() as s:
            for p in projects:
                if s.get(ProjectRow, p.name) is None:
                    s.add(p)
                    created.append(p.name)
            s.commit()
        return created

    def update_project(self, name: str, fields: dict, now: float) -> ProjectRow:
        with self.session() as s:
            row = s.get(ProjectRow, name)
            for key, value in fields.items():
                setattr(row, key, value)
            row.updated = now
            s.commit()
            return row

    # -- departments ----------------------------------------------------------------------
    def departments(self) -> list[DepartmentRow]:
        with self.session() as s:
            return list(s.scalars(select(DepartmentRow).order_by(DepartmentRow.name)))

    def department(self, name: str) -> DepartmentRow | None:
        with self.session() as s:
            return s.get(DepartmentRow, name)

    def members(self, department: str) -> list[str]:
        """The projects of ``department``, by name."""
        with self.session() as s:
            return list(s.scalars(select(ProjectRow.name).where(
                ProjectRow.department == department).order_by(ProjectRow.name)))

    def put_department(self, name: str, fields: dict, members: list[str] | None,
                       now: float) -> DepartmentRow:
        """Create or change department ``name``; ``members`` (when given) become its only
        projects, in one transaction, so that no cycle sees half of the change."""
        with self.session() as s:
            row = s.get(DepartmentRow, name)
            if row is None:
                row = DepartmentRow(name=name, quota=0, over_quota_weight=1, limit=None)
                s.add(row)
            for key, value in fields.items():
                setattr(row, key, value)
            row.updated = now
            if members is not None:
                for project in s.scalars(select(ProjectRow).where(
                        (ProjectRow.department == name) | ProjectRow.name.in_(members))):
                    project.department = name if project.name in members else None
            s.commit()
            return row

    def delete_department(self, name: str) -> bool:
        """Remove a department; its projects belong to none from then on."""
        with self.session() as s:
            row = s.get(DepartmentRow, name)
            if row is None:
                return False
            for project in s.scalars(select(ProjectRow).where(ProjectRow.department == name)):
                project.department = None
            s.delete(row)
            s.commit()
            return True

    # -- jobs -----------------------------------------------------------------------------
    def add_job(self, now: float | None, **fields) -> JobRow:
        """A new pending job submitted at ``now``; ``None``: at the time the row is written,
        taken once this session holds the database's write lock. A submit's time is then
        never earlier than a scheduling cycle that could not see the job yet, so a replay of
        the history (``api/history``) sees each job when the pool did."""
        with self.session() as s:
            job_id = _new_id(s)
            asked = time.time() if now is None else now  # restamped below when None
            row = JobRow(id=job_id, state=PENDING, attempt=1, submitted=asked,
                         pending_since=asked, **fields)
            s.add(row)
            s.flush()  # the job row first: its event refers to it
            if now is None:  # the flush took the write lock: stamp the submit now
                now = row.submitted = row.pending_since = time.time()
            s.add(EventRow(job_id=job_id, t=now, kind="submit", attempt=1))
            s.commit()
            return row

    def add_job_once(self, now: float | None, request_id: str | None, **fields) -> tuple[JobRow, bool]:
        """``add_job`` unless the user already has a job made for ``request_id`` (a retried
        submit): then that job. Returns ``(job, created)``. The unique constraint on (user,
        request_id) decides a race between two tries."""
        if request_id is None:
            return self.add_job(now, **fields), True
        found = self.job_for_request(fields["user"], request_id)
        if found is not None:
            return found, False
        try:
            return self.add_job(now, request_id=request_id, **fields), True
        except IntegrityError:
            found = self.job_for_request(fields["user"], request_id)
            if found is None:
                raise
            return found, False

    def job_for_request(self, user: str, request_id: str) -> JobRow | None:
        with self.session() as s:
            return s.scalars(select(JobRow).where(JobRow.user == user,
                                                  JobRow.request_id == request_id)).first()

    def job(self, job_id: str) -> JobRow | None:
        if self._batch is not None:
            return self._batch.get(JobRow, job_id)
        with self.session() as s:
            return s.get(JobRow, job_id)

    def jobs(self, user: str | None = None, project: str | None = None,
             states: Iterable[str] | None = None, limit: int = 1000) -> list[JobRow]:
        """Newest first. From the job book (copies of the rows, as of their last commit)
        unless the list reaches jobs the book forgot."""
        found = self.book.jobs(user, project, states, limit)
        if found is not None:
            return found
        q = select(JobRow)
        if user is not None:
            q = q.where(JobRow.user == user)
        if project is not None:
            q = q.where(JobRow.project == project)
        if states is not None:
            q = q.where(JobRow.state.in_(list(states)))
        q = q.order_by(JobRow.submitted.desc(), JobRow.id).limit(limit)
        with self.session() as s:
            return list(s.scalars(q))

    def pending_counts(self) -> dict[str, int]:
        """Pending jobs per project, counted in the database (no row limit)."""
        q = select(JobRow.project, func.count()).where(JobRow.state == PENDING) \
            .group_by(JobRow.project)
        with self.session() as s:
            return dict(s.execute(q).all())

    def state_counts(self, user: str) -> dict[str, int]:
        """A user's jobs per state, counted in the database (no row limit)."""
        q = select(JobRow.state, func.count()).where(JobRow.user == user) \
            .group_by(JobRow.state)
        with self.session() as s:
            return dict(s.execute(q).all())

    def active(self) -> list[JobRow]:
        with self.session() as s:
            return list(s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE))))

    def events(self, job_id: str) -> list[EventRow]:
        with self.session() as s:
            return list(s.scalars(select(EventRow).where(EventRow.job_id == job_id)
                                  .order_by(EventRow.id)))

    def attempts(self, job_id: str) -> list[AttemptRow]:
        with self.session() as s:
            return list(s.scalars(select(AttemptRow).where(AttemptRow.job_id == job_id)
                                  .order_by(AttemptRow.attempt)))

    def start(self, job_id: str, placement: dict, now: float) -> JobRow:
        """``start_many`` for one job."""
        return self.start_many([(job_id, placement)], now)[0]

    def start_many(self, starts: list[tuple[str, dict]], now: float) -> list[JobRow]:
        """Record the starts of one cycle, each ``(job_id, placement)``, before the backend
        is asked, so that a crash in between is found (and requeued) on the next start of the
        service; in one transaction (a cycle may start hundreds)."""
        with self.session() as s:
            rows = _by_id(s, [job_id for job_id, _ in starts])
            for job_id, placement in starts:
                row = rows[job_id]
                row.state, row.placement, row.started = RUNNING, placement, now
                row.handle, row.preempting = {}, False
                s.add(AttemptRow(job_id=job_id, attempt=row.attempt, started=now,
                                 placement=placement))
                s.add(EventRow(job_id=job_id, t=now, kind="start", attempt=row.attempt,
                               detail=_placement_text(placement)))
            s.commit()
            return [rows[job_id] for job_id, _ in starts]

    def set_handle(self, job_id: str, handle: dict) -> None:
        self.set_handles({job_id: handle})

    def set_handles(self, handles: dict[str, dict]) -> None:
        """Each job's backend handle, in one transaction."""
        if not handles:
            return
        with self.session() as s:
            for row in _by_id(s, list(handles)).values():
                row.handle = handles[row.id]
            s.commit()

    def mark(self, job_id: str, now: float, *, preempting: bool | None = None,
             cancel: bool | None = None, detail: str = "") -> JobRow:
        with self.session() as s:
            row = s.get(JobRow, job_id)
            if preempting is not None:
                row.preempting = preempting
                s.add(EventRow(job_id=job_id, t=now, kind="preempt", attempt=row.attempt,
                               detail=detail))
            if cancel is not None:
                row.cancel_requested = cancel
                s.add(EventRow(job_id=job_id, t=now, kind="cancel", attempt=row.attempt,
                               detail=detail))
            s.commit()
            return row

    def requeue(self, job_id: str, now: float, outcome: str, detail: str = "",
                exit_code: int | None = None) -> JobRow:
        """The attempt ended without finishing the job (preempted or lost): the job waits
        again with the same id, the next attempt number and the same checkpoint directory."""
        with self._writing() as s:
            row = s.get(JobRow, job_id)
            self._end_attempt(s, row, now, outcome, exit_code)
            row.state, row.attempt, row.pending_since = PENDING, row.attempt + 1, now
            row.placement, row.handle, row.preempting, row.started = {}, {}, False, None
            row.message = detail  # why there is a next attempt, until the job ends
            s.add(EventRow(job_id=job_id, t=now, kind="requeue", attempt=row.attempt,
                           detail=detail))
        return row

    def finish(self, job_id: str, now: float, state: str, exit_code: int | None = None,
               message: str = "") -> JobRow:
        with self._writing() as s:
            row = s.get(JobRow, job_id)
            if row.state == RUNNING:
                self._end_attempt(s, row, now, state, exit_code)
            row.state, row.finished, row.exit_code, row.message = state, now, exit_code, message
            row.preempting = False
            s.add(EventRow(job_id=job_id, t=now, kind="finish", attempt=row.attempt,
                           detail=f"{state}: {message}" if message else state))
        return row

    # -- build slices -----------------------------------------------------------------------
    def slices(self, user: str | None = None) -> list[SliceRow]:
        q = select(SliceRow).order_by(SliceRow.created, SliceRow.id)
        if user is not None:
            q = q.where(SliceRow.user == user)
        with self.session() as s:
            return list(s.scalars(q))

    def holds_slice(self, user: str, server: str) -> bool:
        """Whether the user's server (``""``: the default one) holds a build slice."""
        q = select(SliceRow.id).where(SliceRow.user == user, SliceRow.server == server)
        with self.session() as s:
            return s.scalars(q.limit(1)).first() is not None

    def add_slice(self, now: float, **fields) -> SliceRow:
        with self.session() as s:
            row = SliceRow(id="s-" + secrets.token_hex(4), created=now, **fields)
            s.add(row)
            s.commit()
            return row

    def set_slice_pid(self, slice_id: str, pid: int) -> SliceRow | None:
        with self.session() as s:
            row = s.get(SliceRow, slice_id)
            if row is not None:
                row.pid = pid
                s.commit()
            return row

    def remove_slice(self, slice_id: str) -> SliceRow | None:
        with self.session() as s:
            row = s.get(SliceRow, slice_id)
            if row is not None:
                s.delete(row)
                s.commit()
            return row

    # -- the audit trail ------------------------------------------------------------------
    def add_audit(self, at: float, who: str, action: str, target: str, before: dict | None,
                  after: dict | None, via: str, address: str = "") -> AuditRow:
        """Note one change: ``who`` did ``action`` to ``target`` through ``via``."""
        with self.session() as s:
            row = AuditRow(at=at, who=who[:255], action=action, target=target[:255],
                           before=before, after=after, via=via, address=(address or "")[:64])
            s.add(row)
            s.commit()
            return row

    def audit(self, since: float | None = None, before_id: int | None = None,
              limit: int = 100) -> list[AuditRow]:
        """Entries newest first: from ``since`` on, older than entry ``before_id``."""
        q = select(AuditRow)
        if since is not None:
            q = q.where(AuditRow.at >= since)
        if before_id is not None:
            q = q.where(AuditRow.id < before_id)
        with self.session() as s:
            return list(s.scalars(q.order_by(AuditRow.id.desc()).limit(limit)))

    def prune_audit(self, older_than: float) -> int:
        """Forget the entries made before ``older_than``; returns how many."""
        with self.session() as s:
            gone = s.execute(delete(AuditRow).where(AuditRow.at < older_than)).rowcount
            s.commit()
        return gone

    # -- drained nodes --------------------------------------------------------------------
    def drained(self) -> dict[str, DrainRow]:
        with self.session() as s:
            return {r.node: r for r in s.scalars(select(DrainRow))}

    def drain(self, node: str, by: str, since: float) -> DrainRow:
        """Mark ``node`` drained (kept as it was if it already is)."""
        with self.session() as s:
            row = s.get(DrainRow, node)
            if row is None:
                row = DrainRow(node=node, by=by, since=since)
                s.add(row)
                s.commit()
            return row

    def undrain(self, node: str) -> DrainRow | None:
        with self.session() as s:
            row = s.get(DrainRow, node)
            if row is not None:
                s.delete(row)
                s.commit()
            return row

    # -- fair share over time -------------------------------------------------------------
    def past_use(self, step: int, first: int) -> list[tuple[str, int, float]]:
        """The borrowed milli-GPU-seconds kept in buckets of ``step`` s from ``first`` on."""
        q = select(FairShareRow).where(FairShareRow.step == step, FairShareRow.bucket >= first)
        with self.session() as s:
            return [(r.project, r.bucket, r.borrowed) for r in s.scalars(q)]

    def add_past_use(self, step: int, amounts: dict[tuple[str, int], float],
                     forget_before: int) -> None:
        """Add borrowed milli-GPU-seconds per (project, bucket), and forget the buckets before
        ``forget_before`` (and those of any other step): one transaction."""
        with self.session() as s:
            for (project, bucket), amount in amounts.items():
                row = s.get(FairShareRow, (project, bucket, step))
                if row is None:
                    s.add(FairShareRow(project=project, bucket=bucket, step=step,
                                       borrowed=amount))
                else:
                    row.borrowed += amount
            s.execute(delete(FairShareRow).where(
                (FairShareRow.step != step) | (FairShareRow.bucket < forget_before)))
            s.commit()

    @staticmethod
    def _end_attempt(s, row: JobRow, now: float, outcome: str, exit_code) -> None:
        attempt = s.get(AttemptRow, (row.id, row.attempt))
        if attempt is not None:
            attempt.ended, attempt.outcome, attempt.exit_code = now, outcome, exit_code


def _by_id(session, ids: list[str], chunk: int = 500) -> dict[str, JobRow]:
    """Jobs by id, a few hundred ids per query (SQLite limits the parameters of one)."""
    rows = {}
    for i in range(0, len(ids), chunk):
        rows.update((r.id, r) for r in session.scalars(
            select(JobRow).where(JobRow.id.in_(ids[i:i + chunk]))))
    return rows


def _new_id(session) -> str:
    while True:
        job_id = "j-" + secrets.token_hex(4)
        if session.get(JobRow, job_id) is None:
            return job_id


def _placement_text(placement: dict) -> str:
    return ", ".join(f"{node}: {milli / 1000:g}" for node, milli in sorted(placement.items()))
