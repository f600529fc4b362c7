"""``GET api/jobs`` answers, kept rendered while what they show is unchanged.

Many clients poll the same lists. A list changes only when the caller's jobs change in the
store (the job book's version of them), or when what the scheduler or the meter says of jobs
changes (their versions); so it is rendered once per caller, query and versions, with its
ETag (``handlers.Rendered``). Within a list, each job's JSON is kept while its row (as the job
book hands it out) and what is said of it (``views.JobSays``) are unchanged, so a list that
changed in one job encodes that one. Both caches are this object's, bounded, and dropped
whole when full."""

from __future__ import annotations

import json
from typing import Callable

from ..store.models import JobRow
from ..train.scheduler import Scheduler
from .handlers import Rendered
from .identity import Who
from .views import job_json, job_says

LIST_ARGUMENTS = ("all", "limit", "project", "state")  # the rest say nothing: not in the key


def list_key(who: Who, arguments: dict) -> tuple:
    """What a rendered job list depends on besides versions: the caller (a service is not
    the user of the same name) and the query arguments the list reads; others in the query
    are left out, so that they cannot make a cache entry each."""
    return who, tuple((k, tuple(arguments.get(k, ()))) for k in LIST_ARGUMENTS)


class JobLists:
    def __init__(self, scheduler: Scheduler, meter, max_lists: int = 512,
                 max_jobs: int = 50_000):
        self.scheduler, self.meter = scheduler, meter
        self.max_lists, self.max_jobs = max_lists, max_jobs
        self._lists: dict[tuple, Rendered] = {}
        self._jobs: dict[tuple[str, bool], tuple[JobRow, tuple, str]] = {}

    def answer(self, key: tuple, rows: Callable[[], list[tuple[JobRow, bool]]]) -> Rendered:
        """The list for ``key`` (``list_key`` and the job book's version of what it lists),
        rendered from ``rows()`` — each row with whether the caller sees it in full — when
        not kept."""
        key = (*key, self.scheduler.explained.version, self.meter.version)
        found = self._lists.get(key)
        if found is None:
            texts = [self.job_text(row, full) for row, full in rows()]
            found = Rendered('{"jobs": [' + ", ".join(texts) + "]}")
            if len(self._lists) >= self.max_lists:
                self._lists.clear()
            self._lists[key] = found
        return found

    def job_text(self, row: JobRow, full: bool) -> str:
        says = job_says(row, self.scheduler.explained, self.meter)
        kept = self._jobs.get((row.id, full))
        if kept is not None and kept[0] is row and kept[1] == says:
            return kept[2]
        text = json.dumps(job_json(row, says, full))
        if len(self._jobs) >= self.max_jobs:
            self._jobs.clear()
        self._jobs[(row.id, full)] = (row, says, text)
        return text
