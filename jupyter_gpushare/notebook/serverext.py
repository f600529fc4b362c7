"""The jupyter_server extension: the pool's REST API, forwarded, under ``/gpushare/api/``.

The browser (the JupyterLab extension) talks to its own notebook server, which it is logged in
to; the server calls the pool with *its* JupyterHub token, so the browser never holds a hub
token. Every handler needs the server's own authentication, and POST and DELETE from a browser
need jupyter_server's ``_xsrf`` token as every other Jupyter API does. Whoever may use this
server acts on the pool as the server's owner, as they already can from a terminal.

Routes (answers as the pool's, see ``pool/web/openapi.py``): ``GET api/pool``, ``GET api/quota``,
``GET|POST api/jobs``, ``GET|DELETE api/jobs/{id}``, ``GET api/jobs/{id}/logs`` (``?follow=1``
streams), ``GET api/projects``; and ``GET api/slice``: this server's build slice, the slice
watchdog's latest report, and the pool's record of the slice (``pool``: its GPU use now and
over the last hour, and the culling warning). The pool's refusals come back with its status and sentence, as
``{"error": ...}``; a pool that cannot be reached is a 502.

The HTTP goes through :class:`~jupyter_gpushare.client.PoolClient` (the one place that knows
the pool's paths), in threads, so that a slow pool never blocks the server.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from http.client import responses

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.ioloop import IOLoop, PeriodicCallback
from tornado.iostream import StreamClosedError
from traitlets import Float, Instance, Integer, Unicode, default
from traitlets.config import LoggingConfigurable

from .. import client as pool_client
from ..client import (RETRY_PAUSE_MAX_S, ClientError, NoCredentials, PoolClient, PoolError,
                      PoolUnreachable)
from ..gpus import Inventory, NVMLInventory
from .activity import KernelActivity
from .watchdog import BuildSlice, SliceWatchdog

AUTH_RESOURCE = "gpushare"
NO_SLICE = ("This server has no build slice: a CPU-only profile, or a server not started by "
            "the gpushare spawners.")


class GPUShareExtension(LoggingConfigurable):
    """Settings of the notebook server's gpushare extension (``c.GPUShareExtension.*`` in
    ``jupyter_server_config.py``; the defaults come from what the hub's spawner sets)."""

    pool_url = Unicode(help="""
        The pool service's address, e.g. http://127.0.0.1:8000/services/gpushare/.
        Default: $GPUSHARE_URL, which the gpushare spawners set.
        """).tag(config=True)

    pool_token = Unicode(help="""
        The JupyterHub token this server calls the pool with. Default: $JUPYTERHUB_API_TOKEN,
        the server's own token (its scopes must include access:services!service=gpushare; see
        c.Spawner.server_token_scopes). Never sent to the browser. Leave it to the environment:
        jupyter_server logs its configuration at debug level.
        """).tag(config=True)

    request_timeout = Float(30.0, min=1.0, help="""
        Seconds to wait for the pool to connect and answer (followed logs excepted).
        """).tag(config=True)

    retry_timeout = Float(10.0, min=0.0, help="""
        Seconds a read or a submit keeps trying while the pool service is not answering (it
        is back within seconds of a crash), before the browser gets a 502. Submits carry the
        browser's Idempotency-Key (or one made here), so a retry never makes a second job.
        """).tag(config=True)

    max_log_followers = Integer(16, min=1, help="""
        Streams of followed logs (GET api/jobs/{id}/logs?follow=1) this server serves at once;
        each holds a thread until its job's attempt ends. More are refused with a 503.
        """).tag(config=True)

    watchdog_interval = Float(10.0, min=0.0, help="""
        Seconds between two samples of this server's GPU memory by the slice watchdog, which
        warns (server log, api/slice, the %gpushare panel) when the server's processes use
        more than their build slice. 0 turns it off. It is off anyway without a build slice
        ($GPUSHARE_SLICE_GPUS) or without NVML.
        """).tag(config=True)

    activity_interval = Float(30.0, min=0.0, help="""
        Seconds between two reports of this server's kernels (how many, how many busy) to the
        pool, which never culls a server with a busy kernel; busy kernels also count as
        activity in the hub's records. 0 turns the reports off. Only servers with a build
        slice report.
        """).tag(config=True)

    inventory = Instance(Inventory, help="""
        Where the watchdog reads GPU memory: NVML by default. A
        jupyter_gpushare.gpus.SimulatedInventory stands in on machines without GPUs.
        """).tag(config=True)

    @default("pool_url")
    def _pool_url(self):
        return os.environ.get(pool_client.URL_VARIABLE, "")

    @default("pool_token")
    def _pool_token(self):
        return os.environ.get(pool_client.TOKEN_VARIABLE, "")

    @default("inventory")
    def _inventory(self):
        return NVMLInventory()

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        # Retries wait in GPUShareHandler.pool, on the event loop, not in the client's thread.
        self.client = PoolClient(self.pool_url or None, self.pool_token or None,
                                 timeout=self.request_timeout, retry_s=0)
        self.told_retrying = False
        self.executor = ThreadPoolExecutor(8, thread_name_prefix="gpushare-pool")
        self.following = 0  # streams of followed logs now
        self._following_lock = threading.Lock()
        self.slice: BuildSlice | None = None
        self.watchdog: SliceWatchdog | None = None
        self.watchdog_off: str | None = None
        self.activity: KernelActivity | None = None  # started with the server, with a slice
        self._timer: PeriodicCallback | None = None
        try:
            self.slice = BuildSlice.from_environment()
        except ValueError as e:
            self.watchdog_off = str(e)
            self.log.warning("gpushare: %s", e)
        if self.slice is None:
            self.watchdog_off = self.watchdog_off or NO_SLICE
        elif self.slice.unwatched():
            self.watchdog_off = self.slice.unwatched()
        elif not self.watchdog_interval:
            self.watchdog_off = "The slice watchdog is turned off " \
                                "(c.GPUShareExtension.watchdog_interval = 0)."
        else:
            self.watchdog = SliceWatchdog(self.inventory, self.slice, os.getpid(), log=self.log)

    def start_watchdog(self) -> None:
        """Sample now and then every ``watchdog_interval`` seconds; stay off if the first
        sample cannot be taken (no NVML, a GPU not found): that will not change."""
        if self.watchdog is None or self._timer is not None:
            return
        self._timer = PeriodicCallback(self._check, self.watchdog_interval * 1000)
        IOLoop.current().add_callback(self._first_check)

    def stop_watchdog(self) -> None:
        if self._timer is not None:
            self._timer.stop()

    async def _first_check(self):
        report = await self._check()
        if report["problem"]:
            self.watchdog_off = report["message"]
            self.log.info("gpushare: %s The watchdog is off.", report["message"])
        else:
            self._timer.start()

    async def _check(self) -> dict:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self.watchdog.check)

    def take_follower(self) -> bool:
        with self._following_lock:
            if self.following >= self.max_log_followers:
                return False
            self.following += 1
            return True

    def give_follower(self) -> None:
        with self._following_lock:
            self.following -= 1

    def slice_json(self) -> dict:
        watchdog = self.watchdog.latest if self.watchdog else None
        return {"slice": self.slice.json() if self.slice else None,
                "watchdog": watchdog, "watchdog_off": self.watchdog_off,
                "interval": self.watchdog_interval}


