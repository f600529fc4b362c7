"""Between the pool service and the hub's REST API: a relay the test runs, which counts the
service's questions to the hub and can slow them down or fail them, as a loaded or broken hub
would. The hub itself stays real; the service is pointed at the relay through its
JUPYTERHUB_API_URL (``command_prefix``)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter

from tornado import web
from tornado.httpclient import AsyncHTTPClient

from hubtest import free_port


def kind_of(path: str) -> str:
    """``token``: whose is this token (GET /hub/api/user); ``rights``: a user's admin flag
    and groups (GET /hub/api/users/NAME); else ``other``."""
    if path.rstrip("/") == "/hub/api/user":
        return "token"
    if path.startswith("/hub/api/users/"):
        return "rights"
    return "other"


class _Relay(web.RequestHandler):
    SUPPORTED_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")

    async def _relay(self):
        relay: HubRelay = self.settings["relay"]
        kind = kind_of(self.request.path)
        relay.counts[kind] += 1
        if kind in relay.failing:
            self.set_status(500)
            self.finish('{"message": "the relay plays a broken hub"}')
            return
        if relay.delays.get(kind):
            await asyncio.sleep(relay.delays[kind])
        headers = {k: v for k, v in self.request.headers.items()
                   if k.lower() in ("authorization", "content-type", "accept")}
        resp = await AsyncHTTPClient().fetch(
            relay.target + self.request.uri, method=self.request.method, headers=headers,
            body=self.request.body if self.request.method in ("POST", "PUT", "PATCH") else None,
            raise_error=False, request_timeout=30)
        self.set_status(resp.code)
        if resp.headers.get("Content-Type"):
            self.set_header("Content-Type", resp.headers["Content-Type"])
        self.finish(resp.body or b"")

    get = post = put = patch = delete = _relay


class HubRelay:
    def __init__(self):
        self.port = free_port()
        self.target = ""  # http://127.0.0.1:HUB_PORT, set once the hub's port is known
        self.counts: Counter = Counter()
        self.delays: dict[str, float] = {}
        self.failing: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def command_prefix(self) -> list[str]:
        return ["env", f"JUPYTERHUB_API_URL=http://127.0.0.1:{self.port}/hub/api"]

    def start(self) -> "HubRelay":
        ready = threading.Event()

        def serve():
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            web.Application([(r".*", _Relay)], relay=self).listen(self.port, "127.0.0.1")
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=serve, name="hub-relay", daemon=True).start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
