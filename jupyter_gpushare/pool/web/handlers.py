"""What every handler of the pool service shares: JSON errors, the identity JupyterHub gives
for the request's token, the caller's rights, bodies of bounded size and depth, answers rendered
once for many requests, and the service's parts, each by name from the application's settings
(the wiring, ``app.py``, puts them there).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import re

from jupyterhub.services.auth import HubAuthenticated, UserNotAllowed
from tornado import web

from ..hub import HubUnavailable
from ..store.models import JobRow, ProjectRow
from .identity import TooManyFailures, Who

MAX_DEPTH = 32  # nesting of a JSON body: specs are two levels deep
DRAIN_BYTES = 64 * 1024 * 1024  # a body up to this is read to its end, beyond the limit unkept
VERBS = ("get", "post", "put", "patch", "delete", "head", "options")
ID = re.compile(r"^[A-Za-z0-9._-]{1,64}\Z")  # job and slice ids (j-…, s-…)


class _Part:
    """A part of the service, given to the handlers in the application's settings under the
    attribute's own name."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, handler, owner=None):
        return self if handler is None else handler.settings[self.name]


def _after_the_body(method):
    """A handler's method, run once the body has been read: what ``prepare`` refused is
    answered first."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        if self._refusal is not None:
            raise self._refusal
        return method(self, *args, **kwargs)
    run.after_the_body = True
    return run


@web.stream_request_body
class ServiceHandler(HubAuthenticated, web.RequestHandler):
    """Every handler: JSON errors, the hub's identity for the token, the pool's view of the
    user, bodies of at most ``max_body_size`` bytes.

    The body is streamed: kept up to ``max_body_size``, and beyond it read to its end
    (``DRAIN_BYTES`` at most) but not kept, so that the answer, a 413 or a refusal, reaches
    the client whole through the hub's proxy. A server that answers before it has read the
    body must close the connection with the body unread, and the proxy then answers 503 (a
    retryable error) for the client's mistake. So ``prepare`` only keeps what it refuses, and
    the handler's method, which tornado calls once the body is in, answers it first."""

    who: Who
    _refusal: web.HTTPError | None = None
    _received = 0  # bytes of the body so far
    _kept = b""  # the body, while it is within max_body_size

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for verb in VERBS:
            method = vars(cls).get(verb)
            if method is not None and not getattr(method, "after_the_body", False):
                setattr(cls, verb, _after_the_body(method))

    # -- the service's parts, each by name from the settings (app.make_app) --------------
    store = _Part()  # store/database.py
    scheduler = _Part()  # train/scheduler.py
    backend = _Part()  # backends/
    build = _Part()  # the build pool: build/build_pool.py
    intake = _Part()  # submits: train/submits.py
    usage = _Part()  # GPU use, the culler and their options: utilization/service.py
    directory = _Part()  # what a user may do: web/identity.py
    tokens = _Part()  # whose a token is: web/identity.py
    follows = _Part()  # followed logs: web/log_follows.py
    job_lists = _Part()  # rendered job lists: web/job_lists.py

    def set_default_headers(self):
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")

    async def prepare(self):
        self._kept = bytearray()
        connection = self.request.connection
        if hasattr(connection, "set_max_body_size"):  # read it to its end (see the class)
            connection.set_max_body_size(max(DRAIN_BYTES, 4 * self.settings["max_body_size"]))
        try:
            await self._identify_caller()
        except web.HTTPError as e:
            self._refusal = e  # answered once the body is in

    async def _identify_caller(self) -> None:
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
            self.who = await self.directory.who(model)
        except HubUnavailable as e:
            raise web.HTTPError(503, reason=str(e)) from None

    def _unknown_verb(self, *args, **kwargs):
        raise web.HTTPError(405)  # as tornado answers, after a refusal of the caller

    def data_received(self, chunk: bytes) -> None:
        self._received += len(chunk)
        if self._received <= self.settings["max_body_size"]:
            self._kept += chunk

    async def identify(self) -> dict | None:
        """The hub's model of the token's owner, asked without blocking (HubAuth's own
        get_current_user would ask synchronously), checked against the service's scopes."""
        token = self.hub_auth.get_token(self, in_cookie=False)
        model = await self.tokens.identify(token, self.client_address()) if token else None
        if model is not None:
            try:
                model = self.check_hub_user(dict(model))
            except UserNotAllowed:
                model = None
        self._hub_auth_user_cache = model  # what get_current_user() returns from now on
        return model

    def client_address(self) -> str:
        """Where the request comes from: the address the hub's proxy saw (the last entry of
        X-Forwarded-For, which the proxy appends; earlier ones are the sender's to choose),
        else the peer's."""
        forwarded = self.request.headers.get("X-Forwarded-For", "")
        return forwarded.rsplit(",", 1)[-1].strip()[:64] or self.request.remote_ip or ""

    def via(self) -> str:
        """The door an admin's change came through, for the audit trail: "cli" where the
        gpushare command says so (its Gpushare-Via header), else "api"."""
        return "cli" if self.request.headers.get("Gpushare-Via") == "cli" else "api"

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
        retry = getattr(exc, "retry_after", None)
        if retry is not None:  # set here: tornado clears the headers before write_error
            self.set_header("Retry-After", str(retry))
        self.finish(json.dumps({"error": message}))

    def fail(self, status: int, message: str, retry_after: int | None = None):
        """Answer ``status`` with ``message``; ``retry_after``: when to ask again, in seconds
        (the Retry-After header)."""
        error = web.HTTPError(status, reason=message)
        error.retry_after = retry_after
        raise error

    def body(self):
        """The request's JSON body, or a 413 or 400 with a sentence: larger than
        ``max_body_size``, bytes that are not UTF-8, text that is not JSON, nesting deeper
        than MAX_DEPTH, text no store can hold."""
        limit = self.settings["max_body_size"]
        streamed = getattr(type(self), "_stream_request_body", False)
        if (self._received if streamed else len(self.request.body)) > limit:
            self.fail(413, f"the body is larger than {limit // 1024} KiB; send less (large "
                           f"code belongs in a file)")
        raw = (bytes(self._kept) if streamed else self.request.body) or b"null"
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
        return [p for p in self.store.quotas.projects() if self.member_of(p)]

    def spawner_only(self) -> None:
        """Build slices are the spawner's: only the JupyterHub service named
        ``c.PoolService.spawner_service`` (and admins) may list them all, reserve, change or
        release them. Any other service is refused, the node agent's above all: its token
        sits in a root pod on every GPU node."""
        spawner = self.settings["spawner_service"]
        if self.who.admin or (self.who.kind == "service" and self.who.name == spawner):
            return
        self.fail(403, f"only the hub's spawner (the JupyterHub service {spawner!r}) may list, "
                       f"reserve, change or release build slices")

    def own_job(self, job_id: str) -> JobRow:
        row = self.store.jobs.get(job_id) if ID.match(job_id) else None
        if row is None:
            self.fail(404, f"there is no job {job_id}")
        if not (self.who.is_user(row.user) or self.who.admin):
            self.fail(403, f"job {job_id} is not yours")
        return row


for _verb in VERBS:  # a verb a handler does not have: the caller's refusal first, then 405
    setattr(ServiceHandler, _verb, _after_the_body(ServiceHandler._unknown_verb))


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
