"""What-if replays for the API and the dashboard, run in a worker process: the replay decides
(``sim/history.what_if``, pure), this module only runs it off the event loop.

One at a time: a second request while one runs is refused with a sentence. The worker is a
fresh process (``whatif_worker.py``, in the idle scheduling class from its start) that reads the
history from the store itself, so a long replay never holds up the service's answers; it
reports how far it is in lines on its stdout, which ``api/whatif/{id}`` and the dashboard's
progress bar read. The last few results are kept in memory.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import sys
import time
from dataclasses import dataclass

# A what-if's own states (not a job's: trainjob.STATES)
REPLAYING, DONE, ERROR = "replaying", "done", "error"

KEEP = 10
WORKER = "jupyter_gpushare.pool.whatif_worker"
LINE_LIMIT = 64 * 1024 * 1024  # the result is one JSON line


class Busy(RuntimeError):
    """A what-if is already running."""


@dataclass
class WhatIf:
    id: str
    request: dict
    started: float
    state: str = REPLAYING  # replaying | done | error
    progress: float = 0.0
    result: dict | None = None
    error: str = ""
    finished: float | None = None

    def json(self) -> dict:
        return {"id": self.id, "state": self.state,
                "progress": 1.0 if self.state != REPLAYING else round(self.progress, 3),
                "request": self.request, "started": self.started, "finished": self.finished,
                "result": self.result, "error": self.error or None}


class WhatIfRunner:
    def __init__(self, log: logging.Logger | None = None):
        self.log = log or logging.getLogger("gpushare.whatif")
        self.runs: dict[str, WhatIf] = {}
        self.current: WhatIf | None = None
        self._ids = itertools.count(1)

    def get(self, run_id: str) -> WhatIf | None:
        return self.runs.get(run_id)

    def start(self, request: dict, gather) -> WhatIf:
        """Start a replay; ``gather()`` (a coroutine function) returns the worker's request
        but the history's changes (``whatif_worker.py``). Raises ``Busy``."""
        if self.current is not None and self.current.state == REPLAYING:
            raise Busy(f"a what-if is already running ({self.current.id}, "
                       f"{self.current.progress:.0%} done); wait for it, then ask again")
        run = WhatIf(f"w-{next(self._ids)}-{int(time.time())}", request, time.time())
        self.current = self.runs[run.id] = run
        for old in sorted(self.runs.values(), key=lambda r: r.started)[:-KEEP]:
            del self.runs[old.id]
        asyncio.ensure_future(self._run(run, gather))
        return run

    async def _run(self, run: WhatIf, gather) -> None:
        try:
            body = json.dumps(await gather()).encode()
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", WORKER, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                limit=LINE_LIMIT)
            proc.stdin.write(body)
            await proc.stdin.drain()
            proc.stdin.close()
            async for raw in proc.stdout:
                line = json.loads(raw)
                if "progress" in line:
                    run.progress = line["progress"]
                elif "result" in line:
                    run.result, run.state = line["result"], DONE
                elif "error" in line:
                    run.error, run.state = line["error"], ERROR
            errors = await proc.stderr.read()
            if await proc.wait() != 0 or run.state == REPLAYING:
                self.log.error("a what-if replay failed: %s",
                               errors.decode(errors="replace")[-2000:])
                run.state = ERROR
                run.error = "the replay failed; the pool's log says why"
        except Exception as e:  # noqa: BLE001 - said on the run, logged for the admin
            self.log.exception("a what-if replay failed")
            run.state, run.error = ERROR, f"the replay failed ({type(e).__name__}); the " \
                                             f"pool's log says why"
        finally:
            run.finished = time.time()
