"""REST handlers of the pool service (paths and shapes: openapi.py).

A user sees and acts on their own jobs; members of a project see its queue without other
users' commands, environment or logs; admins see everything. Identity and rights come only
from JupyterHub (``directory.py``), never from a request body.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import re
import time

from jupyterhub.services.auth import HubAuthenticated, UserNotAllowed
from tornado import web
from tornado.iostream import StreamClosedError

from ..backends import logfile
from ..backends.ranks import world_size
from ..policy import SliceRefused
from ..policy.model import GPU
from .directory import HubUnavailable, TooManyFailures, Who
from .models import JobRow, ProjectRow
from .openapi import SPEC
from .validate import Invalid, job_spec, project_name, project_update, request_id

STATES = ("pending", "running", "succeeded", "failed", "cancelled")
MAX_DEPTH = 32  # nesting of a JSON body: specs are two levels deep
_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}\Z")  # job and slice ids (j-…, s-…)
_PROJECT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z")
_LISTS: dict[tuple, "Rendered"] = {}  # rendered job lists, by caller, query and versions
# Each job's JSON as the last list had it, by (job id, with its command and env): the row
# it came from and what the cycle said of the job (job_text).
_JOB_TEXTS: dict[tuple, tuple] = {}
LIST_ARGUMENTS = ("all", "limit", "project", "state")  # the rest say nothing: not in the key


class PoolHandler(HubAuthenticated, web.RequestHandler):
    """Every handler: JSON errors, the hub's identity for the token, the pool's view of the
    user, bodies of at most ``max_body_size`` bytes."""

    who: Who

    @property
    def pool(self):
        return self.settings["pool"]

    def set_default_headers(self):
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")

    async def prepare(self):
        # The HTTP server reads at most four times the limit (app.server_limits) and drops
        # the connection beyond that; a body over the limit, chunked or not, is refused here.
        if len(self.request.body) > self.pool.max_body_size:
            limit = self.pool.max_body_size
            raise web.HTTPError(413, reason=f"the body is larger than {limit // 1024} KiB; "
                                            f"send less (large code belongs in a file)")
        try:
            model = await self.identify()
        except TooManyFailures as e:
            raise web.HTTPError(429, reason=str(e)) from None
        except HubUnavailable as e:
            raise web.HTTPError(503, reason=str(e)) from None
        if model is None:
            raise web.HTTPError(403, reason="this needs a JupyterHub token that may use the "
                                            "gpushare service (Authorization: token ...)")
        try:
            self.who = await self.pool.directory.who(model)
        except HubUnavailable as e:
            raise web.HTTPError(503, reason=str(e)) from None

    async def identify(self) -> dict | None:
        """The hub's model of the token's owner, asked without blocking (HubAuth's own
        get_current_user would ask synchronously), checked against the service's scopes."""
        token = self.hub_auth.get_token(self, in_cookie=False)
        model = await self.pool.tokens.identify(token) if token else None
        if model is not None:
            try:
                model = self.check_hub_user(dict(model))
            except UserNotAllowed:
                model = None
        self._hub_auth_user_cache = model  # what get_current_user() returns from now on
        return model

    def write_error(self, status_code, **kwargs):
        exc = kwargs.get("exc_info", (None, None))[1]
        if isinstance(exc, web.HTTPError) and exc.reason:
            message = exc.reason
        elif status_code == 404:
            message = "no such path in the gpushare API; see api/openapi.json"
        elif status_code == 405:
            message = f"{self.request.method} is not allowed here; see api/openapi.json"
        else:
            message = "the pool service failed to answer; the administrator can see why in its log"
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message}))

    def fail(self, status: int, message: str):
        raise web.HTTPError(status, reason=message)

    def body(self):
        """The request's JSON body, or a 400 with a sentence: bytes that are not UTF-8, text
        that is not JSON, nesting deeper than MAX_DEPTH, text no store can hold."""
        raw = self.request.body or b"null"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(400, f"the body is not UTF-8 text (byte {e.start} is not); send JSON "
                           f"encoded as UTF-8")
        try:
            value = json.loads(text)
        except RecursionError:
            self.fail(400, f"the body nests deeper than {MAX_DEPTH} levels; send a flatter "
                           f"JSON object")
        except ValueError as e:
            where = f" ({e.msg} at character {e.pos})" if isinstance(e, json.JSONDecodeError) \
                else ""
            self.fail(400, f"the body is not valid JSON{where}")
        problem = _unstorable(value)
        if problem:
            self.fail(400, problem)
        return value

    def reply(self, obj, status: int = 200):
        self.set_status(status)
        self.finish(json.dumps(obj))

    # -- rights -----------------------------------------------------------------------
    def member_of(self, project: ProjectRow) -> bool:
        return self.who.admin or bool(self.who.groups & set(project.groups or ()))

    def my_projects(self) -> list[ProjectRow]:
        return [p for p in self.pool.store.projects() if self.member_of(p)]

    def own_job(self, job_id: str) -> JobRow:
        row = self.pool.store.job(job_id) if _ID.match(job_id) else None
        if row is None:
            self.fail(404, f"there is no job {job_id}")
        if not (self.who.is_user(row.user) or self.who.admin):
            self.fail(403, f"job {job_id} is not yours")
        return row

    def job_json(self, row: JobRow, full: bool) -> dict:
        ex = self.pool.scheduler.explained
        out = {
            "id": row.id, "name": row.name, "user": row.user, "project": row.project,
            "gpus": row.gpus / GPU, "priority": row.priority, "state": row.state,
            "attempt": row.attempt, "submitted": row.submitted, "started": row.started,
            "finished": row.finished, "exit_code": row.exit_code,
            "placement": {n: m / GPU for n, m in (row.placement or {}).items()},
            "preempting": bool(row.preempting),
            "per_gpu": bool(row.per_gpu),
            "ranks": world_size(row.placement, row.per_gpu) if row.placement else None,
            "queue_position": ex.positions.get(row.id) if row.state == "pending" else None,
            "reason": self.why_text(row, ex),
            "usage": self.pool.usage.meter.holder_now("job", f"{row.id}/{row.attempt}")
            if row.state == "running" else None,
            # Why this is not the first attempt ("preempted; requeued to resume ..."), for
            # front ends that follow a job across attempts.
            "requeued": (row.message or None) if row.attempt > 1 and row.state in
            ("pending", "running") else None,
        }
        if full:
            out["command"] = row.command
            out["env"] = row.env
            out["workdir"] = row.workdir
            out["request_id"] = row.request_id
        return out

    @staticmethod
    def why_text(row: JobRow, ex) -> str:
        if row.state == "pending":
            return ex.reasons.get(row.id, "waiting for the next scheduling cycle")
        if row.state == "running":
            if row.cancel_requested:
                return "stopping: cancelled by its user"
            if row.preempting:
                return "stopping: preempted, it will be requeued"
            return ex.starting.get(row.id, "")  # e.g. Kubernetes has not placed its pod yet
        return row.message or ""

    def project_json(self, p: ProjectRow, pending_counts: dict | None = None) -> dict:
        ex = self.pool.scheduler.explained
        used = ex.usage.get(p.name, 0)
        counts = self.pool.store.pending_counts() if pending_counts is None else pending_counts
        pending = counts.get(p.name, 0)
        return {"name": p.name, "quota": p.quota / GPU, "over_quota_weight": p.over_quota_weight,
                "limit": None if p.limit is None else p.limit / GPU, "priority": p.priority,
                "job_priority_min": p.job_priority_min, "job_priority_max": p.job_priority_max,
                "groups": list(p.groups or ()), "in_use": used / GPU,
                "borrowed": max(0, used - p.quota) / GPU,
                "deserved": ex.deserved.get(p.name, 0) / GPU, "pending": pending}


