"""Reading the build pool's recorded sessions (``sim/slice_history.py``) from the store's
tables: the usage rows of kind ``slice`` (a past slice's row has left the ``slices`` table),
the slices held now, and the take-backs of lent GPUs in the audit trail. For ``api/history``
in a worker thread and for a what-if in its worker process (``recorded_jobs.open_source``).
Every function blocks on the database.

Light on purpose, as ``recorded_jobs.py``: SQLAlchemy and the models only.
"""

from __future__ import annotations

import re

from sqlalchemy import and_, func, select

from ...sim.slice_history import MAX_SESSIONS, Live, Seen, TakeBack, sessions
from ...usage.rollup import MINUTE, spans
from .models import AuditRow, SliceRow, UsageRow
from .usage_rollups import UsageStore

TAKE_BACK = "take back GPU"  # the audit trail's action (``BuildPool.took_back``)
_GPU = re.compile(r"GPU (\d+) of (.+)")


def seen_slices(source, since: float, until: float, horizon: int) -> list[Seen]:
    """Each slice of the usage rows in [since, until), widened to the rows that cover it:
    its first and last bucket and its sums. Two queries a span of rows (their step), not one
    row each: a month of minute rows stays in the database."""
    rows = UsageStore(source)
    found: dict[str, Seen] = {}
    sums = [func.sum(getattr(UsageRow, c))
            for c in ("allocated", "seconds", "measured", "utilized")]
    with source.engine.connect() as conn:
        for step, lo, hi in spans(int(since), int(until) + 1, horizon,
                                  rolled=rows.rolled()):
            if hi <= lo:
                continue
            where = and_(UsageRow.kind == "slice", UsageRow.step == step, UsageRow.t >= lo,
                         UsageRow.t < hi)
            edges = select(UsageRow.key, func.min(UsageRow.user), func.min(UsageRow.t),
                           func.max(UsageRow.t), *sums).where(where).group_by(UsageRow.key)
            keys = {k: (user, first, last, *totals)
                    for k, user, first, last, *totals in conn.execute(edges)}
            if not keys:
                continue
            edge_ts = sorted({v[1] for v in keys.values()} | {v[2] for v in keys.values()})
            seconds: dict[tuple[str, int], float] = {}
            for i in range(0, len(edge_ts), 500):  # the seconds seen in each edge bucket
                q = select(UsageRow.key, UsageRow.t, func.sum(UsageRow.seconds)).where(
                    where, UsageRow.t.in_(edge_ts[i:i + 500])).group_by(UsageRow.key,
                                                                       UsageRow.t)
                for key, t, s in conn.execute(q):
                    seconds[(key, int(t))] = float(s or 0)
            for key, (user, first, last, allocated, secs, measured, utilized) in keys.items():
                head = (int(first), step, seconds.get((key, int(first)), 0.0))
                tail = (int(last), step, seconds.get((key, int(last)), 0.0))
                old = found.get(key)
                totals = [float(x or 0) for x in (allocated, secs, measured, utilized)]
                if old is None:
                    found[key] = Seen(key, user or "", head, tail, *totals)
                else:  # another step's rows of the same slice: the earliest and latest win
                    found[key] = Seen(key, old.user, min(old.first, head), max(old.last, tail),
                                      old.allocated + totals[0], old.seconds + totals[1],
                                      old.measured + totals[2], old.utilized + totals[3])
    return list(found.values())


def live_slices(source, until: float) -> list[Live]:
    with source.session() as s:
        return [Live(r.id, r.user, r.milli, r.created) for r in
                s.scalars(select(SliceRow).where(SliceRow.created < until))]


def take_backs(source, since: float, until: float) -> list[TakeBack]:
    q = select(AuditRow).where(AuditRow.action == TAKE_BACK, AuditRow.at >= since,
                               AuditRow.at < until)
    out = []
    with source.session() as s:
        for row in s.scalars(q.order_by(AuditRow.at).limit(MAX_SESSIONS)):
            m = _GPU.fullmatch(row.target or "")
            if m:
                out.append(TakeBack(row.at, row.who, m.group(2), int(m.group(1))))
    return out


def read_sessions(source, since: float, until: float, now: float, grace: float,
                  horizon: int) -> tuple[list[dict], list[dict], int]:
    """The build lines of the sessions held in [since, until), the take-backs, and how many
    sessions were left off (``slice_history.sessions``)."""
    end = min(until, now)
    return sessions(seen_slices(source, since - MINUTE, end, horizon),
                    live_slices(source, end), take_backs(source, since, end), since, until,
                    now, grace)
