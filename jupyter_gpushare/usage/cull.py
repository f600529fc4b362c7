"""Which notebook servers to warn and which to stop because their build slice sits idle.

What flows in, per server holding a slice: how long its slice has shown no GPU use (the
meter), how long the hub has seen no activity from it (its activity records, which count
busy kernels as activity through the server extension), the server's own latest word on its
kernels (how many are busy, and how old that word is), and whether its user is following a
train job's output (a ``%%train`` cell).
The steps: 1. a server idle on every count for ``after`` seconds, with no kernel busy and no
output followed, is warned; 2. one still so ``warning`` seconds after its warning is stopped;
3. a warned server that shows any use again is no longer warned.
What flows out: ``Warn``, ``Cull`` and ``Spare`` decisions with their reasons in words.
Pure: no clock, no I/O. Off unless ``after`` is set.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..text import duration


@dataclass(frozen=True)
class CullSettings:
    after: float  # seconds of idleness before a warning
    warning: float  # seconds between the warning and the stop
    fresh: float = 120.0  # how old the server's word on its kernels may be


@dataclass(frozen=True)
class Evidence:
    """What is known about one server (its slice ``slice_id``) now."""

    user: str
    server: str
    slice_id: str
    gpu_idle_for: float | None  # None: its slice showed use (or cannot be measured)
    hub_idle_for: float | None  # None: the hub has no record of it
    kernels_busy: int | None  # None: the server has not said
    kernels_said_ago: float | None
    following: bool


@dataclass(frozen=True)
class Decision:
    kind: str  # "warn" | "cull" | "spare"
    evidence: Evidence
    reason: str


def idle_for(e: Evidence, s: CullSettings) -> tuple[float | None, str]:
    """How long the server has been idle on every count, or None and why it is not."""
    if e.following:
        return None, "its user is following a train job's output"
    if e.kernels_busy is None or e.kernels_said_ago is None or e.kernels_said_ago > s.fresh:
        return None, "the server has not said lately whether its kernels are busy"
    if e.kernels_busy:
        return None, f"{e.kernels_busy} kernel(s) busy"
    if e.gpu_idle_for is None:
        return None, "its slice uses the GPU"
    if e.hub_idle_for is None:
        return None, "the hub has no activity record of it"
    return min(e.gpu_idle_for, e.hub_idle_for), ""


def decide(evidence: list[Evidence], warned: dict[str, float], now: float,
           s: CullSettings) -> list[Decision]:
    """``warned``: slice id → when its server was warned."""
    out = []
    for e in evidence:
        idle, why_not = idle_for(e, s)
        since = warned.get(e.slice_id)
        if idle is None or idle < s.after:
            if since is not None:
                out.append(Decision("spare", e, why_not or "it was used again"))
            continue
        if since is None:
            out.append(Decision("warn", e, f"no GPU use and no activity for {duration(idle)}; "
                                           f"it will be stopped in {duration(s.warning)} unless "
                                           f"used"))
        elif now - since >= s.warning:
            out.append(Decision("cull", e, f"no GPU use and no activity for {duration(idle)}, "
                                           f"warned {duration(now - since)} ago"))
    return out


