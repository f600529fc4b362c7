"""The one HTTP client of the pool service's REST API (see ``pool/web/openapi.py``).

Magics, the widget panel, the ``gpushare`` CLI and the jupyter_server extension all talk to the
pool through :class:`PoolClient`; this is the only module that knows a REST path. Standard
library only, so that it loads in any notebook kernel.

Every failure a user can meet is an exception whose ``str()`` is one sentence that says what to
do. The token is sent in a header and never appears in a sentence, a ``repr`` or a log.
"""

from __future__ import annotations

import argparse
import codecs
import functools
import gzip
import http.client
import json
import os
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Callable, Iterator

from . import __version__, trainjob

URL_VARIABLE = "GPUSHARE_URL"
TOKEN_VARIABLE = "JUPYTERHUB_API_TOKEN"
EXAMPLE_URL = "http://127.0.0.1:8000/services/gpushare/"
RETRY_VARIABLE = "GPUSHARE_RETRY"  # seconds reads and submits keep trying (default 60)
DEFAULT_RETRY_S = 60.0
RETRY_PAUSE_MAX_S = 2.0  # longest pause between two tries while the service is away


class ClientError(Exception):
    """A failure with one sentence for the user."""


class InvalidInput(ClientError, trainjob.BadField):
    """A job spec field (or the URL) the server would refuse; found before sending.

    ``field`` is the spec field and ``problem`` the sentence without it, so that a front end can
    name its own option: the CLI says ``--gpus: must be 1 or more, not 0``."""


class NoCredentials(ClientError):
    """No service address or no token: says which environment variable (or option) to set."""

    def __init__(self, missing: str, *, detail: str = ""):
        self.missing = missing  # "url" or "token"
        self.variable = URL_VARIABLE if missing == "url" else TOKEN_VARIABLE
        self.detail = detail
        super().__init__(self.sentence())

    def sentence(self, option: str | None = None) -> str:
        """The sentence, naming ``option`` (e.g. ``--url``) as the other way to give the value."""
        option = option or f"{self.missing}=..."
        if self.detail:
            return f"{self.detail}; give the right one in {self.variable} or {option}"
        if self.missing == "url":
            return (f"no pool service address: set {URL_VARIABLE} (e.g. {EXAMPLE_URL}) "
                    f"or pass {option}")
        return (f"no JupyterHub token: set {TOKEN_VARIABLE} (JupyterHub sets it in your notebook "
                f"server; elsewhere make one on the hub's Token page) or pass {option}")


class PoolUnreachable(ClientError):
    """The service (or the hub in front of it) cannot be reached or did not answer."""


class PoolError(ClientError):
    """The service answered with an error: ``status`` and the server's sentence; and, where
    it said when to ask again (``Retry-After``, seconds), ``retry_after``."""

    def __init__(self, status: int, message: str, retry_after: float | None = None):
        self.status, self.message, self.retry_after = status, message, retry_after
        super().__init__(message)


# -- job specs ----------------------------------------------------------------------------------
# The rules of trainjob.py, which validate.py checks too, with the server's sentences: a
# wrong value is refused before a request, and the server stays the authority. Front ends give
# text, so numbers may come as "3" or 3.0 here.

