"""Which window of time the dashboard shows, and in which buckets (step 1)."""

from __future__ import annotations

from dataclasses import dataclass

from ..pool.validate import Invalid

MINUTE, HOUR, DAY = 60, 3600, 86400


@dataclass(frozen=True)
class Window:
    name: str
    span: int  # seconds back from now
    step: int  # bucket length; whole minutes, as api/usage's step


# Each about 60–120 buckets, and no bucket finer than the rows kept that far back (minute
# rows for GPUUsage.usage_rollup_after_days, 7 by default; hourly rows after that).
WINDOWS = {w.name: w for w in (Window("1h", HOUR, MINUTE), Window("6h", 6 * HOUR, 5 * MINUTE),
                               Window("24h", DAY, 15 * MINUTE), Window("7d", 7 * DAY, 2 * HOUR),
                               Window("30d", 30 * DAY, 6 * HOUR))}
DEFAULT = "6h"


def choose_window(text: str | None) -> Window:
    """The window ``?window=`` names (default 6 h), or ``Invalid`` with one sentence."""
    if text is None or text == "":
        return WINDOWS[DEFAULT]
    found = WINDOWS.get(text.strip())
    if found is None:
        raise Invalid(f"window must be one of {', '.join(WINDOWS)}, not {text[:40]!r}")
    return found
