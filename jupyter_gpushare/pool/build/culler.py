"""GPU-aware culling of build sessions: the I/O around ``usage/cull.py``.

Every little while: gather the evidence for each server that holds a slice (the meter's idle
time of its slice, the hub's activity record of the server, the server extension's word on its
kernels, open follows of its user's train jobs), decide, then warn (logged; the slice's
``cull`` in ``api/slices`` says when it will be stopped) or stop the server through the hub's
API. Every warning, stop and reprieve is logged and kept for ``api/pool``; every stop is in the
audit trail too (``api/audit``).
The service's role needs the scopes ``read:users`` (activity), ``read:servers`` and
``servers`` (to stop them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Callable
from datetime import datetime
from urllib.parse import quote

from ...usage.cull import CullSettings, Evidence, decide
from ..admin.changes import CULLING, record
from ..hub import HubAPI, HubError
from ..store.database import Store


class SliceCuller:
    def __init__(self, store: Store, meter, hub: HubAPI, following: Callable[[str], bool],
                 settings: CullSettings, log: logging.Logger | None = None):
        """``meter``: how long each slice's GPU use stayed idle; ``hub``: the servers'
        activity, and stopping them; ``following(user)``: whether the user follows a train
        job's output now."""
        self.store, self.meter, self.hub, self.following = store, meter, hub, following
        self.settings = settings
        self.log = log or logging.getLogger("gpushare.cull")
        self.warned: dict[str, float] = {}  # slice id -> when its server was warned
        self.kernels: dict[tuple[str, str], tuple[float, int, int]] = {}  # (user, server) ->
        # (when said, kernels, busy): the server extension's reports
        self.events: deque = deque(maxlen=200)
        self.culled = 0

    # -- what handlers tell it ----------------------------------------------------------------
    def kernels_said(self, user: str, server: str, kernels: int, busy: int) -> bool:
        """Kept only for a server that holds a slice (False, nothing kept, for any other),
        and until it no longer holds one (``once``), so that reports cannot fill memory."""
        if not self.store.slices.holds(user, server):
            return False
        self.kernels[(user, server)] = (time.time(), kernels, busy)
        return True

    def warning_of(self, slice_id: str) -> dict | None:
        since = self.warned.get(slice_id)
        if since is None:
            return None
        reason = next((e["reason"] for e in reversed(self.events)
                       if e["slice"] == slice_id and e["kind"] == "warn"), "")
        return {"warned_at": since, "cull_at": since + self.settings.warning, "reason": reason}

    # -- the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        interval = min(30.0, max(0.5, self.settings.after / 4))
        while True:
            try:
                await self.once()
            except Exception:  # noqa: BLE001 - keep watching; the next round tries again
                self.log.exception("culling idle build sessions failed; trying again")
            await asyncio.sleep(interval)

    async def once(self) -> None:
        now = time.time()
        slices = self.store.slices.all()
        users = sorted({s.user for s in slices})
        activity = dict(zip(users, await asyncio.gather(*(self._hub_servers(u) for u in users))))
        evidence = []
        for s in slices:
            said = self.kernels.get((s.user, s.server))
            last = (activity.get(s.user) or {}).get(s.server)
            evidence.append(Evidence(
                s.user, s.server, s.id, self.meter.idle_for("slice", s.id),
                None if last is None else max(0.0, now - last),
                None if said is None else said[2], None if said is None else now - said[0],
                self.following(s.user)))
        self.warned = {k: v for k, v in self.warned.items() if k in {s.id for s in slices}}
        held = {(s.user, s.server) for s in slices}
        self.kernels = {k: v for k, v in self.kernels.items() if k in held}
        for d in decide(evidence, self.warned, now, self.settings):
            e = d.evidence
            who = f"{e.user}'s server {e.server!r}" if e.server else f"{e.user}'s server"
            if d.kind == "warn":
                self.warned[e.slice_id] = now
                self.log.warning("Culling: warned %s (slice %s): %s", who, e.slice_id, d.reason)
            elif d.kind == "spare":
                self.warned.pop(e.slice_id, None)
                self.log.info("Culling: %s (slice %s) is no longer warned: %s", who,
                              e.slice_id, d.reason)
            elif await self._stop(e.user, e.server):
                self.warned.pop(e.slice_id, None)
                self.culled += 1
                record(self.store, CULLING, "cull server",
                       f"{e.user}/{e.server}" if e.server else e.user,
                       {"server": "up", "slice": e.slice_id, "reason": d.reason},
                       {"server": "stopped"}, "culling")
                self.log.warning("Culling: stopped %s (slice %s): %s", who, e.slice_id,
                                 d.reason)
            else:
                continue
            self.events.append({"at": now, "kind": d.kind, "user": e.user, "server": e.server,
                                "slice": e.slice_id, "reason": d.reason})

    # -- the hub ----------------------------------------------------------------------------
    async def _hub_servers(self, user: str) -> dict[str, float]:
        """The user's servers and when the hub last saw activity from each (epoch seconds)."""
        try:
            model = await self.hub.user(user)
        except HubError as exc:
            self.log.warning("Culling: the hub did not say when %s's servers were last active "
                             "(%s); none of them is culled now", user, exc)
            return {}
        out = {}
        for name, server in (model.get("servers") or {}).items():
            when = server.get("last_activity")
            if when:
                out[name] = datetime.fromisoformat(when.replace("Z", "+00:00")).timestamp()
        return out

    async def _stop(self, user: str, server: str) -> bool:
        path = f"users/{quote(user, safe='')}/" + (f"servers/{quote(server, safe='')}"
                                                   if server else "server")
        try:
            await self.hub.delete(path)
        except HubError as exc:
            self.log.error("Culling: the hub did not stop %s's server %r (%s); the service's "
                           "role needs the 'servers' scope", user, server, exc)
            return False
        return True
