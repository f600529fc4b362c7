"""Small pieces of text every section uses: GPU fractions, times in the service's zone,
tables. Pure."""

from __future__ import annotations

import time
from html import escape
from typing import Sequence

_FRACTIONS = {0.125: "⅛", 0.25: "¼", 0.5: "½", 0.75: "¾"}


def fraction(gpus) -> str:
    """``¼``, ``½``, ``0.3``, ``2``."""
    if not isinstance(gpus, (int, float)):
        return "?"
    return _FRACTIONS.get(gpus, f"{gpus:g}")


def clock(t: float | None, offset: float, seconds: bool = False) -> str:
    """Epoch seconds as ``14:05`` in the zone ``offset`` seconds from UTC; ``–`` for None."""
    if t is None:
        return "–"
    return time.strftime("%H:%M:%S" if seconds else "%H:%M", time.gmtime(t + offset))


def day_clock(t: float | None, offset: float) -> str:
    """``Nov 20 14:05``."""
    return "–" if t is None else time.strftime("%b %d %H:%M", time.gmtime(t + offset))


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, numeric: set[int] = frozenset(),
          empty: str, cls: str = "") -> str:
    """A table whose cells are already HTML; ``numeric``: column numbers aligned right;
    ``empty``: the sentence instead of a table without rows."""
    if not rows:
        return f'<p class="empty">{escape(empty)}</p>'
    head = "".join(f'<th{" class=num" if i in numeric else ""}>{escape(h)}</th>'
                   for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i in numeric else ""}>{c}</td>'
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return (f'<table{f" class={cls!r}" if cls else ""}><thead><tr>{head}</tr></thead>'
            f'<tbody>{body}</tbody></table>')


def hidden(name: str, value: str) -> str:
    """A form's hidden field (the XSRF token, values carried from a page before)."""
    return f'<input type="hidden" name="{escape(name)}" value="{escape(value)}">'


def frame(base: str, title: str, body: str, user: str) -> str:
    """The body of a page under the dashboard (a form, the audit trail): a header with the
    way back to the dashboard, and ``body`` (already HTML) as its main part."""
    return (f'<header><h1>GPU share: {escape(title)}</h1><nav aria-label="back">'
            f'<a href="{escape(base)}dashboard">← Pool dashboard</a></nav>'
            f'<span class="muted">signed in as {escape(user)}</span></header>'
            f'<main>{body}</main>')
