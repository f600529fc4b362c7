"""When the scheduling loop runs a cycle: woken by whatever changes what it decides on (a
submit, a cancel, an admin's change, a notebook server that wants a lent GPU back), and
whether one runs now. The service makes one and gives it to the loop (``scheduler.py``) and
the build pool (``build/build_pool.py``) when it makes them, so neither reaches into the
other."""

from __future__ import annotations

import asyncio


class CycleSignal:
    def __init__(self):
        self.woken = asyncio.Event()
        self.lock = asyncio.Lock()  # held by a cycle from its decisions to its starts

    def wake(self) -> None:
        """Run a cycle soon."""
        self.woken.set()

    def deciding(self) -> bool:
        """Whether a cycle runs now (between its decisions and the starts it asks for)."""
        return self.lock.locked()
