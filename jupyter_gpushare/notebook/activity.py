"""Kernel activity of this notebook server, for GPU-aware culling (``pool/build/culler.py``).

Every ``interval`` seconds: count this server's kernels and the busy ones (jupyter_server's
own ``execution_state``), tell the pool (``api/activity``, with the server's token), and while
any kernel is busy mark the server active in jupyter_server's activity (a setting ending in
``_last_activity``, which ``last_activity()`` counts), so that the hub's activity records, which
culling reads, count a long silent cell as activity too.
"""

from __future__ import annotations

import asyncio
import os
from datetime import datetime, timezone

from tornado.ioloop import PeriodicCallback

from ..client import ClientError, PoolError

SETTING = "gpushare_busy_kernels_last_activity"


class KernelActivity:
    def __init__(self, serverapp, client, executor, interval: float, log):
        self.serverapp, self.client, self.executor, self.log = serverapp, client, executor, log
        self.server = os.environ.get("JUPYTERHUB_SERVER_NAME", "")
        self._timer = PeriodicCallback(self.tick, interval * 1000)
        self._told_failure = False

    def start(self) -> None:
        self._timer.start()
        asyncio.ensure_future(self.tick())

    def stop(self) -> None:
        self._timer.stop()

    def counts(self) -> tuple[int, int]:
        km = self.serverapp.kernel_manager
        ids = list(km.list_kernel_ids())
        busy = sum(1 for k in ids if getattr(km.get_kernel(k), "execution_state", "") == "busy")
        return len(ids), busy

    async def tick(self) -> None:
        kernels, busy = self.counts()
        if busy:
            self.serverapp.web_app.settings[SETTING] = datetime.now(timezone.utc)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.executor, self.client.report_kernels, self.server,
                                       kernels, busy)
            self._told_failure = False
        except PoolError as exc:
            if exc.status != 404:
                self._tell(exc)
            elif not self._told_failure:  # a server without a build slice: nothing to cull
                self.log.info("gpushare: this server holds no build slice, so the pool does "
                              "not take its kernels' activity")
                self._told_failure = True
        except ClientError as exc:
            self._tell(exc)

    def _tell(self, exc: Exception) -> None:
        if not self._told_failure:  # once, not every interval
            self.log.warning("gpushare: the pool was not told about this server's kernels "
                             "(%s); culling spares a server it has not heard from", exc)
            self._told_failure = True