def list_key(who: Who, arguments: dict) -> tuple:
    """What a rendered job list depends on: the caller (a service is not the user of the
    same name) and the query arguments the list reads; others in the query are left out,
    so that they cannot make a cache entry each."""
    return who, tuple((k, tuple(arguments.get(k, ()))) for k in LIST_ARGUMENTS)


class PoolInfoHandler(PoolHandler):
    def get(self):
        self.reply(pool_json(self))


def pool_json(handler: PoolHandler) -> dict:
    """``api/pool`` as the caller may see it (the dashboard shows the same)."""
    from .api_usage import pool_gpus
    pool = handler.pool
    ex = pool.scheduler.explained
    nodes = [{"name": n.name, "gpus": n.gpus, "pool": n.pool, "labels": dict(n.labels)}
             for n in ex.nodes]
    build = pool.build_pool()
    return {"capacity": sum(n.gpus for n in ex.nodes), "nodes": nodes,
            "in_use": sum(ex.usage.values()) / GPU,
            "simulated": any(n.labels.get("gpushare.io/simulated") for n in ex.nodes),
            "build": {"capacity": sum(n.gpus for n in build),
                      "in_use": sum(r.milli for r in pool.store.slices()) / GPU,
                      "allowance": pool.build_allowance,
                      "nodes": [{"name": n.name, "gpus": n.gpus} for n in build]},
            **pool_gpus(handler)}


