"""REST handlers of the pool service (paths and shapes: web/openapi.py).

A user sees and acts on their own jobs; members of a project see its queue without other
users' commands, environment or logs; admins see everything. Identity and rights come only
from JupyterHub (``web/identity.py``, through ``web/handlers.py``), never from a request body.
"""

from __future__ import annotations

import asyncio
import json
import math
import re

from tornado import web
from tornado.iostream import StreamClosedError

from ...backends import logfile
from ...backends.base import SIMULATED_LABEL
from ...backends.ranks import world_size
from ...policy import SliceRefused
from ...policy.model import GPU
from ...trainjob import ACTIVE, PENDING, STATES, BadField, default_project
from ...validate import Invalid, digits, job_spec, request_id
from .. import metrics
from ..admin.changes import cancel_job, change_project, record
from ..admin.project_specs import project_name
from ..store.models import JobRow, ProjectRow
from . import api_admin, api_usage
from .api_usage import pool_gpus
from .handlers import ID, Rendered, ServiceHandler
from .job_lists import list_key
from .openapi import SPEC
from .views import department_json, job_json, job_says, project_json, slice_json


class PoolHandler(ServiceHandler):
    """The API's handlers: what they show of jobs, projects and slices (``web/views.py``)."""

    def job_json(self, row: JobRow, full: bool) -> dict:
        return job_json(row, job_says(row, self.scheduler.explained, self.usage.meter), full)

    def project_json(self, p: ProjectRow, pending_counts: dict | None = None) -> dict:
        counts = self.store.jobs.pending_counts() if pending_counts is None else pending_counts
        return project_json(p, self.scheduler.explained, counts.get(p.name, 0))

    def slice_json(self, row) -> dict:
        culler = self.usage.culler
        return slice_json(row, self.build.uuid(row.node, row.gpu),
                          self.usage.meter.holder_now("slice", row.id),
                          culler.warning_of(row.id) if culler else None)

    def project_row(self, name: str) -> ProjectRow | None:
        """The stored project ``name``, or None (also for a name no project can have)."""
        try:
            return self.store.quotas.project(project_name(name))
        except Invalid:
            return None


class PoolInfoHandler(PoolHandler):
    def get(self):
        self.reply(pool_json(self))


def pool_json(handler: PoolHandler) -> dict:
    """``api/pool`` as the caller may see it (the dashboard shows the same)."""
    ex = handler.scheduler.explained
    drained = handler.scheduler.drained
    own = [n for n in ex.nodes if not n.lent]  # lent build GPUs are under "build"
    nodes = [{"name": n.name, "gpus": n.gpus, "pool": n.pool, "labels": dict(n.labels),
              **_drained(drained.get(n.name))} for n in own]
    return {"capacity": sum(n.gpus for n in own), "nodes": nodes,
            "in_use": sum(ex.usage.values()) / GPU,
            "simulated": any(n.labels.get(SIMULATED_LABEL) for n in own),
            "build": handler.build.summary(_may_see_job(handler)), **pool_gpus(handler)}


def _may_see_job(handler: PoolHandler):
    """Whether the caller may see a job's id: an admin, its user, a member of its project (as
    the pool map names holders)."""
    who = handler.who
    if who.admin:
        return lambda job_id: True
    mine = {p.name for p in handler.my_projects()}

    def may_see(job_id: str) -> bool:
        row = handler.store.jobs.get(job_id)
        return row is not None and (row.user == who.name or row.project in mine)
    return may_see


def _drained(row) -> dict:
    """A node's drain as ``api/pool`` shows it: who drained it and since when."""
    if row is None:
        return {"drained": False}
    return {"drained": True, "drained_by": row.by, "drained_since": row.since}


class QuotaHandler(PoolHandler):
    def get(self):
        counts = {s: 0 for s in STATES} | (self.store.jobs.state_counts(self.who.name)
                                           if self.who.kind == "user" else {})
        pending = self.store.jobs.pending_counts()
        mine = self.my_projects()
        homes = sorted({p.department for p in mine if p.department})
        departments = [d for d in map(self.store.quotas.department, homes) if d is not None]
        self.reply({"user": self.who.name, "admin": self.who.admin,
                    "projects": [self.project_json(p, pending) for p in mine],
                    "departments": [department_json(d, self.store.quotas.members(d.name),
                                                    self.scheduler.explained)
                                    for d in departments],
                    "jobs": counts})