class Failed(web.HTTPError):
    """A refusal with one sentence for the caller."""

    def __init__(self, status: int, sentence: str):
        super().__init__(status)
        self.sentence = sentence


class GPUShareHandler(APIHandler):
    """Common to every route: the extension, calls to the pool in threads, JSON errors.

    Every method is ``@web.authenticated`` and ``@authorized`` on the resource
    ``gpushare``: reading is ``read``, cancelling ``write``, submitting ``execute`` (a job
    runs code as the server's owner), so a server whose Authorizer lets someone only read
    (a shared, read-only view) never lets them submit or cancel."""

    auth_resource = AUTH_RESOURCE

    @property
    def _track_activity(self) -> bool:
        # The panels poll these routes every few seconds: reading is not the user's activity,
        # or an open Lab tab would keep an idle server from being culled. Submitting and
        # cancelling are.
        return self.request.method not in ("GET", "HEAD")

    @property
    def gpushare(self) -> GPUShareExtension:
        return self.settings["gpushare"]

    async def pool(self, call, retry: bool = True):
        """``call(client)`` in a thread; the client's errors become answers. While the pool
        service is not answering (it is back within seconds of a crash), a read or a submit
        is tried again for up to ``retry_timeout``, waiting here on the event loop rather
        than in a thread: a server being stopped leaves no thread behind to wait for."""
        ext = self.gpushare
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + (ext.retry_timeout if retry else 0.0), 0.1
        while True:
            try:
                answer = await loop.run_in_executor(ext.executor, lambda: call(ext.client))
                ext.told_retrying = False
                return answer
            except PoolUnreachable as e:
                left = deadline - loop.time()
                if left <= 0:
                    raise failure(e) from None
                if not ext.told_retrying:  # once per outage
                    ext.log.warning("gpushare: the pool service is not answering (it may be "
                                    "restarting); trying again for up to %g s",
                                    ext.retry_timeout)
                    ext.told_retrying = True
                await asyncio.sleep(min(pause, left))
                pause = min(pause * 2, RETRY_PAUSE_MAX_S)
            except ClientError as e:
                raise failure(e) from None

    def reply(self, obj, status: int = 200):
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj))

    def write_error(self, status_code, **kwargs):
        exc = kwargs.get("exc_info", (None, None, None))[1]
        sentence = getattr(exc, "sentence", None)
        if sentence is None and isinstance(exc, web.HTTPError):
            sentence = exc.log_message or exc.reason
        if sentence is None:
            sentence = ("the gpushare extension failed; the server's log says why"
                        if status_code >= 500 else responses.get(status_code, "error"))
        self.set_header("Content-Type", "application/json")
        # "message" as jupyter_server's own APIs answer, "error" as the pool does
        self.finish(json.dumps({"error": sentence, "message": sentence}))


