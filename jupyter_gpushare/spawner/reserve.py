"""Reserving and releasing build slices at the pool service, for the spawners.

The pool packs slices on build-pool GPUs and enforces each user's build allowance
(``policy/slices.py``); the spawner only asks. It asks with a token of its own (a JupyterHub
service: see ``GPUShareSpawnerMixin.pool_api_token``), since slices are reserved for users
by the hub, never by users. The HTTP is ``client.PoolClient``'s, in a worker thread, so that
the hub's event loop never waits on the network.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable

from ..client import ClientError, PoolClient, PoolError, PoolUnreachable
from ..policy.model import GPU


class SliceClient(PoolClient):
    """The pool client with the calls only the hub's spawner makes (``api/slices``)."""

    def reserve(self, user: str, milli: int, server: str) -> dict:
        return self.reserve_slice(user, milli / GPU, server)

    def release(self, slice_id: str) -> dict:
        return self.release_slice(slice_id)


async def tell_server_pid(client: SliceClient, held: list[Held], pid: int, log=None) -> None:
    """Tell the pool which process is the server of these slices, so that the GPU use of its
    process tree is attributed to them. Failing costs only that attribution: logged."""
    for h in held:
        try:
            await asyncio.to_thread(client.set_slice_pid, h.id, pid)
        except ClientError as exc:
            if log:
                log.warning("The pool was not told the server process of slice %s (%s); its "
                            "GPU use will show as outside gpushare", h.id, exc)


@dataclass(frozen=True)
class Held:
    """A reserved slice, as the pool answered: ``gpu`` of ``node``, ``uuid`` where known."""

    id: str
    milli: int
    node: str
    gpu: int
    uuid: str | None

    @classmethod
    def from_json(cls, reply: dict) -> "Held":
        return cls(str(reply["id"]), round(float(reply["gpus"]) * GPU), str(reply["node"]),
                   int(reply["gpu"]), reply.get("uuid") or None)


MAX_RETRY_AFTER_S = 600.0  # the longest a start waits for a GPU the pool takes back


class Refused(Exception):
    """The pool said no (409: the build pool is full, or the allowance is used); the message
    is the pool's sentence."""


async def reserve(client: SliceClient, user: str, server: str, milli: int, *, wait_s: float,
                  say: Callable[[str], None], interval: float = 2.0) -> list[Held]:
    """Slices for ``milli`` (one, or one whole GPU each for more than one GPU).

    While the pool refuses with 409, ``say`` it once and ask again every ``interval`` seconds
    for up to ``wait_s`` (or, when the pool says when room comes, a GPU lent to train jobs
    taken back, until then); then raise ``Refused``. Other failures raise ``ClientError``. All or
    nothing: what was reserved is released again when a later part fails."""
    parts = [milli] if milli <= GPU else [GPU] * (milli // GPU)
    held: list[Held] = []
    deadline = time.monotonic() + wait_s
    told = extended = False
    try:
        for part in parts:
            while True:
                try:
                    reply = await asyncio.to_thread(client.reserve, user, part, server)
                    held.append(Held.from_json(reply))
                    break
                except PoolError as exc:
                    if exc.status != 409:
                        raise
                    if exc.retry_after is not None and not extended:
                        # a GPU lent to train jobs comes back by then: wait for it, once
                        extended = True
                        deadline = max(deadline, time.monotonic() + interval +
                                       min(exc.retry_after, MAX_RETRY_AFTER_S))
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise Refused(exc.message) from None
                    if not told:
                        wait = f"{wait_s:g}" if exc.retry_after is None else f"{left:.0f}"
                        say(f"{sentence(exc.message)[:-1]}: waiting up to {wait} s for room.")
                        told = True
                    await asyncio.sleep(min(interval, left))
    except BaseException:
        await release(client, [h.id for h in held])
        raise
    return held


async def release(client: SliceClient, ids: list[str], log=None) -> list[str]:
    """Release slices; a slice the pool no longer has is released already. Returns the ids
    that could not be released (logged), which the pool keeps until it next starts (it then
    releases the slices of servers the hub does not run), the server starts again
    (``release_stale``) or an admin deletes them."""
    kept = []
    for slice_id in ids:
        try:
            await asyncio.to_thread(client.release, slice_id)
        except PoolError as exc:
            if exc.status != 404:
                kept.append(slice_id)
                if log:
                    log.error("Build slice %s was not released: %s", slice_id, exc)
        except PoolUnreachable:
            # The usual case when the hub stops: it stops its services before its servers.
            kept.append(slice_id)
            if log:
                log.info("Build slice %s is kept by the pool service, which is not running; "
                         "the pool releases it when it starts again", slice_id)
        except ClientError as exc:
            kept.append(slice_id)
            if log:
                log.error("Build slice %s was not released: %s", slice_id, exc)
    return kept


async def release_stale(client: SliceClient, user: str, server: str, log=None) -> list[str]:
    """Release slices the pool still holds for this server from an earlier run (a hub that
    died, a release that failed): a server runs once at a time, so they are nobody's."""
    stale = [s["id"] for s in await asyncio.to_thread(client.slices)
             if s.get("user") == user and s.get("server") == server]
    if stale and log:
        log.warning("Releasing build slice(s) %s left over from an earlier run of %s's "
                    "server %r", ", ".join(stale), user, server)
    await release(client, stale, log)
    return stale


def sentence(text: str) -> str:
    """The pool's clause as a sentence for the spawn page: capital first, full stop last."""
    text = " ".join(str(text).split())
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else text + "."
