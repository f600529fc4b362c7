"""Who a request comes from, and what they may do: asked from JupyterHub, never believed
from the request.

Two questions, both asked of the hub's REST API (``hub.py``) without blocking the event loop:
- ``HubTokens.identify(token)``: whom the hub says a token belongs to (``GET /user`` with
  that token). Answers are kept a short while in a bounded cache; tokens the hub does not
  know are not kept, and once too many of them came in a short time, further unknown tokens
  are refused at once (``TooManyFailures``) instead of each costing a question to the hub.
- ``HubDirectory.who(model)``: a user's admin flag and groups (``GET /users/{name}`` with the
  service's own token, whose role grants ``read:users``). The name is quoted into the URL
  and the answer must name the same user. Answers are kept ``ttl_s``, refreshed in the
  background after that, and never served more than ``max_stale_s`` after the hub last
  answered: a removed admin does not stay admin because the hub is unreachable
  (``HubUnavailable`` then).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from urllib.parse import quote

from .hub import HubAPI, HubNotFound, HubRefused, HubUnavailable

ADMIN_SCOPE = "custom:gpushare:admin"
log = logging.getLogger("gpushare.pool")


class TooManyFailures(Exception):
    """Too many unknown tokens lately; one sentence for the user (HTTP 429)."""


@dataclass(frozen=True)
class Who:
    name: str
    admin: bool
    groups: frozenset[str]
    kind: str = "user"  # or "service" (the spawner reserving build slices)

    def is_user(self, name: str) -> bool:
        """This is the user ``name`` (a service of the same name is not)."""
        return self.kind == "user" and self.name == name


class _Bucket:
    """A token bucket: ``burst`` at most, ``rate`` more per second."""

    def __init__(self, rate: float, burst: int, clock=time.monotonic):
        self.rate, self.burst, self.clock = rate, burst, clock
        self.level, self.at = float(burst), clock()

    def _fill(self) -> None:
        now = self.clock()
        self.level = min(self.burst, self.level + (now - self.at) * self.rate)
        self.at = now

    def empty(self) -> bool:
        self._fill()
        return self.level < 1

    def take(self) -> None:
        self._fill()
        self.level = max(0.0, self.level - 1)


class HubTokens:
    """Token → the hub's model of its owner (user or service, with the token's scopes)."""

    def __init__(self, hub: HubAPI, ttl_s: float = 60.0, size: int = 10_000,
                 failures_per_s: float = 5.0, failure_burst: int = 50, concurrent: int = 8):
        self.hub = hub
        self.ttl_s, self.size = ttl_s, size
        self._cache: OrderedDict[str, tuple[float, dict]] = OrderedDict()
        self._asking: dict[str, asyncio.Future] = {}
        self._failures = _Bucket(failures_per_s, failure_burst)
        self._concurrent = concurrent
        self._slots: asyncio.Semaphore | None = None

    def __len__(self):
        return len(self._cache)

    async def identify(self, token: str) -> dict | None:
        key = hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()
        hit = self._cache.get(key)
        if hit is not None and time.monotonic() - hit[0] < self.ttl_s:
            self._cache.move_to_end(key)
            return hit[1]
        pending = self._asking.get(key)
        if pending is None:
            if self._failures.empty():
                raise TooManyFailures("too many requests with tokens JupyterHub does not know "
                                      "came in lately; try again in a few seconds")
            pending = self._asking[key] = asyncio.ensure_future(self._ask(key, token))
            pending.add_done_callback(lambda _: self._asking.pop(key, None))
        return await asyncio.shield(pending)

    async def _ask(self, key: str, token: str) -> dict | None:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._concurrent)
        async with self._slots:  # a flood of new tokens waits here, not at the hub
            try:
                model = await self.hub.get("user", token)
            except (HubNotFound, HubRefused):
                model = None  # a token the hub does not know, or one without its scopes
        if model is None or not model.get("name"):
            self._failures.take()
            self._cache.pop(key, None)
            return None
        self._cache[key] = (time.monotonic(), model)
        self._cache.move_to_end(key)
        while len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return model


class HubDirectory:
    """User name → admin flag and groups, as the hub says."""

    def __init__(self, hub: HubAPI, ttl_s: float = 30.0, max_stale_s: float = 300.0,
                 size: int = 10_000):
        self.hub = hub
        self.ttl_s, self.max_stale_s, self.size = ttl_s, max(max_stale_s, ttl_s), size
        self._cache: OrderedDict[str, tuple[float, Who]] = OrderedDict()
        self._asking: dict[str, asyncio.Future] = {}

    async def who(self, model: dict) -> Who:
        """The pool's view of the user (or service) that the hub identified."""
        if model.get("kind") == "service":
            return Who(model["name"], False, frozenset(), kind="service")
        name = model["name"]
        scoped_admin = ADMIN_SCOPE in (model.get("scopes") or ())
        hit = self._cache.get(name)
        age = None if hit is None else time.monotonic() - hit[0]
        if age is None or age >= self.max_stale_s:
            who = await self._refresh(name)
        else:
            who = hit[1]
            self._cache.move_to_end(name)
            if age >= self.ttl_s and name not in self._asking:
                # Answer from what we know and refresh once in the background: when the
                # entry expires under load, the hub gets one question, not one per request.
                asyncio.ensure_future(self._refresh(name)).add_done_callback(_quiet)
        return Who(who.name, who.admin or scoped_admin, who.groups)

    async def _refresh(self, name: str) -> Who:
        """One lookup per user at a time; concurrent askers share it."""
        pending = self._asking.get(name)
        if pending is None:
            pending = self._asking[name] = asyncio.ensure_future(self._lookup(name))
            pending.add_done_callback(lambda _: self._asking.pop(name, None))
        try:
            who = await asyncio.shield(pending)
        except HubUnavailable as e:
            hit = self._cache.get(name)
            if hit is not None and time.monotonic() - hit[0] < self.max_stale_s:
                return hit[1]  # the hub did not answer: keep what we knew, for a while
            raise HubUnavailable(f"JupyterHub cannot say what {name} may do ({e}); try again "
                                 f"shortly") from None
        self._cache[name] = (time.monotonic(), who)
        self._cache.move_to_end(name)
        while len(self._cache) > self.size:
            self._cache.popitem(last=False)
        return who

    async def _lookup(self, name: str) -> Who:
        try:
            model = await self.hub.get(f"users/{quote(name, safe='')}")
        except (HubNotFound, HubRefused):
            return Who(name, False, frozenset())
        if model.get("name") != name:  # never take another user's rights
            log.warning("JupyterHub answered for user %r when asked for %r", model.get("name"),
                        name)
            return Who(name, False, frozenset())
        return Who(name, bool(model.get("admin")), frozenset(model.get("groups") or ()))


def _quiet(future: asyncio.Future) -> None:
    """A background refresh that failed: the next request asks again."""
    if not future.cancelled():
        future.exception()