def _refused(check: Callable) -> Callable:
    """``check`` raising InvalidInput, the client's error, where the rule says BadField."""
    @functools.wraps(check)
    def checked(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        except InvalidInput:
            raise
        except trainjob.BadField as e:
            raise InvalidInput(e.field, e.problem, message=str(e)) from None
    return checked


def _whole(value) -> int | None:
    """``value`` as an int if it is a whole number (``3``, ``3.0``, ``" 3 "``), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def _shown(value) -> str:
    """A value as the server would show it: a number typed as text shows as the number."""
    if isinstance(value, str):
        try:
            float(value)
            return value.strip()
        except ValueError:
            pass
    return repr(value)


@_refused
def check_gpus(value) -> int:
    """A train job's GPUs: a whole number, 1 or more (fractions are for build slices)."""
    number = _whole(value)
    return trainjob.check_gpus(value if number is None else number, _shown(value))


@_refused
def check_priority(value) -> int:
    number = _whole(value)
    return trainjob.check_priority(value if number is None else number, _shown(value))


check_name = _refused(trainjob.check_name)
check_workdir = _refused(trainjob.check_workdir)


@_refused
def parse_env(items) -> dict[str, str]:
    """``["K=V", ...]`` (or a mapping) to a dict; refuses entries without ``=``, bad names and
    the variables the pool sets itself."""
    if isinstance(items, dict):
        pairs = list(items.items())
    else:
        pairs = []
        for item in items or ():
            name, sep, value = str(item).partition("=")
            if not sep:
                raise InvalidInput("env", f"entries must be NAME=VALUE, not {item!r}")
            pairs.append((name, value))
    for name, value in pairs:
        trainjob.check_env_variable(name, value)
    return dict(pairs)


def argument_type(check):
    """An argparse ``type`` from one of the checks above (for the CLI and the magics): its
    sentence, without the field's name, which argparse adds."""
    def convert(text):
        try:
            return check(text)
        except InvalidInput as e:
            raise argparse.ArgumentTypeError(e.problem) from None
    return convert


def add_job_options(parser) -> None:
    """The options of a train job that the CLI's ``submit`` and the magics share."""
    parser.add_argument("--gpus", type=argument_type(check_gpus), default=1, metavar="N",
                        help="whole GPUs, started all at once (default 1)")
    parser.add_argument("--project", metavar="P", help="the project whose quota it uses "
                        "(default: your only project)")
    parser.add_argument("--name", type=argument_type(check_name), metavar="NAME",
                        help="a name to find the job by")
    parser.add_argument("--priority", type=argument_type(check_priority), metavar="P",
                        help="-100 to 100 within your project (default 0)")
    parser.add_argument("--env", type=argument_type(lambda text: parse_env([text])),
                        action="append", default=[], metavar="K=V",
                        help="an environment variable for the job; repeat for more")
    parser.add_argument("--per-gpu", action="store_true",
                        help="run one rank per GPU (each with its LOCAL_RANK) instead of one "
                        "per node (torchrun-style)")


def job_spec(command=None, *, source: str | None = None, gpus=1, project: str | None = None,
             name: str | None = None, priority=None, env=None, workdir: str | None = None,
             path: str | None = None, per_gpu: bool = False) -> dict:
    """Build (and check) the JSON body of ``POST api/jobs`` from front-end arguments.

    ``command`` is a list of words to run, or ``source`` Python code; exactly one of them.
    ``workdir`` is the absolute directory it runs in (default: the user's home). ``path`` is
    the submitter's ``PATH`` (front ends pass their own), so that ``python`` in the job is the
    ``python`` of the terminal or kernel that sent it; a ``PATH`` in ``env`` wins. ``per_gpu``
    runs one rank per GPU instead of one per node."""
    if isinstance(command, tuple):
        command = list(command)
    _refused(trainjob.check_program)(command, source)
    spec: dict = {"source": source} if source is not None else {"command": list(command)}
    spec["gpus"] = check_gpus(gpus)
    if project is not None:
        spec["project"] = project
    if name is not None:
        spec["name"] = check_name(name)
    if priority is not None:
        spec["priority"] = check_priority(priority)
    env = parse_env(env) if env else {}
    if path and "PATH" not in env:
        env.update(parse_env({"PATH": path}))
    if env:
        spec["env"] = env
    if workdir is not None:
        spec["workdir"] = check_workdir(workdir)
    if not isinstance(per_gpu, bool):
        raise InvalidInput("per_gpu", f"must be True or False, not {per_gpu!r}")
    if per_gpu:
        spec["per_gpu"] = True
    return spec


# -- the client ---------------------------------------------------------------------------------

class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are answered, not followed: urllib would carry the token to the new address,
    and the hub redirects to its login page when it does not accept a token."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def display_url(url: str) -> str:
    """The address without user-info, query or fragment, safe to show in a sentence."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return urllib.parse.urlunsplit((parts.scheme, host + port, parts.path, "", ""))


class PoolClient:
    """Talks to the pool service at ``url`` with a JupyterHub ``token``.

    ``url`` defaults to ``$GPUSHARE_URL`` (e.g. ``http://127.0.0.1:8000/services/gpushare/``, the
    trailing slash optional) and ``token`` to ``$JUPYTERHUB_API_TOKEN``. Nothing is checked until
    the first request, so a client can be made where the environment is not set up yet; a request
    without them raises :class:`NoCredentials`. ``timeout`` (seconds) bounds connecting and each
    wait for data, except while following a job's logs, which may be quiet for hours.
    """

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0,
                 retry_s: float | None = None, on_retry: Callable[[str], None] | None = None,
                 via: str | None = None):
        """``retry_s``: how long reads and submits keep trying while the service cannot be
        reached (a restart takes a few seconds), with a pause that grows from 0.1 s to
        ``RETRY_PAUSE_MAX_S``; 0 tries once; default ``$GPUSHARE_RETRY``, else 60.
        ``on_retry(sentence)`` hears, once per outage, that the service is not answering
        and is being tried again. ``via``: "cli" from the gpushare command, so that the
        audit trail says which door an admin's change came through."""
        self.via = via
        self._url_from = "the URL" if url else URL_VARIABLE
        self._url = url if url else os.environ.get(URL_VARIABLE, "")
        self._token = token if token else os.environ.get(TOKEN_VARIABLE, "")
        self.timeout = timeout
        self.retry_s = _retry_from_environment() if retry_s is None else retry_s
        self.on_retry = on_retry
        self._opener = urllib.request.build_opener(_NoRedirect())
        # The last answer to each polled query with its ETag: asked again with
        # If-None-Match, an unchanged list comes back as 304, without a body to send or parse.
        self._answers: dict[str, tuple[str, bytes]] = {}

    def __repr__(self):
        return f"PoolClient({self.url!r})"

    @property
    def url(self) -> str:
        """The service's base address, ending in ``/``, without query or fragment; or ``""``."""
        url = self._url.strip()
        if not url:
            return ""
        parts = urllib.parse.urlsplit(url)
        path = parts.path if parts.path.endswith("/") else parts.path + "/"
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))

    # The API: one method per path, grouped by resource; the paths live here and nowhere else.

    # -- the pool and your quota -------------------------------------------------------------
    def pool(self) -> dict:
        """The train pool: ``capacity``, ``in_use`` (GPUs), ``simulated``, ``nodes``."""
        return self._json("GET", "api/pool")

    def quota(self) -> dict:
        """Your ``projects`` with quota and use, and your job counts by state (``jobs``)."""
        return self._json("GET", "api/quota")

    # -- jobs --------------------------------------------------------------------------------
    def jobs(self, project: str | None = None, all: bool = False, state: str | None = None,
             limit: int | None = None) -> list[dict]:
        """Your jobs; a project's queue (members); every job (``all``, admins). Newest first,
        at most ``limit`` (the server's default 100, at most 1000)."""
        query = {"project": project, "all": "1" if all else None, "state": state,
                 "limit": None if limit is None else str(limit)}
        return self._json("GET", "api/jobs", query=query, revalidate=True)["jobs"]

    def submit(self, spec: dict, request_id: str | None = None) -> dict:
        """Submit a train job (see :func:`job_spec`); returns the job, with its ``reason``.

        The submit carries a key (``request_id``, or one made here) in the
        ``Idempotency-Key`` header, so it is retried through a restart of the service: a try
        that reached the service before it died gets its job back, and no second job is
        made. Pass the same ``request_id`` to submit again safely from a new process."""
        key = request_id or spec.get("request_id") or str(uuid.uuid4())
        return self._json("POST", "api/jobs", body=spec, headers={"Idempotency-Key": key},
                          retry=True)

    def job(self, job_id: str) -> dict:
        return self._json("GET", f"api/jobs/{_segment(job_id)}")

    def cancel(self, job_id: str) -> dict:
        return self._json("DELETE", f"api/jobs/{_segment(job_id)}")

    def logs(self, job_id: str, follow: bool = False, attempt: int | None = None,
             rank: int | None = None) -> Iterator[str]:
        """The job's output as text chunks, as they arrive.

        ``attempt`` defaults to the job's current one, ``rank`` to 0 (a job with several ranks,
        its ``ranks``, has a log for each). With ``follow`` the server keeps the response open
        and sends output until that attempt ends (the job ends or is requeued as the next
        attempt); the iterator ends when the server closes it. The request is made at the first
        ``next()``.
        """
        query = {"follow": "1" if follow else None,
                 "attempt": str(attempt) if attempt is not None else None,
                 "rank": str(rank) if rank else None}
        path = f"api/jobs/{_segment(job_id)}/logs"
        with self._retrying(lambda: self._open("GET", path, query=query), True) as response:
            if follow:
                _wait_forever(response)
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            while True:
                data = self._read(response, path, chunk=True)
                if not data:
                    break
                text = decoder.decode(data)
                if text:
                    yield text
            tail = decoder.decode(b"", final=True)
            if tail:
                yield tail

    # -- projects (admins change them) -------------------------------------------------------
    def projects(self) -> list[dict]:
        return self._json("GET", "api/projects")["projects"]

    def departments(self) -> list[dict]:
        return self._json("GET", "api/departments")["departments"]

    # build slices: only the hub's spawner (a service) or an admin reserves and releases

    def update_project(self, name: str, **fields) -> dict:
        """Change a project (admins): ``quota``, ``over_quota_weight``, ``limit``, ``priority``,
        ``groups``. Quotas are in GPUs; ``limit=None`` removes the limit."""
        return self._json("PUT", f"api/projects/{_segment(name)}", body=fields)

    # -- the admins' console: the audit trail, drained nodes ----------------------------------
    def audit(self, since: str | None = None, limit: int | None = None,
              before: int | None = None) -> dict:
        """The audit trail, newest first (admins): ``entries`` and ``next``, the ``before``
        that asks for the page after this one (None: there is none)."""
        query = {"since": since, "limit": None if limit is None else str(limit),
                 "before": None if before is None else str(before)}
        return self._json("GET", "api/audit", query=query)

    def set_drained(self, node: str, drained: bool, requeue: bool = False) -> dict:
        """Drain a train node (no new job starts there; with ``requeue``, the jobs that run
        there are preempted and requeued) or undrain it (admins)."""
        body = {"drained": drained, **({"requeue": True} if requeue else {})}
        return self._json("PUT", f"api/nodes/{_segment(node)}", body=body)

    # -- build slices (the hub's spawner) ----------------------------------------------------
    def reserve_slice(self, user: str, gpus: float, server: str) -> dict:
        return self._json("POST", "api/slices", body={"user": user, "gpus": gpus, "server": server})

    def release_slice(self, slice_id: str) -> dict:
        return self._json("DELETE", f"api/slices/{_segment(slice_id)}")

    def slices(self) -> list[dict]:
        return self._json("GET", "api/slices")["slices"]

    def set_slice_pid(self, slice_id: str, pid: int) -> dict:
        """Tell the pool which process is the slice's notebook server (the spawner)."""
        return self._json("PATCH", f"api/slices/{_segment(slice_id)}", body={"pid": pid})

    # -- GPU use -----------------------------------------------------------------------------
    def usage(self, since: str | None = None, until: str | None = None, by: str | None = None,
              step: str | None = None, sort: str | None = None, limit: int | None = None
              ) -> dict:
        """Allocation and utilization over a window (``since`` e.g. "7d", "12h", epoch seconds
        or ISO 8601; ``until`` default now) by project, user, job, slice or gpu (admins)."""
        query = {"since": since, "until": until, "by": by, "step": step, "sort": sort,
                 "limit": None if limit is None else str(limit)}
        return self._json("GET", "api/usage", query=query)

    def history(self, since: str | None = None, until: str | None = None,
                limit: int | None = None, after: str | None = None) -> dict:
        """One page of the recorded train jobs as trace lines (admins): ``jobs``, ``next``
        (give it as ``after`` for the next page, None on the last), ``settings``."""
        query = {"since": since, "until": until, "after": after,
                 "limit": None if limit is None else str(limit)}
        return self._json("GET", "api/history", query=query)

    def whole_history(self, since: str | None = None, until: str | None = None) -> dict:
        """Every page of :meth:`history`, its ``jobs`` joined."""
        first = page = self.history(since, until, limit=10_000)
        jobs = list(page["jobs"])
        while page.get("next"):
            page = self.history(str(first["since"]), str(first["until"]), limit=10_000,
                                after=page["next"])
            jobs += page["jobs"]
        return {**first, "jobs": jobs, "next": None}

    def start_whatif(self, since: str, until: str | None = None, capacity: str | None = None,
                     quotas: dict | None = None) -> dict:
        """Start a replay of the history in the service (admins); :meth:`whatif` follows it."""
        body = {"since": since, **({"until": until} if until else {}),
                **({"capacity": capacity} if capacity else {}),
                **({"quotas": quotas} if quotas else {})}
        return self._json("POST", "api/whatif", body=body)

    def whatif(self, run_id: str) -> dict:
        return self._json("GET", f"api/whatif/{_segment(run_id)}")

    def cancel_whatif(self, run_id: str) -> dict:
        """Cancel a running replay (admins): its worker is killed and the next may start."""
        return self._json("DELETE", f"api/whatif/{_segment(run_id)}")

    def post_samples(self, reading: dict, node_token: str = "") -> dict:
        """A node agent's reading of its GPUs (only an agent's service token may), with the
        agent pod's service-account token that proves its node where it has one."""
        headers = {"Gpushare-Node-Token": node_token} if node_token else None
        return self._json("POST", "api/samples", body=reading, headers=headers)

    def report_kernels(self, server: str, kernels: int, busy: int) -> None:
        """A notebook server says how many of its kernels are busy (culling spares it then)."""
        with self._open("POST", "api/activity", body={"server": server, "kernels": kernels,
                                                      "busy": busy}) as response:
            self._read(response, "api/activity")

    # -- this notebook server's own routes (the server extension) ----------------------------
    def slice(self) -> dict:
        """A notebook server's build slice and its slice watchdog's latest report
        (``slice``, ``watchdog``, ``watchdog_off``). Only the server extension answers it: give
        this client the server's address, ``{server}/gpushare/``, where the extension serves
        the pool's paths as well (``notebook/serverext.py``)."""
        return self._json("GET", "api/slice")

    # -- the API's own description -----------------------------------------------------------
    def openapi(self) -> dict:
        """The service's OpenAPI document (needs no token)."""
        return self._json("GET", "api/openapi.json", auth=False)

    # -- HTTP -------------------------------------------------------------------------------
    def _json(self, method, path, *, query=None, body=None, auth=True, headers=None,
              retry=None, revalidate=False):
        """One call; reads (and submits, which carry a key) are tried again while the
        service cannot be reached, for up to ``retry_s``. ``revalidate`` (a GET polled
        often): the last answer is kept with its ETag, and the service's 304 says to use it
        again."""
        key = f"{path}?{sorted((query or {}).items())}" if revalidate else None
        seen = self._answers.get(key) if key else None
        headers = {**(headers or {}), "Accept-Encoding": "gzip"}
        if seen is not None:
            headers["If-None-Match"] = seen[0]

        def call():
            with self._open(method, path, query=query, body=body, auth=auth,
                            headers=headers) as response:
                if response.status == 304 and seen is not None:
                    return 304, None
                return response.status, self._read(response, path), response.headers

        answer = self._retrying(call, method == "GET" if retry is None else retry)
        if answer[0] == 304:
            return json.loads(seen[1])  # parsed anew: the caller may change what it gets
        status, data, response_headers = answer
        try:
            if response_headers.get("Content-Encoding") == "gzip":
                data = gzip.decompress(data)
            value = json.loads(data)
        except (ValueError, OSError, EOFError):  # not JSON, or not gzip after all
            raise PoolError(status, self._not_the_service(
                f"answered {path} with something that is not JSON")) from None
        etag = response_headers.get("Etag")
        if key and etag and status == 200:
            if len(self._answers) >= 32 and key not in self._answers:
                self._answers.clear()
            self._answers[key] = (etag, data)
        return value

    def _retrying(self, call, retry: bool):
        """``call()``, tried again while the service cannot be reached (PoolUnreachable:
        refused, reset, or 502/503/504 from the hub's proxy) until ``retry_s`` is over."""
        deadline, pause, told = time.monotonic() + self.retry_s, 0.1, False
        while True:
            try:
                return call()
            except PoolUnreachable:
                left = deadline - time.monotonic()
                if not retry or left <= 0:
                    raise
                if not told and self.on_retry is not None:
                    self.on_retry(f"the pool service is not answering (it may be restarting);"
                                  f" trying again for up to {self.retry_s:g} s")
                    told = True
                time.sleep(min(pause, left))
                pause = min(pause * 2, RETRY_PAUSE_MAX_S)

    def _open(self, method, path, *, query=None, body=None, auth=True, headers=None):
        base = self._base()
        url = base + path
        query = {k: v for k, v in (query or {}).items() if v is not None}
        if query:
            url += "?" + urllib.parse.urlencode(query)
        headers = {"Accept": "application/json", "User-Agent": f"jupyter-gpushare/{__version__}",
                   **({"Gpushare-Via": self.via} if self.via else {}), **(headers or {})}
        if auth:
            headers["Authorization"] = f"token {self._checked_token()}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            return self._opener.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            if e.code == 304 and "If-None-Match" in headers:
                return e  # not modified: the caller has the answer already
            with e:
                raise self._error(e.code, e.reason, e.headers, path, self._read(e, path)) \
                    from None
        except urllib.error.URLError as e:
            raise self._unreachable(e.reason) from None
        except (OSError, http.client.HTTPException) as e:
            raise self._unreachable(e) from None

    def _read(self, response, path, chunk=False) -> bytes:
        try:
            return response.read1(65536) if chunk else response.read()
        except (OSError, http.client.HTTPException) as e:
            raise self._unreachable(e, during=path) from None

    def _base(self) -> str:
        url = self.url
        if not url:
            raise NoCredentials("url")
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise NoCredentials("url", detail=f"{self._url_from} {display_url(url)!r} is not an "
                                f"http:// or https:// address like {EXAMPLE_URL}")
        return url

    def _checked_token(self) -> str:
        token = self._token.strip()
        if not token:
            raise NoCredentials("token")
        # A bad character would make http.client raise an error that quotes the header,
        # token included; refuse it here without showing it.
        if not all(33 <= ord(c) < 127 for c in token):
            raise NoCredentials("token", detail="the token has spaces, control or non-ASCII "
                                "characters, so it is not a JupyterHub token")
        return token

    def _unreachable(self, why, during: str | None = None) -> PoolUnreachable:
        where = display_url(self.url)
        if during:
            return PoolUnreachable(f"the connection to the pool service at {where} broke while "
                                   f"reading {during} ({_words(why)}); try again")
        return PoolUnreachable(f"the pool service at {where} cannot be reached ({_words(why)}); "
                               f"is JupyterHub running and {self._url_from} right?")

    def _error(self, status, reason, headers, path, data) -> ClientError:
        message = None
        if "json" in (headers.get("Content-Type") or ""):
            try:
                message = json.loads(data).get("error")
            except (ValueError, AttributeError):
                message = None
        if isinstance(message, str) and message.strip():
            if status == 503:  # the service cannot ask the hub now: passes, like a restart
                return PoolUnreachable(" ".join(message.split()))
            return PoolError(status, " ".join(message.split()),
                             _seconds(headers.get("Retry-After")))
        # Not the service's own words: the hub, its proxy or something else answered.
        if 300 <= status < 400:
            location = headers.get("Location") or ""
            if "/login" in location:
                return PoolError(401, f"the hub did not accept the token (it redirected to its "
                                 f"login page); check {TOKEN_VARIABLE} or make a new token")
            return PoolError(status, self._not_the_service(
                f"redirected {path} to {display_url(urllib.parse.urljoin(self.url, location))}"))
        if status in (401, 403):
            return PoolError(status, f"the hub did not accept the token (HTTP {status}); check "
                             f"{TOKEN_VARIABLE} or make a new token")
        if status == 404:
            return PoolError(status, self._not_the_service(f"has no {path} (HTTP 404)"))
        if status in (502, 503, 504):
            return PoolUnreachable(f"the pool service at {display_url(self.url)} is not "
                                   f"answering (HTTP {status} {reason} from the hub); is the "
                                   f"gpushare service running?")
        return PoolError(status, f"the pool service at {display_url(self.url)} answered HTTP "
                         f"{status} {reason}; see the hub's log")

    def _not_the_service(self, what: str) -> str:
        return (f"{display_url(self.url)} {what}; is {self._url_from} the pool service's "
                f"address, like {EXAMPLE_URL}?")


