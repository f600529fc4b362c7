"""Train jobs in the pool's database: each job (``JobRow``) with its attempts (``AttemptRow``,
one per run) and its events (``EventRow``: submit, start, preempt, cancel, requeue, finish).

One part for the three: a job's change and what it adds to its attempts and events are written
in one transaction (a start is the job's row, a new attempt and an event; a finish ends the
attempt too). Lists of jobs are read from the job book (``job_book.py``), which the store's
commit hooks keep up to date. Every method blocks on the database.
"""

from __future__ import annotations

import secrets
import time
from typing import Iterable

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from ...trainjob import ACTIVE, PENDING, RUNNING
from .models import AttemptRow, EventRow, JobRow


class JobStore:
    def __init__(self, store):
        """``store``: the ``Store`` whose sessions, batch and job book this part uses."""
        self._store = store
        self.session, self.writing = store.session, store.writing

    def add(self, now: float | None, **fields) -> JobRow:
        """A new pending job submitted at ``now``; ``None``: at the time the row is written,
        taken once this session holds the database's write lock. A submit's time is then
        never earlier than a scheduling cycle that could not see the job yet, so a replay of
        the history (``api/history``) sees each job when the pool did."""
        with self.writing() as s:
            job_id = _new_id(s)
            asked = time.time() if now is None else now  # restamped below when None
            row = JobRow(id=job_id, state=PENDING, attempt=1, submitted=asked,
                         pending_since=asked, **fields)
            s.add(row)
            s.flush()  # the job row first: its event refers to it
            if now is None:  # the flush took the write lock: stamp the submit now
                now = row.submitted = row.pending_since = time.time()
            s.add(EventRow(job_id=job_id, t=now, kind="submit", attempt=1))
        return row

    def add_once(self, now: float | None, request_id: str | None,
                 **fields) -> tuple[JobRow, bool]:
        """``add`` unless the user already has a job made for ``request_id`` (a retried
        submit): then that job. Returns ``(job, created)``. The unique constraint on (user,
        request_id) decides a race between two tries. Not inside a ``batch``: the losing
        try's failed insert would undo the batch."""
        if request_id is None:
            return self.add(now, **fields), True
        found = self.for_request(fields["user"], request_id)
        if found is not None:
            return found, False
        try:
            return self.add(now, request_id=request_id, **fields), True
        except IntegrityError:
            found = self.for_request(fields["user"], request_id)
            if found is None:
                raise
            return found, False

    def for_request(self, user: str, request_id: str) -> JobRow | None:
        with self.session() as s:
            return s.scalars(select(JobRow).where(JobRow.user == user,
                                                  JobRow.request_id == request_id)).first()

    def get(self, job_id: str) -> JobRow | None:
        """The job as this thread's batch left it, when in one (its change not committed)."""
        batched = self._store.batched
        if batched is not None:
            return batched.get(JobRow, job_id)
        with self.session() as s:
            return s.get(JobRow, job_id)

    def newest(self, user: str | None = None, project: str | None = None,
               states: Iterable[str] | None = None, limit: int = 1000) -> list[JobRow]:
        """Newest first. From the job book (copies of the rows, as of their last commit)
        unless the list reaches jobs the book forgot."""
        found = self._store.book.jobs(user, project, states, limit)
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
        with self.writing() as s:
            rows = _by_id(s, [job_id for job_id, _ in starts])
            for job_id, placement in starts:
                row = rows[job_id]
                row.state, row.placement, row.started = RUNNING, placement, now
                row.handle, row.preempting = {}, False
                s.add(AttemptRow(job_id=job_id, attempt=row.attempt, started=now,
                                 placement=placement))
                s.add(EventRow(job_id=job_id, t=now, kind="start", attempt=row.attempt,
                               detail=_placement_text(placement)))
        return [rows[job_id] for job_id, _ in starts]

    def set_handle(self, job_id: str, handle: dict) -> None:
        self.set_handles({job_id: handle})

    def set_handles(self, handles: dict[str, dict]) -> None:
        """Each job's backend handle, in one transaction."""
        if not handles:
            return
        with self.writing() as s:
            for row in _by_id(s, list(handles)).values():
                row.handle = handles[row.id]

    def mark(self, job_id: str, now: float, *, preempting: bool | None = None,
             cancel: bool | None = None, detail: str = "", stop: str | None = None) -> JobRow:
        """A running job told to stop (``preempting``) or cancelled, with an event that says
        why (``detail``, in words) and, on its attempt, the stop's kind (``stop``)."""
        with self.writing() as s:
            row = s.get(JobRow, job_id)
            if stop is not None and (attempt := s.get(AttemptRow, (job_id, row.attempt))):
                attempt.stop = str(stop)
            if preempting is not None:
                row.preempting = preempting
                s.add(EventRow(job_id=job_id, t=now, kind="preempt", attempt=row.attempt,
                               detail=detail))
            if cancel is not None:
                row.cancel_requested = cancel
                s.add(EventRow(job_id=job_id, t=now, kind="cancel", attempt=row.attempt,
                               detail=detail))
        return row

    def requeue(self, job_id: str, now: float, outcome: str, detail: str = "",
                exit_code: int | None = None) -> JobRow:
        """The attempt ended without finishing the job (preempted or lost): the job waits
        again with the same id, the next attempt number and the same checkpoint directory."""
        with self.writing() as s:
            row = s.get(JobRow, job_id)
            _end_attempt(s, row, now, outcome, exit_code)
            row.state, row.attempt, row.pending_since = PENDING, row.attempt + 1, now
            row.placement, row.handle, row.preempting, row.started = {}, {}, False, None
            row.message = detail  # why there is a next attempt, until the job ends
            s.add(EventRow(job_id=job_id, t=now, kind="requeue", attempt=row.attempt,
                           detail=detail))
        return row

    def finish(self, job_id: str, now: float, state: str, exit_code: int | None = None,
               message: str = "") -> JobRow:
        with self.writing() as s:
            row = s.get(JobRow, job_id)
            if row.state == RUNNING:
                _end_attempt(s, row, now, state, exit_code)
            row.state, row.finished, row.exit_code, row.message = state, now, exit_code, message
            row.preempting = False
            s.add(EventRow(job_id=job_id, t=now, kind="finish", attempt=row.attempt,
                           detail=f"{state}: {message}" if message else state))
        return row


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
