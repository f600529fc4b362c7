"""The admin dashboard's HTTP side: browser login through the hub's OAuth, admins only, and
the gathering of what ``jupyter_gpushare/dashboard/`` draws (the API's own answers).

Routes under the service's prefix: ``dashboard`` (``?window=1h|6h|24h|7d|30d``, or
``?since=…&until=…`` as ``api/usage`` reads them; the admin's forms under it are
``web/dashboard_forms.py``'s), ``dashboard/audit`` (a page of the audit trail, ``?before=<id>``
as ``api/audit`` takes it), the prefix itself (a redirect there: the hub's Services menu
links to it), and ``oauth_callback``, where the hub sends the browser back after login.
The service must be an OAuth client of the hub: a JupyterHub service with a ``url`` is one
(the redirect URI defaults to ``/services/<name>/oauth_callback``); ``oauth_no_confirm``
spares admins the hub's "authorize access" page, and ``oauth_client_allowed_scopes:
["custom:gpushare:admin"]`` lets pool admins who are not hub admins in (docs/howto/utilization.md,
"The admin dashboard").
"""

from __future__ import annotations

import json
import os
import secrets
import time
from datetime import datetime

from jupyterhub.services.auth import (HubOAuth, HubOAuthCallbackHandler, HubOAuthenticated,
                                       UserNotAllowed)
from tornado import web

from ...dashboard import BadWindow, choose_window, refusal, render, render_whatif
from ...dashboard.audit import audit_page
from ...dashboard.page import form_page
from ...usage import showback
from ...usage.report import BY
from ...validate import Invalid
from ..store.usage_rollups import Scope
from .api_admin import audit_listing, audit_query
from .api_history import start_whatif, whatif_request
from .api_jobs import PoolHandler, pool_json
from .api_usage import MAX_WINDOW, parse_time, send_csv
from .views import department_json

REFRESH_S = 15
IDLE_ROWS = 10
AUDIT_PAGE = 50  # entries on a page of dashboard/audit (?limit= as api/audit takes it)
AUDIT_ROWS = 20  # the audit trail's newest entries on the dashboard; older ones: dashboard/audit


class OAuthSettings:
    """The service's HubOAuth, made on first use: it reads the client id and the callback from
    the environment the hub gives a service with a url.

    ``cache_max_age``: seconds the hub's answer for a login (or a token in the header) is
    kept, the API's ``token_cache_ttl``: a revoked token stops opening the dashboard when it
    stops working on the API, not after HubOAuth's default of 300 s."""

    def __init__(self, cache_max_age: int):
        self.cache_max_age = cache_max_age
        self._auth: HubOAuth | None = None

    def get(self) -> HubOAuth | None:
        if self._auth is None and os.environ.get("JUPYTERHUB_CLIENT_ID"):
            self._auth = HubOAuth(cache_max_age=self.cache_max_age)
        return self._auth