def _retry_from_environment() -> float:
    try:
        value = float(os.environ.get(RETRY_VARIABLE, DEFAULT_RETRY_S))
    except ValueError:
        return DEFAULT_RETRY_S
    return value if 0 <= value <= 3600 else DEFAULT_RETRY_S


def _segment(value) -> str:
    return urllib.parse.quote(str(value), safe="")


def _wait_forever(response) -> None:
    """Followed logs may be quiet for hours: no read timeout once the answer has begun."""
    sock = getattr(getattr(response.fp, "raw", None), "_sock", None)
    if isinstance(sock, socket.socket):
        sock.settimeout(None)


def _words(error) -> str:
    """A short lower-case phrase for a network error; never its repr."""
    if isinstance(error, str):
        return error
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, (TimeoutError, socket.timeout)):
        return "no answer in time"
    if isinstance(error, socket.gaierror):
        return "unknown host name"
    if isinstance(error, ssl.SSLCertVerificationError):
        return f"TLS certificate not trusted: {error.verify_message}"
    if isinstance(error, ssl.SSLError):
        return "TLS failed"
    if isinstance(error, (ConnectionResetError, http.client.RemoteDisconnected)):
        return "the connection was closed"
    if isinstance(error, http.client.IncompleteRead):
        return "the answer was cut short"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror[:1].lower() + error.strerror[1:]
    return type(error).__name__


def _seconds(value) -> float | None:
    """A ``Retry-After`` header given in seconds (at most a day), or None."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if 0 <= seconds <= 86400 else None
