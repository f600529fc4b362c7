"""What people read: jobs, quotas, the pool and GPU use as lines and tables.

One module that the ``gpushare`` command, the notebook magics, the ``%gpushare`` panel and
the admin dashboard print from, and that none of them owns. Pure functions of the pool API's
answers (no I/O).
"""

from __future__ import annotations

import re
import time

from .trainjob import FAILED, PENDING, RUNNING

GiB, MiB = 2**30, 2**20
# A slice that has just started, or a job loading its data, shows no GPU use for a while:
# an idle flag only after five minutes of it says something.
SHOW_IDLE_AFTER_S = 300
RECENT_S = 3600  # events this recent are said relative to now ("2 min ago"), older by the clock


# Characters a terminal obeys instead of showing: the C0 controls and DEL (ESC starts the
# sequences that retitle a window or hide the rows below; CR and BS overwrite), the C1
# controls (U+009B is a one-character CSI), the line and paragraph separators, and the
# bidirectional controls that make a name read backwards or reorder the rest of its row.
_UNSEEN = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                     r"\u2066-\u2069]")


def visible(text: str, lines: bool = False) -> str:
    """``text`` as a terminal may print it: each character it would obey instead of show
    written as an escape, ``\\x1b``, ``\\u202e``; letters of any script are left alone. Names,
    reasons and sentences come from other people through the pool: a job named
    ``"\\x1b]0;PWNED\\x07"`` must not retitle an admin's window. With ``lines``, newlines
    are kept (text of several lines); a table cell keeps none."""
    if lines:
        return "\n".join(visible(line) for line in text.split("\n"))
    return _UNSEEN.sub(_escape, text)


