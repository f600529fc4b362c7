"""The job book: the store's jobs in memory, so that listing them asks no database.

Many clients poll ``GET api/jobs`` while the scheduling loop writes; a list read from the
database costs a query and the decoding of every row's JSON columns each time. The book keeps
a copy of each job as of its last commit, in the store's order (newest first), and is kept up
to date by the store's own sessions: every committed change to a job row reaches it, whichever
part of the store made it, so no write path can forget it.

What flows in: copies of the rows a session flushed, made when it commits (nothing when it
rolls back), on the event loop's thread even when a worker thread committed (``Store``'s commit
hooks, ``database.py``). What flows out: ``jobs(...)`` as ``JobStore.newest`` (``jobs.py``)
answers it, or None when the book cannot answer exactly (it forgot old ended jobs to stay within
``size`` jobs and ``max_bytes``: the store asks the database then), and versions per user, per
project and overall that change exactly when a list of theirs may have changed.

The book is this process's: a second process writing the same database would not reach it.
"""

from __future__ import annotations

import bisect
from types import SimpleNamespace
from typing import Iterable

from ...trainjob import ACTIVE


def _order(job) -> tuple:
    # JobStore.newest's order: submitted descending, then id.
    return (-job.submitted, job.id)


def weight(job) -> int:
    """About the bytes a job holds in memory: its command, env and workdir (up to the
    service's max_job_size each), and a little for the rest."""
    return (sum(len(a) for a in job.command or ()) + len(job.workdir or "")
            + sum(len(k) + len(v) for k, v in (job.env or {}).items()) + 1000)


class JobBook:
    def __init__(self, columns: Iterable[str], size: int = 20_000,
                 max_bytes: int = 64 * 1024 * 1024):
        self.columns = tuple(columns)
        self.size, self.max_bytes = size, max_bytes
        self.bytes = 0  # sum of weight() over the jobs held
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
        self._forget_beyond()

    def copy(self, row) -> SimpleNamespace:
        """A plain copy of a job row's columns: what the book hands out never changes under
        a reader, and holds no database session."""
        return SimpleNamespace(**{c: getattr(row, c) for c in self.columns})

    def committed(self, copies: Iterable[SimpleNamespace]) -> None:
        """Copies (``copy``) of job rows as a session just committed them."""
        for job in copies:
            self._put(job)
        self._forget_beyond()

    def _put(self, job: SimpleNamespace) -> None:
        old = self._jobs.get(job.id)
        key = _order(job)
        if old is None:
            bisect.insort(self._all, key)
            bisect.insort(self._by_user.setdefault(job.user, []), key)
            bisect.insort(self._by_project.setdefault(job.project, []), key)
        else:
            self.bytes -= weight(old)
        self._jobs[job.id] = job
        self.bytes += weight(job)
        self.version += 1
        self._user_versions[job.user] = self._user_versions.get(job.user, 0) + 1
        self._project_versions[job.project] = self._project_versions.get(job.project, 0) + 1

    def _forget_beyond(self) -> None:
        """Forget the oldest ended jobs until at most ``size`` jobs and ``max_bytes`` are
        held (active ones always stay: the lists show them first); lists that reach past
        them go to the database."""
        count, held = len(self._jobs), self.bytes
        if count <= self.size and held <= self.max_bytes:
            return
        forgotten = []
        for key in reversed(self._all):
            if count <= self.size and held <= self.max_bytes:
                break
            job = self._jobs[key[1]]
            if job.state not in ACTIVE:
                forgotten.append(key)
                count, held = count - 1, held - weight(job)
        for key in forgotten:
            job = self._jobs.pop(key[1])
            self.bytes -= weight(job)
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
        """``JobStore.newest`` from memory, or None when jobs the book forgot could belong."""
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
