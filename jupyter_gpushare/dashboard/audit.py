"""The audit trail (step 5): who changed what in the pool, when, through which door; the
latest entries on the dashboard, older ones a page each (``audit_page``). From
``GET api/audit``'s entries, as ``pool/web/dashboard_pages.py`` lists them with the API's own
code."""

from __future__ import annotations

from html import escape

from ..text import change_words, recently
from .markup import day_clock, frame, table


def moment(t: float | None, now: float, offset: float) -> str:
    """``just now``, ``5 min ago``, else ``Nov 20 14:05`` in the service's zone."""
    if t is None:
        return "–"
    return recently(t, now) or day_clock(t, offset)


def audit_table(entries: list[dict], now: float, offset: float) -> str:
    """Newest first: when, who, what, target, before → after in words, via."""
    rows = [[f'<span title="{escape(day_clock(e.get("at"), offset))}">'
             f'{escape(moment(e.get("at"), now, offset))}</span>',
             f'<b>{escape(e.get("who") or "?")}</b>', escape(e.get("action") or "?"),
             escape(e.get("target") or "–"),
             escape(change_words(e.get("before"), e.get("after"))),
             escape(e.get("via") or "?")] for e in entries]
    return table(["When", "Who", "What", "Target", "Before → after", "Via"], rows,
                 empty="Nothing recorded yet: no admin has changed the pool, and culling has "
                       "stopped no server.", cls="audit")


def older_link(base: str, next_id: int | None) -> str:
    """The link to the entries before ``next_id`` ("" when there are none)."""
    if next_id is None:
        return ""
    return (f'<a id="older" href="{escape(base)}dashboard/audit?before={int(next_id)}">'
            f'Older entries…</a>')


def audit_section(base: str, entries: list[dict], next_id: int | None, now: float,
                  offset: float) -> str:
    """The dashboard's section: the latest entries and the way to older ones."""
    older = older_link(base, next_id)
    return audit_table(entries, now, offset) + (f"<p>{older}</p>" if older else "")


def audit_page(base: str, user: str, entries: list[dict], next_id: int | None,
               before: int | None, now: float, offset: float, zone: str) -> tuple[str, str]:
    """A page of the trail: the entries older than ``before`` (None: the newest)."""
    where = "the newest entries" if before is None else f"entries before #{int(before)}"
    links = [f'<a id="newest" href="{escape(base)}dashboard/audit">Newest entries</a>'
             if before is not None else "", older_link(base, next_id)]
    links = " · ".join(link for link in links if link)
    body = (f'<section id="audit"><h2>Audit trail: {where}</h2>'
            f'<p class="muted">Times in {escape(zone)}. The same entries as gpushare audit and '
            f'GET api/audit.</p>'
            + audit_table(entries, now, offset)
            + (f'<p>{links}</p>' if links else "") + '</section>')
    return "GPU share: audit trail", frame(base, "audit trail", body, user)