class JobsHandler(PoolHandler):
    def get(self):
        # Lists are kept rendered, with their ETag, while unchanged (web/job_lists.py); a client
        # that sends the ETag back gets 304.
        key = (*list_key(self.who, self.request.query_arguments), self._jobs_version())
        answer = self.job_lists.answer(key, self._rows)
        self.set_header("Cache-Control", "private, no-cache")  # keep it, but ask each time
        answer.send(self)

    def _jobs_version(self) -> int:
        """The job book's version of what the query lists (store/job_book.py)."""
        book = self.store.book
        if self.get_argument("all", None):
            return book.version_of()
        project = self.get_argument("project", None)
        if project is not None:
            return book.version_of(project=project)
        return book.version_of(user=self.who.name)

    def _rows(self) -> list[tuple[JobRow, bool]]:
        """The jobs the query lists, each with whether the caller sees it in full."""
        store = self.store
        state = self.get_argument("state", None)
        if state is not None and state not in STATES:
            self.fail(400, f"state must be one of {', '.join(STATES)}, not {state!r}")
        states = (state,) if state else None
        limit = self.get_argument("limit", "100")
        if not re.fullmatch(r"[0-9]{1,4}", limit) or not 1 <= int(limit) <= 1000:
            self.fail(400, f"limit must be a whole number from 1 to 1000, not {limit!r}")
        limit = int(limit)
        project = self.get_argument("project", None)
        if self.get_argument("all", None):
            if not self.who.admin:
                self.fail(403, "only admins can list every job; leave out all=1 for yours")
            rows = store.jobs.newest(states=states, limit=limit)
        elif project is not None:
            row = self.project_row(project)
            if row is None:
                self.fail(400, f"there is no project {project!r}")
            if not self.member_of(row):
                self.fail(403, f"you are not a member of project {project}")
            rows = store.jobs.newest(project=project, states=states, limit=limit)
        elif self.who.kind == "user":
            rows = store.jobs.newest(user=self.who.name, states=states, limit=limit)
        else:
            rows = []  # a service has no jobs of its own
        return [(r, self.who.is_user(r.user) or self.who.admin) for r in rows]

    async def post(self):
        if self.who.kind != "user":
            self.fail(403, "train jobs are submitted by users, not by services")
        try:
            spec = job_spec(self.body(), self.intake.max_job_size)
            spec["request_id"] = self._request_id(spec["request_id"])
            if spec["request_id"] is not None:  # a retry: the job the first try made
                row = self.store.jobs.for_request(self.who.name, spec["request_id"])
                if row is not None:
                    return self._again(row, spec)
            project = self._project(spec.pop("project"), spec["gpus"], spec["priority"])
            row, created = await self.intake.submit(self.who.name, project, spec)
        except Invalid as e:
            self.fail(e.status, str(e))
        if not created:  # a concurrent try of the same request won
            return self._again(row, spec)
        self.reply(self.job_json(row, True), 201)

    def _request_id(self, in_body: str | None) -> str | None:
        header = self.request.headers.get("Idempotency-Key")
        if header is None:
            return in_body
        header = request_id(header)
        if in_body is not None and in_body != header:
            raise Invalid("the Idempotency-Key header and request_id differ; send one of them")
        return header

    def _again(self, row: JobRow, spec: dict) -> None:
        """Answer a retried submit with its job (200, not 201), unless the key was used for a
        different job: then 409, since a key names one submit."""
        asked = {"gpus": spec["gpus"], "name": spec["name"], "priority": spec["priority"],
                 "env": spec["env"], "workdir": spec.get("workdir"),
                 "command": self.intake.command_for(spec)}
        had = {"gpus": row.gpus, "name": row.name, "priority": row.priority, "env": row.env,
               "workdir": row.workdir, "command": row.command}
        project = spec.get("project")
        if asked != had or project not in (None, row.project):
            self.fail(409, f"request_id {row.request_id} was used for job {row.id}, which "
                           f"asked for something else; use a new request_id for a new job")
        self.reply(self.job_json(row, True), 200)

    def _project(self, name, gpus: int, priority: int = 0) -> ProjectRow:
        mine = self.my_projects()
        if name is None:
            try:
                chosen = default_project([p.name for p in mine])
            except BadField as e:
                if not mine:
                    raise Invalid(str(e), 403) from None
                raise Invalid(f"{e}; say which with project") from None
            project = next(p for p in mine if p.name == chosen)
        else:
            if not isinstance(name, str):
                raise Invalid("project must be a project name")
            project = self.store.quotas.project(name)
            if project is None:
                raise Invalid(f"there is no project {name!r}; yours: "
                              + (", ".join(p.name for p in mine) or "none"))
            if not self.member_of(project):
                raise Invalid(f"you are not a member of project {name}", 403)
        never = self.scheduler.never_fits(gpus, project)
        if never is not None:
            raise Invalid(str(never))
        low, high = project.job_priority_min, project.job_priority_max
        if not low <= priority <= high:
            raise Invalid(f"project {project.name} takes job priorities from {low} to {high}, "
                          f"not {priority}; an admin may widen the range", 403)
        return project


