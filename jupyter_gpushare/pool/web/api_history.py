"""``GET api/history``: the recorded train jobs in the simulator's trace format (admins), page
by page, as JSON or CSV (paths and shapes: web/openapi.py; what a line is: ``sim/history.py``).

A page lists the jobs submitted in [since, until) in order of submission, at most ``limit``;
``next`` names the last one, to be given back as ``after`` for the next page. Each job's
measured utilization comes from ``api/usage``'s own sums (by job), where the usage store has
them. Where the pool has build nodes, the first page also gives the build pool (``build``:
its nodes, its lending options, and the notebook sessions held in the window with the
take-backs of lent GPUs, ``sim/slice_history.py``), which a replay lends build GPUs by; in
CSV, the sessions follow the jobs as ``kind=build`` lines.
"""

from __future__ import annotations

import time


from ... import spreadsheet
from ...policy.model import GPU
from ...policy.settings import DEFAULT_GRACE_S
from ...sim.history import (COLUMNS, BadChange, capacity_target, check_capacity, quota_changes,
                            settings_from)
from ...usage.rollup import HOUR
from ...validate import Invalid, digits
from ..admin.changes import record
from ..store.recorded_jobs import MAX_LIMIT, all_entries, read_entries
from ..store.recorded_slices import read_sessions
from ..whatif.runner import KEEP, REPLAYING, Busy
from .api_jobs import PoolHandler, pool_json
from .api_usage import parse_window
from .handlers import ID, ServiceHandler
from .views import department_json

DEFAULT_LIMIT = 1000
PARAMETERS = ("since", "until", "limit", "after", "format")


def history_query(args: dict[str, str], now: float) -> dict:
    """The checked query of ``GET api/history`` (``Invalid`` with one sentence otherwise)."""
    unknown = sorted(set(args) - set(PARAMETERS))
    if unknown:
        raise Invalid(f"unknown parameter(s) {', '.join(unknown)[:80]}; the parameters are "
                      f"since, until, limit, after and format")
    since, until = parse_window(args, now, "30d")
    limit = args.get("limit", str(DEFAULT_LIMIT))
    if not digits(limit, 6) or not 1 <= int(limit) <= MAX_LIMIT:
        raise Invalid(f"limit must be a whole number from 1 to {MAX_LIMIT}, not {limit[:40]!r}")
    after = args.get("after") or None
    if after is not None and not ID.match(after):
        raise Invalid(f"after must be a job id from the previous page's next, not {after[:40]!r}")
    fmt = args.get("format", "json")
    if fmt not in ("json", "csv"):
        raise Invalid(f"format must be json or csv, not {fmt[:40]!r}")
    return {"since": since, "until": until, "limit": int(limit), "after": after, "format": fmt}


def to_csv(entries: list[dict]) -> str:
    return spreadsheet.to_csv(list(COLUMNS), entries)


class HistoryHandler(ServiceHandler):
    async def get(self):
        if not self.who.admin:
            self.fail(403, "only admins can read the pool's history; gpushare jobs lists "
                           "your own jobs")
        args = {k: self.get_argument(k) for k in self.request.query_arguments}
        now = time.time()
        try:
            q = history_query(args, now)
            entries, nxt = await self.store.in_thread(
                read_entries, self.store, q["since"], q["until"], now, _grace(self),
                _horizon(self, now), q["limit"], q["after"])
            build = None
            if q["after"] is None:
                build = await build_part(self, q["since"], q["until"], now)
        except Invalid as e:
            self.fail(e.status, str(e))
        if q["format"] == "csv":
            self.set_header("Content-Type", "text/csv; charset=utf-8")
            self.set_header("Content-Disposition", 'attachment; filename="history.csv"')
            if nxt:
                self.set_header("Link", f'<?after={nxt}>; rel="next"')
            self.finish(to_csv(entries + (build["sessions"] if build else [])))
            return
        knobs = self.settings.get("replay_knobs", {})
        self.reply({"since": q["since"], "until": q["until"], "jobs": entries, "next": nxt,
                    "settings": knobs, **({"build": build} if build else {})})


def build_settings(build) -> dict | None:
    """The build pool's nodes and lending options as a replay reads them
    (``sim/replay_build.build_from``); None where the pool has no build nodes."""
    if not build.nodes:
        return None
    return {"nodes": [{"name": n.name, "gpus": n.gpus} for n in build.nodes],
            "allowance": build.allowance, "lending": build.lend,
            "reserve": build.reserve_gpus, "lend_again_after_s": build.lend_again_after_s,
            "take_backs_per_user": build.take_backs_per_user,
            "take_back_window_s": build.take_back_window_s}


async def build_part(handler, since: float, until: float, now: float) -> dict | None:
    """``api/history``'s ``build``: the build pool and its sessions in [since, until)."""
    out = build_settings(handler.build)
    if out is None:
        return None
    lines, backs, left_off = await handler.store.in_thread(
        read_sessions, handler.store, since, until, now, _grace(handler),
        _horizon(handler, now))
    return {**out, "sessions": lines, "take_backs": backs, "sessions_left_off": left_off}


