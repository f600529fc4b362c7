"""Which window of time the dashboard shows, and in which buckets (step 1): the last hour, six
hours, day, week or month (``?window=6h``), or any period (``?since=…&until=…``, read as
``api/usage`` reads them). Asked for nothing, the last six hours, or on a pool younger than
that the time since its first reading (at least a quarter of an hour), so that its data fill
the charts instead of a sliver at their right edge."""

from __future__ import annotations

from dataclasses import dataclass

from ..usage.rollup import DAY, HOUR, MINUTE
STEPS = (MINUTE, 5 * MINUTE, 15 * MINUTE, 30 * MINUTE, HOUR, 2 * HOUR, 6 * HOUR, DAY)

# Back from now, each in about 60–120 buckets: (span, bucket) seconds.
WINDOWS = {"1h": (HOUR, MINUTE), "6h": (6 * HOUR, 5 * MINUTE), "24h": (DAY, 15 * MINUTE),
           "7d": (7 * DAY, 2 * HOUR), "30d": (30 * DAY, 6 * HOUR)}
DEFAULT = "6h"
YOUNGEST = 15 * MINUTE  # the shortest window shown by default


class BadWindow(ValueError):
    """A window the dashboard cannot show, in one sentence that says what to ask for."""


@dataclass(frozen=True)
class Window:
    name: str  # one of WINDOWS, or "" for a period given by since and until
    since: float
    until: float
    step: int  # bucket length; whole minutes, as api/usage's step
    young: bool = False  # the default window of a pool younger than it: from its first reading
    first: float | None = None  # a young window's first reading (it starts earlier when the
    # pool is younger than YOUNGEST)

    @property
    def span(self) -> float:
        return self.until - self.since


def step_for(span: float) -> int:
    """The finest bucket that draws ``span`` seconds in at most 120 buckets."""
    return next((s for s in STEPS if span / s <= 120), STEPS[-1])


def choose_window(name: str | None, now: float, since: float | None = None,
                  until: float | None = None, first: float | None = None) -> Window:
    """``name``: one of WINDOWS back from ``now``; or the period from ``since`` to ``until``
    (times already read; ``until`` defaults to now). ``BadWindow`` with one sentence otherwise.
    Neither: the DEFAULT window, or, when the pool's ``first`` reading is more recent, the
    period from it (at least YOUNGEST) to now."""
    if since is not None or until is not None:
        if name:
            raise BadWindow("ask for a window (window=6h) or a period (since=…&until=…), not both")
        until = now if until is None else until
        if since is None:
            raise BadWindow("a period needs since as well as until")
        if since >= until:
            raise BadWindow("since must be before until")
        return Window("", since, until, step_for(until - since))
    if not name and first is not None and now - first < WINDOWS[DEFAULT][0]:
        span = max(YOUNGEST, now - first)
        return Window("", now - span, now, step_for(span), young=True, first=first)
    found = WINDOWS.get((name or DEFAULT).strip())
    if found is None:
        raise BadWindow(f"window must be one of {', '.join(WINDOWS)}, not {name[:40]!r}")
    span, step = found
    return Window(name or DEFAULT, now - span, now, step)
