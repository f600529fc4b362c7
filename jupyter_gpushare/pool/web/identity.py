"""Who a request comes from, and what they may do: asked from JupyterHub, never believed
from the request.

Two questions, both asked of the hub's REST API (``hub.py``) without blocking the event loop:
- ``HubTokens.identify(token)``: whom the hub says a token belongs to (``GET /user`` with
  that token). Answers are kept a short while in bounded caches. Tokens the hub confirmed
  and new tokens reach the hub in separate lanes, so a flood of random tokens cannot keep a
  valid one from being checked; only new tokens are ever refused for their number
  (``TooManyFailures``), when more wait for the hub than it answers.
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

from ..hub import HubAPI, HubNotFound, HubRefused, HubUnavailable

ADMIN_SCOPE = "custom:gpushare:admin"
log = logging.getLogger("gpushare.pool")


class TooManyFailures(Exception):
    """Too many new tokens wait for the hub's answer; one sentence for the user (HTTP 429)."""


@dataclass(frozen=True)
class Who:
    name: str
    admin: bool
    groups: frozenset[str]
    kind: str = "user"  # or "service" (the spawner reserving build slices)

    def is_user(self, name: str) -> bool:
        """This is the user ``name`` (a service of the same name is not)."""
        return self.kind == "user" and self.name == name


class HubTokens:
    """Token → the hub's model of its owner (user or service, with the token's scopes).

    Tokens take one of two lanes to the hub, so that strangers cannot spend what valid
    tokens need:
    - *confirmed*: a token the hub said is valid. Its answer is used for ``ttl_s``; then it
      is checked again, and while the hub takes more than ``recheck_wait_s`` to answer (or
      does not answer) the old answer is used, for up to ``ttl_s`` more. Confirmed tokens
      never wait behind unknown ones and are never refused for their number. One owner keeps
      at most ``per_owner`` of them (their least recently used go first), so a user who makes
      many tokens cannot push out everyone else's.
    - *new*: any other token. At most ``concurrent`` are asked about at once and at most
      ``waiting`` wait for an answer, a quarter of them at most from one client; beyond that
      they are refused (``TooManyFailures``), which happens only when they come faster than
      the hub answers. A token the hub did not know is answered "no" for ``ttl_s`` without
      asking again.
    """

    def __init__(self, hub: HubAPI, ttl_s: float = 60.0, size: int = 10_000,
                 waiting: int = 256, concurrent: int = 8, per_owner: int = 64,
                 recheck_wait_s: float = 1.0, clock=time.monotonic):
        self.hub = hub
        self.ttl_s, self.size, self.waiting, self.clock = ttl_s, size, waiting, clock
        self.per_client = max(1, waiting // 4)
        self.per_owner, self.recheck_wait_s = per_owner, recheck_wait_s
        self._confirmed: OrderedDict[str, tuple[float, dict]] = OrderedDict()
        self._owned: dict[tuple, OrderedDict[str, None]] = {}  # owner -> their token hashes
        self._refused: OrderedDict[str, float] = OrderedDict()
        self._asking: dict[str, asyncio.Future] = {}
        self._concurrent = concurrent
        self._lanes: dict[bool, asyncio.Semaphore] = {}
        self._new_waiting = 0
        self._waiting_from: dict[str, int] = {}  # client -> its new tokens waiting

    def __len__(self):
        return len(self._confirmed)

    async def identify(self, token: str, client: str = "") -> dict | None:
        """``client``: where the request comes from (the proxy's X-Forwarded-For), for the
        share of the new tokens' line one client may take."""
        key = hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()
        now = self.clock()
        hit = self._confirmed.get(key)
        if hit is not None:
            self._confirmed.move_to_end(key)
            age = now - hit[0]
            if age < self.ttl_s:
                return hit[1]
            check = self._ask(key, token, confirmed=True)
            if age >= 2 * self.ttl_s:
                return await asyncio.shield(check)
            try:  # the hub's new answer if it comes soon, else what it said before
                return await asyncio.wait_for(asyncio.shield(check), self.recheck_wait_s)
            except (asyncio.TimeoutError, HubUnavailable):
                check.add_done_callback(_quiet)
                return hit[1]
        refused = self._refused.get(key)
        if refused is not None and now - refused < self.ttl_s:
            return None
        if key not in self._asking:
            if self._new_waiting >= self.waiting:
                raise TooManyFailures("too many requests with new tokens are waiting for "
                                      "JupyterHub's answer; try again in a few seconds")
            if self._waiting_from.get(client, 0) >= self.per_client:
                raise TooManyFailures("too many requests with new tokens from your address "
                                      "are waiting for JupyterHub's answer; try again in a "
                                      "few seconds")
            self._count(client, +1)
            self._ask(key, token, confirmed=False).add_done_callback(
                lambda _: self._count(client, -1))
        return await asyncio.shield(self._asking[key])

    def _count(self, client: str, step: int) -> None:
        """New tokens waiting, in all and per client (counted from the moment they ask)."""
        self._new_waiting += step
        left = self._waiting_from.get(client, 0) + step
        if left > 0:
            self._waiting_from[client] = left
        else:
            self._waiting_from.pop(client, None)

    def _ask(self, key: str, token: str, confirmed: bool) -> asyncio.Future:
        """One question to the hub per token at a time; concurrent askers share it."""
        pending = self._asking.get(key)
        if pending is None:
            pending = self._asking[key] = asyncio.ensure_future(
                self._lookup(key, token, confirmed))
            pending.add_done_callback(lambda _: self._asking.pop(key, None))
        return pending

    async def _lookup(self, key: str, token: str, confirmed: bool) -> dict | None:
        lane = self._lanes.get(confirmed)
        if lane is None:
            lane = self._lanes[confirmed] = asyncio.Semaphore(self._concurrent)
        async with lane:
            try:
                model = await self.hub.get("user", token)
            except (HubNotFound, HubRefused):
                model = None  # a token the hub does not know, or one without its scopes
        if model is None or not model.get("name"):
            self._forget(key)
            _remember(self._refused, key, self.clock(), self.size)
            return None
        self._refused.pop(key, None)
        self._forget(key)
        _remember(self._confirmed, key, (self.clock(), model), self.size,
                  on_evict=self._disown)
        owned = self._owned.setdefault(_owner(model), OrderedDict())
        owned[key] = None
        while len(owned) > self.per_owner:  # this owner's least recently confirmed go
            self._forget(next(iter(owned)))
        return model

    def _forget(self, key: str) -> None:
        hit = self._confirmed.pop(key, None)
        if hit is not None:
            self._disown(key, hit)

    def _disown(self, key: str, hit: tuple[float, dict]) -> None:
        owner = _owner(hit[1])
        owned = self._owned.get(owner)
        if owned is not None:
            owned.pop(key, None)
            if not owned:
                del self._owned[owner]


def _owner(model: dict) -> tuple:
    return model.get("kind", "user"), model.get("name")


def _remember(cache: OrderedDict, key: str, value, size: int, on_evict=None) -> None:
    """Keep ``value`` as the newest entry of a cache of at most ``size`` entries."""
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > size:
        old = cache.popitem(last=False)
        if on_evict is not None:
            on_evict(*old)


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