class QuotaHandler(PoolHandler):
    def get(self):
        store = self.pool.store
        counts = {s: 0 for s in STATES} | (store.state_counts(self.who.name)
                                           if self.who.kind == "user" else {})
        pending = store.pending_counts()
        self.reply({"user": self.who.name, "admin": self.who.admin,
                    "projects": [self.project_json(p, pending) for p in self.my_projects()],
                    "jobs": counts})


class JobsHandler(PoolHandler):
    def get(self):
        # Many clients poll the same lists: the answer only changes when the caller's jobs
        # change in the store or a cycle explains the queue differently, so it is kept
        # rendered, with its ETag, until then; a client that sends the ETag back gets 304.
        key = (*list_key(self.who, self.request.query_arguments), id(self.pool.store),
               self._jobs_version(), self.pool.scheduler.explained.version,
               self.pool.usage.meter.version)
        answer = _LISTS.get(key)
        if answer is None:
            answer = Rendered(self._list())
            if len(_LISTS) >= 512:
                _LISTS.clear()
            _LISTS[key] = answer
        self.set_header("Cache-Control", "private, no-cache")  # keep it, but ask each time
        answer.send(self)

    def _jobs_version(self) -> int:
        """The job book's version of what the query lists (book.py)."""
        book = self.pool.store.book
        if self.get_argument("all", None):
            return book.version_of()
        project = self.get_argument("project", None)
        if project is not None:
            return book.version_of(project=project)
        return book.version_of(user=self.who.name)

    def _list(self) -> str:
        store = self.pool.store
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
            rows = store.jobs(states=states, limit=limit)
        elif project is not None:
            row = store.project(project) if _PROJECT.match(project) else None
            if row is None:
                self.fail(400, f"there is no project {project!r}")
            if not self.member_of(row):
                self.fail(403, f"you are not a member of project {project}")
            rows = store.jobs(project=project, states=states, limit=limit)
        elif self.who.kind == "user":
            rows = store.jobs(user=self.who.name, states=states, limit=limit)
        else:
            rows = []  # a service has no jobs of its own
        texts = [self.job_text(r, self.who.is_user(r.user) or self.who.admin) for r in rows]
        return '{"jobs": [' + ", ".join(texts) + "]}"

    def job_text(self, row: JobRow, full: bool) -> str:
        """``job_json`` as JSON text, kept for the next list while neither the job (its
        row, as the job book hands it out) nor what the last cycle and the usage meter say
        of it changes: a list that changed in one job encodes that job only."""
        ex = self.pool.scheduler.explained
        says = (ex.positions.get(row.id) if row.state == "pending" else None,
                self.why_text(row, ex),
                self.pool.usage.meter.holder_now("job", f"{row.id}/{row.attempt}")
                if row.state == "running" else None)
        kept = _JOB_TEXTS.get((row.id, full))
        if kept is not None and kept[0] is row and kept[1] == says:
            return kept[2]
        text = json.dumps(self.job_json(row, full))
        if len(_JOB_TEXTS) >= 50_000:
            _JOB_TEXTS.clear()
        _JOB_TEXTS[(row.id, full)] = (row, says, text)
        return text

    async def post(self):
        if self.who.kind != "user":
            self.fail(403, "train jobs are submitted by users, not by services")
        try:
            spec = job_spec(self.body(), self.pool.max_job_size)
            spec["request_id"] = self._request_id(spec["request_id"])
            if spec["request_id"] is not None:  # a retry: the job the first try made
                row = self.pool.store.job_for_request(self.who.name, spec["request_id"])
                if row is not None:
                    return self._again(row, spec)
            project = self._project(spec.pop("project"), spec["gpus"], spec["priority"])
        except Invalid as e:
            self.fail(e.status, str(e))
        # Submits still being written count as waiting: a flood of concurrent ones must not
        # all pass the check before the first is stored.
        cap, user = self.pool.max_pending_per_user, self.who.name
        if (self.pool.store.state_counts(user).get("pending", 0)
                + self.pool.submitting[user]) >= cap:
            self.fail(429, f"you have {cap} jobs waiting, the most one user may; wait for some "
                           f"to start, or cancel some")
        self.pool.submitting[user] += 1
        try:
            row, created = await self.pool.submit(user, project, spec)
        finally:
            self.pool.submitting[user] -= 1
            if not self.pool.submitting[user]:
                del self.pool.submitting[user]
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
                 "command": self.pool.command_for(spec)}
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
            if len(mine) == 1:
                project = mine[0]
            elif not mine:
                raise Invalid("you are in no project; ask an admin to add you to the "
                              "JupyterHub group of one", 403)
            else:
                raise Invalid("you are in several projects (" + ", ".join(p.name for p in mine)
                              + "); say which with project")
        else:
            if not isinstance(name, str):
                raise Invalid("project must be a project name")
            project = self.pool.store.project(name)
            if project is None:
                raise Invalid(f"there is no project {name!r}; yours: "
                              + (", ".join(p.name for p in mine) or "none"))
            if not self.member_of(project):
                raise Invalid(f"you are not a member of project {name}", 403)
        capacity = self.pool.train_capacity()
        if gpus > capacity:
            raise Invalid(f"the job asks for {gpus // GPU} GPUs but the train pool has only "
                          f"{capacity // GPU}; ask for fewer")
        if project.limit is not None and gpus > project.limit:
            raise Invalid(f"the job asks for {gpus // GPU} GPUs but project {project.name} may "
                          f"use at most {project.limit / GPU:g}; ask for fewer")
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
        if row.state not in ("pending", "running"):
            self.fail(409, f"job {job_id} has already ended ({row.state})")
        row = await self.pool.scheduler.cancel(row)
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
            followers = self.pool.followers
            followers[self._following] -= 1
            if not followers[self._following]:
                del followers[self._following]
            self._following = None

    async def get(self, job_id):
        row = self.own_job(job_id)
        attempt = self.get_argument("attempt", None)
        if attempt is None:
            attempt = row.attempt
        else:
            try:
                attempt = int(attempt)
            except ValueError:
                self.fail(400, f"attempt must be a whole number, not {attempt!r}")
            if not 1 <= attempt <= row.attempt:
                self.fail(400, f"job {job_id} has attempts 1 to {row.attempt}")
        rank = self._rank(row, attempt)
        follow = self.get_argument("follow", "0") not in ("0", "", "false")
        if follow:
            followers, cap = self.pool.followers, self.pool.max_followers_per_user
            if followers.get(self.who.name, 0) >= cap:
                self.fail(429, f"you follow {cap} logs already, the most one user may; close "
                               f"one (or read without follow)")
            followers[self.who.name] = followers.get(self.who.name, 0) + 1
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
        backend, offset, pause = self.pool.backend, 0, 0.02
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
            row = self.pool.store.job(job_id)
            if not (row.state in ("pending", "running") and row.attempt == attempt
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
        if not text.isdigit() or len(text) > 6:
            self.fail(400, f"rank must be a whole number from 0, not {text!r}")
        rank = int(text)
        if rank == 0:
            return 0
        if attempt == row.attempt:
            placement = row.placement if row.state != "pending" else None
        else:
            placement = next((a.placement for a in self.pool.store.attempts(row.id)
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
        counts = self.pool.store.pending_counts()
        self.reply({"projects": [self.project_json(p, counts)
                                 for p in self.pool.store.projects()]})


class ProjectHandler(PoolHandler):
    def put(self, name):
        if not self.who.admin:
            self.fail(403, "only admins can change projects")
        try:
            project_name(name)
            current = self.pool.store.project(name)
            fields = project_update(self.body(), None if current is None else {
                "quota": current.quota, "limit": current.limit,
                "job_priority_min": current.job_priority_min,
                "job_priority_max": current.job_priority_max})
        except Invalid as e:
            self.fail(e.status, str(e))
        if "quota" in fields:
            others = sum(p.quota for p in self.pool.store.projects() if p.name != name)
            capacity = self.pool.train_capacity()
            if others + fields["quota"] > capacity:
                self.fail(409, f"quotas would add up to {(others + fields['quota']) / GPU:g} GPUs "
                               f"but the train pool has {capacity / GPU:g}; a guarantee that "
                               f"cannot be honoured is refused: lower another project's quota "
                               f"first")
        row = self.pool.store.update_project(name, fields, time.time()) if current else \
            self.pool.create_project(name, fields)
        self.pool.scheduler.wake()
        self.reply(self.project_json(row))


class SlicesHandler(PoolHandler):
    """Build slices, reserved by the spawner (a JupyterHub service) for notebook servers."""

    def get(self):
        mine = None if (self.who.admin or self.who.kind == "service") else self.who.name
        rows = self.pool.store.slices(user=mine)
        self.reply({"slices": [slice_json(r, self.pool) for r in rows]})

    def post(self):
        if not (self.who.admin or self.who.kind == "service"):
            self.fail(403, "build slices are reserved by the hub's spawner, not by users")
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
        placed = self.pool.reserve_slice(user, round(gpus * GPU), server)
        if isinstance(placed, SliceRefused):
            self.fail(409, str(placed))
        self.reply(slice_json(placed, self.pool), 201)


class SliceHandler(PoolHandler):
    def patch(self, slice_id):
        """The spawner says which process is the slice's notebook server (usage attribution)."""
        if not (self.who.admin or self.who.kind == "service"):
            self.fail(403, "build slices are changed by the hub's spawner, not by users")
        body = self.body()
        pid = body.get("pid") if isinstance(body, dict) else None
        if not isinstance(body, dict) or set(body) != {"pid"} or isinstance(pid, bool) or \
                not isinstance(pid, int) or not 0 < pid < 2**31:
            self.fail(400, "the body must be {\"pid\": N}, the notebook server's process id")
        row = self.pool.store.set_slice_pid(slice_id, pid)
        if row is None:
            self.fail(404, f"there is no slice {slice_id}")
        self.reply(slice_json(row, self.pool))

    def delete(self, slice_id):
        if not (self.who.admin or self.who.kind == "service"):
            self.fail(403, "build slices are released by the hub's spawner, not by users")
        row = self.pool.store.remove_slice(slice_id) if _ID.match(slice_id) else None
        if row is None:
            self.fail(404, f"there is no slice {slice_id}")
        self.reply(slice_json(row, self.pool))


def slice_json(row, pool) -> dict:
    """A slice as the API shows it; ``uuid`` names its GPU where the pool's machine can
    (pinned slices need it), else null."""
    return {"id": row.id, "user": row.user, "server": row.server, "gpus": row.milli / GPU,
            "node": row.node, "gpu": row.gpu, "uuid": pool.build_gpu_uuid(row.node, row.gpu),
            "created": row.created, "pid": row.pid,
            "usage": pool.usage.meter.holder_now("slice", row.id),
            "cull": pool.usage.culler.warning_of(row.id) if pool.usage.culler else None}


class MetricsHandler(PoolHandler):
    def get(self):
        if not self.who.admin:
            self.fail(403, "only admins can read the metrics")
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish(self.pool.metrics())


class Rendered:
    """An answer rendered once and sent to many requests: its body, the body gzipped (made
    at the first request that takes gzip), and their ETags, hashes of the body: equal tags,
    equal answers, whoever asks."""

    __slots__ = ("body", "etag", "_gzipped")

    def __init__(self, text: str):
        self.body = text.encode()
        self.etag = '"%s"' % hashlib.sha1(self.body).hexdigest()
        self._gzipped: bytes | None = None

    def send(self, handler: web.RequestHandler) -> None:
        """304 when the request names the answer it has (If-None-Match); gzipped when it takes
        gzip (a list of 100 jobs is about 40 kB, a tenth of that gzipped)."""
        gz = "gzip" in handler.request.headers.get("Accept-Encoding", "")
        handler.set_header("Vary", "Accept-Encoding")
        handler.set_header("Etag", self.etag[:-1] + '-gzip"' if gz else self.etag)
        if handler.check_etag_header():
            handler.set_status(304)
            handler.finish()
        elif gz:
            if self._gzipped is None:
                self._gzipped = gzip.compress(self.body, compresslevel=1, mtime=0)
            handler.set_header("Content-Encoding", "gzip")
            handler.finish(self._gzipped)
        else:
            handler.finish(self.body)


class OpenAPIHandler(web.RequestHandler):
    answer = Rendered(json.dumps(SPEC))  # it changes only with the code

    def get(self):
        self.set_header("Content-Type", "application/json")
        self.answer.send(self)


def routes(prefix: str) -> list:
    from .api_usage import ActivityHandler, SamplesHandler, UsageHandler
    p = prefix.rstrip("/")
    return [
        (rf"{p}/api/pool", PoolInfoHandler),
        (rf"{p}/api/quota", QuotaHandler),
        (rf"{p}/api/jobs", JobsHandler),
        (rf"{p}/api/jobs/([^/]+)", JobHandler),
        (rf"{p}/api/jobs/([^/]+)/logs", LogsHandler),
        (rf"{p}/api/projects", ProjectsHandler),
        (rf"{p}/api/projects/([^/]+)", ProjectHandler),
        (rf"{p}/api/slices", SlicesHandler),
        (rf"{p}/api/slices/([^/]+)", SliceHandler),
        (rf"{p}/api/usage", UsageHandler),
        (rf"{p}/api/samples", SamplesHandler),
        (rf"{p}/api/activity", ActivityHandler),
        (rf"{p}/metrics", MetricsHandler),
        (rf"{p}/api/openapi.json", OpenAPIHandler),
    ]


def _unstorable(value) -> str | None:
    """Why a parsed JSON body cannot be taken (too deep, or a string with a lone surrogate
    such as "\\ud800", which is no text any database holds), or None. Iterative, so that
    no nesting can exhaust the stack."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"the body nests deeper than {MAX_DEPTH} levels; send a flatter JSON object"
        if isinstance(item, dict):
            stack.extend((k, depth + 1) for k in item)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return ("the body has a string with a lone UTF-16 surrogate (\\ud800 to "
                        "\\udfff), which is not text; send valid Unicode")
    return None
