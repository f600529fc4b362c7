"""The what-if's worker process: ``python -I -m jupyter_gpushare.pool.whatif.worker``, started
by ``whatif/runner.py`` at a lower CPU priority, in isolated mode (it imports the installed
package, whatever the service's PYTHON* variables and current folder), and killed by it when the
what-if is cancelled or runs past its timeout.

It reads one JSON object on stdin: ``history`` (the trace lines, or ``{"db_url", "window"}``
to read them from the store itself), ``pool``, ``projects``, ``departments``, ``knobs``
(the pool's settings), ``build`` (the build pool and its lending options, with its sessions,
or without them where ``history`` says where to read them; None: no build pool),
``capacity`` and ``quotas`` (milli-GPUs); and writes JSON lines on stdout:
``{"progress": share}`` now and then, then ``{"result": ...}`` or ``{"error": sentence}``.
"""

from __future__ import annotations

import json
import os
import sys


def _lower() -> None:
    """The idle scheduling class where Linux has it (the worker runs only on CPU time nothing
    else wants, so the service's answers keep their latency), else the highest nice value.
    Done here, first, rather than by the service between fork and exec: a service that forks
    with a function to run copies its whole memory map first, which holds up its answers."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass
    try:
        os.nice(19)
    except OSError:
        pass


_lower()

from ...sim.history import BadChange, what_if  # noqa: E402  imported at the lower priority


def _say(**line) -> None:
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def run(request: dict) -> dict:
    history, build = request["history"], request.get("build")
    if isinstance(history, dict):
        from ..store.recorded_jobs import all_entries, open_source
        from ..store.recorded_slices import read_sessions

        source = open_source(history["db_url"])
        try:
            if build is not None and "sessions" not in build:
                lines, backs, left_off = read_sessions(source, *history["window"])
                build = {**build, "sessions": lines, "take_backs": backs,
                         "sessions_left_off": left_off}
            history = all_entries(source, *history["window"])
        finally:
            source.engine.dispose()
    _say(progress=0.05)
    return what_if(request["pool"], request["projects"], request["knobs"], history,
                   request["capacity"], request["quotas"],
                   lambda share: _say(progress=round(0.05 + 0.95 * share, 4)),
                   request.get("departments"), build)


def main() -> int:
    try:
        result = run(json.load(sys.stdin))
    except BadChange as e:
        _say(error=str(e))
        return 0
    _say(result=result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
