"""The build pool's recorded sessions as trace lines (``kind=build``): the pure half of
``api/history``'s ``build`` part, which a replay lends build GPUs by (``replay_build.py``).

What flows in: what the pool keeps of its slices. A slice's row leaves the store when its
server stops, so a past session is known from the usage store's rows of kind ``slice`` (one
per slice and bucket of a minute, an hour or a day: how many seconds it was seen held there,
``Seen``); a session still open from its row (``Live``); and each take-back of a lent GPU
from the audit trail (``TakeBack``: when the loop preempted the job there, for whom).
The steps:
  1. ``span_of``: a slice's start and end from its first and last bucket: held to the end of
     its first bucket, from the start of its last (to within one reading of the GPUs); one
     seen in a single bucket only is placed in the middle of it (where, the rows do not say);
  2. ``sessions``: the sessions of the window, each asked for when its slice came, or, where
     its server took a lent GPU back first, at that take-back (matched by user: the first
     session of theirs that begins within the grace period and ``MATCH_S`` after it, or,
     read from usage rows, up to ``EARLY_S`` before it); take-backs that no session follows
     (the server gave up) stay apart;
  3. each as a trace line of ``history.COLUMNS`` (``build_entry``).
What flows out: JSON-able dicts. No I/O, no clocks.
"""

from __future__ import annotations

from typing import NamedTuple

from ..policy.model import GPU

BUILD_PROJECT = "build"
"""The ``project`` of a build line (the trace format wants one; a slice has none)."""
MATCH_S = 30.0
"""Seconds beyond the grace period within which a slice follows its server's take-back (the
spawner asks again every 2 s; a reading of the GPUs comes every ``sample_interval``)."""
EARLY_S = 5.0
"""A slice's start read from usage rows may seem this much before its take-back."""
MAX_SESSIONS = 10_000
"""Sessions one history gives; the rest are counted (``left_off``) and the replay says so."""


class Seen(NamedTuple):
    """What the usage rows say of one slice in the window: its first and last bucket
    ``(start, step, seconds seen held)`` and its sums (milli-GPU-seconds, seconds)."""

    slice_id: str
    user: str
    first: tuple[int, int, float]
    last: tuple[int, int, float]
    allocated: float
    seconds: float
    measured: float = 0.0
    utilized: float = 0.0


class Live(NamedTuple):
    """A slice held now (``SliceRow``)."""

    slice_id: str
    user: str
    milli: int
    created: float


class TakeBack(NamedTuple):
    """A lent GPU taken back for a user's server (the audit trail's ``take back GPU``)."""

    at: float
    user: str
    node: str
    gpu: int


def span_of(seen: Seen) -> tuple[float, float]:
    """(start, end) of a slice from its first and last bucket (step 1)."""
    t0, step0, s0 = seen.first
    tn, _, sn = seen.last
    if (t0, step0) == seen.last[:2]:
        start = t0 + max(0.0, step0 - s0) / 2
        return start, start + s0
    return t0 + step0 - min(s0, step0), tn + sn


def sessions(seen: list[Seen], live: list[Live], take_backs: list[TakeBack], since: float,
             until: float, now: float, grace_s: float, limit: int = MAX_SESSIONS
             ) -> tuple[list[dict], list[dict], int]:
    """The build lines of the sessions held in [since, until), in the order their servers
    asked (at most ``limit``), the take-backs as ``{"at", "user", "node", "gpu",
    "session"}`` (the session it was for, None where none followed), and how many sessions
    were left off (step 2)."""
    found: dict[str, dict] = {}
    for s in seen:
        start, end = span_of(s)
        found[s.slice_id] = {"id": s.slice_id, "user": s.user, "start": start, "end": end,
                             "milli": round(s.allocated / s.seconds) if s.seconds else 0,
                             "utilization": s.utilized / s.measured if s.measured else None,
                             "exact": False}
    for row in live:  # still held: its start is exact and it has no end yet
        util = found.get(row.slice_id, {}).get("utilization")
        found[row.slice_id] = {"id": row.slice_id, "user": row.user, "start": row.created,
                               "end": None, "milli": row.milli, "utilization": util,
                               "exact": True}
    held = sorted((s for s in found.values() if 0 < s["milli"] <= GPU and s["start"] < until
                   and (s["end"] is None or s["end"] > since)),
                  key=lambda s: (s["start"], s["id"]))
    for s in held:
        s["asked"] = s["start"]
    backs = []
    for tb in sorted(take_backs):
        follows = sorted((s for s in held if s["user"] == tb.user and "by" not in s and
                          tb.at - (0.0 if s["exact"] else EARLY_S) <= s["start"]
                          <= tb.at + grace_s + MATCH_S),
                         key=lambda s: (s["start"] < tb.at, s["start"]))
        if follows:
            follows[0]["by"] = tb
            follows[0]["asked"] = tb.at
        backs.append({"at": round(tb.at, 3), "user": tb.user, "node": tb.node, "gpu": tb.gpu,
                      "session": follows[0]["id"] if follows else None})
    held.sort(key=lambda s: (s["asked"], s["id"]))
    kept = held[:limit]
    return ([build_entry(s, since, now) for s in kept], backs, len(held) - len(kept))


def build_entry(s: dict, since: float, now: float) -> dict:
    """One session as a trace line (step 3): asked at ``submit_time`` (from ``since``;
    a session open before the window, at 0), holding ``gpus`` of a build GPU for
    ``duration`` (one still open: up to ``now``)."""
    asked = max(s["asked"], since)
    start = max(s["start"], asked)
    end = now if s["end"] is None else max(s["end"], start)
    return {"job_id": s["id"], "submit_time": round(asked - since, 3),
            "duration": round(max(end - asked, 0.001), 3), "gpus": s["milli"] / GPU,
            "project": BUILD_PROJECT, "user": s["user"], "priority": 0, "kind": "build",
            "submitted": round(asked, 3), "held_s": round(end - start, 3),
            "queued_s": round(start - asked, 3), "first_start_s": round(start - asked, 3),
            "end_s": round(end - asked, 3), "attempts": 1,
            "state": "open" if s["end"] is None else "closed",
            "utilization": None if s["utilization"] is None else round(s["utilization"], 4)}