def _grace(handler) -> float:
    return handler.settings.get("replay_knobs", {}).get("grace_period_s", DEFAULT_GRACE_S)


def _horizon(handler, now: float) -> int:
    """Where the usage store's minute rows begin (``rollup.spans``)."""
    return int(now - handler.usage.meter.settings.rollup_after) // HOUR * HOUR



def whatif_request(body, now: float) -> dict:
    """The checked body of ``POST api/whatif``."""
    if not isinstance(body, dict):
        raise Invalid("the body must be a JSON object: {\"since\": \"30d\", \"capacity\": "
                      "\"+8\", \"quotas\": {\"project\": GPUs}}")
    unknown = sorted(set(body) - {"since", "until", "capacity", "quotas"})
    if unknown:
        raise Invalid(f"unknown field(s) {', '.join(unknown)[:80]}; the fields are since, "
                      f"until, capacity and quotas")
    for name in ("since", "until"):
        if name in body and not isinstance(body[name], str):
            raise Invalid(f"{name} must be a string such as 30d or 2026-10-01")
    q = history_query({k: body[k] for k in ("since", "until") if k in body}, now)
    try:
        capacity = check_capacity(body.get("capacity"))
        quotas = quota_changes(body.get("quotas"))
    except BadChange as e:
        raise Invalid(str(e)) from None
    return {"since": q["since"], "until": q["until"], "capacity": capacity,
            "quotas": {k: v / GPU for k, v in quotas.items()}}


class WhatIfsHandler(PoolHandler):
    async def post(self):
        if not self.who.admin:
            self.fail(403, "only admins can run a what-if of the pool's history")
        try:
            request = whatif_request(self.body(), time.time())
            run = start_whatif(self, request)
        except Invalid as e:
            self.fail(e.status, str(e))
        self.reply(run.json(), 202)


class WhatIfHandler(PoolHandler):
    def get(self, run_id):
        if not self.who.admin:
            self.fail(403, "only admins can read what-if replays")
        run = self.settings["whatif"].get(run_id)
        if run is None:
            self.fail(404, f"there is no what-if {run_id[:40]} (the last {KEEP} are kept)")
        self.reply(run.json())

    def delete(self, run_id):
        """Cancel a running what-if: its worker killed, noted in the audit trail; a finished
        one is answered as it is."""
        if not self.who.admin:
            self.fail(403, "only admins can cancel what-if replays")
        runner = self.settings["whatif"]
        run = runner.get(run_id)
        if run is None:
            self.fail(404, f"there is no what-if {run_id[:40]} (the last {KEEP} are kept)")
        if run.state == REPLAYING:
            progress = round(run.progress, 3)
            runner.cancel(run_id, self.who.name)
            record(self.store, self.who.name, "cancel what-if", run_id,
                   {"state": REPLAYING, "progress": progress}, {"state": run.state},
                   self.via(), self.client_address())
        self.reply(run.json())


def start_whatif(handler, request: dict):
    """Start the replay of ``request`` (checked by ``whatif_request``) in the worker
    process; ``Invalid`` (409) while one runs, (400) for a capacity beyond the bound
    (``capacity_target``). Shared by the API and the dashboard."""
    now = time.time()
    if request["capacity"] is not None:
        try:  # here, not only in the worker: the bound is what keeps the worker's cost sane
            capacity_target(settings_from(pool_json(handler), [], {}).capacity,
                            request["capacity"])
        except BadChange as e:
            raise Invalid(str(e)) from None

    async def gather():
        """What the worker needs: where to read the history (the store's URL; the jobs
        themselves only for a database another process cannot open), today's settings."""
        knobs = handler.settings.get("replay_knobs", {})
        counts = handler.store.jobs.pending_counts()
        projects = [handler.project_json(p, counts) for p in handler.store.quotas.projects()]
        quotas = {k: round(v * GPU) for k, v in request["quotas"].items()}
        url = handler.store.engine.url
        window = (request["since"], request["until"], now, _grace(handler),
                  _horizon(handler, now))
        build = build_settings(handler.build)  # the worker reads its sessions with the jobs
        if url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:"):
            history = await handler.store.in_thread(all_entries, handler.store, *window)
            if build is not None:
                lines, backs, left_off = await handler.store.in_thread(
                    read_sessions, handler.store, *window)
                build.update(sessions=lines, take_backs=backs, sessions_left_off=left_off)
        else:
            history = {"db_url": url.render_as_string(hide_password=False), "window": window}
        departments = [department_json(d, handler.store.quotas.members(d.name),
                                       handler.scheduler.explained)
                       for d in handler.store.quotas.departments()]
        return {"history": history, "pool": pool_json(handler), "projects": projects,
                "departments": departments, "knobs": knobs, "capacity": request["capacity"],
                "quotas": quotas, "build": build}

    try:
        return handler.settings["whatif"].start(request, gather)
    except Busy as e:
        raise Invalid(str(e), 409) from None


def routes(prefix: str) -> list:
    p = prefix.rstrip("/")
    return [(rf"{p}/api/history", HistoryHandler), (rf"{p}/api/whatif", WhatIfsHandler),
            (rf"{p}/api/whatif/([^/]+)", WhatIfHandler)]
