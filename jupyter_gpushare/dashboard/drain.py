"""Draining a train node from the pool map: the node's line ("drained by admin since …"), its
drain… / undrain link, the page that asks first and the page that says what happened. Pure:
a node as ``api/pool`` shows it (``drained``, ``drained_by``, ``drained_since``) in, HTML out;
``pool/web/dashboard_forms.py`` posts the answer to ``admin.set_drained`` (as ``PUT
api/nodes/{node}``)."""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from .markup import day_clock, frame, hidden

REQUEUE = ("also requeue the jobs running there now (they resume from their checkpoints)")


def drained_words(node: dict, offset: float) -> str:
    """``drained by admin since Nov 20 14:05`` ("" for a node that is not drained)."""
    if not node.get("drained"):
        return ""
    return (f'drained by {node.get("drained_by") or "?"} since '
            f'{day_clock(node.get("drained_since"), offset)}')


def drain_link(base: str, node: dict) -> str:
    """``drain…`` for a node in service, ``undrain`` for a drained one: to the page that asks."""
    word = "undrain" if node.get("drained") else "drain…"
    label = "Undrain" if node.get("drained") else "Drain"
    return (f'<a class="drain" href="{escape(base)}dashboard/nodes/'
            f'{escape(quote(node["name"], safe=""))}/drain" '
            f'aria-label="{label} node {escape(node["name"])}">{word}</a>')


def _node_lines(node: dict, jobs: list[dict], offset: float) -> str:
    state = drained_words(node, offset) or "in service: new jobs may start there"
    running = ", ".join(f'{escape(j.get("name") or j["id"])} ({escape(j.get("user") or "?")}, '
                        f'{escape(j.get("project") or "?")})' for j in jobs) or "none"
    return (f'<dl class="job"><dt>Node</dt><dd><b>{escape(node["name"])}</b> '
            f'<span class="muted">{node.get("gpus", 0):g} GPUs</span></dd>'
            f'<dt>State</dt><dd id="drain-state">{escape(state)}</dd>'
            f'<dt>Jobs there</dt><dd id="jobs-there">{running}</dd></dl>')


def drain_page(base: str, user: str, xsrf: str, node: dict, jobs: list[dict], offset: float,
               problem: str = "") -> tuple[str, str]:
    """Asks before draining ``node`` (or undraining a drained one); ``jobs``: those running
    there now, as ``api/jobs`` shows them; ``problem``: why the last post was refused."""
    drained = bool(node.get("drained"))
    action = f'{escape(base)}dashboard/nodes/{escape(quote(node["name"], safe=""))}/drain'
    alert = f'<p class="problem" role="alert" id="problem">{escape(problem)}</p>' \
        if problem else ""
    if drained:
        ask = ("<p>Undrain this node? New train jobs may start there again.</p>"
               + hidden("drained", "0") + '<div class="actions"><button type="submit" '
               'autofocus>Undrain the node</button>')
    else:
        ask = ("<p>Drain this node? No new train jobs start there; what runs there now runs to "
               "its end, unless you requeue it.</p>" + hidden("drained", "1")
               + '<p><label><input type="checkbox" name="requeue" value="1" id="f-requeue"> '
               f'{escape(REQUEUE)}</label></p>'
               '<div class="actions"><button type="submit" class="danger" autofocus>'
               'Drain the node</button>')
    body = (f'<section><h2>{"Undrain" if drained else "Drain"} a node</h2>{alert}'
            f'{_node_lines(node, jobs, offset)}'
            f'<form method="post" action="{action}">{hidden("_xsrf", xsrf)}{ask}'
            f'<a href="{escape(base)}dashboard">Back without changing it</a></div></form>'
            f'</section>')
    return f"GPU share: drain {node['name']}", frame(base, "drain a node", body, user)


def drain_done_page(base: str, user: str, answer: dict) -> tuple[str, str]:
    """What happened: ``answer`` is ``set_drained``'s (``PUT api/nodes/{node}``'s)."""
    name, requeued = answer["name"], answer.get("requeued") or []
    if answer.get("drained"):
        words = f"Node {name} is drained: no new jobs start there"
        words += (f"; {len(requeued)} job(s) are being requeued and resume from their "
                  f"checkpoints elsewhere: {', '.join(requeued)}." if requeued else
                  "; what runs there runs to its end.")
    else:
        words = f"Node {name} takes new jobs again."
    body = (f'<section><h2>{"Drained" if answer.get("drained") else "Undrained"}</h2>'
            f'<p class="done" id="drain-done" role="status">{escape(words)}</p>'
            f'<p><a href="{escape(base)}dashboard">Back to the pool dashboard</a></p>'
            f'</section>')
    return f"GPU share: {name}", frame(base, "drain a node", body, user)
