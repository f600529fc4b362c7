"""What-if replays for the API and the dashboard, run in a worker process: the replay decides
(``sim/history.what_if``, pure), this module only runs it off the event loop.

One at a time: a second request while one runs is refused with a sentence. The worker is a
fresh process (``whatif/worker.py``, in the idle scheduling class from its start, and in
Python's isolated mode: no PYTHON* variables, no current folder or user site on its path)
that reads the history from the store itself, so a long replay never holds up the service's
answers; it reports how far it is in lines on its stdout, which ``api/whatif/{id}`` and the
dashboard's progress bar read. A replay that runs past ``timeout`` seconds, or one an admin
cancels (``DELETE api/whatif/{id}``), is stopped: its worker killed, its state saying why,
and the next one may start. The last few results are kept in memory.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import sys
import time
from dataclasses import dataclass, field

# A what-if's own states (not a job's: trainjob.STATES)
REPLAYING, DONE, ERROR, STOPPED = "replaying", "done", "error", "stopped"
STATES = (REPLAYING, DONE, ERROR, STOPPED)

KEEP = 10
WORKER = "jupyter_gpushare.pool.whatif.worker"
LINE_LIMIT = 64 * 1024 * 1024  # the result is one JSON line


class Busy(RuntimeError):
    """A what-if is already running."""


@dataclass
class WhatIf:
    id: str
    request: dict
    started: float
    state: str = REPLAYING  # replaying | done | error | stopped (cancelled by an admin)
    progress: float = 0.0
    result: dict | None = None
    error: str = ""
    finished: float | None = None
    task: asyncio.Future | None = field(default=None, repr=False, compare=False)
    worker: asyncio.subprocess.Process | None = field(default=None, repr=False, compare=False)

    def json(self) -> dict:
        return {"id": self.id, "state": self.state,
                "progress": 1.0 if self.state == DONE else round(self.progress, 3),
                "request": self.request, "started": self.started, "finished": self.finished,
                "result": self.result, "error": self.error or None}


class WhatIfRunner:
    """Runs what-ifs one at a time, each in a worker process stopped after ``timeout``
    seconds of wall-clock time (``PoolService.whatif_timeout``)."""

    def __init__(self, log: logging.Logger | None = None, timeout: float = 600.0):
        self.log = log or logging.getLogger("gpushare.whatif")
        self.timeout = timeout
        self.runs: dict[str, WhatIf] = {}
        self.current: WhatIf | None = None
        self._ids = itertools.count(1)

    def command(self) -> list[str]:
        """The worker's command line: this Python in isolated mode (``-I``), so that neither
        the service's PYTHON* variables nor its current folder choose what the worker
        imports."""
        return [sys.executable, "-I", "-m", WORKER]

    def get(self, run_id: str) -> WhatIf | None:
        return self.runs.get(run_id)

    def start(self, request: dict, gather) -> WhatIf:
        """Start a replay; ``gather()`` (a coroutine function) returns the worker's request
        but the history's changes (``whatif/worker.py``). Raises ``Busy``."""
        if self.current is not None and self.current.state == REPLAYING:
            raise Busy(f"a what-if is already running ({self.current.id}, "
                       f"{self.current.progress:.0%} done); wait for it or cancel it "
                       f"(DELETE api/whatif/{self.current.id}), then ask again")
        run = WhatIf(f"w-{next(self._ids)}-{int(time.time())}", request, time.time())
        self.current = self.runs[run.id] = run
        for old in sorted(self.runs.values(), key=lambda r: r.started)[:-KEEP]:
            del self.runs[old.id]
        run.task = asyncio.ensure_future(self._run(run, gather))
        return run

    def cancel(self, run_id: str, who: str) -> WhatIf | None:
        """Stop the replay ``run_id`` if it runs: its worker killed at once, its state
        ``stopped``. None for an unknown id; a finished one is returned as it is."""
        run = self.runs.get(run_id)
        if run is not None and run.state == REPLAYING:
            self._end(run, STOPPED, f"{who} cancelled it before it finished")
            if run.task is not None:
                run.task.cancel()
        return run

    def _end(self, run: WhatIf, state: str, error: str) -> None:
        run.state, run.error, run.finished = state, error, time.time()
        _kill(run.worker)

    async def _run(self, run: WhatIf, gather) -> None:
        try:
            await asyncio.wait_for(self._replay(run, gather), self.timeout)
        except asyncio.TimeoutError:
            self.log.warning("a what-if ran past %s s and was stopped", self.timeout)
            self._end(run, ERROR, f"the replay timed out: it ran longer than the pool's "
                                  f"what-if timeout ({self.timeout:g} s, PoolService."
                                  f"whatif_timeout) and was stopped; replay a shorter window")
        except asyncio.CancelledError:
            if run.state == REPLAYING:  # not by cancel(): the service stops
                self._end(run, STOPPED, "the pool service stopped before it finished")
        except Exception as e:  # noqa: BLE001 - said on the run, logged for the admin
            self.log.exception("a what-if replay failed")
            if run.state == REPLAYING:
                run.state, run.error = ERROR, f"the replay failed ({type(e).__name__}); " \
                                              f"the pool's log says why"
        finally:
            _kill(run.worker)
            if run.worker is not None:
                await run.worker.wait()
            if run.finished is None:
                run.finished = time.time()

    async def _replay(self, run: WhatIf, gather) -> None:
        body = json.dumps(await gather()).encode()
        proc = run.worker = await asyncio.create_subprocess_exec(
            *self.command(), stdin=asyncio.subprocess.PIPE,
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


def _kill(worker) -> None:
    """SIGKILL the worker if it still runs (it holds nothing that needs a clean exit)."""
    if worker is not None and worker.returncode is None:
        try:
            worker.kill()
        except ProcessLookupError:
            pass
