"""The page around the sections (step 6), and the refusal page.

``render(data)`` takes one dict (``pool/web/dashboard_pages.py`` gathers it; the tests write it by
hand):
  ``now`` (epoch seconds), ``offset`` (the service's UTC offset, seconds) and ``zone`` (its
  name), ``user`` (the admin reading), ``window`` (a ``Window``: the usage's period),
  ``refresh_s``;
  ``pool`` (``api/pool`` as an admin reads it), ``projects`` (``api/projects``' list),
  ``usage`` (``api/usage?by=project&step=…`` over the window), ``idle_jobs`` and
  ``idle_slices`` (the rows of ``api/usage?by=job|slice&sort=idle``), ``jobs`` (running and
  waiting jobs as ``api/jobs`` shows them) and ``slices`` (``api/slices``' list);
  ``audit`` (the newest entries of ``api/audit``) and ``audit_next`` (its ``next``: the id
  the older entries' page starts before, None when there are none);
  ``base`` (the service's prefix, ``/services/gpushare/``): where the links to the admin's
  forms point: each project's settings and each job's cancel (``forms.py``), each train
  node's drain (``drain.py``), the older entries of the audit trail (``audit.py``).
"""

from __future__ import annotations

import json
from html import escape

from .. import __version__
from ..text import percent
from ..trainjob import PENDING, RUNNING
from . import audit, forms, poolmap, tables, usage
from .markup import clock, day_clock
from .window import WINDOWS, Window

STYLE = """
:root{--fg:#212121;--muted:#616161;--line:#e0e0e0;--accent:#0072b2;--warn:#b35c00;--bad:#c62828}
*{box-sizing:border-box}
body{margin:0;font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
  background:#fafafa}
header{display:flex;flex-wrap:wrap;align-items:baseline;gap:4px 16px;padding:10px 20px;
  background:#fff;border-bottom:1px solid var(--line)}
header h1{font-size:18px;margin:0}
header nav a{margin-right:6px;padding:1px 6px;border-radius:3px;text-decoration:none;
  color:var(--accent)}
header nav a.on{background:var(--accent);color:#fff}
main{padding:4px 20px 30px;max-width:1400px}footer{padding:0 20px 20px}
section{background:#fff;border:1px solid var(--line);border-radius:4px;margin:14px 0;
  padding:8px 14px 12px}
h2{font-size:16px;margin:4px 0 8px}h3{font-size:14px;margin:10px 0 4px}
.muted,.source{color:var(--muted)}.empty{color:var(--muted);font-style:italic}
.summary{display:flex;flex-wrap:wrap;gap:8px 28px}.summary div b{font-size:18px}
.notes li{color:var(--warn)}
.node{margin:6px 0 10px}.node h3{margin:4px 0}.node h3 a.drain{font-size:12px;font-weight:400}
.node.drained .gpu{background:#f5f5f5}
.gpus{display:flex;flex-wrap:wrap;gap:8px}
.gpu{width:230px;border:1px solid var(--line);border-radius:4px;padding:5px 7px;background:#fff}
.gpu.held{border-color:#90caf9}.gpu.idle{border-color:var(--warn);background:#fff8e1}
.gpu.lost{border-color:var(--bad);background:#ffebee}.gpu.unread{opacity:.6}
.gpu-head{display:flex;justify-content:space-between}.util{font-weight:600}
.bar{height:8px;background:#eee;border-radius:2px;margin:3px 0}
.bar span{display:block;height:100%;background:var(--accent);border-radius:2px}
.mem{color:var(--muted);font-size:12px}
.holders{list-style:none;margin:3px 0 0;padding:0;font-size:12px}
.holders li{margin:1px 0}.outside{color:var(--warn)}.bad{color:var(--bad)}
.flag{display:inline-block;padding:0 5px;border-radius:8px;background:#ffe0b2;color:#8a4600;
  font-size:12px;white-space:nowrap}
.legend .key{margin-right:14px}.legend i{display:inline-block;width:10px;height:10px;
  margin-right:4px;border-radius:2px}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:10px}
figure{margin:0}figcaption{color:var(--muted);font-size:12px}
svg.gpushare-chart{width:100%;height:auto;font-size:11px;fill:#424242}
table{border-collapse:collapse;width:100%;margin:4px 0}
th,td{text-align:left;padding:3px 8px;border-bottom:1px solid var(--line);vertical-align:top}
th{font-weight:600;background:#f5f5f5}.num{text-align:right;white-space:nowrap}
td .muted{white-space:nowrap}table.audit td:not(:nth-child(5)){white-space:nowrap}
.event-cull{color:var(--bad);font-weight:600}.event-warn{color:var(--warn)}
#refresh-note{color:var(--warn)}
.refusal{max-width:640px;margin:60px auto;background:#fff;border:1px solid var(--line);
  border-radius:4px;padding:18px 24px}
"""

