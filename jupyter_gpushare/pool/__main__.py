"""``python -m jupyter_gpushare.pool``: the pool service (``app.py``).

Under the supervisor (``supervisor.py``) a spare copy is started with ``GPUSHARE_STANDBY=1``:
it does its imports (most of its start-up time) and then waits on its standard input; it
takes over when the supervisor writes to it, and leaves quietly when the pipe closes."""

import os
import sys

standby = os.environ.pop("GPUSHARE_STANDBY", "") == "1"

from .app import main  # noqa: E402  the slow part, done while the spare waits

if standby and sys.stdin.buffer.read(1) != b"1":
    sys.exit(0)  # not needed after all: the supervisor is stopping
main()
