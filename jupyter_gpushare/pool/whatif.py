"""What-if replays for the API and the dashboard, run in a worker process: the replay decides
(``sim/history.what_if``, pure), this module only runs it off the event loop.

One at a time: a second request while one runs is refused with a sentence. The worker is a
fresh process (spawned, at a lower CPU priority), so a long replay never holds up the
service's answers; it reports how far it is through a shared number, which ``api/whatif/{id}``
and the dashboard's progress bar read. The last few results are kept in memory.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from ..sim.history import BadChange, what_if

KEEP = 10
_progress = None  # in the worker: the shared number it writes its progress to


class Busy(RuntimeError):
    """A what-if is already running."""


@dataclass
class WhatIf:
    id: str
    request: dict
    started: float
    state: str = "running"  # running | done | failed
    result: dict | None = None
    error: str = ""
    finished: float | None = None
    progress: object = field(default=None, repr=False)  # multiprocessing.Value('d')

    def json(self) -> dict:
        done = 1.0 if self.state != "running" else \
            round(self.progress.value if self.progress is not None else 0.0, 3)
        return {"id": self.id, "state": self.state, "progress": done, "request": self.request,
                "started": self.started, "finished": self.finished, "result": self.result,
                "error": self.error or None}


def _init(progress, nice: int) -> None:
    global _progress
    _progress = progress
    try:
        os.nice(nice)
    except OSError:
        pass


def _tell(share: float) -> None:
    _progress.value = share


def _work(history, pool, projects, knobs, capacity, quotas) -> dict:
    """In the worker: read the history (``history``: the jobs, or the store's URL and the
    window to read them from), then replay it."""
    if isinstance(history, tuple):
        from .api_history import all_entries, open_source

        source = open_source(history[0])
        try:
            history = all_entries(source, *history[1:])
        finally:
            source.engine.dispose()
        _tell(0.05)
    return what_if(pool, projects, knobs, history, capacity, quotas,
                   lambda share: _tell(0.05 + 0.95 * share))


class WhatIfRunner:
    def __init__(self, nice: int = 10, log: logging.Logger | None = None):
        self.nice = nice
        self.log = log or logging.getLogger("gpushare.whatif")
        self.runs: dict[str, WhatIf] = {}
        self.current: WhatIf | None = None
        self._ids = itertools.count(1)

    def get(self, run_id: str) -> WhatIf | None:
        return self.runs.get(run_id)

    def start(self, request: dict, gather) -> WhatIf:
        """Start a replay; ``gather()`` (a coroutine function) returns the arguments of
        ``what_if`` but the progress, as the API shows them. Raises ``Busy``."""
        if self.current is not None and self.current.state == "running":
            raise Busy(f"a what-if is already running ({self.current.id}, "
                       f"{self.current.json()['progress']:.0%} done); wait for it, then ask "
                       f"again")
        ctx = multiprocessing.get_context("spawn")
        run = WhatIf(f"w-{next(self._ids)}-{int(time.time())}", request, time.time(),
                     progress=ctx.Value("d", 0.0, lock=False))
        self.current = self.runs[run.id] = run
        for old in sorted(self.runs.values(), key=lambda r: r.started)[:-KEEP]:
            del self.runs[old.id]
        asyncio.ensure_future(self._run(run, ctx, gather))
        return run

    async def _run(self, run: WhatIf, ctx, gather) -> None:
        try:
            args = await gather()
            with ProcessPoolExecutor(1, mp_context=ctx, initializer=_init,
                                     initargs=(run.progress, self.nice)) as pool:
                run.result = await asyncio.wrap_future(pool.submit(_work, *args))
            run.state = "done"
        except BadChange as e:
            run.state, run.error = "failed", str(e)
        except Exception as e:  # noqa: BLE001 - said on the run, logged for the admin
            self.log.exception("a what-if replay failed")
            run.state, run.error = "failed", f"the replay failed ({type(e).__name__}); the " \
                                             f"pool's log says why"
        finally:
            run.finished = time.time()