# Refresh in place: fetch this page again and swap its <main>; say so when that fails (an
# expired login is a redirect, which a fetch does not follow here: reloading logs in again).
# A script's request with the login cookie carries the page's XSRF token, as JupyterHub
# requires of every request that is not a plain page view.
SCRIPT = """
(function () {
  var every = %d * 1000, xsrf = %s;
  function say(text) { document.getElementById('refresh-note').textContent = text; }
  async function refresh() {
    if (document.hidden) { return; }
    try {
      var r = await fetch(location.href, {credentials: 'same-origin', redirect: 'manual',
                                          headers: {'X-XSRFToken': xsrf}});
      if (!r.ok) { say('Not refreshed (HTTP ' + (r.status || 'redirect') + '): reload the page.'); return; }
      var doc = new DOMParser().parseFromString(await r.text(), 'text/html');
      var fresh = doc.querySelector('main');
      if (fresh) { document.querySelector('main').replaceWith(fresh); say(''); }
    } catch (e) { say('Not refreshed: the pool service did not answer; trying again.'); }
  }
  setInterval(refresh, every);
})();
"""


def _document(title: str, body: str, script: str = "", nonce: str = "") -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{STYLE}{forms.FORM_STYLE}</style></head>"
            f"<body>{body}"
            + (f'<script nonce="{escape(nonce)}">{script}</script>' if script else "")
            + "</body></html>\n")


def summary(pool: dict, jobs: list[dict]) -> str:
    train = [g for g in pool.get("gpus") or () if g.get("pool") == "train"]
    measured = [g["utilization"] for g in train if g.get("utilization") is not None]
    build = pool.get("build") or {}
    running = sum(1 for j in jobs if j.get("state") == RUNNING)
    waiting = sum(1 for j in jobs if j.get("state") == PENDING)
    simulated = " (simulated)" if pool.get("simulated") else ""
    now = percent(sum(measured) / len(measured)) if measured else "–"
    return ('<div class="summary">'
            f'<div>Train pool{simulated}<br><b>{pool.get("in_use", 0):g}</b> of '
            f'<b>{pool.get("capacity", 0):g}</b> GPUs allocated</div>'
            f'<div>Train GPUs\' utilization now<br><b>{now}</b></div>'
            f'<div>Build pool<br><b>{build.get("in_use", 0):g}</b> of '
            f'<b>{build.get("capacity", 0):g}</b> GPUs in slices</div>'
            f'<div>Train jobs<br><b>{running}</b> running, <b>{waiting}</b> waiting</div>'
            "</div>")


def window_words(window: Window, offset: float) -> str:
    """``last 6h``, or ``Nov 20 14:00 to Nov 20 14:10`` (``since the pool's first reading,
    …`` for a young pool's default window)."""
    if window.name:
        return f"last {window.name}"
    period = f"{day_clock(window.since, offset)} to {day_clock(window.until, offset)}"
    if window.young and window.first is not None and window.first - window.since >= 60:
        # younger than the shortest window: it starts before the first reading; say when
        return f"{period} (the pool's first reading: {day_clock(window.first, offset)})"
    return f"since the pool's first reading, {period}" if window.young else period