def failure(e: ClientError) -> Failed:
    if isinstance(e, NoCredentials):
        option = "c.GPUShareExtension.pool_url" if e.missing == "url" else \
            "c.GPUShareExtension.pool_token"
        return Failed(503, "this notebook server cannot reach the pool: " + e.sentence(option))
    if isinstance(e, PoolError) and 400 <= e.status < 500:
        return Failed(e.status, str(e))
    return Failed(502, str(e))  # unreachable, or the hub or pool failed


class PoolInfoHandler(GPUShareHandler):
    @web.authenticated
    @authorized
    async def get(self):
        self.reply(await self.pool(lambda c: c.pool()))


class QuotaHandler(GPUShareHandler):
    @web.authenticated
    @authorized
    async def get(self):
        self.reply(await self.pool(lambda c: c.quota()))


class JobsHandler(GPUShareHandler):
    @web.authenticated
    @authorized
    async def get(self):
        everything = self.get_argument("all", "") not in ("", "0", "false")
        project, state = self.get_argument("project", None), self.get_argument("state", None)
        limit = self.get_argument("limit", None)
        jobs = await self.pool(lambda c: c.jobs(project=project, all=everything, state=state,
                                                limit=limit))
        self.reply({"jobs": jobs})

    @web.authenticated
    @authorized(action="execute", message="submitting a job runs code as this server's owner, "
                                          "and you may not do that here")
    async def post(self):
        try:
            spec = json.loads(self.request.body or b"null")
        except ValueError as e:
            raise Failed(400, f"the body is not valid JSON ({e})") from None
        # A job from the Lab dialog runs with this server's PATH, as one sent from its
        # terminals or kernels does; the pool checks everything else.
        if isinstance(spec, dict) and os.environ.get("PATH"):
            env = spec.setdefault("env", {})
            if isinstance(env, dict):
                env.setdefault("PATH", os.environ["PATH"])
        # The browser's key, so that its retries and ours make one job between them.
        key = self.request.headers.get("Idempotency-Key") or None
        self.reply(await self.pool(lambda c: c.submit(spec, request_id=key)), 201)


class JobHandler(GPUShareHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id):
        self.reply(await self.pool(lambda c: c.job(job_id)))

    @web.authenticated
    @authorized(message="cancelling a job changes it, and you may only read here")
    async def delete(self, job_id):
        self.reply(await self.pool(lambda c: c.cancel(job_id), retry=False))