class JobHandler(PoolHandler):
    def get(self, job_id):
        self.reply(self.job_json(self.own_job(job_id), True))

    async def delete(self, job_id):
        row = self.own_job(job_id)
        try:
            row = await cancel_job(self.store, self.scheduler, row, self.who.name,
                                   self.who.is_user(row.user), self.via(),
                                   self.client_address())
        except Invalid as e:
            self.fail(e.status, str(e))
        self.reply(self.job_json(row, True))


class LogsHandler(PoolHandler):
    _gone = False  # the client closed the connection
    _following: str | None = None  # whose follower count this request holds

    def set_default_headers(self):
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.set_header("Cache-Control", "no-store")

    def on_connection_close(self):
        self._gone = True

    def on_finish(self):
        self._unfollow()

    def _unfollow(self):
        if self._following is not None:
            self.follows.stop(self._following)
            self._following = None

    async def get(self, job_id):
        row = self.own_job(job_id)
        attempt = self.get_argument("attempt", None)
        if attempt is None:
            attempt = row.attempt
        else:
            if not digits(attempt, 6):
                self.fail(400, f"attempt must be a whole number, not {attempt[:40]!r}")
            attempt = int(attempt)
            if not 1 <= attempt <= row.attempt:
                self.fail(400, f"job {job_id} has attempts 1 to {row.attempt}")
        rank = self._rank(row, attempt)
        follow = self.get_argument("follow", "0") not in ("0", "", "false")
        if follow:
            follows = self.follows
            if not follows.start(self.who.name):
                self.fail(429, f"you follow {follows.cap} logs already, the most one user may; "
                               f"close one (or read without follow)")
            self._following = self.who.name
        try:
            if follow:  # the answer starts now, even while the job prints nothing
                await self.flush()
            await self._stream(job_id, row, attempt, rank, follow)
        finally:
            self._unfollow()
        if not self._gone:
            self.finish()

    async def _stream(self, job_id: str, row: JobRow, attempt: int, rank: int,
                      follow: bool) -> None:
        """The log of one rank in bounded chunks; with ``follow``, then what the attempt
        prints, until it ends or the client goes."""
        backend, offset, pause = self.backend, 0, 0.02
        while not self._gone:
            start, chunk = await backend.read_log_from(row.id, attempt, offset, rank=rank)
            if start > offset:
                self.write(logfile.dropped_note(start - offset))
            offset = start + len(chunk)
            if chunk:
                pause = 0.02  # output flows: look again soon
                self.write(chunk)
                try:
                    await self.flush()
                except StreamClosedError:
                    return
                continue
            if not follow:
                return
            row = self.store.jobs.get(job_id)
            if not (row.state in ACTIVE and row.attempt == attempt
                    or row.attempt < attempt):
                # It ended: what it printed last may have come after the read above.
                start, chunk = await backend.read_log_from(row.id, attempt, offset, rank=rank)
                if chunk:
                    continue
                return
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.2)

    def _rank(self, row: JobRow, attempt: int) -> int:
        """``?rank=N`` (default 0), checked against the ranks the attempt has."""
        text = self.get_argument("rank", "0")
        if not digits(text, 6):
            self.fail(400, f"rank must be a whole number from 0, not {text[:40]!r}")
        rank = int(text)
        if rank == 0:
            return 0
        if attempt == row.attempt:
            placement = row.placement if row.state != PENDING else None
        else:
            placement = next((a.placement for a in self.store.jobs.attempts(row.id)
                              if a.attempt == attempt), None)
        if not placement:
            self.fail(400, f"attempt {attempt} of job {row.id} has not started, so it has "
                           f"only rank 0 for now; ask again once it runs")
        count = world_size(placement, row.per_gpu)
        if rank >= count:
            self.fail(400, f"attempt {attempt} of job {row.id} has ranks 0 to {count - 1}, "
                           f"not {rank}")
        return rank


class ProjectsHandler(PoolHandler):
    def get(self):
        counts = self.store.jobs.pending_counts()
        self.reply({"projects": [self.project_json(p, counts)
                                 for p in self.store.quotas.projects()]})


class ProjectHandler(PoolHandler):
    def put(self, name):
        if not self.who.admin:
            self.fail(403, "only admins can change projects")
        try:
            row = change_project(self.store, self.scheduler, name, self.body(), self.who.name,
                                 self.via(), self.client_address())
        except Invalid as e:
            self.fail(e.status, str(e))
        self.reply(self.project_json(row))