class DashboardHandler(HubOAuthenticated, PoolHandler):
    """Token or browser login (HubOAuth); pages, not JSON. ``base``: the service's prefix
    (``/services/gpushare/``), where the pages link to one another."""

    form_action = "'none'"  # where the page's forms may post (the CSP's form-action)
    # Forms: tornado reads the body whole and parses its fields (its own limit, 4x
    # max_body_size, drops a larger one); the API's handlers stream theirs (web/handlers.py).
    _stream_request_body = False

    def initialize(self, base: str = "/"):
        self.base = base

    @property
    def hub_auth(self):
        auth = self.settings["dashboard_oauth"].get()
        if auth is None:
            raise web.HTTPError(503, reason="the dashboard needs the pool service to be an "
                                            "OAuth client of the hub: give its entry in "
                                            "c.JupyterHub.services a url")
        return auth

    @hub_auth.setter
    def hub_auth(self, auth):  # HubAuthenticated's own setter; the service's is used instead
        pass

    def set_default_headers(self):
        self.nonce = secrets.token_urlsafe(12)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")
        self.set_header("Content-Security-Policy", (
            f"default-src 'none'; style-src 'unsafe-inline'; script-src 'nonce-{self.nonce}'; "
            f"connect-src 'self'; img-src 'self' data:; base-uri 'none'; "
            f"form-action {self.form_action}; "
            f"frame-ancestors 'self'"))

    async def prepare(self):
        # Who it is (a login cookie or a token), asked without blocking the service as
        # HubAuth's own get_current_user would; @web.authenticated then sends strangers to the
        # hub's login, and get() checks rights. A form's body is bounded as the API's are.
        limit = self.settings["max_body_size"]
        if len(self.request.body) > limit:
            raise web.HTTPError(413, reason=f"the form is larger than {limit // 1024} KiB; "
                                            f"send less")
        model = await self.hub_auth.get_user(self, sync=False)
        if model is not None:
            try:
                model = self.check_hub_user(model)
            except UserNotAllowed:
                raise web.HTTPError(403) from None  # a login that may not use the service
        self._hub_auth_user_cache = model

    def write_error(self, status_code, **kwargs):
        exc = kwargs.get("exc_info", (None, None))[1]
        sentence = exc.reason if isinstance(exc, web.HTTPError) and exc.reason else None
        if status_code == 403 and not sentence:
            sentence = ("You are signed in to JupyterHub, but your account may not use the "
                        "gpushare service; an admin can grant it "
                        "access:services!service=gpushare.")
        if not sentence:
            sentence = ("The pool service failed to draw the dashboard; the administrator can "
                        "see why in its log.")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(refusal(status_code, sentence))

    async def admin_only(self) -> None:
        """Sets ``self.who``; refuses (403) anyone but a pool admin signed in as a person."""
        model = self.current_user
        if model is None:  # a post whose login cookie came without the page's XSRF token
            self.fail(403, "Sign in again: this request came without a JupyterHub login the "
                           "dashboard can take.")
        if model.get("kind", "user") != "user":
            self.fail(403, "The dashboard is for people signed in to JupyterHub, not for "
                           "services.")
        self.who = await self.directory.who(model)
        if not self.who.admin:
            self.fail(403, f"Only admins of the GPU pool see its dashboard (JupyterHub admins "
                           f"and holders of custom:gpushare:admin); you are signed in as "
                           f"{self.who.name}. Your own jobs, quota and GPU use are in "
                           f"JupyterLab's GPU share panel, %gpushare and gpushare usage.")

    @property
    def xsrf(self) -> str:
        """The page's XSRF token for its forms (asking for it sets the _xsrf cookie)."""
        token = self.xsrf_token
        return token.decode() if isinstance(token, bytes) else token

    async def admin_window(self):
        """For a pool admin: the window the query asks for (a 400 sentence if it is bad)."""
        await self.admin_only()
        try:
            return await self.window(time.time())
        except (Invalid, BadWindow) as e:
            self.fail(400, f"{str(e)[:1].upper()}{str(e)[1:]}.")

    @web.authenticated
    async def get(self):
        window = await self.admin_window()
        self.finish(render(await gather(self, window), nonce=self.nonce, xsrf=self.xsrf))

    async def window(self, now: float):
        """``?window=6h``, or ``?since=…&until=…`` as api/usage reads them; neither, a window
        that the pool's readings fill (``choose_window``)."""
        unknown = sorted(set(self.request.query_arguments) - {"window", "since", "until"})
        if unknown:
            raise Invalid(f"unknown parameter(s) {', '.join(unknown)[:80]}; the dashboard "
                          f"takes window, or since and until")
        since, until = self.get_argument("since", None), self.get_argument("until", None)
        since = None if since is None else parse_time(since, now, "since")
        until = None if until is None else parse_time(until, now, "until")
        name = self.get_argument("window", None)
        first = None
        if not name and since is None and until is None:
            first = await self.usage.meter.first_reading()
        window = choose_window(name, now, since, until, first)
        if window.span > MAX_WINDOW:
            raise Invalid(f"the period may be at most {MAX_WINDOW // 86400} days; ask for less")
        return window


class AuditPageHandler(DashboardHandler):
    """``dashboard/audit?before=<id>``: a page of the audit trail, older than entry ``id``
    (none: the newest), listed as ``GET api/audit`` lists it, with its query's words."""

    @web.authenticated
    async def get(self):
        await self.admin_only()
        now = time.time()
        args = {"limit": str(AUDIT_PAGE)} | \
            {k: self.get_argument(k) for k in self.request.query_arguments}
        try:
            q = audit_query(args, now)
        except Invalid as e:
            self.fail(e.status, f"{str(e)[:1].upper()}{str(e)[1:]}.")
        listing = audit_listing(self.store, **q)
        offset, zone = service_zone(now)
        self.finish(form_page(audit_page(self.base, self.who.name, listing["entries"],
                                         listing["next"], q["before_id"], now, offset, zone)))


class RootHandler(web.RequestHandler):
    def get(self):
        self.redirect(self.request.path.rstrip("/") + "/dashboard")


def service_zone(now: float) -> tuple[float, str]:
    local = datetime.fromtimestamp(now).astimezone()
    return local.utcoffset().total_seconds(), local.tzname() or "UTC"


