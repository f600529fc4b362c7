"""The job book: the store's jobs in memory, so that listing them asks no database.

Many clients poll ``GET api/jobs`` while the scheduling loop writes; a list read from the
database costs a query and the decoding of every row's JSON columns each time. The book keeps
a copy of each job as of its last commit, in the store's order (newest first), and is kept up
to date by the store's own sessions: every committed change to a job row reaches it, whichever
store method made it, so no write path can forget it.

What flows in: copies of the rows a session flushed, made when it commits (nothing when it
rolls back), on the event loop's thread even when a worker thread committed. What flows out: ``jobs(...)`` as ``Store.jobs`` answers it, or None when the book cannot
answer exactly (it forgot old finished jobs to stay within ``size``: the store asks the
database then), and versions per user, per project and overall that change exactly when a
list of theirs may have changed.

The book is this process's: a second process writing the same database would not reach it.
"""

from __future__ import annotations

import bisect
from types import SimpleNamespace
from typing import Iterable

ACTIVE = ("pending", "running")


def _order(job) -> tuple:
    # Store.jobs' order: submitted descending, then id.
    return (-job.submitted, job.id)


class JobBook:
    def __init__(self, columns: Iterable[str], size: int = 20_000):
        self.columns = tuple(columns)
        self.size = size
        self._jobs: dict[str, SimpleNamespace] = {}
        self._all: list[tuple] = []  # order keys of every job held
        self._by_user: dict[str, list[tuple]] = {}
        self._by_project: dict[str, list[tuple]] = {}
        # Jobs ordered at or after this key may be missing (forgotten to stay within size);
        # None: the book holds every job of the store.
        self._horizon: tuple | None = None
        self.version = 0
        self._user_versions: dict[str, int] = {}
        self._project_versions: dict[str, int] = {}

    def __len__(self):
        return len(self._jobs)

    # -- filling ------------------------------------------------------------------------
    def load(self, newest: list, active: Iterable) -> None:
        """Start from the store's ``newest`` jobs (at most ``size``, in its order) and every
        active one; when ``newest`` has ``size`` jobs, older ones may exist and lists that
        reach past them are asked of the database."""
        for row in [*newest, *active]:
            if row.id not in self._jobs:
                self._put(self.copy(row))
        if len(newest) >= self.size:
            self._horizon = _order(newest[-1])  # conservative: from this one on

    def copy(self, row) -> SimpleNamespace:
        """A plain copy of a job row's columns: what the book hands out never changes under
        a reader, and holds no database session."""
        return SimpleNamespace(**{c: getattr(row, c) for c in self.columns})

    def committed(self, copies: Iterable[SimpleNamespace]) -> None:
        """Copies (``copy``) of job rows as a session just committed them."""
        for job in copies:
            self._put(job)
        if len(self._jobs) > self.size:
            self._forget_beyond(self.size)

    def _put(self, job: SimpleNamespace) -> None:
        old = self._jobs.get(job.id)
        key = _order(job)
        if old is None:
            bisect.insort(self._all, key)
            bisect.insort(self._by_user.setdefault(job.user, []), key)
            bisect.insort(self._by_project.setdefault(job.project, []), key)
        self._jobs[job.id] = job
        self.version += 1
        self._user_versions[job.user] = self._user_versions.get(job.user, 0) + 1
        self._project_versions[job.project] = self._project_versions.get(job.project, 0) + 1

    def _forget_beyond(self, size: int) -> None:
        """Forget the oldest ended jobs until ``size`` are held (active ones always stay: the
        loop and the lists need them); lists that reach past them go to the database."""
        excess = len(self._jobs) - size
        forgotten = []
        for key in reversed(self._all):
            if excess <= 0:
                break
            if self._jobs[key[1]].state not in ACTIVE:
                forgotten.append(key)
                excess -= 1
        for key in forgotten:
            job = self._jobs.pop(key[1])
            for index in (self._all, self._by_user[job.user], self._by_project[job.project]):
                del index[bisect.bisect_left(index, key)]
        if forgotten:
            newest_gone = forgotten[-1]  # found last walking from the oldest: the newest
            if self._horizon is None or newest_gone < self._horizon:
                self._horizon = newest_gone

    # -- reading ------------------------------------------------------------------------
    def get(self, job_id: str) -> SimpleNamespace | None:
        return self._jobs.get(job_id)

    def jobs(self, user: str | None = None, project: str | None = None,
             states: Iterable[str] | None = None, limit: int = 1000) -> list | None:
        """``Store.jobs`` from memory, or None when jobs the book forgot could belong."""
        if user is not None:
            keys = self._by_user.get(user, [])
        elif project is not None:
            keys = self._by_project.get(project, [])
        else:
            keys = self._all
        states = None if states is None else frozenset(states)
        out = []
        for key in keys:
            if len(out) >= limit:
                return out
            if self._horizon is not None and key >= self._horizon:
                return None  # older jobs than this may be missing: the database answers
            job = self._jobs[key[1]]
            if user is not None and project is not None and job.project != project:
                continue
            if states is None or job.state in states:
                out.append(job)
        if self._horizon is not None and len(out) < limit:
            return None
        return out

    def active(self) -> list:
        return [j for j in self._jobs.values() if j.state in ACTIVE]

    def version_of(self, user: str | None = None, project: str | None = None) -> int:
        """Changes whenever a list of the user's (or the project's) jobs may have."""
        if user is not None:
            return self._user_versions.get(user, 0)
        if project is not None:
            return self._project_versions.get(project, 0)
        return self.version