class SliceRoutes(PoolHandler):
    def audit_slice(self, action: str, slice_id: str, before, after) -> None:
        """An admin's change of a slice is in the audit trail (releasing a running server's
        slice lets another be packed onto its GPU); the spawner's own are its daily work."""
        if self.who.kind == "service" and self.who.name == self.settings["spawner_service"]:
            return
        record(self.store, self.who.name, action, slice_id, before, after, self.via(),
               self.client_address())


class SlicesHandler(SliceRoutes):
    """Build slices, reserved by the spawner (a JupyterHub service) for notebook servers."""

    def get(self):
        if self.who.kind == "user":
            mine = None if self.who.admin else self.who.name
        else:
            self.spawner_only()
            mine = None
        self.reply({"slices": [self.slice_json(r) for r in self.store.slices.all(user=mine)]})

    def post(self):
        self.spawner_only()
        body = self.body()
        try:
            if not isinstance(body, dict):
                raise Invalid("the body must be a JSON object with user and gpus")
            extra = sorted(set(body) - {"user", "gpus", "server"})
            if extra:
                raise Invalid(f"unknown field(s) {', '.join(extra)}; the fields are gpus, "
                              f"server and user")
            user, server = body.get("user"), body.get("server", "")
            if not isinstance(user, str) or not user:
                raise Invalid("user must be the JupyterHub user the slice is for")
            if not isinstance(server, str) or len(server) > 255:
                raise Invalid("server must be the server's name (at most 255 characters)")
            gpus = body.get("gpus")
            if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or \
                    not 0 < gpus <= 1:
                raise Invalid(f"gpus must be a fraction of one GPU, more than 0 and at most 1, "
                              f"not {gpus!r}")
        except Invalid as e:
            self.fail(e.status, str(e))
        placed = self.build.reserve(user, round(gpus * GPU), server)
        if isinstance(placed, SliceRefused):  # retry_s: a GPU lent to train jobs is back by then
            self.fail(409, str(placed), None if placed.retry_s is None else
                      math.ceil(placed.retry_s))
        self.audit_slice("reserve slice", placed.id, None, _slice_fields(placed))
        self.reply(self.slice_json(placed), 201)


class SliceHandler(SliceRoutes):
    def patch(self, slice_id):
        """The spawner says which process is the slice's notebook server (usage attribution)."""
        self.spawner_only()
        body = self.body()
        pid = body.get("pid") if isinstance(body, dict) else None
        if not isinstance(body, dict) or set(body) != {"pid"} or isinstance(pid, bool) or \
                not isinstance(pid, int) or not 0 < pid < 2**31:
            self.fail(400, "the body must be {\"pid\": N}, the notebook server's process id")
        row = self.store.slices.set_pid(slice_id, pid) if ID.match(slice_id) else None
        if row is None:
            self.fail(404, f"there is no slice {slice_id}")
        self.audit_slice("set slice server", row.id, None, {"pid": row.pid})
        self.reply(self.slice_json(row))

    def delete(self, slice_id):
        self.spawner_only()
        row = self.store.slices.remove(slice_id) if ID.match(slice_id) else None
        if row is None:
            self.fail(404, f"there is no slice {slice_id}")
        self.audit_slice("release slice", row.id, _slice_fields(row), None)
        self.reply(self.slice_json(row))


def _slice_fields(row) -> dict:
    return {"user": row.user, "server": row.server, "gpus": row.milli / GPU,
            "node": row.node, "gpu": row.gpu, "pid": row.pid}


class MetricsHandler(PoolHandler):
    def get(self):
        if not self.who.admin:
            self.fail(403, "only admins can read the metrics")
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish(metrics.render(self.store, self.scheduler, self.usage))


class OpenAPIHandler(web.RequestHandler):
    answer = Rendered(json.dumps(SPEC))  # it changes only with the code

    def get(self):
        self.set_header("Content-Type", "application/json")
        self.answer.send(self)


def routes(prefix: str) -> list:
    """The paths of this module, ``api_usage`` and ``api_admin`` (all of the REST API:
    ``rest.routes``)."""
    p = prefix.rstrip("/")
    return api_usage.routes(prefix) + api_admin.routes(prefix) + [
        (rf"{p}/api/pool", PoolInfoHandler),
        (rf"{p}/api/quota", QuotaHandler),
        (rf"{p}/api/jobs", JobsHandler),
        (rf"{p}/api/jobs/([^/]+)", JobHandler),
        (rf"{p}/api/jobs/([^/]+)/logs", LogsHandler),
        (rf"{p}/api/projects", ProjectsHandler),
        (rf"{p}/api/projects/([^/]+)", ProjectHandler),
        (rf"{p}/api/slices", SlicesHandler),
        (rf"{p}/api/slices/([^/]+)", SliceHandler),
        (rf"{p}/metrics", MetricsHandler),
        (rf"{p}/api/openapi.json", OpenAPIHandler),
    ]
