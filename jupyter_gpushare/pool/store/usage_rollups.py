"""Rollup rows of GPU use in the pool's database (table ``usage``, model ``UsageRow``).

Minute rows are written as each minute closes; when an hour has closed, its minute rows are
summed into hour rows, and when a day (UTC) has closed, its hour rows into a day row. Minute
rows older than ``rollup_after`` seconds are dropped (their hours remain), hour and day rows
older than ``retention`` seconds too. A window is read from day rows for its whole days, hour
rows for the partial days at its edges and minute rows for the partial hours, so a query over
90 days reads about 140 buckets per key, not 130,000.

Every method blocks on the database: the pool calls them in worker threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from sqlalchemy import and_, func, insert, literal, select

from ...usage.rollup import DAY, HOUR, MINUTE, RowKey, Totals
from .models import UsageRow

_SUMS = ("capacity", "allocated", "measured", "utilized", "idle", "seconds")
_MAXES = ("memory_peak", "memory_total")
GROUPS = {"kind", "key", "node", "project", "user", "job"}


class UsageStore:
    def __init__(self, store):
        self.engine, self.session = store.engine, store.session

    # -- writing --------------------------------------------------------------------------
    def write(self, start: int, step: int, rows: Mapping[RowKey, Totals]) -> None:
        if not rows:
            return
        values = [{"t": start, "step": step, **key._asdict(), **t.as_dict()}
                  for key, t in rows.items()]
        with self.engine.begin() as conn:
            conn.execute(insert(UsageRow), values)

    def newest(self, step: int) -> int | None:
        """Start of the newest row of ``step``, or None when there is none."""
        with self.engine.connect() as conn:
            return conn.execute(select(func.max(UsageRow.t)).where(UsageRow.step == step)).scalar()

    def oldest(self, step: int) -> int | None:
        with self.engine.connect() as conn:
            return conn.execute(select(func.min(UsageRow.t)).where(UsageRow.step == step)).scalar()

    def rolled(self) -> tuple[int, int]:
        """Where the summed rows end: (hours, days) such that every hour that ends by
        ``hours`` and had readings has its hour rows, and so for days; 0 before any. Read from
        the pool rows, which every reading writes (the index's step, kind and t)."""
        out = []
        with self.engine.connect() as conn:
            for step in (HOUR, DAY):
                newest = conn.execute(select(func.max(UsageRow.t)).where(
                    UsageRow.step == step, UsageRow.kind == "pool")).scalar()
                out.append(0 if newest is None else int(newest) + step)
        return out[0], out[1]

    def roll_up(self, start: int, step: int = HOUR) -> None:
        """Sum the rows of the next finer step (minutes for an hour, hours for a day) in the
        bucket of ``step`` seconds from ``start`` into rows of ``step``."""
        finer = MINUTE if step == HOUR else HOUR
        keys = [UsageRow.kind, UsageRow.key, UsageRow.node, UsageRow.project, UsageRow.user,
                UsageRow.job]
        query = select(literal(start), literal(step), *keys,
                       *(func.sum(getattr(UsageRow, s)) for s in _SUMS),
                       *(func.max(getattr(UsageRow, m)) for m in _MAXES)) \
            .where(UsageRow.step == finer, UsageRow.t >= start, UsageRow.t < start + step) \
            .group_by(*keys)
        columns = ["t", "step", "kind", "key", "node", "project", "user", "job", *_SUMS, *_MAXES]
        with self.engine.begin() as conn:
            conn.execute(insert(UsageRow).from_select(columns, query))

    def prune(self, minutes_before: int, hours_before: int) -> None:
        """Drop minute rows that start before ``minutes_before``, hour rows that start before
        ``hours_before`` and day rows that end by then."""
        with self.engine.begin() as conn:
            for step, before in ((MINUTE, minutes_before), (HOUR, hours_before),
                                 (DAY, hours_before - DAY)):
                conn.execute(UsageRow.__table__.delete().where(UsageRow.step == step,
                                                               UsageRow.t < before))

    # -- reading --------------------------------------------------------------------------
    def sums(self, kinds: Sequence[str], spans: Iterable[tuple[int, int, int]],
             group: Sequence[str], where=None, series_step: int | None = None
             ) -> dict[tuple, Totals]:
        """Totals over ``spans`` (``(step, from, to)``: rows of that step with from ≤ t < to)
        of rows of ``kinds``, grouped by the columns ``group`` (and by buckets of
        ``series_step`` seconds, first in each key, when given). ``where`` adds a condition."""
        assert set(group) <= GROUPS
        cols = [getattr(UsageRow, g) for g in group]
        bucket = (UsageRow.t - UsageRow.t % series_step).label("b") if series_step else None
        keys = ([bucket] if bucket is not None else []) + cols
        out: dict[tuple, Totals] = {}
        with self.engine.connect() as conn:
            for step, lo, hi in spans:
                if hi <= lo:
                    continue
                q = select(*keys, *(func.sum(getattr(UsageRow, s)) for s in _SUMS),
                           *(func.max(getattr(UsageRow, m)) for m in _MAXES)) \
                    .where(UsageRow.step == step, UsageRow.kind.in_(list(kinds)),
                           UsageRow.t >= lo, UsageRow.t < hi)
                if where is not None:
                    q = q.where(where)
                if keys:
                    q = q.group_by(*keys)
                for row in conn.execute(q):
                    k = tuple(int(v) if i == 0 and bucket is not None else v
                              for i, v in enumerate(row[:len(keys)]))
                    values = row[len(keys):]
                    t = Totals(*(float(v or 0) for v in values[:len(_SUMS)]),
                               *(int(v or 0) for v in values[len(_SUMS):]))
                    found = out.get(k)
                    if found is None:
                        out[k] = t
                    else:
                        found.merge(t)
        return out


@dataclass(frozen=True)
class Scope:
    """The rows a caller may read: every row (``user`` None: admins), or the user's own and
    their projects' (project rows, and the jobs of those projects)."""

    user: str | None = None
    projects: frozenset[str] = frozenset()

    def sql(self):
        if self.user is None:
            return None
        return (UsageRow.user == self.user) | and_(UsageRow.project != "",
                                                    UsageRow.project.in_(sorted(self.projects)))

    def admits(self, key: RowKey) -> bool:
        return self.user is None or key.user == self.user or \
            (key.project != "" and key.project in self.projects)
