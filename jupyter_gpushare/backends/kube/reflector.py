"""One list-then-watch loop per kind of object, shared by everything the backend asks about
those objects (like KubeSpawner's reflector, and client-go's). The cache is the state: the
backend reads it on every poll instead of asking the API server per object.

List (the full set and its resourceVersion), then watch from that resourceVersion; when the
watch ends (the server's timeout, a dropped connection) watch again from the last version
seen; when the server says the version is too old (410 Gone) list again; on any error back
off (doubling, capped) and try again, keeping the last known objects meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Awaitable, Callable

import aiohttp

from .api import REFUSED, REFUSED_RETRY_S, KubeError, raise_for_status

Gone = 410


class Reflector:
    """``Reflector(what, list_call)``: ``list_call(**query)`` sends a list (or, with
    ``watch=True``, a watch) request without decoding it, as kubernetes_asyncio does with
    ``_preload_content=False``. ``objects`` maps names to the latest objects; ``listed_at``
    is when the newest complete list was asked for (``time.monotonic``): an object created
    before it and missing from ``objects`` is gone. ``on_event(type, obj)`` sees every
    watch event. With ``index(obj) -> key`` (as client-go's indexers), ``by(key)`` gives the
    objects of one key without a look at the others."""

    def __init__(self, what: str, list_call: Callable[..., Awaitable], *,
                 log: logging.Logger | None = None, timeout_s: int = 300,
                 backoff_s: tuple[float, float] = (0.2, 5.0), on_event=None,
                 index: Callable[[dict], str] | None = None):
        self.what = what
        self._list_call = list_call
        self.log = log or logging.getLogger("gpushare.kube")
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.on_event = on_event
        self._key = index
        self._index: dict[str, dict[str, dict]] = {}  # key -> name -> object
        self.objects: dict[str, dict] = {}
        self.resource_version = ""
        self.listed_at = float("-inf")
        self.synced = asyncio.Event()
        self.relists = 0  # lists after the first one
        self.watches = 0  # watch requests sent
        self.failures = 0  # consecutive failed requests (0 while healthy)
        self.last_error: Exception | None = None
        self._task: asyncio.Task | None = None

    def by(self, key: str):
        """The objects whose ``index`` is ``key``."""
        return (self._index.get(key) or {}).values()

    def _indexed(self, name: str, old: dict | None, new: dict | None) -> None:
        if self._key is None:
            return
        if old is not None:
            key = self._key(old)
            bucket = self._index.get(key)
            if bucket is not None:
                bucket.pop(name, None)
                if not bucket:
                    del self._index[key]
        if new is not None:
            self._index.setdefault(self._key(new), {})[name] = new

    def start(self) -> "Reflector":
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(),
                                                                name=f"reflector {self.what}")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None

    async def wait_synced(self, timeout: float) -> bool:
        """Whether the first list came within ``timeout`` s; False sooner when the server
        keeps refusing it for lack of rights (401, 403), which no waiting mends."""
        started = time.monotonic()
        while not self.synced.is_set():
            # (A refusal right after an API server started may pass: see api.REFUSED_RETRY_S.)
            refused = isinstance(self.last_error, KubeError) and \
                self.last_error.status in REFUSED and \
                time.monotonic() > started + REFUSED_RETRY_S
            if refused or time.monotonic() > started + timeout:
                return False
            try:
                await asyncio.wait_for(self.synced.wait(), 0.1)
            except asyncio.TimeoutError:
                pass
        return True

    async def _run(self) -> None:
        delay = self.backoff_s[0]
        must_list = True
        while True:
            try:
                if must_list:
                    await self._list()
                    must_list = False
                await self._watch()
                delay = self.backoff_s[0]
            except asyncio.CancelledError:
                raise
            except KubeError as e:
                if e.status == Gone:
                    self.log.info("Watch of %s: resource version too old; listing again",
                                  self.what)
                    must_list = True
                    continue
                delay = await self._back_off(e, delay)
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
                delay = await self._back_off(e, delay)
            except Exception as e:  # a bug must not end the watch for good
                self.log.exception("Watch of %s failed", self.what)
                delay = await self._back_off(e, delay)

    async def _back_off(self, error, delay: float) -> float:
        self.failures += 1
        self.last_error = error
        log = self.log.warning if self.failures in (1, 10) or self.failures % 100 == 0 \
            else self.log.debug
        log("Watch of %s failed (%s); trying again in %.1f s", self.what,
            str(error).splitlines()[0] if str(error) else type(error).__name__, delay)
        await asyncio.sleep(delay)
        return min(delay * 2, self.backoff_s[1])

    async def _list(self) -> None:
        asked = time.monotonic()
        response = await self._list_call(_preload_content=False, _request_timeout=60)
        try:
            await raise_for_status(response, f"list {self.what}")
            body = json.loads(await response.read())
        finally:
            response.release()
        self.objects = {o["metadata"]["name"]: o for o in body.get("items") or []}
        self._index = {}
        for name, o in self.objects.items():
            self._indexed(name, None, o)
        self.resource_version = body["metadata"]["resourceVersion"]
        self.listed_at = asked
        if self.synced.is_set():
            self.relists += 1
        self.synced.set()
        self.failures = 0

    async def _watch(self) -> None:
        self.watches += 1
        response = await self._list_call(
            watch=True, resource_version=self.resource_version, allow_watch_bookmarks=True,
            timeout_seconds=self.timeout_s, _preload_content=False,
            _request_timeout=(10, self.timeout_s + 30))
        try:
            await raise_for_status(response, f"watch {self.what}")
            self.failures = 0
            async for line in response.content:
                if line.strip():
                    self._apply(json.loads(line))
        finally:
            response.release()

    def _apply(self, event: dict) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise KubeError(obj.get("code", 500), obj.get("reason", ""), obj.get("message", ""))
        meta = obj.get("metadata") or {}
        if kind == "DELETED":
            self._indexed(meta.get("name"), self.objects.pop(meta.get("name"), None), None)
        elif kind in ("ADDED", "MODIFIED"):
            self._indexed(meta["name"], self.objects.get(meta["name"]), obj)
            self.objects[meta["name"]] = obj
        if meta.get("resourceVersion"):
            self.resource_version = meta["resourceVersion"]
        if self.on_event is not None and kind != "BOOKMARK":
            self.on_event(kind, obj)
