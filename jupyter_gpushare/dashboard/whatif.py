"""The what-if page: choose a window, a capacity change and quota changes; watch the replay's
progress; read recorded, today's settings and the changed ones side by side.

``render_whatif(data)`` takes one dict (``pool/web/dashboard_pages.py`` gathers it): ``now``,
``offset``, ``zone``, ``user``, ``pool`` (``api/pool``), ``projects`` (``api/projects``' list) and
``run`` (``api/whatif/{id}``'s answer, or None). Pure: HTML out.
"""

from __future__ import annotations

import json
from html import escape

from .page import _document

STYLE_EXTRA = """
<style>
form.whatif label{display:inline-block;margin:4px 14px 4px 0}
form.whatif input{width:7em}
.progress{height:14px;background:#eee;border-radius:3px;max-width:480px}
.progress span{display:block;height:100%;background:#0072b2;border-radius:3px}
</style>
"""

# Start a replay (JSON to this page, with the page's XSRF token), then show it; while it runs,
# fetch the page again every second and swap its <main> (the progress bar comes from the worker).
SCRIPT = """
(function () {
  var xsrf = %s, running = %s;
  function say(text) { document.getElementById('whatif-note').textContent = text; }
  var form = document.getElementById('whatif-form');
  if (form) {
    form.addEventListener('submit', async function (event) {
      event.preventDefault();
      var body = {since: form.since.value};
      if (form.until.value) { body.until = form.until.value; }
      if (form.capacity.value) { body.capacity = form.capacity.value; }
      var quotas = {};
      form.querySelectorAll('input[data-project]').forEach(function (input) {
        if (input.value !== input.defaultValue) { quotas[input.dataset.project] = Number(input.value); }
      });
      if (Object.keys(quotas).length) { body.quotas = quotas; }
      say('Starting…');
      try {
        var r = await fetch('whatif', {method: 'POST', credentials: 'same-origin',
                                       headers: {'X-XSRFToken': xsrf, 'Content-Type': 'application/json'},
                                       body: JSON.stringify(body)});
        var answer = await r.json();
        if (!r.ok) { say(answer.error || ('HTTP ' + r.status)); return; }
        location.href = 'whatif?run=' + encodeURIComponent(answer.id);
      } catch (e) { say('The pool service did not answer; try again.'); }
    });
  }
  async function refresh() {
    try {
      var r = await fetch(location.href, {credentials: 'same-origin', redirect: 'manual',
                                          headers: {'X-XSRFToken': xsrf}});
      if (!r.ok) { say('Not refreshed (HTTP ' + (r.status || 'redirect') + '): reload the page.'); return; }
      var doc = new DOMParser().parseFromString(await r.text(), 'text/html');
      var fresh = doc.querySelector('#whatif-run');
      if (fresh) { document.querySelector('#whatif-run').replaceWith(fresh); }
      if (fresh && fresh.dataset.state === 'replaying') { setTimeout(refresh, 1000); }
    } catch (e) { setTimeout(refresh, 2000); }
  }
  if (running) { setTimeout(refresh, 1000); }
})();
"""


def _pct(x) -> str:
    return "–" if x is None else f"{x * 100:.1f}%"


def _secs(x) -> str:
    if x is None:
        return "–"
    return f"{x:.0f} s" if x < 600 else f"{x / 3600:.2f} h"


def form(projects: list[dict], request: dict | None) -> str:
    request = request or {}
    quotas = request.get("quotas") or {}
    cells = "".join(
        f'<label>{escape(p["name"])} quota <input type="number" min="0" step="1" '
        f'data-project="{escape(p["name"])}" value="{quotas.get(p["name"], p["quota"]):g}">'
        f'</label>' for p in projects)
    return (
        '<form class="whatif" id="whatif-form">'
        '<label>Jobs submitted since <input name="since" value="30d" required '
        'title="30d, 12h, or a date like 2026-10-01"></label>'
        '<label>until <input name="until" placeholder="now"></label>'
        '<label>Capacity change <input name="capacity" placeholder="+8" '
        f'value="{escape(str(request.get("capacity") or ""))}" '
        'title="+K more GPUs, -K fewer, or N in all"></label><br>'
        f'{cells}<br><button type="submit">Replay</button> '
        '<span id="whatif-note" role="status" class="muted"></span></form>')


