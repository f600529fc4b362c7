"""``python -m jupyter_gpushare.pool.supervisor [service options]``: the pool service, started
again at once when it dies.

Why: JupyterHub 6 restarts a managed service that dies, but only notices at its next poll of
the process. ``Service.start()`` polls through a ``_ServiceSpawner`` it builds without the
hub's configuration, so the poll interval is the Spawner default of 30 s (±10 % jitter) and
``c.Spawner.poll_interval`` does not reach it: the pool was away 23-31 s after a crash.
This small process is what the hub manages instead. It runs the service as its child and,
when the child dies for any reason but a stop it asked for, starts it again at once (the
pause grows to 10 s if it keeps dying at once, so a broken configuration does not spin). A
spare child waits with its imports done (``__main__.py``, about 0.7 s of a 1 s start), so a
restart only reads the configuration, opens the store and listens. SIGTERM or SIGINT (the hub stopping the service) is passed on as SIGTERM and
the supervisor exits with the child's status. On Linux the child gets SIGTERM if the
supervisor itself is killed, so no orphan keeps the port; the hub then restarts the
supervisor at its next poll. When the hub itself dies (``kill -9``, the OOM killer), the
supervisor notices within a second (its parent is no longer the hub) and stops the service
as the hub would have: train jobs keep running and the next start adopts them, and the port
is free for the hub started again.

Standard library only, and no import of the service: it starts in a few milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

QUICK_S = 10.0  # a child that dies sooner than this after its start is restarted after a pause
LOOK_S = 1.0  # how often the supervisor looks whether the hub that started it is still there
STOP_WAIT_S = 30.0  # how long a service told to stop may take before it is killed
MAX_PAUSE_S = 10.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child, before exec
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: an orphan would be stopped by the next start's port clash instead


def _say(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[W {stamp} gpushare-supervisor] {message}", file=sys.stderr, flush=True)


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = [sys.executable, "-m", "jupyter_gpushare.pool", *argv]
    active: subprocess.Popen | None = None
    stopping = False

    def stop(signum, _frame):
        nonlocal stopping
        stopping = True
        if active is not None and active.poll() is None:
            active.send_signal(signal.SIGTERM)

    def spare() -> subprocess.Popen:
        return subprocess.Popen(command, stdin=subprocess.PIPE, preexec_fn=_die_with_parent,
                                env={**os.environ, "GPUSHARE_STANDBY": "1"})

    def go(child: subprocess.Popen) -> subprocess.Popen:
        try:
            child.stdin.write(b"1")
            child.stdin.close()
            return child
        except OSError:  # the spare died meanwhile: a fresh one goes at once
            child.wait()
            return go(spare())

    # The hub that manages this service (JupyterHub names the service in its environment);
    # None where something else started it, which may well leave it running on purpose.
    hub = os.getppid() if os.environ.get("JUPYTERHUB_SERVICE_NAME") else None

    def orphaned() -> None:
        """The hub that started this is gone: stop as it would have stopped us."""
        if not stopping and hub is not None and os.getppid() != hub:
            _say("the hub that started the pool service is gone; stopping the service "
                 "(train jobs keep running; the next start adopts them)")
            stop(signal.SIGTERM, None)

    def watch(child: subprocess.Popen) -> int:
        """The child's exit status, looking at the hub every LOOK_S meanwhile; a child told
        to stop that does not within STOP_WAIT_S is killed."""
        told = None
        while True:
            try:
                return child.wait(timeout=LOOK_S)
            except subprocess.TimeoutExpired:
                orphaned()
                if stopping and told is None:
                    told = time.monotonic()
                elif told is not None and time.monotonic() - told > STOP_WAIT_S:
                    child.kill()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    waiting, pause = spare(), 0.0
    try:
        while not stopping:
            started = time.monotonic()
            active, waiting = go(waiting), spare()
            if stopping:  # the signal came while it was being started
                active.send_signal(signal.SIGTERM)
            code = watch(active)
            if stopping:
                return code if code >= 0 else 0
            pause = 0.0 if time.monotonic() - started > QUICK_S else min(max(pause * 2, 0.5),
                                                                           MAX_PAUSE_S)
            _say(f"the pool service {_how(code)}; starting it again"
                 + (f" in {pause:g} s" if pause else ""))
            deadline = time.monotonic() + pause
            while not stopping and time.monotonic() < deadline:
                time.sleep(min(0.1, deadline - time.monotonic()))
                orphaned()
        return 0
    finally:
        try:  # the spare reads the end of its input and leaves
            waiting.stdin.close()
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