def render(data: dict, nonce: str = "", xsrf: str = "") -> str:
    """The page; ``nonce``: the Content-Security-Policy nonce of its one script, ``xsrf``: the
    XSRF token its refreshes send."""
    now, offset, window = data["now"], data.get("offset", 0.0), data["window"]
    pool, jobs, slices = data["pool"], data.get("jobs") or [], data.get("slices") or []
    running = {j["id"]: j for j in jobs}
    base = data.get("base", "")  # the service's prefix, for the links to the admin's forms
    nav = "".join(f'<a href="?window={name}"{" class=on" if name == window.name else ""}>'
                  f"{name}</a>" for name in WINDOWS)
    threshold = (data.get("usage") or {}).get("idle_threshold") or 0.05
    words = escape(window_words(window, offset))
    header = (f'<header><h1>GPU share: pool dashboard</h1><nav aria-label="window">{nav}</nav>'
              f'<span class="muted">signed in as {escape(data.get("user") or "?")}; times in '
              f'{escape(data.get("zone") or "UTC")}; refreshes every {data.get("refresh_s", 15)} s'
              f'</span><a href="dashboard/usage.csv?since={window.since:.0f}&amp;until='
              f'{window.until:.0f}" download>CSV of this window</a>'
              f'<a href="dashboard/whatif">What if…</a>'
              f'<span id="refresh-note" role="status"></span></header>')
    body = (
        f'<main data-updated="{now:.0f}"><p class="muted">Updated '
        f'{clock(now, offset, seconds=True)}. Definitions: allocation = GPU-seconds held ÷ '
        f'(GPUs × time); utilization = utilized GPU-seconds ÷ allocated GPU-seconds; '
        f'idle-allocated = GPU-seconds held while SM utilization stayed below '
        f'{percent(threshold)}.</p>'
        f'<section id="summary">{summary(pool, jobs)}</section>'
        f'<section id="pool-map"><h2>Pool map: every GPU now</h2>'
        f'{poolmap.pool_map(pool, running, threshold, base=base, offset=offset)}</section>'
        f'<section id="projects"><h2>Allocation and utilization per project, {words}</h2>'
        f'{usage.pools_line(data.get("usage") or {})}'
        f'{usage.charts(data.get("usage") or {}, data.get("projects") or [], pool.get("capacity") or 0, window, offset)}'
        f'{usage.project_table(data.get("usage") or {}, data.get("projects") or [])}</section>'
        f'<section id="idle"><h2>Top idle-allocated, {words}</h2>'
        f'<h3>Train jobs</h3>{usage.idle_jobs_table(data.get("idle_jobs") or [], running)}'
        f'<h3>Build slices</h3>'
        f'{usage.idle_slices_table(data.get("idle_slices") or [], {s["id"]: s for s in slices}, offset)}'
        f'</section>'
        f'<section id="settings"><h2>Projects: quotas and members</h2>'
        f'{forms.settings_table(base, data.get("projects") or [])}'
        f'{forms.departments_table(base, data.get("departments") or [])}</section>'
        f'<section id="queue"><h2>Queue</h2>{tables.queue_table(jobs, now, cancel=base)}'
        f'</section>'
        f'<section id="culls"><h2>Culls of idle build sessions</h2>'
        f'{tables.culls(pool.get("culling"), slices, offset)}</section>'
        f'<section id="audit"><h2>Audit trail</h2>'
        f'{audit.audit_section(base, data.get("audit") or [], data.get("audit_next"), now, offset)}'
        f'</section></main>'
        f'<footer class="muted">jupyter-gpushare {escape(__version__)}</footer>')
    return _document("GPU share: pool dashboard", header + body,
                     SCRIPT % (int(data.get("refresh_s", 15)),
                               json.dumps(xsrf).replace("</", "<\\/")), nonce)


def form_page(title_and_body: tuple[str, str]) -> str:
    """A page under the dashboard, a form (``forms.py``, ``drain.py``) or the audit trail
    (``audit.py``), which make its title and body; no script."""
    return _document(*title_and_body)


def refusal(status: int, sentence: str, home: str = "/hub/home") -> str:
    """A page with one sentence, for a refusal (403) or a mistake in the address (400)."""
    titles = {400: "Not understood", 403: "Not allowed", 404: "Not here",
              503: "Not available now"}
    title = titles.get(status, "Refused")
    return _document(f"GPU share: {title}", (
        f'<div class="refusal"><h1>{escape(title)} ({status})</h1><p>{escape(sentence)}</p>'
        f'<p><a href="{escape(home)}">Back to JupyterHub</a></p></div>'))