def result_table(result: dict) -> str:
    cols = ["recorded", "today"] + (["changed"] if "changed" in result else [])
    heads = {"recorded": "Recorded", "today": "Replayed, today's settings",
             "changed": "Replayed, changed settings"}
    rows = [("GPUs", lambda b: f'{b["capacity_gpus"]}'),
            ("Allocation", lambda b: _pct(b["allocation"])),
            ("Utilization (of the GPU-time where it was measured)",
             lambda b: f'{_pct(b["utilization"])} (measured for {_pct(b["utilization_known"])})'),
            ("Queueing p50", lambda b: _secs(b["queue_p50_s"])),
            ("Queueing p95", lambda b: _secs(b["queue_p95_s"])),
            ("Guarantee wait p95", lambda b: _secs(b["guarantee_wait_p95_s"])
             if b.get("guarantee_waits") else "–"),
            ("Preemptions", lambda b: str(b.get("preemptions", "–")))]
    head = "".join(f'<th class="num">{heads[c]}</th>' for c in cols)
    body = "".join(f"<tr><td>{label}</td>" + "".join(
        f'<td class="num">{escape(cell(result[c]))}</td>' for c in cols) + "</tr>"
        for label, cell in rows)
    settings = result.get("settings", {})
    per = []
    for name in sorted(result["recorded"]["per_project"]):
        q = " → ".join(f'{settings[k]["quotas"].get(name, 0):g}' for k in ("today", "changed")
                       if k in settings)
        for label, key, show in (("allocation", "allocation", _pct),
                                 ("queueing p50", "queue_p50_s", _secs),
                                 ("queueing p95", "queue_p95_s", _secs)):
            per.append(f"<tr><td>{escape(name)} (quota {q})</td><td>{label}</td>" + "".join(
                f'<td class="num">{show(result[c]["per_project"].get(name, {}).get(key))}</td>'
                for c in cols) + "</tr>")
    return (f'<p>{result["jobs"]} recorded train jobs over {result["span_s"] / 3600:.1f} h.</p>'
            f"<table><tr><th></th>{head}</tr>{body}</table>"
            f"<h3>Per project</h3><table><tr><th>Project</th><th></th>{head}</tr>"
            f"{''.join(per)}</table>")


def run_section(run: dict | None) -> str:
    if run is None:
        return '<section id="whatif-run" data-state="none"><p class="empty">Choose a window ' \
               'and changes, then Replay.</p></section>'
    state = run["state"]
    inner = ""
    if state == "replaying":
        inner = (f'<p>Replaying… {run["progress"] * 100:.0f}%</p><div class="progress" '
                 f'role="progressbar" aria-valuenow="{run["progress"] * 100:.0f}" '
                 f'aria-valuemin="0" aria-valuemax="100"><span style="width:'
                 f'{run["progress"] * 100:.0f}%"></span></div>')
    elif state in ("error", "stopped"):
        inner = f'<p class="bad">{escape(run.get("error") or "The replay failed.")}</p>'
    else:
        inner = result_table(run["result"])
    return (f'<section id="whatif-run" data-state="{escape(state)}"><h2>What-if '
            f'{escape(run["id"])}</h2>{inner}</section>')


def render_whatif(data: dict, nonce: str = "", xsrf: str = "") -> str:
    run = data.get("run")
    pool = data.get("pool") or {}
    header = ('<header><h1>GPU share: what if…</h1><nav><a href="../dashboard">Dashboard</a>'
              '</nav><span class="muted">signed in as '
              f'{escape(data.get("user") or "?")}</span></header>')
    body = (f'<main>{STYLE_EXTRA}<section><h2>Replay the recorded train jobs</h2><p class="muted">'
            f'The pool has {pool.get("capacity", 0):g} train GPUs today. The replay runs the '
            "pool's own scheduling code on the jobs as they were submitted and as long as they "
            "ran, once under today's settings and once under the changes; one replay at a "
            "time, in a worker process.</p>"
            f'{form(data.get("projects") or [], (run or {}).get("request"))}</section>'
            f"{run_section(run)}</main>")
    script = SCRIPT % (json.dumps(xsrf).replace("</", "<\\/"),
                       "true" if run and run["state"] == "replaying" else "false")
    return _document("GPU share: what if", header + body, script, nonce)
