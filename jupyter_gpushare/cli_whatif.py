"""``gpushare simulate --from-pool``: the pool's recorded jobs (``api/history``) replayed here
under today's settings (``api/projects``, ``api/pool``) and under changed ones, side by side.

The replay is ``sim/history.what_if``, the same the dashboard's what-if page runs in the
service; this module only fetches, checks the arguments and prints.
"""

from __future__ import annotations

import json
import time

from .cli_base import UsageError, say
from .cli_pool import pool_command
from .client import PoolError
from .sim.history import BadChange, check_capacity, what_if
from .sim.trace import TraceError, read_quotas

_TRACE_ONLY = {"trace": "--trace", "events": "--events", "plot": "--plot",
               "scale_quotas": "--scale-quotas"}


def check_args(args) -> tuple[str | None, dict[str, int]]:
    """The changed capacity and quotas, or a ``UsageError`` with one sentence."""
    for name, option in _TRACE_ONLY.items():
        if getattr(args, name, None):
            raise UsageError(f"{option} is for replaying a trace file; leave it out with "
                             f"--from-pool")
    if args.policy != "guaranteed":
        raise UsageError("--from-pool replays the pool's own policy; leave out --policy")
    try:
        capacity = check_capacity(args.capacity)
    except BadChange as e:
        raise UsageError(f"--{e}") from None
    quotas: dict[str, int] = {}
    if args.quotas == "proportional":
        raise UsageError("--quotas proportional is for trace files; with --from-pool give a "
                         "CSV project,quota of the quotas to change")
    if args.quotas:
        try:
            quotas = read_quotas(args.quotas)
        except TraceError as e:
            raise UsageError(str(e)) from None
    return capacity, quotas


@pool_command
def cmd_from_pool(args, client) -> int:
    capacity, quotas = check_args(args)
    tick = time.perf_counter()
    history = client.whole_history(since=args.since or "30d", until=args.until)
    pool, projects, departments = client.pool(), client.projects(), _departments(client)
    fetched = time.perf_counter() - tick
    if not history["jobs"]:
        raise UsageError("the pool recorded no train job that ran in this window; choose an "
                         "earlier --since")
    try:
        result = what_if(pool, projects, history.get("settings") or {}, history["jobs"],
                         capacity, quotas, departments=departments, build=history.get("build"))
    except BadChange as e:
        raise UsageError(str(e)) from None
    result["fetch_s"] = round(fetched, 2)
    result["wall_s"] = round(time.perf_counter() - tick, 2)
    result["window"] = {"since": history["since"], "until": history["until"]}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        say(format_comparison(result))  # the pool's project names
    return 0


def _departments(client) -> list[dict]:
    """The pool's departments; none from a pool older than departments (404)."""
    try:
        return client.departments()
    except PoolError as e:
        if e.status != 404:
            raise
        return []


def _pct(x) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _s(x) -> str:
    return "-" if x is None else f"{x:.0f} s" if x < 600 else f"{x / 3600:.2f} h"


def format_comparison(r: dict) -> str:
    """Recorded, today's settings and the changed ones, as columns."""
    cols = ["recorded", "today"] + (["changed"] if "changed" in r else [])
    heads = {"recorded": "RECORDED", "today": "REPLAY TODAY", "changed": "REPLAY CHANGED"}
    lines = [f"{r['jobs']} recorded train jobs over {r['span_s'] / 3600:.1f} h "
             f"(history fetched in {r.get('fetch_s', 0)} s, replays in "
             f"{max(0.0, r.get('wall_s', 0) - r.get('fetch_s', 0)):.2f} s)"]
    rows = [("capacity", lambda b: f"{b['capacity_gpus']} GPUs"),
            ("allocation", lambda b: _pct(b["allocation"])),
            ("utilization (known)", lambda b: f"{_pct(b['utilization'])} of "
                                              f"{_pct(b['utilization_known'])}"),
            ("queueing p50", lambda b: _s(b["queue_p50_s"])),
            ("queueing p95", lambda b: _s(b["queue_p95_s"])),
            ("guarantee wait p95", lambda b: _s(b["guarantee_wait_p95_s"])
             if b["guarantee_waits"] else "-"),
            ("preemptions", lambda b: str(b.get("preemptions", "-")))]
    width = 24
    lines.append("".ljust(width) + "".join(heads[c].rjust(16) for c in cols))
    for label, cell in rows:
        lines.append(label.ljust(width) + "".join(cell(r[c]).rjust(16) for c in cols))
    quotas = r["settings"]
    for name in sorted(r["recorded"]["per_project"] | r["today"]["per_project"]):
        q = " → ".join(f"{quotas[k]['quotas'].get(name, 0):g}" for k in ("today", "changed")
                       if k in quotas)
        lines.append(f"project {name} (quota {q} GPUs)")
        for label, key, show in (("  allocation", "allocation", _pct),
                                 ("  queueing p50", "queue_p50_s", _s),
                                 ("  queueing p95", "queue_p95_s", _s)):
            cells = [show(r[c]["per_project"].get(name, {}).get(key)) for c in cols]
            lines.append(label.ljust(width) + "".join(x.rjust(16) for x in cells))
    return "\n".join(lines)
