"""What the pool service sweeps: build slices of servers that no longer run, released when
it starts; and, every hour while it runs, audit entries older than their retention.

JupyterHub stops its services before its notebook servers, so the spawners of a stopping hub
cannot release their slices: the pool keeps them. When the pool starts again:

1. the slices in the store, by user;
2. each user's active servers, asked from the hub with the service's own token (its role
   needs ``read:users`` and ``read:servers``); a user the hub does not know runs nothing;
3. ``stale()`` (pure): the slices whose server is not among them;
4. those are released, each with one log line.

Nothing is released for a user the hub cannot answer about (no ``read:servers`` scope, an
error): a running server must keep its slice. Its spawner releases it at its next start.
"""

from __future__ import annotations

import asyncio
import logging
import time

from .hub import HubAPI, HubError, HubNotFound
from .store.database import Store
from .store.models import SliceRow

UNKNOWN = None  # the hub could not say which servers the user runs


def stale(slices: list[SliceRow], servers: dict[str, set[str] | None]) -> list[SliceRow]:
    """The slices whose (user, server) the hub says does not run."""
    return [s for s in slices
            if servers.get(s.user, UNKNOWN) is not UNKNOWN and s.server not in servers[s.user]]


async def active_servers(hub: HubAPI, user: str) -> set[str] | None:
    """The names of the user's active servers ("" is the default one), as the hub says;
    an empty set for a user the hub does not know; None when it cannot be told."""
    try:
        model = await hub.user(user)
    except HubNotFound:
        return set()
    except HubError:
        return UNKNOWN
    if not isinstance(model.get("servers"), dict):
        return UNKNOWN  # no read:servers
    return set(model["servers"])


async def release_stale(store: Store, hub: HubAPI, log: logging.Logger) -> list[SliceRow]:
    slices = store.slices.all()
    if not slices or not hub:
        return []
    servers = {user: await active_servers(hub, user)
               for user in sorted({s.user for s in slices})}
    unknown = sorted(u for u, names in servers.items() if names is UNKNOWN)
    if unknown:
        log.info("Keeping the build slices of %s: the hub does not say which servers they "
                 "run (the service's role needs read:servers)", ", ".join(unknown))
    gone = stale(slices, servers)
    for row in gone:
        store.slices.remove(row.id)
        log.info("Released build slice %s of %s's server %r, which no longer runs",
                 row.id, row.user, row.server)
    return gone


async def prune_audit(store: Store, retention_days: float, log: logging.Logger,
                      every_s: float = 3600.0) -> None:
    """Forget audit entries older than ``retention_days``, now and every ``every_s``."""
    while True:
        try:
            gone = await asyncio.to_thread(store.audit.prune,
                                           time.time() - retention_days * 86400)
            if gone:
                log.info("Forgot %d audit entries older than %g days "
                         "(PoolService.audit_retention_days)", gone, retention_days)
        except Exception:  # noqa: BLE001 - the next sweep tries again
            log.exception("pruning the audit trail failed; trying again later")
        await asyncio.sleep(every_s)