async def gather(handler: PoolHandler, window) -> dict:
    """What the dashboard shows, as the API shows it to an admin."""
    store, now = handler.store, time.time()
    meter, since, until = handler.usage.meter, window.since, window.until
    usage = await meter.query(since, until, BY["project"], Scope(), window.step, "allocated",
                              1000)
    usage["idle_threshold"] = handler.usage.idle_threshold / 100
    idle_jobs = (await meter.query(since, until, BY["job"], Scope(), None, "idle",
                                   IDLE_ROWS))["rows"]
    idle_slices = (await meter.query(since, until, BY["slice"], Scope(), None, "idle",
                                     IDLE_ROWS))["rows"]
    rows = {r.id: r for r in store.jobs.active()}
    for r in idle_jobs:  # ended jobs among the idlest: their names and how they ended
        if r.get("job") and r["job"] not in rows:
            found = store.jobs.get(r["job"])
            if found is not None:
                rows[found.id] = found
    counts = store.jobs.pending_counts()
    offset, zone = service_zone(now)
    audit = audit_listing(store, None, None, AUDIT_ROWS)
    return {"now": now, "offset": offset, "zone": zone, "user": handler.who.name,
            "base": handler.base,
            "window": window, "refresh_s": REFRESH_S, "pool": pool_json(handler),
            "projects": [handler.project_json(p, counts) for p in store.quotas.projects()],
            "departments": [department_json(d, store.quotas.members(d.name),
                                            handler.scheduler.explained)
                            for d in store.quotas.departments()],
            "usage": usage, "idle_jobs": idle_jobs, "idle_slices": idle_slices,
            "jobs": [handler.job_json(r, False) for r in rows.values()],
            "slices": [handler.slice_json(s) for s in store.slices.all()],
            "audit": audit["entries"], "audit_next": audit["next"]}


class UsageCSVHandler(DashboardHandler):
    """``dashboard/usage.csv``: the dashboard's window by project, as ``api/usage?format=csv``
    gives it, for a browser signed in to the dashboard."""

    @web.authenticated
    async def get(self):
        window = await self.admin_window()
        answer = await self.usage.meter.query(window.since, window.until, BY["project"],
                                              Scope(), None, "name", 1000)
        send_csv(self, showback.to_csv(showback.showback_rows(answer, "project")),
                 "gpushare-usage.csv")


class WhatIfPageHandler(DashboardHandler):
    """``dashboard/whatif``: the what-if page (``?run=ID`` shows one run, refreshed while it
    runs); a POST of ``{since, until, capacity, quotas}`` starts one (as ``POST api/whatif``)
    and answers JSON."""

    @web.authenticated
    async def get(self):
        await self.admin_only()
        run_id = self.get_argument("run", "")
        run = self.settings["whatif"].get(run_id) if run_id else None
        if run_id and run is None:
            self.fail(404, f"There is no what-if {run_id[:40]} (the last few are kept); start "
                           f"another.")
        counts = self.store.jobs.pending_counts()
        now = time.time()
        offset, zone = service_zone(now)
        self.finish(render_whatif({
            "now": now, "offset": offset, "zone": zone, "user": self.who.name,
            "pool": pool_json(self), "run": run.json() if run else None,
            "projects": [self.project_json(p, counts) for p in self.store.quotas.projects()]},
            nonce=self.nonce, xsrf=self.xsrf))

    @web.authenticated
    async def post(self):
        self.json_errors = True
        await self.admin_only()
        try:
            run = start_whatif(self, whatif_request(self.body(), time.time()))
        except Invalid as e:
            self.fail(e.status, str(e))
        self.set_header("Content-Type", "application/json")
        self.set_status(202)
        self.finish(json.dumps(run.json()))

    def write_error(self, status_code, **kwargs):
        if not getattr(self, "json_errors", False):
            return super().write_error(status_code, **kwargs)
        exc = kwargs.get("exc_info", (None, None))[1]
        sentence = exc.reason if isinstance(exc, web.HTTPError) and exc.reason else \
            "the pool service failed to start the what-if; its log says why"
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": sentence}))


def routes(prefix: str) -> list:
    """The dashboard's paths (its admin's forms: ``dashboard_forms.routes``)."""
    p = prefix.rstrip("/")
    base = {"base": p + "/"}
    return [(rf"{p}/?", RootHandler), (rf"{p}/dashboard", DashboardHandler, base),
            (rf"{p}/dashboard/audit", AuditPageHandler, base),
            (rf"{p}/dashboard/usage\.csv", UsageCSVHandler, base),
            (rf"{p}/dashboard/whatif", WhatIfPageHandler, base),
            (rf"{p}/oauth_callback", CallbackHandler)]


class CallbackHandler(HubOAuthCallbackHandler):
    """Where the hub sends the browser back after login (HubOAuth's own handler, given the
    service's HubOAuth)."""

    @property
    def hub_auth(self):
        auth = self.settings["dashboard_oauth"].get()
        if auth is None:
            raise web.HTTPError(503, reason="this pool service is not an OAuth client of the hub")
        return auth

    @hub_auth.setter
    def hub_auth(self, auth):
        pass