class LogsHandler(GPUShareHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id):
        attempt, rank = self.get_argument("attempt", None), self.get_argument("rank", None)
        if self.get_argument("follow", "0") in ("0", "", "false"):
            text = await self.pool(lambda c: "".join(c.logs(job_id, attempt=attempt, rank=rank)))
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish(text)
            return
        await self.follow(job_id, attempt, rank)

    async def follow(self, job_id, attempt, rank=None):
        """Stream the pool's followed logs. The blocking read may wait hours for output, so it
        gets its own thread, not one of the pool-call threads; it ends with the attempt, or at
        its next output once the browser has gone."""
        ext = self.gpushare
        if not ext.take_follower():
            raise Failed(503, f"this server already follows {ext.max_log_followers} logs; close "
                              f"some, or read the log without follow")
        loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._gone = threading.Event()

        def put(item):
            try:
                loop.call_soon_threadsafe(self._queue.put_nowait, item)
            except RuntimeError:  # the server's loop has ended
                self._gone.set()

        def pump():
            try:
                for chunk in ext.client.logs(job_id, follow=True, attempt=attempt, rank=rank):
                    if self._gone.is_set():
                        return
                    put(chunk)
                put(None)
            except ClientError as e:
                put(e)
            finally:
                ext.give_follower()

        threading.Thread(target=pump, name=f"gpushare-logs-{job_id}", daemon=True).start()
        started = False
        while True:
            item = await self._queue.get()
            if item is None or self._gone.is_set():
                break
            if isinstance(item, ClientError):
                if not started:
                    raise failure(item)
                # Too late for a status: end the response unfinished, as a broken stream.
                self.log.warning("gpushare: following the logs of job %s broke: %s", job_id, item)
                self.request.connection.close()
                return
            if not started:
                self.set_header("Content-Type", "text/plain; charset=utf-8")
                started = True
            self.write(item)
            try:
                await self.flush()
            except StreamClosedError:
                break  # the browser has gone
        if not self._gone.is_set():
            self.finish()

    def on_connection_close(self):
        gone = getattr(self, "_gone", None)
        if gone is not None:
            gone.set()
            self._queue.put_nowait(None)


class ProjectsHandler(GPUShareHandler):
    @web.authenticated
    @authorized
    async def get(self):
        self.reply({"projects": await self.pool(lambda c: c.projects())})


class SliceHandler(GPUShareHandler):
    @web.authenticated
    @authorized
    async def get(self):
        answer = self.gpushare.slice_json()
        answer["pool"] = await self.pool_slice() if self.gpushare.slice else None
        self.reply(answer)

    async def pool_slice(self) -> dict | None:
        """The pool's record of this server's slice: its GPU use now and over the last hour,
        and the culling warning (None when the pool has none or cannot be asked)."""
        user = os.environ.get("JUPYTERHUB_USER")
        server = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        try:
            slices = await self.pool(lambda c: c.slices())
        except Failed:
            return None
        mine = [s for s in slices if s.get("server", "") == server
                and (user is None or s.get("user") == user)]
        if not mine:
            return None
        found = max(mine, key=lambda s: s.get("created") or 0)
        return {k: found.get(k) for k in ("id", "gpus", "usage", "cull")}


HANDLERS = [
    ("api/pool", PoolInfoHandler),
    ("api/quota", QuotaHandler),
    ("api/jobs", JobsHandler),
    (r"api/jobs/([^/]+)", JobHandler),
    (r"api/jobs/([^/]+)/logs", LogsHandler),
    ("api/projects", ProjectsHandler),
    ("api/slice", SliceHandler),
]


def _load_jupyter_server_extension(serverapp):
    extension = GPUShareExtension(parent=serverapp, log=serverapp.log)
    serverapp.web_app.settings["gpushare"] = extension
    base = url_path_join(serverapp.web_app.settings["base_url"], "gpushare")
    serverapp.web_app.add_handlers(".*$", [(url_path_join(base, path), handler)
                                          for path, handler in HANDLERS])
    if extension.watchdog is None:
        serverapp.log.info("gpushare: %s", extension.watchdog_off)


async def _start_jupyter_server_extension(serverapp):
    extension = serverapp.web_app.settings["gpushare"]
    extension.start_watchdog()
    if extension.slice is not None and extension.activity_interval and extension.pool_url:
        extension.activity = KernelActivity(serverapp, extension.client, extension.executor,
                                            extension.activity_interval, extension.log)
        extension.activity.start()
