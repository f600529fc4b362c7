"""The queue with its reasons, and the culls of idle build sessions (step 4)."""

from __future__ import annotations

from html import escape

from ..text import duration
from ..trainjob import PENDING
from .forms import cancel_link
from .markup import clock, day_clock, fraction, table

EVENTS = {"warn": "warned", "cull": "stopped", "spare": "no longer warned"}


def queue_table(jobs: list[dict], now: float, most: int = 200, cancel: str | None = None) -> str:
    """Waiting jobs in queue order, each with the scheduler's reason in words (the first
    ``most`` of them); ``cancel``: the service's prefix, for a cancel link on each (None:
    none)."""
    waiting = sorted((j for j in jobs if j.get("state") == PENDING),
                     key=lambda j: (j.get("queue_position") is None,
                                    j.get("queue_position") or 0, j.get("submitted") or 0,
                                    j.get("id", "")))
    cells = []
    for j in waiting[:most]:
        position = j.get("queue_position")
        attempt = j.get("attempt") or 1
        flag = f' <span class="flag">requeued, attempt {attempt}</span>' if attempt > 1 else ""
        cells.append(["–" if position is None else str(position),
                      f'<b>{escape(j.get("name") or j["id"])}</b> <span class="muted">'
                      f'{escape(j["id"])}</span>{flag}',
                      escape(j.get("user") or "?"), escape(j.get("project") or "?"),
                      f'{j.get("gpus", 0):g}',
                      escape(duration(max(0.0, now - (j.get("submitted") or now)))),
                      escape(j.get("reason") or "")]
                     + ([] if cancel is None else [cancel_link(cancel, j)]))
    more = len(waiting) - most
    headers = ["#", "Job", "User", "Project", "GPUs", "Waiting", "Why it waits"]
    return table(headers + ([] if cancel is None else [""]), cells,
                 numeric={0, 4, 5}, empty="Nothing waits: every job that was submitted runs or "
                 "has ended.", cls="queue") + \
        (f'<p class="muted">… and {more} more waiting.</p>' if more > 0 else "")


def culls(culling: dict | None, slices: list[dict], offset: float) -> str:
    """What culling does, who is warned now, and what it did (newest first)."""
    if culling is None:
        return ('<p class="empty">Culling of idle build sessions is off '
                '(c.GPUUsage.cull_idle_slices_after = 0).</p>')
    parts = [f'<p>Notebook servers whose build slice shows no GPU use and that the hub saw no '
             f'activity from for {escape(duration(culling.get("after") or 0))} are warned, then '
             f'stopped {escape(duration(culling.get("warning") or 0))} later unless used; never '
             f'while a kernel is busy or a train job\'s output is followed. Stopped so far: '
             f'<b>{int(culling.get("culled") or 0)}</b>.</p>']
    warned = [s for s in slices if s.get("cull")]
    rows = [[f'<b>{escape(s.get("user") or "?")}</b>',
             escape(s.get("server") or "(default)"), f'{fraction(s.get("gpus"))} slice',
             escape(clock(s["cull"].get("cull_at"), offset)),
             escape(s["cull"].get("reason") or "")] for s in warned]
    parts.append("<h3>Warned now</h3>" + table(
        ["User", "Server", "Holds", "Stopped at", "Why"], rows,
        empty="No server is warned now.", cls="warned"))
    events = sorted(culling.get("events") or (), key=lambda e: -(e.get("at") or 0))
    rows = [[escape(day_clock(e.get("at"), offset)),
             f'<span class="event-{escape(e.get("kind") or "")}">'
             f'{escape(EVENTS.get(e.get("kind"), e.get("kind") or "?"))}</span>',
             f'<b>{escape(e.get("user") or "?")}</b>', escape(e.get("server") or "(default)"),
             escape(e.get("reason") or "")] for e in events]
    parts.append("<h3>Warnings and stops</h3>" + table(
        ["When", "What", "User", "Server", "Why"], rows,
        empty="No server has been warned or stopped since the service started.", cls="culls"))
    return "".join(parts)