def _escape(match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def percent(ratio) -> str:
    """``0.934`` → ``93%``; None (not measurable) → ``-``."""
    return "-" if ratio is None else f"{ratio * 100:.0f}%"


def size(n) -> str:
    """Bytes as ``11 GiB``, ``1.5 GiB``, ``300 MiB``; None → ``-``."""
    if n is None:
        return "-"
    if n >= 10 * GiB:
        return f"{n / GiB:.0f} GiB"
    if n >= GiB:
        return f"{n / GiB:.1f} GiB"
    return f"{n / MiB:.0f} MiB"


def idle_text(seconds) -> str:
    """``idle 25m``, ``idle 2h 05m`` (whole minutes); empty when not idle or idle for less
    than ``SHOW_IDLE_AFTER_S``."""
    if seconds is None or seconds < SHOW_IDLE_AFTER_S:
        return ""
    return f"idle {duration(seconds // 60 * 60)}"


def sm_cell(usage) -> str:
    """A job's or slice's SM utilization now and over the last hour: ``93% (1h 88%)``."""
    if not usage:
        return "-"
    return f"{percent(usage.get('sm_now'))} (1h {percent(usage.get('sm_last_hour'))})"


def memory_cell(usage) -> str:
    return size(usage.get("memory_now_bytes")) if usage else "-"


def usage_line(usage) -> str:
    """One line for a panel or a status: ``SM 93% (1h 88%), 11 GiB, idle 25 min``."""
    if not usage:
        return "not measured yet"
    parts = [f"SM {sm_cell(usage)}", memory_cell(usage)]
    if idle_text(usage.get("idle_for_s")):
        parts.append(idle_text(usage.get("idle_for_s")))
    return ", ".join(parts)


HEADERS = {"project": "PROJECT", "department": "DEPARTMENT", "user": "USER", "job": "JOB",
           "slice": "SLICE", "gpu": "GPU", "node": "NODE"}


def format_usage(answer: dict) -> str:
    """The ``gpushare usage`` table of an ``api/usage`` answer."""
    by = answer.get("by", "project")
    names = {"project": ["project"], "department": ["department"], "user": ["user"],
             "job": ["job", "project", "user"], "slice": ["slice", "user"],
             "gpu": ["node", "gpu"]}[by]
    pools = answer.get("pools") or {}
    lines = []
    for name in ("train", "build"):
        p = pools.get(name)
        if p and p.get("capacity_gpu_seconds"):
            lines.append(f"{name} pool: allocation {percent(p.get('allocation'))}, utilization "
                         f"{percent(p.get('utilization'))} of what was allocated (average GPU "
                         f"utilization {percent(p.get('average_utilization'))}), idle-allocated "
                         f"{percent(p.get('idle_ratio'))}")
    rows = answer.get("rows") or []
    if not rows:
        lines.append("no GPU use in this window")
        return "\n".join(lines)
    headers = [HEADERS[n] for n in names] + ["GPU-HOURS", "ALLOCATION", "UTILIZATION",
                                             "IDLE-ALLOCATED", "PEAK MEMORY"]
    cells = [[str(r.get(n) or "-") for n in names]
             + [f"{r.get('allocated_gpu_seconds', 0) / 3600:.2f}", percent(r.get("allocation")),
                percent(r.get("utilization")), percent(r.get("idle_ratio")),
                size(r.get("memory_peak_bytes"))] for r in rows]
    lines.append(table(headers, cells, numeric=set(headers[len(names):])))
    return "\n".join(lines)


# -- jobs, quotas and the pool ----------------------------------------------------------------------------

def duration(seconds) -> str:
    """How long, in one format everywhere: ``45s``, ``1m 10s``, ``2h 05m``, ``3d 4h``
    (a zero second part left out: ``30m``, ``2h``, ``3d``); None → ``-``."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    for big, small, unit, second, pad in ((86400, 3600, "d", "h", False),
                                          (3600, 60, "h", "m", True), (60, 1, "m", "s", True)):
        if seconds >= big:
            whole, rest = divmod(seconds, big)
            part = rest // small
            if not part:
                return f"{whole}{unit}"
            return f"{whole}{unit} {part:02d}{second}" if pad else f"{whole}{unit} {part}{second}"
    return f"{seconds}s"


def clock_time(t: float) -> str:
    """A moment by the clock, in this machine's time zone: ``14:56``; ``Nov 24 14:56`` on
    another day."""
    moment = time.localtime(t)
    same_day = moment[:3] == time.localtime()[:3]
    return time.strftime("%H:%M" if same_day else "%b %d %H:%M", moment)


def when(t, now: float | None = None) -> str:
    """A past moment as people read it: ``just now``, ``2 min ago`` within the hour,
    by the clock (:func:`clock_time`) before that; None → ``-``."""
    if t is None:
        return "-"
    return recently(t, time.time() if now is None else now) or clock_time(t)


def recently(t: float, now: float) -> str | None:
    """``just now`` or ``2 min ago`` for a moment within the hour; None for an older one
    (which each reader says by its own clock: :func:`when`, the dashboard's zone)."""
    ago = now - t
    if ago < 60:
        return "just now"
    if ago < RECENT_S:
        return f"{int(ago // 60)} min ago"
    return None


def gpus(value) -> str:
    """A GPU amount from the API (GPUs, maybe fractional) as a short number: 4, 0.25."""
    if value is None:
        return "-"
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def gpu_count(value) -> str:
    """``2 GPUs``, ``1 GPU``, ``0.5 GPUs``; ``? GPUs`` when not known."""
    if isinstance(value, (int, float)):
        return f"{value:g} GPU" + ("" if value == 1 else "s")
    return "? GPUs"


def describe(job: dict) -> str:
    """One line about a job: its state and the server's words on why, e.g. after submitting."""
    ident, state, reason = job.get("id"), job.get("state"), job.get("reason")
    amount = f"{gpus(job.get('gpus'))} GPU{'' if job.get('gpus') == 1 else 's'}"
    if state == PENDING:
        where = f"{amount}, project {job.get('project')}"
        if job.get("queue_position") is not None:
            where += f", position {job['queue_position']}"
        line = f"job {ident} {PENDING} ({where})"
    elif state == RUNNING:
        nodes = ", ".join(job.get("placement") or {}) or "the train pool"
        line = f"job {ident} {RUNNING} ({amount} on {nodes}, attempt {job.get('attempt', 1)})"
    elif state == FAILED and job.get("exit_code") is not None:
        line = f"job {ident} {FAILED} (exit code {job['exit_code']})"
    else:
        line = f"job {ident} {state}"
    return line + (f": {reason}" if reason else "")


def status_line(job: dict, now: float | None = None) -> str:
    """The line a notebook cell shows for its job and updates while it runs, with the times
    that matter there: ``j-1 running on 2 GPUs · 12s elapsed``."""
    now = time.time() if now is None else now
    ident = job.get("id") + (f" ({job['name']})" if job.get("name") else "")
    state, attempt, reason = job.get("state"), job.get("attempt") or 1, job.get("reason")
    if state == PENDING:
        where = "queued" if attempt == 1 else f"preempted, requeued (attempt {attempt})"
        if job.get("queue_position") is not None:
            where += f": position {job['queue_position']}"
        return f"{ident} {where}" + (f" — {reason}" if reason else "")
    started, finished = job.get("started"), job.get("finished")
    if state == RUNNING:
        line = f"{ident} {RUNNING} on {gpu_count(job.get('gpus'))} · " \
               f"{duration(now - (started or now))} elapsed"
        if attempt > 1:
            line += f" · attempt {attempt}"
        return line + (f" · {reason}" if reason else "")
    took = f" after {duration(finished - started)}" if started and finished else ""
    if state == FAILED and job.get("exit_code") is not None:
        return f"{ident} {FAILED} (exit code {job['exit_code']}){took}"
    return f"{ident} {state}{took}"


def table(headers, rows, numeric=()) -> str:
    """Aligned columns, two spaces apart; the columns named in ``numeric`` aligned right.
    Every cell, and every header (a node's fields name columns), is :func:`visible`."""
    right = [h in numeric for h in headers]
    rows = [[visible(str(cell)) for cell in row] for row in [headers] + list(rows)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(headers))]
    lines = []
    for row in rows:
        cells = [cell.rjust(w) if r else cell.ljust(w) for cell, w, r in zip(row, widths, right)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _cut(text: str, width: int) -> str:
    """A table cell of at most ``width`` characters as printed (:func:`visible`)."""
    text = visible(text)
    return text if len(text) <= width else text[:max(width - 1, 0)] + "…"


def format_jobs(jobs: list[dict], now: float | None = None, width: int | None = 120) -> str:
    """The jobs as a table for people. A USER column appears when the jobs are several users';
    the reason is cut to fit ``width`` characters (None: never cut)."""
    now = time.time() if now is None else now
    several_users = len({job.get("user") for job in jobs}) > 1
    measured = any(job.get("usage") for job in jobs)  # running jobs the pool has read
    headers = ["ID", "NAME"] + (["USER"] if several_users else []) + [
        "STATE", "GPUS", "PROJECT", "POSITION"] + (["SM NOW (1H)", "GPU MEM"] if measured
                                                    else []) + ["REASON", "ATTEMPT", "AGE"]
    rows = []
    for job in jobs:
        state = job.get("state") or "-"
        if state == RUNNING and job.get("preempting"):
            state = "preempting"
        submitted = job.get("submitted")
        usage = job.get("usage") if job.get("state") == RUNNING else None
        reason = " ".join((job.get("reason") or "").split())
        idle = idle_text((usage or {}).get("idle_for_s"))
        reason = "; ".join(r for r in (idle, reason) if r) or "-"
        rows.append([job.get("id", "-"), _cut(job.get("name") or "-", 24)]
                    + ([job.get("user") or "-"] if several_users else [])
                    + [state, gpus(job.get("gpus")), job.get("project") or "-",
                       job.get("queue_position") if job.get("queue_position") is not None else "-"]
                    + ([sm_cell(usage), memory_cell(usage)] if measured else [])
                    + [reason, job.get("attempt") if job.get("attempt") is not None else "-",
                       duration(now - submitted if submitted is not None else None)])
    if width is not None:
        col = headers.index("REASON")
        others = sum(max([len(h)] + [len(visible(str(r[i]))) for r in rows])
                     for i, h in enumerate(headers) if i != col) + 2 * (len(headers) - 1)
        room = max(width - others, 24)
        for row in rows:
            row[col] = _cut(row[col], room)
    return table(headers, rows, numeric={"GPUS", "POSITION", "ATTEMPT", "AGE", "GPU MEM"})


def format_quota(quota: dict) -> str:
    """``gpushare quota``: the quota first (each project's guaranteed GPUs, those in use and
    the jobs waiting, then the finer terms), then how many jobs the user has in each state."""
    projects = quota.get("projects") or []
    if projects:
        headers = ["PROJECT", "QUOTA", "IN USE", "WAITING", "BORROWED", "DESERVED", "LIMIT",
                   "WEIGHT", "PRIORITY"]
        rows = [[p.get("name"), gpus(p.get("quota")), gpus(p.get("in_use")),
                 _plain(p.get("pending")), gpus(p.get("borrowed")), gpus(p.get("deserved")),
                 gpus(p.get("limit")), _plain(p.get("over_quota_weight")),
                 _plain(p.get("priority"))] for p in projects]
        if any(p.get("department") for p in projects):
            headers.append("DEPARTMENT")
            for row, p in zip(rows, projects):
                row.append(p.get("department") or "-")
        lines = [table(headers, rows, numeric=set(headers[1:9]))]
        departments = quota.get("departments") or []
        if departments:  # the level above: what the projects of each hold together
            headers = ["DEPARTMENT", "QUOTA", "IN USE", "BORROWED", "DESERVED", "LIMIT",
                       "WEIGHT", "PROJECTS"]
            rows = [[d.get("name"), gpus(d.get("quota")), gpus(d.get("in_use")),
                     gpus(d.get("borrowed")), gpus(d.get("deserved")), gpus(d.get("limit")),
                     _plain(d.get("over_quota_weight")), ", ".join(d.get("projects") or [])]
                    for d in departments]
            lines.append(table(headers, rows, numeric=set(headers[1:7])))
    else:
        lines = ["you are in no project; ask an admin to add you to one"]
    counts = quota.get("jobs") or {}
    said = ", ".join(f"{n} {state}" for state, n in counts.items() if n) or "none yet"
    lines.append(f"jobs of {quota.get('user', 'yours')}: {said}")
    return "\n".join(lines)


def no_jobs(filtered: bool = False) -> str:
    """What a list of jobs says when it has none: how to send one, unless a filter left
    them out."""
    if filtered:
        return "no jobs match"
    return ("no jobs yet: send one with %%train in a notebook cell, or "
            "gpushare submit --gpus 1 -- python train.py in a terminal")


def format_pool(pool: dict) -> str:
    capacity, in_use = pool.get("capacity") or 0, pool.get("in_use") or 0
    line = f"{gpus(in_use)} of {gpus(capacity)} GPUs in use, {gpus(max(capacity - in_use, 0))} idle"
    if pool.get("simulated"):
        line += " (simulated inventory: no GPUs were found)"
    lent = [f"GPU {g.get('gpu')} of {g.get('node')}: lent to "
            + (f"job {g['job']}" if g.get("job") else "a train job" if g.get("held")
               else "train jobs, free")
            + ("; being taken back for a notebook server" if g.get("taking_back") else "")
            for g in (pool.get("build") or {}).get("lent") or ()]
    if lent:
        line += "\n" + "\n".join(lent)
    nodes = pool.get("nodes") or []
    if not nodes:
        return line
    # The nodes' fields are whatever the service reports; name first, then in its order.
    keys = ["name"] if any("name" in n for n in nodes) else []
    for node in nodes:
        keys += [k for k in node if k not in keys]
    headers = [k.replace("_", " ").upper() for k in keys]
    rows = [[_cut(_node_cell(k, node.get(k)), 40) for k in keys] for node in nodes]
    numeric = {h for h, k in zip(headers, keys) if not k.endswith("_since")
               and all(isinstance(n.get(k), (int, float)) and not isinstance(n.get(k), bool)
                      for n in nodes if n.get(k) is not None)}
    return line + "\n" + table(headers, rows, numeric=numeric)


def _node_cell(key: str, value) -> str:
    """A node's field for the table; a moment (``drained_since``) as people read it."""
    return when(value) if key.endswith("_since") and value is not None else _plain(value)


def format_audit(entries: list[dict], now: float | None = None) -> str:
    """The audit trail as a table: when, who, what, target, before → after, via."""
    if not entries:
        return "no audit entries (in this window)"
    rows = [[when(e.get("at"), now), e.get("who", ""), e.get("action", ""),
             _cut(e.get("target") or "-", 40), _cut(_change(e.get("before"), e.get("after")), 70),
             e.get("via", "")] for e in entries]
    return table(["WHEN", "WHO", "WHAT", "TARGET", "BEFORE → AFTER", "VIA"], rows)


def _change(before, after) -> str:
    """``quota=2 → quota=4``; a new thing: ``→ …``; a thing gone: ``… → -``."""
    if isinstance(before, dict) and isinstance(after, dict):
        keys = [k for k in after if before.get(k) != after.get(k)] or list(after)
        before = {k: before.get(k) for k in keys if k in before}
        after = {k: after[k] for k in keys}
    left = _plain(before) if before else "-"
    right = _plain(after) if after else "-"
    return f"{left} → {right}"


def change_words(before, after) -> str:
    """An audit entry's change in words: ``quota 4 → 6``, ``drained no → yes, requeued j-1``,
    ``state pending → cancelled (user alice, project vision)``; a new thing: its values
    (``quota 1, limit -``). Unchanged values kept for context follow in brackets."""
    before = before if isinstance(before, dict) else {}
    after = after if isinstance(after, dict) else {}
    words = [f"{_key(k)} {_word(before[k])} → {_word(v)}" if k in before else
             f"{_key(k)} {_word(v)}" for k, v in after.items() if before.get(k) != v or
             k not in before]
    kept = [f"{_key(k)} {_word(v)}" for k, v in before.items() if k not in after]
    if not words and not after:
        words = [f"was {', '.join(kept)}"] if kept else []
        kept = []
    return ", ".join(words or ["nothing"]) + (f" ({', '.join(kept)})" if kept else "")


def _key(key: str) -> str:
    """A field's name as words: ``over_quota_weight`` → ``over quota weight``."""
    return key.replace("_", " ")


def _word(value) -> str:
    return "none" if value in ([], None) else _plain(value).replace(",", ", ")


def _plain(value) -> str:
    """Any JSON value as short text for a table cell."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ",".join(_plain(v) for v in value) or "-"
    if isinstance(value, dict):
        return ",".join(f"{k}={_plain(v)}" for k, v in value.items()) or "-"
    return str(value)
