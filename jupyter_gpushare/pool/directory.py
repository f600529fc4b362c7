"""Who a user is to the pool: admin or not, and in which JupyterHub groups.

The identity comes from the hub for the request's token (HubAuth); what that user may do is
asked from the hub's REST API with the service's own token (its role grants ``read:users``)
and kept for a short while. Nothing a request says about itself is believed.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

ADMIN_SCOPE = "custom:gpushare:admin"


@dataclass(frozen=True)
class Who:
    name: str
    admin: bool
    groups: frozenset[str]
    kind: str = "user"  # or "service" (the spawner reserving build slices)


class HubDirectory:
    def __init__(self, api_url: str, token: str, ttl_s: float = 30.0):
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.ttl_s = ttl_s
        self._cache: dict[str, tuple[float, Who]] = {}
        self._asking: dict[str, asyncio.Future] = {}

    async def who(self, model: dict) -> Who:
        """The pool's view of the user (or service) that HubAuth identified."""
        if model.get("kind") == "service":
            return Who(model["name"], False, frozenset(), kind="service")
        name = model["name"]
        scoped_admin = ADMIN_SCOPE in (model.get("scopes") or ())
        hit = self._cache.get(name)
        if hit is None:
            who = await self._refresh(name)
        else:
            who = hit[1]
            if time.monotonic() - hit[0] >= self.ttl_s and name not in self._asking:
                # Answer from what we know and refresh once in the background: when the
                # entry expires under load, the hub gets one question, not one per request.
                asyncio.ensure_future(self._refresh(name))
        return Who(who.name, who.admin or scoped_admin, who.groups)

    async def _refresh(self, name: str) -> Who:
        """One lookup per user at a time; concurrent askers share it."""
        pending = self._asking.get(name)
        if pending is None:
            pending = self._asking[name] = asyncio.ensure_future(self._lookup(name))
            pending.add_done_callback(lambda _: self._asking.pop(name, None))
        try:
            who = await asyncio.shield(pending)
        except Exception:
            hit = self._cache.get(name)
            if hit is None:
                raise
            return hit[1]  # the hub did not answer: keep what we knew
        self._cache[name] = (time.monotonic(), who)
        return who

    async def _lookup(self, name: str) -> Who:
        req = HTTPRequest(f"{self.api_url}/users/{name}",
                          headers={"Authorization": f"token {self.token}"}, request_timeout=10)
        try:
            resp = await AsyncHTTPClient().fetch(req)
        except HTTPClientError as e:
            if e.code == 404:
                return Who(name, False, frozenset())
            raise
        model = json.loads(resp.body)
        return Who(name, bool(model.get("admin")), frozenset(model.get("groups") or ()))
