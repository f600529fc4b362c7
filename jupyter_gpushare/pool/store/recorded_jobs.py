"""Reading the recorded train jobs as trace lines (``sim/history.py``) from the store's tables:
for ``api/history`` in a worker thread, and for a what-if in its worker process, which opens
the database itself (``open_source``). Every function blocks on the database.

Light on purpose: SQLAlchemy and the models, none of the service's HTTP side, so that the
what-if's worker process starts fast.
"""

from __future__ import annotations

from types import SimpleNamespace

from sqlalchemy import and_, create_engine, or_, select
from sqlalchemy.orm import sessionmaker

from ...sim.history import history_entry
from ...usage.rollup import MINUTE, spans
from ...validate import Invalid
from .models import AttemptRow, JobRow
from .usage_rollups import UsageStore

MAX_LIMIT = 10_000  # jobs a page


def read_history(store, since: float, until: float, limit: int, after: str | None):
    """Jobs submitted in [since, until) after the job ``after``, at most ``limit``, with their
    attempts; blocks on the database (call it in a worker thread)."""
    with store.session() as s:
        q = select(JobRow).where(JobRow.submitted >= since, JobRow.submitted < until)
        if after is not None:
            mark = s.get(JobRow, after)
            if mark is None:
                raise Invalid(f"after names no job ({after}); give the next of the previous page")
            q = q.where(or_(JobRow.submitted > mark.submitted,
                            and_(JobRow.submitted == mark.submitted, JobRow.id > mark.id)))
        jobs = list(s.scalars(q.order_by(JobRow.submitted, JobRow.id).limit(limit)))
        attempts: dict[str, list] = {j.id: [] for j in jobs}
        ids = list(attempts)
        for i in range(0, len(ids), 500):
            for a in s.scalars(select(AttemptRow).where(AttemptRow.job_id.in_(ids[i:i + 500]))):
                attempts[a.job_id].append(a)
    return jobs, attempts


def stored_utilization(source, jobs, attempts, now: float, horizon: int) -> dict[str, float]:
    """Each job's utilization from the usage store's job rows over its runs: the sums
    ``api/usage?by=job`` reads (without the minute not yet written)."""
    ran = [a for j in jobs for a in attempts[j.id]]
    if not ran:
        return {}
    lo = int(min(a.started for a in ran))
    hi = int(min(max((a.ended or now) for a in ran), now)) + MINUTE
    rows = UsageStore(source)
    sums = rows.sums(("job",), spans(lo, hi, horizon, rolled=rows.rolled()), ("job",))
    wanted = {j.id for j in jobs}
    return {k[0]: t.utilized / t.measured for k, t in sums.items()
            if k[0] in wanted and t.measured}


def read_entries(source, since: float, until: float, now: float, grace: float, horizon: int,
                 limit: int = MAX_LIMIT, after: str | None = None):
    """One page of trace lines and the id to go on ``after`` (None on the last page). Blocks
    on the database: a worker thread or the what-if's worker process calls it. ``source``:
    anything with a SQLAlchemy ``engine`` and ``session`` factory (the store)."""
    jobs, attempts = read_history(source, since, until, limit, after)
    util = stored_utilization(source, jobs, attempts, now, horizon)
    entries = [e for j in jobs if (e := history_entry(
        j, attempts[j.id], util.get(j.id), since, now, grace)) is not None]
    for e in entries:  # why the pool stopped each attempt it stopped, in order
        e["stops"] = [a.stop for a in sorted(attempts[e["job_id"]], key=lambda a: a.attempt)
                      if a.stop]
    return entries, (jobs[-1].id if len(jobs) == limit else None)


def all_entries(source, since: float, until: float, now: float, grace: float,
                horizon: int) -> list[dict]:
    """Every page of ``read_entries``."""
    entries, after = [], None
    while True:
        page, after = read_entries(source, since, until, now, grace, horizon, MAX_LIMIT, after)
        entries += page
        if after is None:
            return entries


def open_source(db_url: str):
    """The store's tables by URL, for reading in a process of its own: no migrations, no job
    book, none of the service's modules."""
    args = {"connect_args": {"timeout": 30}} if db_url.startswith("sqlite") else \
        {"pool_pre_ping": True}
    engine = create_engine(db_url, **args)
    return SimpleNamespace(engine=engine, session=sessionmaker(engine, expire_on_commit=False))
